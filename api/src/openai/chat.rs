//! Chat Completions (`POST /v1/chat/completions`) and the model list (`GET /v1/models`).
//!
//! A completion is one run of the agent `model` names. Its thread: `metadata.thread_id` (any
//! UUID, created on first use; the thread keeps the conversation, so only the last user
//! message is sent to it), else a new thread seeded with the request's earlier messages. The
//! agent's own tool calls run server-side: the client sees the answer's text. Function `tools`
//! are the run's client tools ([`functions`]): a completion ends at their calls
//! (`finish_reason: "tool_calls"`), and `tool` messages answer them, linked to the waiting run
//! by `tool_call_id` (the same run goes on). `stream: true` sends it as
//! `chat.completion.chunk`s (with a usage chunk when `stream_options.include_usage`), then
//! `[DONE]`; a run that fails sends an `error` object, which the SDKs raise. There is no cursor
//! in this protocol: a dropped stream cannot be resumed here, but the run goes on and its
//! answer is stored (the Responses routes, or Spool's own, resume).
//!
//! `n` above 1 is refused; `temperature`, `top_p`, `max_completion_tokens` (or `max_tokens`)
//! and `reasoning_effort` apply to the run's model calls ([`sampling`]), `response_format` is
//! the answer's form; `user`, `store` and the like change nothing, and parameters Spool cannot
//! honour (`stop`, `seed`, `logprobs`, ...) are refused ([`params`]).

use std::convert::Infallible;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::Event as SseEvent;
use axum::response::{IntoResponse, Response};
use futures::Stream;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use spool_shared::db::runs::Run;
use spool_shared::db::{agents, messages};
use spool_shared::event::transcript::Shown;
use spool_shared::status::RunStatus;
use spool_shared::{ThreadId, WorkflowId};

use crate::app::AppState;
use crate::auth::{Caller, Permission};
use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath};
use crate::gateway;
use crate::openai::citations;
use crate::openai::create::{self, Create};
use crate::openai::feed::{Feed, Followed};
use crate::openai::format;
use crate::openai::functions::{self, Api, Functions, Segments};
use crate::openai::responses::{content_text, turns};
use crate::openai::{DEFAULT_MODEL, chat_usage, find_run, model_of, resolve_model, wait_for_run};
use crate::openai::{history, params, sampling};
use spool_shared::event::transcript::Pause;
use utoipa_axum::{router::OpenApiRouter, routes};

/// `/v1/chat/completions`, `/v1/models`.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_completion))
        .routes(routes!(list_models))
        .routes(routes!(get_model))
}

/// The body of `POST /v1/chat/completions` (others accepted and ignored: see the module doc).
#[derive(Debug, Deserialize)]
struct ChatRequest {
    model: String,
    messages: Vec<Value>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    metadata: Option<Map<String, Value>>,
    #[serde(default)]
    n: Option<u32>,
}

#[derive(Debug, Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

