//! The prompt: the agent's instructions and the thread's recent messages, kept within the
//! agent's context budget and the model's context window.
//!
//! The conversation starts from the instructions, the newest stored summary of the thread's
//! older turns, and the last `history_depth` completed messages after it (earlier answers with
//! their tool calls and results), ending with the run's user message; the loop appends each
//! step's model output and tool results. When a prompt would not fit the model's context
//! window, the loop makes room ([`Loop::make_room`]): when the thread's history is what
//! overflows, its oldest turns are summarised ([`summarise`]: their text, tool calls and
//! results, a piece at a time so each call fits) into a stored summary that every later run
//! reuses, at most [`MAX_COMPACTIONS`] times an attempt; when the run's own steps are, their
//! results are cut. A summary that failed, or stopped short, or said nothing, is never stored:
//! it would be the thread's memory of those turns for good. Before each model call, [`prune`] keeps the estimated
//! prompt (4 characters a token) within `context_budget_tokens`: old tool results become
//! placeholders first, then messages before the last 3 user turns.

use futures::StreamExt as _;
use sqlx::PgPool;

use spool_shared::agent::AgentSpec;
use spool_shared::db::messages::{self, HistoryMessage, Summary};
use spool_shared::db::runs::Run;
use spool_shared::run::{FailureCode, MessagePart, Usage};
use spool_shared::status::Role;

use super::Loop;
use super::answer::{Exit, LoopEnd};
use super::context::Attempt;
use super::engine::Candidate;
use super::llm::{
    ChatChunk, ChatMessage, ChatRequest, ChatResponse, Choice, FinishReason, LlmError, ToolCall,
};

/// What replaces a tool result pruned to fit the context window.
pub(crate) const PRUNED: &str = "[earlier tool result omitted to fit the context window]";

/// The longest tool result an earlier turn replays, in characters.
pub(crate) const HISTORY_RESULT_CHARS: usize = 2_000;

/// What a run's prompt starts from.
pub(crate) struct Prompt {
    /// The instructions, the summary of older turns if there is one, and the replayed history
    /// ending with the run's user message.
    pub(crate) conversation: Vec<ChatMessage>,
    /// The user's input (the run's message).
    pub(crate) input: String,
    /// The thread's messages replayed (the run's own last).
    pub(crate) history: Vec<HistoryMessage>,
    /// The summary the history starts after, if any.
    pub(crate) summary: Option<Summary>,
    /// Whether older messages than the replayed ones follow the summary: a backlog that a new
    /// summary is to cover ([`Loop::absorb_backlog`]), so that no turn is simply dropped.
    pub(crate) backlog: bool,
}

/// The conversation a run starts from: the agent's instructions, the newest stored summary
/// of the thread's older turns, then its last `history_depth` messages after that summary
/// (an assistant's with its tool calls and their results, each result cut to
/// [`HISTORY_RESULT_CHARS`]), ending with the run's user message.
pub(crate) async fn start(db: &PgPool, run: &Run, spec: &AgentSpec) -> sqlx::Result<Prompt> {
    let mut conversation = Vec::new();
    if !spec.instructions.is_empty() {
        conversation.push(ChatMessage::System {
            content: spec.instructions.clone(),
        });
    }
    let (history, summary, backlog) = if run.depth > 0 {
        // A child run (an agent called as a tool) sees its input only, not the thread's
        // conversation, which its parent's model summed up in the call.
        (own_message(db, run).await?, None, false)
    } else {
        messages::history(
            db,
            run.thread_id,
            run.user_message_id,
            i64::from(spec.history_depth),
        )
        .await?
    };
    if let Some(summary) = &summary {
        conversation.push(ChatMessage::System {
            content: format!("Summary of the earlier conversation:\n{}", summary.content),
        });
    }
    let input = history
        .last()
        .map(|m| m.content.clone())
        .unwrap_or_default();
    for message in &history {
        match message.role {
            Role::User => conversation.push(ChatMessage::User {
                content: message.content.clone(),
            }),
            Role::Assistant => replay(&message.parts.0, &message.content, &mut conversation),
        }
    }
    Ok(Prompt {
        conversation,
        input,
        history,
        summary,
        backlog,
    })
}

