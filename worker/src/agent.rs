//! The agent: a ReAct loop over a chat model and tools, checkpointed step by step.
//!
//! One step = one model call (plus up to 3 continuations after `finish_reason: length`) and
//! the tool calls it asks for. Before the next model call the step is saved in Postgres,
//! fenced on the attempt ([`spool_shared::db::steps::save`]). A new attempt rebuilds the
//! conversation from the saved steps and continues with the next one: completed model calls
//! and tool calls are never repeated; the tool call in flight at a crash is repeated with the
//! same `Idempotency-Key: {workflow_id}:{step}:{tool_call_id}`, so the tool can de-duplicate it.
//!
//! Pauses: a call of a client tool, or of a tool that needs approval, is held; the step is
//! saved with the held calls, the run pauses (`requires_action` / `awaiting_approval`) and
//! releases its worker. The answer (tool outputs, a decision, or the approval's expiry, which
//! counts as a denial) lands in the saved step, and the next attempt settles the step and goes
//! on. A cancel request stops the model call or the tools at once and keeps the partial answer.
//!
//! Safeguards: `max_steps` (tools withheld on the last step, so the model must answer in text),
//! `tool_choice` and per-step `step_rules`, `stop_conditions`, doom-loop detection (the same
//! call three times in a row fails the run), retries of retryable model errors (3, with
//! exponential backoff and jitter, honouring `Retry-After`; only before any text of that call
//! was streamed, so a client never sees text twice), tool timeouts, results over 50,000
//! characters truncated with a marker, read-only tools of one step run concurrently, and old
//! tool results replaced by placeholders when the estimated prompt exceeds the context budget.

pub mod engine;
mod hooks;
pub mod llm;
pub mod tools;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder as _, ExponentialBuilder};
use futures::StreamExt as _;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use spool_shared::agent::{AgentSpec, HookEvent, StopCondition, ToolChoice, ToolSpec};
use spool_shared::db::runs::{self, Claimed};
use spool_shared::db::steps::{AssistantTurn, CallResult, CallState, SavedStep};
use spool_shared::db::{agents, messages, steps};
use spool_shared::event::EventType;
use spool_shared::run::{
    Citation, FailureCode, MessagePart, PendingAction, PendingCall, RunFailure, Usage,
};
use spool_shared::status::{Role, RunStatus};

use crate::claim::Worker;
use crate::lease::Lease;
use crate::publish::Publisher;
use hooks::{Hooks, ToolDecision};
use llm::{
    ChatChunk, ChatMessage, ChatModel, ChatRequest, Choice, FinishReason, LlmError, ToolCall,
    ToolDef,
};
use tools::ToolOutput;
use tools::mcp::{McpServer, McpSession};

/// Tool results longer than this are truncated.
pub const MAX_TOOL_RESULT_CHARS: usize = 50_000;
/// Continuations after `finish_reason: length`.
const MAX_CONTINUATIONS: usize = 3;
/// Retries of a retryable model error.
const MODEL_RETRIES: usize = 3;
/// The same call this many times in a row is a doom loop.
const DOOM_LOOP: usize = 3;

/// Everything an attempt's loop works with.
pub(crate) struct Turn<'a> {
    pub(crate) worker: &'a Worker,
    pub(crate) claimed: &'a Claimed,
    pub(crate) lease: &'a Lease,
    pub(crate) release: &'a CancellationToken,
    pub(crate) events: &'a Publisher,
}

/// How the loop ended.
#[derive(Debug)]
pub(crate) enum LoopEnd {
    /// An answer (or a stop condition).
    Completed(Answer),
    /// A failure to record, and what was produced before it.
    Failed(RunFailure, Answer),
    /// Cancelled on request: record what was produced.
    Cancelled(Answer),
    /// Paused (client tool outputs or an approval); the run no longer holds a worker.
    Paused,
    /// The lease is gone: write nothing.
    LeaseLost,
    /// Shutdown: give the run back.
    Released,
}

/// What makes an attempt stop whatever it is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Halt {
    LeaseLost,
    Released,
    Cancelled,
}

impl Halt {
    fn end(self, answer: Answer) -> LoopEnd {
        match self {
            Self::LeaseLost => LoopEnd::LeaseLost,
            Self::Released => LoopEnd::Released,
            Self::Cancelled => LoopEnd::Cancelled(answer),
        }
    }
}

/// Resolves when the attempt must stop: lease lost, shutdown, or a cancel request.
async fn halted(t: &Turn<'_>) -> Halt {
    tokio::select! {
        () = t.lease.lost.cancelled() => Halt::LeaseLost,
        () = t.release.cancelled() => Halt::Released,
        () = t.lease.cancel_requested.cancelled() => Halt::Cancelled,
    }
}

/// Whether the attempt must stop now.
fn halt_now(t: &Turn<'_>) -> Option<Halt> {
    if t.lease.lost.is_cancelled() {
        Some(Halt::LeaseLost)
    } else if t.lease.cancel_requested.is_cancelled() || t.claimed.run.cancel_requested_at.is_some()
    {
        Some(Halt::Cancelled)
    } else if t.release.is_cancelled() {
        Some(Halt::Released)
    } else {
        None
    }
}