/// Runs the agent on the conversation (one run) and answers with its reply; with `stream`,
/// as `chat.completion.chunk`s, then `[DONE]`.
#[utoipa::path(
    post,
    path = "/v1/chat/completions",
    tag = "openai",
    security(("bearer" = ["runs:create"])),
    request_body = crate::openai::schema::ChatCompletionRequest,
    responses(
        (status = 200, description = "The completion (JSON), or its chunks (`stream: true`).",
            content(
                (crate::openai::schema::ChatCompletion = "application/json"),
                (crate::openai::schema::ChatCompletionChunk = "text/event-stream"),
            )),
        (status = 400, description = "`invalid_body`, `invalid_json`, `invalid_input`, `unsupported_input`, `unsupported_n`, `invalid_thread_id`, `ambiguous_model`, `unsupported_parameter` (a parameter, hosted tool or tool choice Spool does not apply), `invalid_value` (`temperature`, `top_p`, an output limit or a reasoning effort out of range), `instructions_not_allowed` (`system` or `developer` messages without an admin token); function calling: `invalid_tools`, `no_pending_call`, `unknown_call_id`, `missing_function_call_outputs` (with `missing`); `param` names the parameter", body = crate::openai::schema::OpenAiErrorBody),
        crate::openai::schema::OpenAiUnauthenticated,
        (status = 403, description = "`forbidden`: the token lacks `runs:create` (`permission` says which); `agent_disabled`: the agent (the `model`) is disabled", body = crate::openai::schema::OpenAiErrorBody),
        (status = 404, description = "`model_not_found`, `thread_not_found`", body = crate::openai::schema::OpenAiErrorBody),
        (status = 409, description = "`thread_busy`, `run_not_finished` (the run waits for an approval), `run_not_waiting`, `idempotency_key_in_use` (a follow-up)", body = crate::openai::schema::OpenAiErrorBody),
        crate::openai::schema::OpenAiEnqueueRefusals,
        (status = 502, description = "The run failed: its failure code (`model_unavailable`, `timeout`, ...) and `workflow_id`", body = crate::openai::schema::OpenAiErrorBody),
    )
)]
pub(crate) async fn create_completion(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    ApiJson(raw): ApiJson<Value>,
) -> Result<Response, ApiError> {
    caller.require(Permission::RunsCreate)?;
    let request: ChatRequest = serde_json::from_value(raw.clone())
        .map_err(|err| ApiError::bad_request("invalid_body", err.to_string()))?;
    if request.n.is_some_and(|n| n != 1) {
        return Err(ApiError::bad_request("unsupported_n", "n must be 1").with("param", "n"));
    }
    params::check_chat(&raw)?;
    let functions = Functions::parse(&raw, Api::Chat)?;
    let sampling = sampling::parse(&raw, Api::Chat)?;
    let agent_id = resolve_model(&state, &caller, &request.model).await?;
    let include_usage = request
        .stream_options
        .as_ref()
        .is_some_and(|o| o.include_usage);
    let create = Create {
        state: &state,
        caller: &caller,
        headers: &headers,
        raw: &raw,
        route: b"chat.completions",
        stream: request.stream == Some(true),
    };
    if let Some(outputs) = tool_answers(&request.messages)? {
        // The `tool` messages answer the calls a completion ended with: the same run goes on.
        let (slot, run, segment) = create
            .follow_up(None, outputs, &functions, &sampling, "messages")
            .await?;
        return reply(&state, &caller, slot, run, segment, include_usage).await;
    }
    let turns = turns(&without_tool_turns(&request.messages), "messages")?;
    if turns.instructions.is_some() {
        let param = crate::openai::responses::instructions_item(&request.messages, "messages");
        params::check_instructions(&caller, &param)?;
    }
    if !functions.tools.is_empty() {
        let names = crate::openai::responses::agent_tool_names(&state, &caller, agent_id).await?;
        functions.check_names(&names)?;
    }
    let thread = metadata_thread(request.metadata.as_ref())?;
    // A thread of its own keeps the conversation; so does the thread of an earlier request
    // whose conversation this one resends; else a new one is seeded with it.
    let continued = match thread {
        Some(thread) => Some(thread),
        None => history::continued(&state, &caller, &request.messages).await?,
    };
    let (thread_id, history) = match continued {
        Some(thread) => (thread, Vec::new()),
        None => (ThreadId::new(), turns.history),
    };
    let message = create::message(
        turns.input_text,
        agent_id,
        request.metadata.clone(),
        turns.instructions,
        &functions,
        &sampling,
        format::from_chat(raw.get("response_format"))?,
    );
    let (slot, id) = create.enqueue(thread_id, &message, &history).await?;
    history::remember(&state, &caller, &request.messages, thread_id).await?;
    reply(&state, &caller, slot, id, 0, include_usage).await
}

/// The thread `metadata.thread_id` names, if it names one; 400 if it is not a UUID.
fn metadata_thread(metadata: Option<&Map<String, Value>>) -> Result<Option<ThreadId>, ApiError> {
    metadata
        .and_then(|metadata| metadata.get("thread_id"))
        .map(|id| {
            id.as_str()
                .and_then(|id| id.parse::<ThreadId>().ok())
                .ok_or_else(|| {
                    ApiError::bad_request("invalid_thread_id", "metadata.thread_id must be a UUID")
                        .with("param", "metadata")
                })
        })
        .transpose()
}

/// Segment `segment` of the run (see [`functions`]) as chunks (with a `slot`), or as a
/// completion once the run has ended or paused.
async fn reply(
    state: &AppState,
    caller: &Caller,
    slot: Option<gateway::StreamSlot>,
    id: WorkflowId,
    segment: u32,
    include_usage: bool,
) -> Result<Response, ApiError> {
    if let Some(slot) = slot {
        let run = find_run(state, caller, id).await?;
        let feed = Feed::open(state, caller, slot, &run).await?;
        let chunks = Chunks {
            feed,
            workflow_id: run.id,
            id: completion_id(run.id, segment),
            model: model_of(&run),
            created: run.created_at.timestamp(),
            include_usage,
            started: false,
            over: false,
            segment,
            pauses: 0,
        };
        return Ok(gateway::sse_without_retry(chunks.into_sse()));
    }
    let run = wait_for_run(state, caller, id).await?;
    completion(state, &run, segment).await
}

