//! One model call of a step: streamed as `text_*` events while it arrives, retried, continued.
//!
//! - Retries: a retryable failure (429, 5xx, timeouts, a stream cut short) is retried up to
//!   [`MODEL_RETRIES`] times with exponential backoff and jitter, waiting at least what the
//!   provider asked (`Retry-After`); only while no text of that try has been shown, so a client
//!   never sees text twice.
//! - Fallbacks: when the retries of a retryable failure are spent before any text of the call
//!   was shown, the agent's next `fallback_models` entry is asked the same request; the step's
//!   model call records the model that answered (continuations stay with it).
//! - Continuations: `finish_reason: length` without tool calls continues up to
//!   [`MAX_CONTINUATIONS`] times; the text of every part goes into one block.
//! - Held text: with `pre_response` hooks the text is not published as it streams; the loop
//!   shows it once the hooks have decided.
//! - A stop (cancel, lost lease, shutdown) ends the call at once with the text streamed so far.

use std::time::{Duration, Instant};

use backon::{BackoffBuilder as _, ExponentialBuilder};
use futures::StreamExt as _;
use tracing::Instrument as _;

use chrono::Utc;
use spool_shared::citation::Source;
use spool_shared::db::steps::{AssistantTurn, CallResult, ModelCall, SavedStep};
use spool_shared::event::{BlockId, TextDelta, TextEnd, TextStart};
use spool_shared::run::Usage;

use super::context::Attempt;
use super::engine::Candidate;
use super::genai;
use super::llm::{
    ChatChunk, ChatMessage, ChatModel, ChatRequest, ChatResponse, FinishReason, LlmError, ToolCall,
};
use crate::stop::Halt;

/// Continuations after `finish_reason: length`.
const MAX_CONTINUATIONS: usize = 3;
/// Retries of a retryable model error.
const MODEL_RETRIES: usize = 3;

/// One model call's result.
#[derive(Debug)]
pub(crate) struct ModelOutput {
    pub(crate) text: String,
    pub(crate) tool_calls: Vec<ToolCall>,
    pub(crate) usage: Usage,
    /// The model call, for the timeline (absent in steps saved before it was recorded).
    pub(crate) model_call: Option<ModelCall>,
}

impl ModelOutput {
    /// The step to save: this output with its calls' `results` and their numbered `sources`.
    pub(crate) fn saved(&self, results: Vec<CallResult>, sources: Vec<Source>) -> SavedStep {
        SavedStep {
            assistant: AssistantTurn {
                text: self.text.clone(),
                tool_calls: self.tool_calls.clone(),
            },
            results,
            usage: self.usage,
            sources,
            model_call: self.model_call.clone(),
            node: None,
        }
    }
}

/// Why a model call produced no output.
pub(crate) enum LlmEnd {
    /// Stopped from outside, with the text streamed so far.
    Halt(Halt, String),
    /// The provider failed (after the retries, if it was retryable).
    Error(LlmError),
}

/// Calls the model inside a `chat {model}` span (GenAI semantic conventions, see
/// [`super::genai`]: operation, provider, requested and answering model, the thread as the
/// conversation, finish reasons, the tokens used summed over retries and continuations, and,
/// when the operator opts in, the messages).
pub(crate) async fn call_model(
    a: &Attempt<'_>,
    models: &[Candidate],
    request: ChatRequest,
    step: u32,
    buffer: bool,
) -> Result<ModelOutput, LlmEnd> {
    let span = chat_span(a, models, &request, step);
    let mut out = Streamed {
        a,
        block: BlockId::of_step(step),
        buffer,
        block_open: false,
        text: String::new(),
        streamed: false,
    };
    let result = continued(models, request, &mut out, &span)
        .instrument(span.clone())
        .await;
    match &result {
        Ok(output) => genai::record_usage(&span, &output.usage),
        Err(LlmEnd::Error(err)) => genai::record_error(&span, err),
        // A halt (cancel, lease lost, shutdown) is not the model's failure.
        Err(LlmEnd::Halt(..)) => {}
    }
    result
}