/// What the run produced.
#[derive(Debug, Default)]
pub(crate) struct Answer {
    pub(crate) content: String,
    pub(crate) parts: Vec<MessagePart>,
    pub(crate) usage: Usage,
    pub(crate) citations: Vec<Citation>,
}

impl Answer {
    fn add_text(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        if !self.content.is_empty() {
            self.content.push_str("\n\n");
        }
        self.content.push_str(text);
        self.parts.push(MessagePart::Text { text: text.into() });
    }

    /// Adds a settled step's tool calls and results as parts.
    fn add_calls(&mut self, step: u32, saved: &SavedStep) {
        for call in &saved.assistant.tool_calls {
            self.parts.push(MessagePart::ToolCall {
                step: Some(step),
                tool_call_id: call.id.clone(),
                name: call.name.clone(),
                arguments: call.arguments.clone(),
            });
            let Some(result) = saved.results.iter().find(|r| r.tool_call_id == call.id) else {
                continue;
            };
            self.parts.push(MessagePart::ToolResult {
                step: Some(step),
                tool_call_id: result.tool_call_id.clone(),
                name: result.name.clone(),
                output: result.output.clone(),
                is_error: result.is_error,
            });
        }
    }
}

fn failure(code: FailureCode, message: impl Into<String>) -> RunFailure {
    RunFailure::new(code, message)
}

/// Runs the agent for this attempt.
pub(crate) async fn run(t: &Turn<'_>) -> anyhow::Result<LoopEnd> {
    let run = &t.claimed.run;
    let engine = &t.worker.engine;
    let mut spec = match run.agent_id {
        None => engine.default_agent.clone(),
        Some(id) => match agents::find(&t.worker.db, id, &run.tenant_id).await? {
            Some(agent) => agent.spec.0,
            None => {
                t.events
                    .send(EventType::MessageStart, json!({"role": "assistant"}));
                let error = failure(
                    FailureCode::AgentNotFound,
                    "the run's agent no longer exists",
                );
                return Ok(LoopEnd::Failed(error, Answer::default()));
            }
        },
    };
    if !run.resumed {
        t.events.send(
            EventType::MessageStart,
            json!({"role": "assistant", "model": spec.model}),
        );
    }
    if let Some(halt) = halt_now(t) {
        return Ok(halt.end(Answer::default()));
    }
    let model = match engine.model(&spec.model) {
        Ok(model) => model,
        Err(err) => {
            let error = failure(FailureCode::ModelUnavailable, err.to_string());
            return Ok(LoopEnd::Failed(error, Answer::default()));
        }
    };

    let mut conversation = Vec::new();
    if !spec.instructions.is_empty() {
        conversation.push(ChatMessage::System {
            content: spec.instructions.clone(),
        });
    }
    let history = messages::history(
        &t.worker.db,
        run.thread_id,
        run.user_message_id,
        i64::from(spec.history_depth),
    )
    .await?;
    let input = history
        .last()
        .map(|(_, content)| content.clone())
        .unwrap_or_default();
    for (role, content) in history {
        conversation.push(match role {
            Role::User => ChatMessage::User { content },
            Role::Assistant => ChatMessage::Assistant {
                content: Some(content),
                tool_calls: Vec::new(),
            },
        });
    }

    let mut answer = Answer::default();
    let mut recent: Vec<(String, String)> = Vec::new();
    let mut saved = steps::load(&t.worker.db, run.id).await?;
    // The last step is unsettled if some of its calls have not finished: cut short by a crash,
    // or paused for the client or a person.
    let unsettled = saved.pop_if(|step| !step.data.0.is_settled());
    for step in &saved {
        replay(step, &mut conversation, &mut answer, &mut recent);
    }
    let mut first = u32::try_from(saved.len())
        .unwrap_or(u32::MAX)
        .saturating_add(1);
    if let Some(overrides) = &run.overrides {
        // Checked and pinned to their steps by the API.
        overrides.0.clone().apply(&mut spec);
    }
    let context = json!({"workflow_id": run.id, "thread_id": run.thread_id, "agent": spec.name});
    let hooks = Hooks::new(&spec, &engine.http, &engine.policy, context);
    if !run.resumed
        && saved.is_empty()
        && unsettled.is_none()
        && let Some(reason) = hooks.on_run_start(&input).await
    {
        return Ok(LoopEnd::Failed(
            failure(FailureCode::BlockedByHook, reason),
            answer,
        ));
    }
    let tools = ToolSet::build(t, &spec).await;

    if let Some(step) = unsettled {
        let SavedStep {
            assistant,
            mut results,
            usage,
            ..
        } = step.data.0;
        let output = ModelOutput {
            text: assistant.text,
            tool_calls: assistant.tool_calls,
            usage,
        };
        // After a crash (not an answered pause) the client dropped this step's events on
        // `attempt_restarted`: show its text and calls again, and publish every result anew.
        let restarted = !run.resumed;
        if restarted {
            emit_text(t, &format!("s{first}"), &output.text);
            results.iter_mut().for_each(|r| r.published = false);
        }
        answer.usage.add(output.usage);
        recent.extend(
            output
                .tool_calls
                .iter()
                .map(|c| (c.name.clone(), c.arguments.clone())),
        );
        let settled = settle_step(
            t,
            &spec,
            &tools,
            &hooks,
            first,
            output,
            results,
            restarted,
            &mut conversation,
            &mut answer,
        )
        .await?;
        if let Some(end) = settled {
            return Ok(end);
        }
        first += 1;
    }

    let buffer = hooks.has(HookEvent::PreResponse);
    for step in first..=spec.max_steps {
        if let Some(halt) = halt_now(t) {
            return Ok(halt.end(answer));
        }
        let last = step == spec.max_steps;
        let (offered, choice) = tools.offer(&spec, step, last);
        prune(&mut conversation, spec.context_budget_tokens);
        let request = ChatRequest {
            model: spec.model.clone(),
            messages: conversation.clone(),
            tools: offered,
            tool_choice: choice,
            temperature: spec.temperature,
        };
        let mut output = match call_model(t, model.as_ref(), request, step, buffer).await? {
            Ok(output) => output,
            Err(LlmEnd::Halt(halt, partial)) => {
                answer.add_text(&partial);
                return Ok(halt.end(answer));
            }
            Err(LlmEnd::Error(err)) => {
                let code = if err.is_retryable() {
                    FailureCode::ModelUnavailable
                } else {
                    FailureCode::ModelError
                };
                return Ok(LoopEnd::Failed(failure(code, err.to_string()), answer));
            }
        };
        answer.usage.add(output.usage);
        if output.tool_calls.is_empty() {
            // The final answer: with `pre_response` hooks it was held back until they decide.
            let text = if buffer {
                match hooks.pre_response(&output.text).await {
                    Ok(text) => {
                        emit_text(t, &format!("s{step}"), &text);
                        text
                    }
                    Err(reason) => {
                        return Ok(LoopEnd::Failed(
                            failure(FailureCode::ResponseBlocked, reason),
                            answer,
                        ));
                    }
                }
            } else {
                output.text
            };
            answer.add_text(&text);
            return Ok(LoopEnd::Completed(answer));
        }
        if buffer {
            emit_text(t, &format!("s{step}"), &output.text);
        }
        for call in &output.tool_calls {
            recent.push((call.name.clone(), call.arguments.clone()));
            let tail = &recent[recent.len().saturating_sub(DOOM_LOOP)..];
            if tail.len() == DOOM_LOOP && tail.iter().all(|c| *c == tail[DOOM_LOOP - 1]) {
                let message = format!(
                    "the model called `{}` with the same arguments {DOOM_LOOP} times in a row",
                    call.name
                );
                return Ok(LoopEnd::Failed(
                    failure(FailureCode::DoomLoop, message),
                    answer,
                ));
            }
        }
        let results = classify(&spec, &tools, &hooks, &mut output).await;
        // Saved before any call runs: a new attempt repeats these calls with the same ids (and
        // so the same idempotency keys), never the model call that chose them.
        let data = output.saved(results.clone(), Vec::new());
        if !steps::save(&t.worker.db, run.id, run.attempt, step_number(step), &data).await? {
            return Ok(LoopEnd::LeaseLost);
        }
        let settled = settle_step(
            t,
            &spec,
            &tools,
            &hooks,
            step,
            output,
            results,
            true,
            &mut conversation,
            &mut answer,
        )
        .await?;
        if let Some(end) = settled {
            return Ok(end);
        }
    }
    Ok(LoopEnd::Completed(answer))
}