/// The run's own user message, as the history of a child run.
async fn own_message(db: &PgPool, run: &Run) -> sqlx::Result<Vec<messages::HistoryMessage>> {
    let message = messages::find_in_thread(db, run.user_message_id, run.thread_id).await?;
    Ok(message
        .into_iter()
        .map(|m| messages::HistoryMessage {
            role: m.role,
            content: m.content,
            parts: m.parts,
            // Never summarised: the history holds nothing older to summarise.
            seq: 0,
        })
        .collect())
}

/// An earlier assistant message as the model said it: each step's text and tool calls, then
/// their results (calls without a result are left out: providers refuse them), then the final
/// text. A message without parts replays its content.
fn replay(parts: &[MessagePart], content: &str, conversation: &mut Vec<ChatMessage>) {
    if parts.is_empty() {
        conversation.push(ChatMessage::Assistant {
            content: Some(content.to_owned()),
            tool_calls: Vec::new(),
        });
        return;
    }
    let mut text = String::new();
    let mut calls: Vec<ToolCall> = Vec::new();
    let mut results: Vec<(String, String)> = Vec::new();
    let mut step = None;
    let flush = |text: &mut String,
                 calls: &mut Vec<ToolCall>,
                 results: &mut Vec<(String, String)>,
                 conversation: &mut Vec<ChatMessage>| {
        calls.retain(|c| results.iter().any(|(id, _)| *id == c.id));
        results.retain(|(id, _)| calls.iter().any(|c| c.id == *id));
        if calls.is_empty() {
            return;
        }
        conversation.push(ChatMessage::Assistant {
            content: (!text.is_empty()).then(|| std::mem::take(text)),
            tool_calls: std::mem::take(calls),
        });
        for (tool_call_id, content) in results.drain(..) {
            conversation.push(ChatMessage::Tool {
                tool_call_id,
                content,
            });
        }
    };
    for part in parts {
        match part {
            MessagePart::Text { text: more } => {
                flush(&mut text, &mut calls, &mut results, conversation);
                if !text.is_empty() {
                    text.push_str("\n\n");
                }
                text.push_str(more);
            }
            MessagePart::ToolCall {
                step: of,
                tool_call_id,
                name,
                arguments,
            } => {
                if *of != step {
                    flush(&mut text, &mut calls, &mut results, conversation);
                    step = *of;
                }
                calls.push(ToolCall {
                    id: tool_call_id.clone(),
                    name: name.clone(),
                    arguments: arguments.clone(),
                });
            }
            MessagePart::ToolResult {
                tool_call_id,
                output,
                ..
            } => results.push((tool_call_id.clone(), cut(output))),
            MessagePart::Citations { .. } => {}
        }
    }
    flush(&mut text, &mut calls, &mut results, conversation);
    if !text.is_empty() {
        conversation.push(ChatMessage::Assistant {
            content: Some(text),
            tool_calls: Vec::new(),
        });
    }
}

/// A replayed tool result, cut to [`HISTORY_RESULT_CHARS`] with a marker.
fn cut(output: &str) -> String {
    match output.char_indices().nth(HISTORY_RESULT_CHARS) {
        Some((at, _)) => format!(
            "{}\n[result cut to {HISTORY_RESULT_CHARS} characters]",
            &output[..at]
        ),
        None => output.to_owned(),
    }
}

/// What a summary is asked to keep.
const SUMMARY_INSTRUCTIONS: &str = "Summarise the conversation below for an assistant that will \
continue it without seeing it: keep every fact, name, number, decision, tool result that \
matters and open question; drop pleasantries. At most 300 words, plain text.";

/// Tokens a summary may take (the instructions ask for far fewer: a summary cut at this length
/// is not stored).
const SUMMARY_OUTPUT_TOKENS: u32 = 1024;

/// The fewest characters of transcript one summary call takes, however small the window.
const MIN_CHUNK_CHARS: usize = 1_000;

/// The older messages a new summary covers: the first half of the history before the run's
/// own message (at least one); `None` when there is none.
pub(crate) fn older(history: &[HistoryMessage]) -> Option<&[HistoryMessage]> {
    let earlier = history.len().checked_sub(1).filter(|n| *n > 0)?;
    Some(&history[..earlier.div_ceil(2)])
}