/// A completion's id: its run's, and the segment's number after the first.
fn completion_id(id: WorkflowId, segment: u32) -> String {
    let id = id.to_string().replace('-', "");
    if segment == 0 {
        format!("chatcmpl-{id}")
    } else {
        format!("chatcmpl-{id}_{segment}")
    }
}

/// The outputs the trailing `tool` messages give (`(tool_call_id, content)`), if the
/// conversation ends with them. Malformed ones are a 400 naming the message.
fn tool_answers(messages: &[Value]) -> Result<Option<functions::Outputs>, ApiError> {
    let first = messages
        .iter()
        .rposition(|m| m["role"] != "tool")
        .map_or(0, |i| i + 1);
    if first == messages.len() {
        return Ok(None);
    }
    let mut outputs = Vec::new();
    for (index, message) in messages.iter().enumerate().skip(first) {
        let malformed = |why: &str| {
            ApiError::bad_request("invalid_input", format!("messages[{index}]: {why}"))
                .with("param", format!("messages[{index}]"))
        };
        let id = message["tool_call_id"]
            .as_str()
            .filter(|id| !id.is_empty())
            .ok_or_else(|| malformed("a tool message needs its tool_call_id"))?;
        let content = content_text(&message["content"])
            .ok_or_else(|| malformed("a tool message's content is text (or text parts)"))?;
        outputs.push((id.to_owned(), content));
    }
    Ok(Some(outputs))
}

/// `messages` without the function calls of earlier turns (assistant messages that only
/// call, and `tool` messages): the thread keeps the text of those turns.
fn without_tool_turns(messages: &[Value]) -> Vec<Value> {
    messages
        .iter()
        .filter(|m| m["role"] != "tool")
        .filter(|m| !(m["role"] == "assistant" && m["content"].is_null()))
        .map(|m| {
            let mut m = m.clone();
            if let Some(object) = m.as_object_mut() {
                object.remove("tool_calls");
            }
            m
        })
        .collect()
}

/// The `chat.completion` of a settled run's segment (an error for a failed run, or one that
/// waits for an approval).
async fn completion(state: &AppState, run: &Run, segment: u32) -> Result<Response, ApiError> {
    let segments = Segments::load(state, run).await?;
    let index = segment as usize;
    if segments.pauses.len() > index {
        return Ok(Json(paused_completion(run, &segments, segment)).into_response());
    }
    if index > segments.pauses.len() {
        return Err(crate::openai::response_not_found());
    }
    match run.status {
        RunStatus::Completed | RunStatus::Cancelled => {}
        RunStatus::Failed => return Ok(failed_completion(run)),
        _ => {
            return Err(ApiError::conflict(
                "run_not_finished",
                "the run waits for client tool outputs or an approval (or is still running): \
                 answer it through /v1/workflows/{workflow_id}",
            )
            .with("workflow_id", run.id)
            .with("status", run.status));
        }
    }
    let (content, annotations) = if segments.pauses.is_empty() {
        let message =
            messages::find_in_thread(&state.db, run.assistant_message_id, run.thread_id).await?;
        message.map_or_else(Default::default, |m| {
            let annotations = citations::chat_annotations(citations::of_parts(&m.parts.0));
            (m.content, annotations)
        })
    } else {
        let items = segments.output(index);
        (
            functions::text_of(&items),
            citations::chat_annotations_of(&items),
        )
    };
    let mut usage = run.usage.as_ref().map(|u| u.0).unwrap_or_default();
    for pause in &segments.pauses {
        usage = functions::minus(usage, pause.usage);
    }
    Ok(Json(json!({
        "id": completion_id(run.id, segment),
        "object": "chat.completion",
        "created": run.created_at.timestamp(),
        "model": model_of(run),
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": content, "refusal": null,
                "annotations": annotations},
            "finish_reason": "stop",
            "logprobs": null,
        }],
        "usage": chat_usage(&usage),
    }))
    .into_response())
}