/// Publishes a whole text block at once (held-back or re-shown text).
fn emit_text(t: &Turn<'_>, block: &str, text: &str) {
    if text.is_empty() {
        return;
    }
    t.events
        .send(EventType::TextStart, json!({"block_id": block}));
    t.events.send(
        EventType::TextDelta,
        json!({"block_id": block, "delta": text}),
    );
    t.events
        .send(EventType::TextEnd, json!({"block_id": block}));
}

/// Decides, for each call of a new step, what happens to it: run it, hold it for the client
/// or for approval, or refuse it (a `pre_tool_use` hook). Hooks may rewrite the arguments.
async fn classify(
    spec: &AgentSpec,
    tools: &ToolSet,
    hooks: &Hooks<'_>,
    output: &mut ModelOutput,
) -> Vec<CallResult> {
    let now = chrono::Utc::now();
    let mut results = Vec::with_capacity(output.tool_calls.len());
    for call in &mut output.tool_calls {
        let tool = tools.find(&call.name);
        let mut result = CallResult::new(call, CallState::Approved);
        let decision = hooks
            .pre_tool_use(&call.name, &call.parsed_arguments())
            .await;
        let hook_timeout = match decision {
            ToolDecision::Deny(reason) => {
                result.settle(format!("Blocked by a hook: {reason}"), true);
                results.push(result);
                continue;
            }
            ToolDecision::Allow(Some(arguments)) => {
                call.arguments = arguments.to_string();
                None
            }
            ToolDecision::Allow(None) => None,
            ToolDecision::Approval(timeout) => Some(timeout.unwrap_or(spec.approval_timeout_secs)),
        };
        let approval = hook_timeout.or(tool
            .filter(|t| t.requires_approval)
            .map(|_| spec.approval_timeout_secs));
        if let Some(secs) = approval {
            result.state = CallState::PendingApproval;
            result.expires_at = Some(now + chrono::Duration::seconds(i64::from(secs)));
        } else if tool.is_some_and(|t| matches!(t.kind, Kind::Client)) {
            result.state = CallState::PendingClient;
        }
        results.push(result);
    }
    results
}