/// A message as the summary's transcript shows it: its text, and an assistant's tool calls
/// and their results (arguments and results cut to [`HISTORY_RESULT_CHARS`], as a replay
/// cuts them), which often hold the facts that matter ("order #123 created").
fn transcript_of(message: &HistoryMessage) -> String {
    let who = match message.role {
        Role::User => "user",
        Role::Assistant => "assistant",
    };
    if message.parts.0.is_empty() {
        return format!("{who}: {}\n\n", message.content);
    }
    let mut text = String::new();
    for part in &message.parts.0 {
        match part {
            MessagePart::Text { text: said } => text.push_str(&format!("{who}: {said}\n\n")),
            MessagePart::ToolCall {
                name, arguments, ..
            } => text.push_str(&format!("{who} called {name} with {}\n\n", cut(arguments))),
            MessagePart::ToolResult {
                name,
                output,
                is_error,
                ..
            } => {
                let what = if *is_error { "error" } else { "result" };
                text.push_str(&format!("{what} of {name}: {}\n\n", cut(output)));
            }
            MessagePart::Citations { .. } => {}
        }
    }
    text
}

/// The transcript of `older` in pieces of at most `chunk_chars` characters each: whole
/// messages together while they fit, a message that does not fit the space left starting a new
/// piece, and one longer than a piece split across pieces (nothing is left out).
fn chunks(older: &[HistoryMessage], chunk_chars: usize) -> Vec<String> {
    let chunk_chars = chunk_chars.max(1);
    let mut chunks: Vec<String> = Vec::new();
    let mut room = 0;
    for message in older {
        let mut text: &str = &transcript_of(message);
        let mut chars = text.chars().count();
        while chars > 0 {
            if room == 0 || (chars > room && chars <= chunk_chars) {
                chunks.push(String::new());
                room = chunk_chars;
            }
            let take = chars.min(room);
            let at = text
                .char_indices()
                .nth(take)
                .map_or(text.len(), |(at, _)| at);
            if let Some(last) = chunks.last_mut() {
                last.push_str(&text[..at]);
            }
            text = &text[at..];
            chars -= take;
            room -= take;
        }
    }
    chunks
}

/// A summary of `older` (continuing `summary`), written by `model` without streaming it to
/// anyone, a piece of the transcript at a time so each call fits the model (`chunk_chars`
/// characters, each call continuing the summary so far): the summary, or why there is none
/// (the model failed, stopped before the end, or said nothing), and the tokens it took either
/// way. Only a summary every call of which ended with `stop` and said something is one.
pub(crate) async fn summarise(
    model: &Candidate,
    summary: Option<&Summary>,
    older: &[HistoryMessage],
    chunk_chars: usize,
) -> (Result<String, String>, Usage) {
    let mut usage = Usage::default();
    let mut so_far = summary.map(|s| s.content.clone());
    for chunk in chunks(older, chunk_chars) {
        let mut transcript = String::new();
        if let Some(so_far) = &so_far {
            transcript.push_str(&format!("Summary so far:\n{so_far}\n\n"));
        }
        transcript.push_str(&chunk);
        let (text, used) = summarise_once(model, transcript).await;
        usage.add(used);
        match text {
            Ok(text) => so_far = Some(text),
            Err(why) => return (Err(why), usage),
        }
    }
    (
        so_far.ok_or_else(|| "nothing to summarise".to_owned()),
        usage,
    )
}

/// One summary call over `transcript`.
async fn summarise_once(model: &Candidate, transcript: String) -> (Result<String, String>, Usage) {
    let request = ChatRequest {
        model: model.name.clone(),
        messages: vec![
            ChatMessage::System {
                content: SUMMARY_INSTRUCTIONS.into(),
            },
            ChatMessage::User {
                content: transcript,
            },
        ],
        tools: Vec::new(),
        tool_choice: Choice::Auto,
        temperature: None,
        max_output_tokens: Some(SUMMARY_OUTPUT_TOKENS),
        response_format: None,
        parallel_tool_calls: None,
        top_p: None,
        reasoning_effort: None,
    };
    let response = async {
        let mut stream = model.model.stream(request).await?;
        while let Some(chunk) = stream.next().await {
            if let ChatChunk::Done(response) = chunk? {
                return Ok(response);
            }
        }
        Err(LlmError::Incomplete)
    };
    let span = summary_span(model);
    let response = tracing::Instrument::instrument(response, span.clone()).await;
    record_summary(&span, &response);
    match response {
        Err(err) => (
            Err(format!("the summary model failed: {err}")),
            Usage::default(),
        ),
        Ok(response) if response.finish_reason != FinishReason::Stop => {
            let why = format!(
                "the summary stopped with `{}` before its end",
                response.finish_reason.as_str()
            );
            (Err(why), model.priced(response.usage))
        }
        Ok(response) if response.text.trim().is_empty() => (
            Err("the summary model said nothing".to_owned()),
            model.priced(response.usage),
        ),
        Ok(response) => (Ok(response.text), model.priced(response.usage)),
    }
}