/// The `chat {model}` span of a model call, with what the request says of itself: the
/// provider, the requested model and sampling, the thread as the conversation, and (opted in)
/// the instructions and input messages; the response's fields are recorded as they come.
fn chat_span(
    a: &Attempt<'_>,
    models: &[Candidate],
    request: &ChatRequest,
    step: u32,
) -> tracing::Span {
    let span = tracing::info_span!("chat",
        otel.name = %format!("chat {}", request.model),
        otel.kind = "client",
        otel.status_code = tracing::field::Empty,
        gen_ai.operation.name = "chat",
        gen_ai.provider.name = models.first().map_or("openai", |c| c.model.system()),
        gen_ai.request.model = %request.model,
        gen_ai.conversation.id = %a.claimed.run().thread_id,
        gen_ai.request.stream = true,
        gen_ai.request.temperature = tracing::field::Empty,
        gen_ai.request.top_p = tracing::field::Empty,
        gen_ai.request.max_tokens = tracing::field::Empty,
        gen_ai.output.type = tracing::field::Empty,
        gen_ai.response.model = tracing::field::Empty,
        gen_ai.response.id = tracing::field::Empty,
        gen_ai.usage.input_tokens = tracing::field::Empty,
        gen_ai.usage.output_tokens = tracing::field::Empty,
        gen_ai.system_instructions = tracing::field::Empty,
        gen_ai.input.messages = tracing::field::Empty,
        gen_ai.output.messages = tracing::field::Empty,
        error.type = tracing::field::Empty,
        run.step = i64::from(step));
    if let Some(temperature) = request.temperature {
        span.record("gen_ai.request.temperature", temperature);
    }
    if let Some(top_p) = request.top_p {
        span.record("gen_ai.request.top_p", top_p);
    }
    if let Some(max_tokens) = request.max_output_tokens {
        span.record("gen_ai.request.max_tokens", i64::from(max_tokens));
    }
    if request.response_format.is_some() {
        span.record("gen_ai.output.type", "json");
    }
    if a.engine.capture_content {
        let (instructions, input) = genai::input_messages(&request.messages);
        if let Some(instructions) = instructions {
            span.record("gen_ai.system_instructions", instructions.as_str());
        }
        span.record("gen_ai.input.messages", input.as_str());
    }
    span
}

/// Records on the chat span what the last response says of itself: the answering model, its
/// id, why it stopped, and (opted in) the answer, all parts' text together.
fn record_response(span: &tracing::Span, response: &ChatResponse, text: &str, capture: bool) {
    if let Some(model) = &response.model {
        span.record("gen_ai.response.model", model.as_str());
    }
    if let Some(id) = &response.id {
        span.record("gen_ai.response.id", id.as_str());
    }
    let reason = genai::finish_reason(&response.finish_reason);
    spool_shared::telemetry::set_string_array(
        span,
        "gen_ai.response.finish_reasons",
        vec![reason.to_owned()],
    );
    if capture {
        let output = genai::output_messages(text, &response.tool_calls, &response.finish_reason);
        span.record("gen_ai.output.messages", output.as_str());
    }
}

/// The call, continued after `finish_reason: length`; the block's `text_end` goes out however
/// it ends.
async fn continued(
    mut models: &[Candidate],
    mut request: ChatRequest,
    out: &mut Streamed<'_, '_>,
    span: &tracing::Span,
) -> Result<ModelOutput, LlmEnd> {
    let mut usage = Usage::default();
    let mut continuations = 0;
    let started_at = Utc::now();
    loop {
        let part_start = out.text.len();
        let started = Instant::now();
        let response = match retried(models, &request, out).await {
            Ok((response, answered)) => {
                // Later parts go to the model that answered.
                models = &models[answered..];
                request.model.clone_from(&models[0].name);
                response
            }
            Err(end) => {
                out.close();
                return Err(match end {
                    LlmEnd::Halt(halt, _) => LlmEnd::Halt(halt, std::mem::take(&mut out.text)),
                    error => error,
                });
            }
        };
        let part = models[0].priced(response.usage);
        usage.add(part);
        record(&request.model, part, started.elapsed());
        if response.finish_reason == FinishReason::Length
            && response.tool_calls.is_empty()
            && continuations < MAX_CONTINUATIONS
        {
            continuations += 1;
            request.messages.push(ChatMessage::Assistant {
                content: Some(out.text[part_start..].to_owned()),
                tool_calls: Vec::new(),
            });
            request.messages.push(ChatMessage::User {
                content: "Continue exactly where you stopped, without repeating anything.".into(),
            });
            continue;
        }
        out.close();
        record_response(span, &response, &out.text, out.a.engine.capture_content);
        return Ok(ModelOutput {
            text: std::mem::take(&mut out.text),
            tool_calls: response.tool_calls,
            usage,
            model_call: Some(ModelCall {
                model: request.model.clone(),
                started_at,
                ended_at: Utc::now(),
                finish_reason: response.finish_reason.as_str().to_owned(),
            }),
        });
    }
}

/// One request, retried while it fails retryably before any of its text was shown; when the
/// retries are spent, asked of the next candidate. The response, and the index of the
/// candidate that gave it.
async fn retried(
    models: &[Candidate],
    request: &ChatRequest,
    out: &mut Streamed<'_, '_>,
) -> Result<(ChatResponse, usize), LlmEnd> {
    let mut last = None;
    for (index, candidate) in models.iter().enumerate() {
        if let Some(err) = last.take() {
            tracing::warn!(error = %err, model = %candidate.name, "the model kept failing; falling back");
        }
        let mut request = request.clone();
        request.model.clone_from(&candidate.name);
        match retried_one(candidate.model.as_ref(), &request, out).await {
            Ok(response) => return Ok((response, index)),
            Err(LlmEnd::Error(err)) if err.is_retryable() && !out.streamed => last = Some(err),
            Err(end) => return Err(end),
        }
    }
    Err(LlmEnd::Error(last.unwrap_or_else(|| {
        LlmError::Unavailable("no model to call".into())
    })))
}