/// Fires the agent's `on_run_complete` hooks after the run ended; never waits for them.
pub(crate) async fn run_completed(
    worker: &Worker,
    claimed: &Claimed,
    status: RunStatus,
    content: &str,
) {
    let run = &claimed.run;
    // The default agent has no hooks.
    let Some(agent_id) = run.agent_id else { return };
    let Ok(Some(agent)) = agents::find(&worker.db, agent_id, &run.tenant_id).await else {
        return;
    };
    let spec = agent.spec.0;
    if spec
        .hooks
        .iter()
        .any(|h| h.event == HookEvent::OnRunComplete)
    {
        let context =
            json!({"workflow_id": run.id, "thread_id": run.thread_id, "agent": spec.name});
        let engine = &worker.engine;
        Hooks::new(&spec, &engine.http, &engine.policy, context)
            .on_run_complete(status.as_str(), content);
    }
}

fn step_number(step: u32) -> i32 {
    i32::try_from(step).unwrap_or(i32::MAX)
}

/// Brings a step's tool calls to a settled state: runs those that can run (read-only ones
/// concurrently, results passed through `post_tool_use` hooks), holds client tools and calls
/// needing approval (pausing the run), feeds decisions and client outputs back, then saves the
/// step with its results and adds it to the conversation. `announce` publishes the calls (a new
/// step, or one re-shown after a crash). `Some` ends the loop: paused, halted, or a stop
/// condition.
#[expect(
    clippy::too_many_arguments,
    reason = "the loop's state, passed explicitly"
)]
async fn settle_step(
    t: &Turn<'_>,
    spec: &AgentSpec,
    tools: &ToolSet,
    hooks: &Hooks<'_>,
    step: u32,
    output: ModelOutput,
    mut results: Vec<CallResult>,
    announce: bool,
    conversation: &mut Vec<ChatMessage>,
    answer: &mut Answer,
) -> anyhow::Result<Option<LoopEnd>> {
    let run = &t.claimed.run;
    let now = chrono::Utc::now();
    if announce {
        for call in &output.tool_calls {
            t.events.send(
                EventType::Step,
                json!({"phase": "call", "step": step,
                "tool_call_id": call.id, "tool_name": call.name,
                "arguments": call.parsed_arguments()}),
            );
        }
    }
    // Decisions and expiries: a denial, or no decision in time, reaches the model as an error.
    for result in &mut results {
        match result.state {
            CallState::Denied => {
                let output = match &result.reason {
                    Some(reason) => format!("The user denied this tool call: {reason}"),
                    None => "The user denied this tool call.".to_owned(),
                };
                result.settle(output, true);
            }
            CallState::PendingApproval if result.expires_at.is_none_or(|at| at <= now) => {
                let output = format!(
                    "No one approved this tool call within {} s; it was not made.",
                    spec.approval_timeout_secs
                );
                result.settle(output, true);
            }
            CallState::ClientOutput => result.state = CallState::Done,
            _ => {}
        }
    }
    let to_run: Vec<&ToolCall> = output
        .tool_calls
        .iter()
        .zip(&results)
        .filter(|(_, r)| r.state == CallState::Approved)
        .map(|(call, _)| call)
        .collect();
    if !to_run.is_empty() {
        let outputs = tokio::select! {
            outputs = tools.execute(t, step, &to_run) => outputs,
            halt = halted(t) => return Ok(Some(halt.end(std::mem::take(answer)))),
        };
        for (call, out) in to_run.iter().zip(outputs) {
            if let Some(result) = results.iter_mut().find(|r| r.tool_call_id == call.id) {
                let output = hooks
                    .post_tool_use(&call.name, &call.parsed_arguments(), out.content)
                    .await;
                result.settle(output, out.is_error);
            }
        }
    }
    if let Some(halt) = halt_now(t) {
        return Ok(Some(halt.end(std::mem::take(answer))));
    }
    for result in results
        .iter_mut()
        .filter(|r| r.state == CallState::Done && !r.published)
    {
        t.events.send(
            EventType::Step,
            json!({"phase": "result", "step": step,
            "tool_call_id": result.tool_call_id, "tool_name": result.name,
            "output": result.output, "is_error": result.is_error}),
        );
        result.published = true;
    }
    let pending_approval: Vec<&CallResult> = results
        .iter()
        .filter(|r| r.state == CallState::PendingApproval)
        .collect();
    let pending_client: Vec<&CallResult> = results
        .iter()
        .filter(|r| r.state == CallState::PendingClient)
        .collect();
    if !pending_approval.is_empty() || !pending_client.is_empty() {
        let data = output.saved(results.clone(), Vec::new());
        if !steps::save(&t.worker.db, run.id, run.attempt, step_number(step), &data).await? {
            return Ok(Some(LoopEnd::LeaseLost));
        }
        let pending = |result: &CallResult| PendingCall {
            tool_call_id: result.tool_call_id.clone(),
            tool_name: result.name.clone(),
            arguments: output
                .tool_calls
                .iter()
                .find(|c| c.id == result.tool_call_id)
                .map_or(Value::Null, |c| c.parsed_arguments()),
        };
        // Approvals first, one call at a time; client tools once no approval is pending.
        let (status, action, expires_at, event, event_data) =
            if let Some(first) = pending_approval.first() {
                let call = pending(first);
                let data = json!({"tool_call_id": call.tool_call_id, "tool_name": call.tool_name,
                "arguments": call.arguments, "expires_at": first.expires_at});
                let action = PendingAction::Approval {
                    tool_call_id: call.tool_call_id,
                    tool_name: call.tool_name,
                    arguments: call.arguments,
                    expires_at: first.expires_at,
                };
                (
                    RunStatus::AwaitingApproval,
                    action,
                    first.expires_at,
                    EventType::ApprovalRequested,
                    data,
                )
            } else {
                let calls: Vec<PendingCall> = pending_client.iter().map(|r| pending(r)).collect();
                let data = json!({"tool_calls": calls});
                (
                    RunStatus::RequiresAction,
                    PendingAction::SubmitToolOutputs { tool_calls: calls },
                    None,
                    EventType::RequiresAction,
                    data,
                )
            };
        if !runs::pause(
            &t.worker.db,
            run.id,
            run.attempt,
            status,
            &action,
            expires_at,
        )
        .await?
        {
            return Ok(Some(LoopEnd::LeaseLost));
        }
        t.events.send(event, event_data);
        return Ok(Some(LoopEnd::Paused));
    }

    let citations = results
        .iter()
        .flat_map(|r| citations_in(&r.output, r.is_error))
        .collect();
    let data = output.saved(results.clone(), citations);
    if !steps::save(&t.worker.db, run.id, run.attempt, step_number(step), &data).await? {
        return Ok(Some(LoopEnd::LeaseLost));
    }
    answer.add_text(&output.text);
    answer.add_calls(step, &data);
    answer.citations.extend(data.citations);
    conversation.push(ChatMessage::Assistant {
        content: (!output.text.is_empty()).then(|| output.text.clone()),
        tool_calls: output.tool_calls.clone(),
    });
    for result in results {
        conversation.push(ChatMessage::Tool {
            tool_call_id: result.tool_call_id,
            content: result.output,
        });
    }
    let stop = spec
        .stop_conditions
        .iter()
        .any(|StopCondition::HasToolCall { tool_name }| {
            output.tool_calls.iter().any(|c| c.name == *tool_name)
        });
    Ok(stop.then(|| LoopEnd::Completed(std::mem::take(answer))))
}