/// The completion of a segment that ended at function calls, while the run waits for their
/// outputs: its text and the calls, `finish_reason: "tool_calls"`.
fn paused_completion(run: &Run, segments: &Segments, segment: u32) -> Value {
    let index = segment as usize;
    let usage = segments.pauses[index].usage;
    let items = segments.output(index);
    let text = functions::text_of(&items);
    let calls: Vec<Value> = segments
        .waiting_calls(index)
        .iter()
        .map(|call| {
            json!({"id": call["call_id"], "type": "function", "function": {
                "name": call["name"], "arguments": call["arguments"]}})
        })
        .collect();
    json!({
        "id": completion_id(run.id, segment),
        "object": "chat.completion",
        "created": run.created_at.timestamp(),
        "model": model_of(run),
        "choices": [{
            "index": 0,
            "message": {"role": "assistant",
                "content": if text.is_empty() { Value::Null } else { json!(text) },
                "refusal": null, "tool_calls": calls},
            "finish_reason": "tool_calls",
            "logprobs": null,
        }],
        "usage": chat_usage(&usage),
    })
}

/// A failed run's error, with its failure code and `workflow_id`: 422 `invalid_output` for an
/// answer that never validated against `response_format` (the request's fault as OpenAI sees
/// it), else 502.
fn failed_completion(run: &Run) -> Response {
    let (code, message) = run.error.as_ref().map_or_else(
        || ("run_failed".to_owned(), "the run failed".to_owned()),
        |e| {
            (
                json!(e.0.code).as_str().unwrap_or("run_failed").to_owned(),
                e.0.message.clone(),
            )
        },
    );
    let (status, kind) = if code == "invalid_output" {
        (StatusCode::UNPROCESSABLE_ENTITY, "invalid_request_error")
    } else {
        (StatusCode::BAD_GATEWAY, "server_error")
    };
    let body = json!({"error": {"message": message, "type": kind,
        "code": code, "param": null, "workflow_id": run.id}});
    (status, Json(body)).into_response()
}

/// A run's transcript as chat-completion chunks.
struct Chunks {
    feed: Feed,
    workflow_id: WorkflowId,
    id: String,
    model: String,
    created: i64,
    include_usage: bool,
    started: bool,
    over: bool,
    /// The run's segment this completion is (see [`functions`]).
    segment: u32,
    /// The client-tool pauses seen so far.
    pauses: u32,
}

impl Chunks {
    fn chunk(&self, choices: Value, usage: Option<Value>) -> Value {
        let mut chunk = json!({"id": self.id, "object": "chat.completion.chunk",
            "created": self.created, "model": self.model, "choices": choices});
        if let Some(usage) = usage {
            chunk["usage"] = usage;
        }
        chunk
    }