/// A summary call's span: a model call like the loop's, `chat {model}` (no content: the
/// transcript is the thread's older history, which the loop's spans carry when opted in).
fn summary_span(model: &Candidate) -> tracing::Span {
    tracing::info_span!("chat",
        otel.name = %format!("chat {}", model.name),
        otel.kind = "client",
        otel.status_code = tracing::field::Empty,
        gen_ai.operation.name = "chat",
        gen_ai.provider.name = model.model.system(),
        gen_ai.request.model = %model.name,
        gen_ai.request.max_tokens = i64::from(SUMMARY_OUTPUT_TOKENS),
        gen_ai.response.model = tracing::field::Empty,
        gen_ai.usage.input_tokens = tracing::field::Empty,
        gen_ai.usage.output_tokens = tracing::field::Empty,
        error.type = tracing::field::Empty,
        spool.purpose = "summary")
}

/// Records how a summary call ended on its span: the answering model, usage and finish
/// reason, or the error's kind.
fn record_summary(span: &tracing::Span, response: &Result<ChatResponse, LlmError>) {
    match response {
        Ok(response) => {
            if let Some(answering) = &response.model {
                span.record("gen_ai.response.model", answering.as_str());
            }
            super::genai::record_usage(span, &response.usage);
            spool_shared::telemetry::set_string_array(
                span,
                "gen_ai.response.finish_reasons",
                vec![super::genai::finish_reason(&response.finish_reason).to_owned()],
            );
        }
        Err(err) => super::genai::record_error(span, err),
    }
}

/// Summaries one attempt may write to fit its prompt before it fails with `context_overflow`.
pub(crate) const MAX_COMPACTIONS: u32 = 3;

/// The most messages beyond `history_depth` one summary takes in.
const BACKLOG_BATCH: i64 = 200;