/// Restores a saved, settled step into the conversation and the answer.
fn replay(
    step: &steps::Step,
    conversation: &mut Vec<ChatMessage>,
    answer: &mut Answer,
    recent: &mut Vec<(String, String)>,
) {
    let saved = &step.data.0;
    let text = &saved.assistant.text;
    answer.add_text(text);
    answer.add_calls(u32::try_from(step.step).unwrap_or(0), saved);
    conversation.push(ChatMessage::Assistant {
        content: (!text.is_empty()).then(|| text.clone()),
        tool_calls: saved.assistant.tool_calls.clone(),
    });
    for call in &saved.assistant.tool_calls {
        recent.push((call.name.clone(), call.arguments.clone()));
    }
    for result in &saved.results {
        conversation.push(ChatMessage::Tool {
            tool_call_id: result.tool_call_id.clone(),
            content: result.output.clone(),
        });
    }
    answer.usage.add(saved.usage);
    answer.citations.extend(saved.citations.iter().cloned());
}

/// The citations a tool result carries: `{"citations": [{title, url, snippet}]}` in JSON.
fn citations_in(output: &str, is_error: bool) -> Vec<Citation> {
    if is_error {
        return Vec::new();
    }
    let Ok(value) = serde_json::from_str::<Value>(output) else {
        return Vec::new();
    };
    value["citations"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["url"].is_string() || c["title"].is_string())
        .map(|c| Citation {
            title: c["title"].clone(),
            url: c["url"].clone(),
            snippet: c["snippet"].clone(),
        })
        .collect()
}

/// One model call's result.
struct ModelOutput {
    text: String,
    tool_calls: Vec<ToolCall>,
    usage: Usage,
}

impl ModelOutput {
    /// The step to save: this output with its calls' `results` and `citations`.
    fn saved(&self, results: Vec<CallResult>, citations: Vec<Citation>) -> SavedStep {
        SavedStep {
            assistant: AssistantTurn {
                text: self.text.clone(),
                tool_calls: self.tool_calls.clone(),
            },
            results,
            usage: self.usage,
            citations,
        }
    }
}

/// The text of one model call as it streams.
struct Streamed<'a> {
    block: &'a str,
    /// Hold the text back instead of publishing it.
    buffer: bool,
    block_open: bool,
    text: String,
    /// Whether any text arrived (a retry would then repeat it).
    streamed: bool,
}

enum LlmEnd {
    /// Stopped from outside, with the text streamed so far.
    Halt(Halt, String),
    Error(LlmError),
}