    fn delta(&self, delta: Value, finish: Option<&str>) -> Value {
        self.chunk(
            json!([{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": null}]),
            None,
        )
    }

    /// The data lines an item becomes.
    fn lines(&mut self, followed: Followed) -> Vec<String> {
        let mut lines = Vec::new();
        if !self.started {
            self.started = true;
            lines.push(
                self.delta(json!({"role": "assistant", "content": ""}), None)
                    .to_string(),
            );
        }
        match followed {
            Followed::Shown(Shown::Paused(Pause::RequiresAction(action))) => {
                self.pauses += 1;
                if self.pauses == self.segment + 1 {
                    // Ended at function calls, while the run waits.
                    let calls: Vec<Value> = action
                        .tool_calls
                        .iter()
                        .enumerate()
                        .map(|(i, call)| {
                            let arguments = match &call.arguments {
                                Value::String(text) => text.clone(),
                                other => other.to_string(),
                            };
                            json!({"index": i, "id": call.tool_call_id, "type": "function",
                                "function": {"name": call.tool_name, "arguments": arguments}})
                        })
                        .collect();
                    lines.push(self.delta(json!({"tool_calls": calls}), None).to_string());
                    lines.push(self.delta(json!({}), Some("tool_calls")).to_string());
                    lines.push("[DONE]".to_owned());
                    self.over = true;
                }
            }
            Followed::Shown(Shown::TextDelta { .. }) if self.pauses < self.segment => {}
            Followed::Shown(Shown::TextDelta { delta, .. }) => {
                lines.push(self.delta(json!({"content": delta}), None).to_string());
            }
            Followed::Shown(Shown::Paused(_)) => {
                let message = "the run waits for client tool outputs or an approval: answer it \
                    through /v1/workflows/{workflow_id}";
                lines.push(
                    json!({"error": {"message": message, "type": "invalid_request_error",
                        "code": "run_not_finished", "param": null,
                        "workflow_id": self.workflow_id}})
                    .to_string(),
                );
                self.over = true;
            }
            Followed::Ended(run) if run.status != RunStatus::Failed => {
                lines.push(self.delta(json!({}), Some("stop")).to_string());
                if self.include_usage {
                    let usage = run.usage.as_ref().map(|u| u.0).unwrap_or_default();
                    lines.push(self.chunk(json!([]), Some(chat_usage(&usage))).to_string());
                }
                lines.push("[DONE]".to_owned());
                self.over = true;
            }
            Followed::Ended(run) => {
                let (message, code) = run
                    .error
                    .as_ref()
                    .map_or((Value::Null, Value::Null), |e| {
                        (json!(e.0.message), json!(e.0.code))
                    });
                lines.push(self.error(message, code));
            }
            Followed::Expired => lines.push(self.error(
                json!("the events of this response are no longer retained; GET the response without stream"),
                json!("stream_expired"),
            )),
            Followed::Reset => lines.push(self.error(
                json!("events of this response were lost; GET the response without stream"),
                json!("stream_reset"),
            )),
            Followed::Shown(_) | Followed::Live => {}
        }
        lines
    }

    /// An `error` object (the SDKs raise it); the stream is over.
    fn error(&mut self, message: Value, code: Value) -> String {
        self.over = true;
        json!({"error": {"message": message, "type": "server_error", "code": code,
            "param": null}})
        .to_string()
    }

    fn into_sse(self) -> impl Stream<Item = Result<SseEvent, Infallible>> + Send {
        let pending = std::collections::VecDeque::<String>::new();
        futures::stream::unfold((self, pending), |(mut chunks, mut pending)| async move {
            loop {
                if let Some(line) = pending.pop_front() {
                    return Some((Ok(SseEvent::default().data(line)), (chunks, pending)));
                }
                if chunks.over {
                    return None;
                }
                let followed = chunks.feed.next().await?;
                pending.extend(chunks.lines(followed));
            }
        })
    }
}

/// The agents the caller may use as models: the server's default and the tenant's active
/// agents (by id; `name` beside it).
#[utoipa::path(
    get,
    path = "/v1/models",
    tag = "openai",
    security(("bearer" = ["agents:read"])),
    responses(
        (status = 200, description = "The models.", body = crate::openai::schema::ModelList),
        crate::openai::schema::OpenAiUnauthenticated,
        crate::openai::schema::OpenAiMissingPermission,
    )
)]
pub(crate) async fn list_models(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<Json<Value>, ApiError> {
    caller.require(Permission::AgentsRead)?;
    let agents = agents::list(&state.db, &caller.owner.tenant_id).await?;
    let mut data = vec![default_model()];
    data.extend(
        agents
            .iter()
            .filter(|agent| agent.spec.0.status.is_active())
            .filter(|agent| crate::auth::public::may_use(&caller, &agent.spec.0))
            .map(|agent| {
                json!({"id": agent.id, "object": "model", "created": agent.created_at.timestamp(),
                    "owned_by": caller.owner.tenant_id, "name": agent.spec.0.name})
            }),
    );
    Ok(Json(json!({"object": "list", "data": data})))
}

fn default_model() -> Value {
    json!({"id": DEFAULT_MODEL, "object": "model", "created": 0, "owned_by": "spool",
        "name": DEFAULT_MODEL})
}

/// One model: an agent by id or name, or the default.
#[utoipa::path(
    get,
    path = "/v1/models/{model}",
    tag = "openai",
    security(("bearer" = ["agents:read"])),
    params(("model" = String, Path, description = "An agent id, an agent name, or `spool-default`.")),
    responses(
        (status = 200, description = "The model.", body = crate::openai::schema::Model),
        (status = 400, description = "`ambiguous_model`", body = crate::openai::schema::OpenAiErrorBody),
        crate::openai::schema::OpenAiUnauthenticated,
        crate::openai::schema::OpenAiMissingPermission,
        (status = 404, description = "`model_not_found`", body = crate::openai::schema::OpenAiErrorBody),
    )
)]
pub(crate) async fn get_model(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(model): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    caller.require(Permission::AgentsRead)?;
    let Some(id) = resolve_model(&state, &caller, &model).await? else {
        return Ok(Json(default_model()));
    };
    let agent = agents::find(&state.db, id, &caller.owner.tenant_id)
        .await?
        .filter(|agent| crate::auth::public::may_use(&caller, &agent.spec.0))
        .ok_or_else(|| ApiError::not_found("model_not_found", "no such model"))?;
    Ok(Json(json!({"id": agent.id, "object": "model",
        "created": agent.created_at.timestamp(), "owned_by": caller.owner.tenant_id,
        "name": agent.spec.0.name})))
}