impl Loop<'_> {
    /// Makes the prompt smaller, or fails the run with `context_overflow` when nothing more
    /// can: the thread's history is summarised only when it is what overflows (the run's own
    /// part, its message and steps with the instructions, fits the window alone; without a
    /// window, when the provider refused, the history is the larger part); otherwise, or once
    /// summaries cannot help (failed, or [`MAX_COMPACTIONS`] written), the results of the run's
    /// own steps are cut to [`HISTORY_RESULT_CHARS`], once. A summary that failed stores
    /// nothing, and the run goes on if the prompt fits without it.
    pub(super) async fn make_room(&mut self, a: &Attempt<'_>) -> Result<(), Exit> {
        let window = self.spec.context_window_tokens.map(|w| w as usize);
        // The start is the instructions, the summary, the history and the run's message.
        let instructions = self.spec.instructions.len() / 4;
        let own_start = self.prefix.saturating_sub(1);
        let own = instructions + estimate_tokens(&self.conversation[own_start..]);
        let history = estimate_tokens(&self.conversation[..own_start]).saturating_sub(instructions);
        let history_overflows = match window {
            Some(window) => own <= window,
            None => history >= own,
        };
        let can_summarise = self.summary_failed.is_none()
            && self.compactions < MAX_COMPACTIONS
            && older(&self.history).is_some();
        if history_overflows && can_summarise {
            match self.compact(a).await? {
                Ok(()) => return Ok(()),
                Err(why) => {
                    tracing::warn!(
                        why,
                        "the thread's earlier turns could not be summarised; nothing stored"
                    );
                    self.summary_failed = Some(why);
                }
            }
        }
        if !self.cut_own && cut_results(&mut self.conversation[self.prefix..]) {
            self.cut_own = true;
            tracing::info!("the run's own tool results were cut to fit the context window");
            return Ok(());
        }
        self.cut_own = true;
        let mut message = format!(
            "the prompt does not fit the model's context window (context_window_tokens: {:?}) \
             after {} summaries of the thread's earlier turns",
            self.spec.context_window_tokens, self.compactions
        );
        if let Some(why) = &self.summary_failed {
            message.push_str(&format!(" (a summary was not stored: {why})"));
        }
        Err(self.failed(FailureCode::ContextOverflow, message))
    }

    /// Folds the thread's messages older than the replayed window (`history_depth`) that no
    /// summary covers yet into a new stored summary, so the prompt keeps what they said rather
    /// than dropping them; a batch of [`BACKLOG_BATCH`] messages at a time, at most
    /// [`MAX_COMPACTIONS`] batches. A summary that fails stores nothing and the run goes on
    /// with the window alone (as if the backlog were not there).
    pub(super) async fn absorb_backlog(&mut self, a: &Attempt<'_>) -> Result<(), Exit> {
        let run = a.claimed.run();
        let mut rounds = 0;
        while self.backlog && rounds < MAX_COMPACTIONS {
            rounds += 1;
            let after = self.summary.as_ref().map_or(0, |s| s.through_seq);
            let before = self.history.first().map_or(i64::MAX, |message| message.seq);
            let older =
                messages::backlog(a.db, run.thread_id, after, before, BACKLOG_BATCH).await?;
            let Some(through) = older.last().map(|m| m.seq) else {
                return Ok(());
            };
            let summarizer = match a
                .engine
                .summarizer(a.db, &a.claimed.run().tenant_id, &self.spec)
                .await
            {
                Ok(summarizer) => summarizer,
                Err(err) => {
                    tracing::warn!(error = %err, "no model to summarise the thread's backlog");
                    return Ok(());
                }
            };
            let (text, usage) = summarise(
                &summarizer,
                self.summary.as_ref(),
                &older,
                self.chunk_chars(),
            )
            .await;
            self.spend(a, usage).await?;
            let text = match text {
                Ok(text) => text,
                Err(why) => {
                    tracing::warn!(
                        why,
                        "the thread's turns beyond history_depth could not be summarised; \
                         nothing stored"
                    );
                    return Ok(());
                }
            };
            let model = &summarizer.name;
            let held =
                messages::save_summary(a.db, run.id, run.attempt, through, &text, model).await?;
            if !held {
                return Err(LoopEnd::LeaseLost.into());
            }
            tracing::info!(
                through_seq = through,
                "summarised the thread's turns beyond history_depth"
            );
            self.rebuild_start(a).await?;
        }
        Ok(())
    }

    /// Characters of transcript per summary call: half the window (4 characters a token),
    /// room for the instructions, the summary so far and the answer; without a window, half
    /// the context budget.
    fn chunk_chars(&self) -> usize {
        let budget = self
            .spec
            .context_window_tokens
            .unwrap_or(self.spec.context_budget_tokens) as usize;
        (budget * 2).max(MIN_CHUNK_CHARS)
    }

    /// Rebuilds the conversation's start (instructions, summary, history) from what is
    /// stored now, keeping the run's own steps after it.
    async fn rebuild_start(&mut self, a: &Attempt<'_>) -> Result<(), Exit> {
        let steps = self.conversation.split_off(self.prefix);
        let start = start(a.db, a.claimed.run(), &self.spec).await?;
        self.prefix = start.conversation.len();
        self.conversation = start.conversation;
        self.conversation.extend(steps);
        (self.history, self.summary) = (start.history, start.summary);
        self.backlog = start.backlog;
        Ok(())
    }

    /// Summarises the oldest half of the replayed history (with the summary it started after)
    /// into a stored summary, and rebuilds the conversation's start from it; `Ok(Err(why))`,
    /// storing nothing, when the summary failed.
    async fn compact(&mut self, a: &Attempt<'_>) -> Result<Result<(), String>, Exit> {
        let Some(older) = older(&self.history).map(<[_]>::to_vec) else {
            return Ok(Err("no earlier turn to summarise".to_owned()));
        };
        self.compactions += 1;
        let summarizer = match a
            .engine
            .summarizer(a.db, &a.claimed.run().tenant_id, &self.spec)
            .await
        {
            Ok(summarizer) => summarizer,
            Err(err) => return Ok(Err(err.to_string())),
        };
        let through = older.last().map_or(0, |m| m.seq);
        let chunk_chars = self.chunk_chars();
        let (text, usage) =
            summarise(&summarizer, self.summary.as_ref(), &older, chunk_chars).await;
        self.spend(a, usage).await?;
        let text = match text {
            Ok(text) => text,
            Err(why) => return Ok(Err(why)),
        };
        let run = a.claimed.run();
        let model = &summarizer.name;
        let held = messages::save_summary(a.db, run.id, run.attempt, through, &text, model).await?;
        if !held {
            // Reclaimed, or the thread was erased meanwhile: nothing was stored.
            return Err(LoopEnd::LeaseLost.into());
        }
        tracing::info!(
            through_seq = through,
            "summarised the thread's oldest turns"
        );
        self.rebuild_start(a).await?;
        Ok(Ok(()))
    }
}