/// Calls the model inside a `chat {model}` span (GenAI semantic conventions: operation, system,
/// model, and the tokens used, summed over retries and continuations).
async fn call_model(
    t: &Turn<'_>,
    model: &dyn ChatModel,
    request: ChatRequest,
    step: u32,
    buffer: bool,
) -> anyhow::Result<Result<ModelOutput, LlmEnd>> {
    let span = tracing::info_span!("chat",
        otel.name = %format!("chat {}", request.model),
        otel.kind = "client",
        otel.status_code = tracing::field::Empty,
        gen_ai.operation.name = "chat",
        gen_ai.system = model.system(),
        gen_ai.request.model = %request.model,
        gen_ai.usage.input_tokens = tracing::field::Empty,
        gen_ai.usage.output_tokens = tracing::field::Empty,
        error.type = tracing::field::Empty,
        run.step = i64::from(step));
    let result = model_call(t, model, request, step, buffer)
        .instrument(span.clone())
        .await;
    match &result {
        Ok(Ok(output)) => {
            // As i64: OpenTelemetry has no unsigned integers (a u64 would arrive as text).
            let tokens = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
            span.record(
                "gen_ai.usage.input_tokens",
                tokens(output.usage.input_tokens),
            );
            span.record(
                "gen_ai.usage.output_tokens",
                tokens(output.usage.output_tokens),
            );
        }
        Ok(Err(LlmEnd::Error(err))) => {
            span.record("otel.status_code", "error");
            span.record("error.type", err.kind());
        }
        // A halt (cancel, lease lost, shutdown) is not the model's failure.
        Ok(Err(LlmEnd::Halt(..))) => {}
        Err(_) => {
            span.record("otel.status_code", "error");
        }
    }
    result
}

/// Streams the model's text as `text_*` events (unless `buffer`), retrying retryable failures
/// that happened before any text, and continuing after `finish_reason: length`.
async fn model_call(
    t: &Turn<'_>,
    model: &dyn ChatModel,
    mut request: ChatRequest,
    step: u32,
    buffer: bool,
) -> anyhow::Result<Result<ModelOutput, LlmEnd>> {
    let block = format!("s{step}");
    let mut text = String::new();
    let mut usage = Usage::default();
    let mut block_open = false;
    let mut continuations = 0;
    loop {
        let mut delays = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(200))
            .with_max_delay(Duration::from_secs(8))
            .with_jitter()
            .with_max_times(MODEL_RETRIES)
            .build();
        let call_start = text.len();
        let call_started = std::time::Instant::now();
        let response = loop {
            let mut streamed = false;
            let result = {
                let mut out = Streamed {
                    block: &block,
                    buffer,
                    block_open,
                    text: std::mem::take(&mut text),
                    streamed,
                };
                let result = stream_once(t, model, request.clone(), &mut out).await;
                (block_open, text, streamed) = (out.block_open, out.text, out.streamed);
                result
            };
            match result {
                Ok(response) => break response,
                Err(LlmEnd::Error(err)) if err.is_retryable() && !streamed => match delays.next() {
                    Some(delay) => {
                        let delay = err.retry_after().map_or(delay, |asked| asked.max(delay));
                        tracing::warn!(error = %err, ?delay, "model call failed; retrying");
                        tokio::select! {
                            () = tokio::time::sleep(delay) => {}
                            halt = halted(t) => return Ok(Err(LlmEnd::Halt(halt, text))),
                        }
                    }
                    None => return Ok(Err(LlmEnd::Error(err))),
                },
                Err(LlmEnd::Halt(halt, _)) => {
                    if block_open {
                        t.events
                            .send(EventType::TextEnd, json!({"block_id": block}));
                    }
                    return Ok(Err(LlmEnd::Halt(halt, text)));
                }
                Err(end) => return Ok(Err(end)),
            }
        };
        usage.add(response.usage);
        let model_name = request.model.clone();
        metrics::counter!("spool_model_tokens_total", "model" => model_name.clone(), "direction" => "input")
            .increment(response.usage.input_tokens);
        metrics::counter!("spool_model_tokens_total", "model" => model_name.clone(), "direction" => "output")
            .increment(response.usage.output_tokens);
        metrics::histogram!("spool_model_call_duration_seconds", "model" => model_name)
            .record(call_started.elapsed().as_secs_f64());
        if response.finish_reason == FinishReason::Length
            && response.tool_calls.is_empty()
            && continuations < MAX_CONTINUATIONS
        {
            continuations += 1;
            request.messages.push(ChatMessage::Assistant {
                content: Some(text[call_start..].to_owned()),
                tool_calls: Vec::new(),
            });
            request.messages.push(ChatMessage::User {
                content: "Continue exactly where you stopped, without repeating anything.".into(),
            });
            continue;
        }
        if block_open {
            t.events
                .send(EventType::TextEnd, json!({"block_id": block}));
        }
        return Ok(Ok(ModelOutput {
            text,
            tool_calls: response.tool_calls,
            usage,
        }));
    }
}

async fn stream_once(
    t: &Turn<'_>,
    model: &dyn ChatModel,
    request: ChatRequest,
    out: &mut Streamed<'_>,
) -> Result<llm::ChatResponse, LlmEnd> {
    let mut stream = tokio::select! {
        stream = model.stream(request) => stream.map_err(LlmEnd::Error)?,
        halt = halted(t) => return Err(LlmEnd::Halt(halt, String::new())),
    };
    loop {
        let chunk = tokio::select! {
            chunk = stream.next() => chunk,
            halt = halted(t) => return Err(LlmEnd::Halt(halt, String::new())),
        };
        match chunk {
            Some(Ok(ChatChunk::Text(delta))) => {
                out.streamed = true;
                out.text.push_str(&delta);
                // Held back (for `pre_response` hooks) until the caller knows what to show.
                if out.buffer {
                    continue;
                }
                if !out.block_open {
                    t.events
                        .send(EventType::TextStart, json!({"block_id": out.block}));
                    out.block_open = true;
                }
                t.events.send(
                    EventType::TextDelta,
                    json!({"block_id": out.block, "delta": delta}),
                );
            }
            Some(Ok(ChatChunk::Done(response))) => return Ok(response),
            Some(Err(err)) => return Err(LlmEnd::Error(err)),
            None => return Err(LlmEnd::Error(LlmError::Incomplete)),
        }
    }
}