/// One request to one model, retried while it fails retryably before any of its text was
/// shown.
async fn retried_one(
    model: &dyn ChatModel,
    request: &ChatRequest,
    out: &mut Streamed<'_, '_>,
) -> Result<ChatResponse, LlmEnd> {
    let mut delays = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(Duration::from_secs(8))
        .with_jitter()
        .with_max_times(MODEL_RETRIES)
        .build();
    loop {
        out.streamed = false;
        let err = match streamed_once(model, request.clone(), out).await {
            Err(LlmEnd::Error(err)) if err.is_retryable() && !out.streamed => err,
            result => return result,
        };
        let Some(delay) = delays.next() else {
            return Err(LlmEnd::Error(err));
        };
        let delay = err.retry_after().map_or(delay, |asked| asked.max(delay));
        tracing::warn!(error = %err, ?delay, "model call failed; retrying");
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            halt = out.a.stop.wait() => return Err(LlmEnd::Halt(halt, String::new())),
        }
    }
}

/// One streaming request: its text goes out as it arrives.
async fn streamed_once(
    model: &dyn ChatModel,
    request: ChatRequest,
    out: &mut Streamed<'_, '_>,
) -> Result<ChatResponse, LlmEnd> {
    let stop = out.a.stop;
    let mut stream = tokio::select! {
        stream = model.stream(request) => stream.map_err(LlmEnd::Error)?,
        halt = stop.wait() => return Err(LlmEnd::Halt(halt, String::new())),
    };
    loop {
        let chunk = tokio::select! {
            chunk = stream.next() => chunk,
            halt = stop.wait() => return Err(LlmEnd::Halt(halt, String::new())),
        };
        match chunk {
            Some(Ok(ChatChunk::Text(delta))) => out.push(delta),
            Some(Ok(ChatChunk::Done(response))) => return Ok(response),
            Some(Err(err)) => return Err(LlmEnd::Error(err)),
            None => return Err(LlmEnd::Error(LlmError::Incomplete)),
        }
    }
}

/// The most distinct `model` label values a worker reports; later ones are `other`.
const MODEL_LABELS: usize = 32;

/// The `model` label for `model`: itself while fewer than [`MODEL_LABELS`] distinct models have
/// been seen, else `other`. Model names come from tenants' agent specs: unbounded, they would
/// grow every scrape without limit.
fn model_label(model: &str) -> String {
    static SEEN: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut seen = SEEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if seen.iter().any(|m| m == model) {
        return model.to_owned();
    }
    if seen.len() < MODEL_LABELS {
        seen.push(model.to_owned());
        return model.to_owned();
    }
    "other".to_owned()
}

/// Counts a model response's tokens and times it, by model.
fn record(model: &str, usage: Usage, took: Duration) {
    let model = model_label(model);
    metrics::counter!("spool_model_tokens_total", "model" => model.clone(), "direction" => "input")
        .increment(usage.input_tokens);
    metrics::counter!("spool_model_tokens_total", "model" => model.clone(), "direction" => "output")
        .increment(usage.output_tokens);
    metrics::histogram!("spool_model_call_duration_seconds", "model" => model)
        .record(took.as_secs_f64());
}

/// The text of one model call as it streams, across its retries and continuations.
struct Streamed<'a, 'b> {
    a: &'a Attempt<'b>,
    block: BlockId,
    /// Hold the text back instead of publishing it.
    buffer: bool,
    block_open: bool,
    text: String,
    /// Whether text arrived in the current try (a retry would then repeat it).
    streamed: bool,
}

impl Streamed<'_, '_> {
    /// Takes one delta: kept, and published unless held back (for `pre_response` hooks, until
    /// the loop knows what to show).
    fn push(&mut self, delta: String) {
        self.streamed = true;
        self.text.push_str(&delta);
        if self.buffer {
            return;
        }
        if !self.block_open {
            self.a.events.send(TextStart {
                block_id: self.block.clone(),
            });
            self.block_open = true;
        }
        self.a.events.send(TextDelta {
            block_id: self.block.clone(),
            delta,
        });
    }

    /// Ends the block, if one was opened.
    fn close(&mut self) {
        if std::mem::take(&mut self.block_open) {
            self.a.events.send(TextEnd {
                block_id: self.block.clone(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_label_stops_growing_after_a_bound() {
        for i in 0..MODEL_LABELS * 2 {
            let label = model_label(&format!("tenant-model-{i}"));
            assert!(label == format!("tenant-model-{i}") || label == "other");
        }
        assert_eq!(model_label("one-more-model"), "other");
    }
}