/// Cuts each tool result of `steps` longer than [`HISTORY_RESULT_CHARS`] to it (with a
/// marker); whether any was.
fn cut_results(steps: &mut [ChatMessage]) -> bool {
    let mut cut_any = false;
    for message in steps {
        if let ChatMessage::Tool { content, .. } = message
            && content.chars().nth(HISTORY_RESULT_CHARS).is_some()
        {
            *content = cut(content);
            cut_any = true;
        }
    }
    cut_any
}

/// Estimated tokens of the conversation (4 characters a token).
pub(crate) fn estimate_tokens(conversation: &[ChatMessage]) -> usize {
    conversation
        .iter()
        .map(|m| match m {
            ChatMessage::System { content }
            | ChatMessage::User { content }
            | ChatMessage::Tool { content, .. } => content.len(),
            ChatMessage::Assistant {
                content,
                tool_calls,
            } => {
                content.as_ref().map_or(0, String::len)
                    + tool_calls
                        .iter()
                        .map(|c| c.arguments.len() + c.name.len())
                        .sum::<usize>()
            }
        })
        .sum::<usize>()
        / 4
}

/// Over budget: replaces old tool results by placeholders (all but the latest step's), then
/// messages before the last 3 user turns.
pub(crate) fn prune(conversation: &mut [ChatMessage], budget: u32) {
    let budget = budget as usize;
    if estimate_tokens(conversation) <= budget {
        return;
    }
    let last_assistant = conversation
        .iter()
        .rposition(|m| matches!(m, ChatMessage::Assistant { .. }))
        .unwrap_or(0);
    for message in conversation[..last_assistant].iter_mut() {
        if let ChatMessage::Tool { content, .. } = message {
            *content = PRUNED.to_owned();
        }
    }
    if estimate_tokens(conversation) <= budget {
        return;
    }
    let user_turns: Vec<usize> = conversation
        .iter()
        .enumerate()
        .filter(|(_, m)| matches!(m, ChatMessage::User { .. }))
        .map(|(i, _)| i)
        .collect();
    if user_turns.len() > 3 {
        let keep_from = user_turns[user_turns.len() - 3];
        for message in conversation[..keep_from].iter_mut() {
            match message {
                ChatMessage::User { content } | ChatMessage::Tool { content, .. } => {
                    *content = "[omitted]".to_owned()
                }
                ChatMessage::Assistant { content, .. } => *content = Some("[omitted]".to_owned()),
                ChatMessage::System { .. } => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn over_budget_old_tool_results_become_placeholders_and_the_last_step_stays() {
        let big = "y".repeat(4000);
        let mut conversation = vec![
            ChatMessage::User {
                content: "q".into(),
            },
            ChatMessage::Assistant {
                content: None,
                tool_calls: vec![],
            },
            ChatMessage::Tool {
                tool_call_id: "1".into(),
                content: big.clone(),
            },
            ChatMessage::Assistant {
                content: None,
                tool_calls: vec![],
            },
            ChatMessage::Tool {
                tool_call_id: "2".into(),
                content: big.clone(),
            },
        ];
        prune(&mut conversation, 1500);
        assert_eq!(
            conversation[2],
            ChatMessage::Tool {
                tool_call_id: "1".into(),
                content: PRUNED.into()
            }
        );
        assert_eq!(
            conversation[4],
            ChatMessage::Tool {
                tool_call_id: "2".into(),
                content: big
            }
        );
    }
}