/// Estimated tokens of the conversation (4 characters a token).
fn estimate_tokens(conversation: &[ChatMessage]) -> usize {
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

const PRUNED: &str = "[earlier tool result omitted to fit the context window]";

/// Over budget: replaces old tool results by placeholders (all but the latest step's), then
/// messages before the last 3 user turns.
fn prune(conversation: &mut [ChatMessage], budget: u32) {
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
/// The tools of one attempt.
struct ToolSet {
    tools: Vec<Tool>,
}

struct Tool {
    def: ToolDef,
    read_only: bool,
    requires_approval: bool,
    kind: Kind,
}

enum Kind {
    /// Executed by the client: the run waits for its output.
    Client,
    Http(spool_shared::agent::HttpToolSpec),
    Mcp {
        session: Arc<McpSession>,
        remote: String,
    },
}

impl ToolSet {
    /// The agent's HTTP tools, and the tools of its MCP servers (a server that cannot be
    /// reached only removes its own tools).
    async fn build(t: &Turn<'_>, spec: &AgentSpec) -> Self {
        let engine = &t.worker.engine;
        let mut tools = Vec::new();
        for tool in &spec.tools {
            match tool {
                ToolSpec::Http(http) => tools.push(Tool {
                    def: ToolDef {
                        name: http.name.clone(),
                        description: http.description.clone(),
                        parameters: http.parameters.clone(),
                    },
                    read_only: http.read_only,
                    requires_approval: http.requires_approval,
                    kind: Kind::Http(http.clone()),
                }),
                ToolSpec::Mcp(mcp) => {
                    let server = McpServer {
                        prefix: &mcp.name,
                        url: &mcp.url,
                        headers: &mcp.headers,
                    };
                    match McpSession::connect(
                        &server,
                        engine.http.for_headers(server.headers).clone(),
                        engine.tool_timeout,
                    )
                    .await
                    {
                        Ok((session, discovered)) => {
                            let session = Arc::new(session);
                            for found in discovered {
                                tools.push(Tool {
                                    def: ToolDef {
                                        name: found.name,
                                        description: found.description,
                                        parameters: found.parameters,
                                    },
                                    read_only: found.read_only,
                                    requires_approval: mcp.requires_approval,
                                    kind: Kind::Mcp {
                                        session: session.clone(),
                                        remote: found.remote_name,
                                    },
                                });
                            }
                        }
                        Err(err) => {
                            tracing::warn!(mcp.server = %mcp.name, error = format!("{err:#}"),
                            "MCP server unavailable; running without its tools")
                        }
                    }
                }
                ToolSpec::Client(client) => tools.push(Tool {
                    def: ToolDef {
                        name: client.name.clone(),
                        description: client.description.clone(),
                        parameters: client.parameters.clone(),
                    },
                    read_only: false,
                    requires_approval: client.requires_approval,
                    kind: Kind::Client,
                }),
            }
        }
        Self { tools }
    }

    /// The tools offered at `step` and the tool choice, after `step_rules`; none on the last.
    /// Each field comes from the first rule for the step that sets it, so a rule posted later
    /// that only narrows the tools keeps an earlier rule's tool choice.
    fn offer(&self, spec: &AgentSpec, step: u32, last: bool) -> (Vec<ToolDef>, Choice) {
        if last || self.tools.is_empty() {
            return (Vec::new(), Choice::Auto);
        }
        let mut rules = spec.step_rules.iter().filter(|r| r.step == step);
        let active: Option<&Vec<String>> = rules.clone().find_map(|r| r.active_tools.as_ref());
        let offered = self
            .tools
            .iter()
            .filter(|tool| active.is_none_or(|names| names.contains(&tool.def.name)))
            .map(|tool| tool.def.clone())
            .collect();
        let choice = match rules
            .find_map(|r| r.tool_choice.clone())
            .unwrap_or_else(|| spec.tool_choice.clone())
        {
            ToolChoice::Auto => Choice::Auto,
            ToolChoice::Required => Choice::Required,
            ToolChoice::None => Choice::None,
            ToolChoice::Tool(name) => Choice::Tool(name),
        };
        (offered, choice)
    }

    /// The tool of this name, if the agent has one.
    fn find(&self, name: &str) -> Option<&Tool> {
        self.tools.iter().find(|tool| tool.def.name == name)
    }

    /// Executes calls of one step: read-only tools concurrently, the others in order; results
    /// come back in the calls' order.
    async fn execute(&self, t: &Turn<'_>, step: u32, calls: &[&ToolCall]) -> Vec<ToolOutput> {
        let by_name: HashMap<&str, &Tool> = self
            .tools
            .iter()
            .map(|tool| (tool.def.name.as_str(), tool))
            .collect();
        let mut results: Vec<Option<ToolOutput>> = vec![None; calls.len()];
        let concurrent = calls.iter().enumerate().filter(|(_, c)| {
            by_name
                .get(c.name.as_str())
                .is_some_and(|tool| tool.read_only)
        });
        let outputs =
            futures::future::join_all(concurrent.clone().map(|(_, call)| {
                self.call(t, step, call, by_name.get(call.name.as_str()).copied())
            }))
            .await;
        for ((index, _), output) in concurrent.zip(outputs) {
            results[index] = Some(output);
        }
        for (index, call) in calls.iter().enumerate() {
            if results[index].is_none() {
                let tool = by_name.get(call.name.as_str()).copied();
                results[index] = Some(self.call(t, step, call, tool).await);
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| ToolOutput::error("not executed")))
            .collect()
    }

    async fn call(
        &self,
        t: &Turn<'_>,
        step: u32,
        call: &ToolCall,
        tool: Option<&Tool>,
    ) -> ToolOutput {
        let Some(tool) = tool else {
            return ToolOutput::error(format!("unknown tool `{}`", call.name));
        };
        let kind = match tool.kind {
            Kind::Http(_) => "http",
            Kind::Mcp { .. } => "mcp",
            Kind::Client => "client",
        };
        let span = tracing::info_span!("tool",
            otel.name = %format!("tool {}", call.name),
            otel.status_code = tracing::field::Empty,
            gen_ai.operation.name = "execute_tool",
            gen_ai.tool.call.id = %call.id,
            tool.name = %call.name,
            tool.kind = kind,
            tool.outcome = tracing::field::Empty,
            run.step = i64::from(step));
        let started = std::time::Instant::now();
        let output = self
            .run_tool(t, step, call, tool)
            .instrument(span.clone())
            .await;
        let outcome = if output.is_error { "error" } else { "ok" };
        span.record("tool.outcome", outcome);
        if output.is_error {
            span.record("otel.status_code", "error");
        }
        metrics::counter!("spool_tool_calls_total", "kind" => kind, "outcome" => outcome)
            .increment(1);
        metrics::histogram!("spool_tool_call_duration_seconds", "kind" => kind)
            .record(started.elapsed().as_secs_f64());
        truncate(output)
    }

    /// Parses the arguments and executes one call of `tool`, within the tool timeout.
    async fn run_tool(&self, t: &Turn<'_>, step: u32, call: &ToolCall, tool: &Tool) -> ToolOutput {
        let arguments: Value = if call.arguments.trim().is_empty() {
            json!({})
        } else {
            match serde_json::from_str(&call.arguments) {
                Ok(arguments) => arguments,
                Err(err) => {
                    return ToolOutput::error(format!("the arguments are not valid JSON: {err}"));
                }
            }
        };
        let engine = &t.worker.engine;
        let key = format!("{}:{step}:{}", t.claimed.run.id, call.id);
        let call = async {
            match &tool.kind {
                Kind::Http(http) => {
                    let target = tools::http::HttpTool {
                        url: &http.url,
                        method: &http.method,
                        headers: &http.headers,
                    };
                    tools::http::call(
                        engine.http.for_headers(target.headers),
                        &engine.policy,
                        &target,
                        &arguments,
                        &key,
                    )
                    .await
                }
                Kind::Client => ToolOutput::error("client tools are executed by the client"),
                Kind::Mcp { session, remote } => {
                    session
                        .call(remote, arguments, &key, engine.tool_timeout)
                        .await
                }
            }
        };
        match tokio::time::timeout(engine.tool_timeout, call).await {
            Ok(output) => output,
            Err(_) => ToolOutput::error(format!(
                "the tool did not answer within {:?}",
                engine.tool_timeout
            )),
        }
    }
}

/// Cuts a result over [`MAX_TOOL_RESULT_CHARS`] characters, saying how much was cut.
fn truncate(mut output: ToolOutput) -> ToolOutput {
    let total = output.content.chars().count();
    if total > MAX_TOOL_RESULT_CHARS {
        let cut: String = output.content.chars().take(MAX_TOOL_RESULT_CHARS).collect();
        output.content = format!(
            "{cut}\n[truncated: {} more characters]",
            total - MAX_TOOL_RESULT_CHARS
        );
    }
    output
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_results_are_truncated_with_a_marker() {
        let short = truncate(ToolOutput::ok("x".repeat(10)));
        assert_eq!(short.content.len(), 10);
        let long = truncate(ToolOutput::ok("é".repeat(MAX_TOOL_RESULT_CHARS + 5)));
        assert!(long.content.ends_with("[truncated: 5 more characters]"));
        assert_eq!(
            long.content.chars().filter(|c| *c == 'é').count(),
            MAX_TOOL_RESULT_CHARS
        );
    }

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

    #[test]
    fn citations_are_read_from_json_results() {
        let result = ToolOutput::ok(
            r#"{"answer": 1, "citations": [{"title": "T", "url": "https://x", "snippet": "s", "extra": 1}]}"#,
        );
        assert_eq!(
            citations_in(&result.content, result.is_error),
            [Citation {
                title: json!("T"),
                url: json!("https://x"),
                snippet: json!("s")
            }]
        );
        assert!(citations_in("plain text", false).is_empty());
    }
}
