//! The OpenAI-compatible surface (docs/clients.md), so the official OpenAI SDKs work against Spool
//! unchanged: the Responses API with background mode and `starting_after` resume
//! ([`responses`]), Chat Completions and the model list ([`chat`]). Spool's own API stays the
//! primary one: these routes map onto it (a response is a run, its `id` the `workflow_id`; a
//! conversation is a thread) and add no state of their own.
//!
//! Streams are translated from the thread's Redis Stream ([`translate`]), so they are as
//! durable as Spool's own: a dropped connection resumes with `starting_after`, a crashed worker's
//! new attempt does not make a client show text twice.
//!
//! Errors on these routes are OpenAI's shape, `{"error": {"message", "type", "code", "param"}}`
//! (Spool's code in `code`, its extra fields kept), so the SDKs raise their typed exceptions by
//! status (401, 403, 404, 409, 422, 429).

pub mod chat;
pub mod citations;
pub mod conversations;
pub mod create;
pub mod echo;
pub mod feed;
pub mod format;
pub mod functions;
pub mod history;
pub mod params;
pub mod responses;
pub mod sampling;
pub mod schema;
pub mod translate;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use serde_json::{Value, json};

use spool_shared::db::messages::{self, Message};
use spool_shared::db::runs::Run;
use spool_shared::ids::AgentId;
use spool_shared::run::{FailureCode, MessagePart, RunFailure, Usage};
use spool_shared::status::RunStatus;

use crate::app::AppState;
use crate::auth::Caller;
use crate::error::ApiError;
use utoipa_axum::router::OpenApiRouter;

/// The model name of the server's default agent.
pub const DEFAULT_MODEL: &str = "spool-default";

/// `/v1/responses...`, `/v1/chat/completions`, `/v1/models`, with OpenAI's error shape.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .merge(responses::router())
        .merge(chat::router())
        .merge(conversations::router())
        .layer(axum::middleware::from_fn(openai_errors))
}

/// Rewrites Spool's error body into OpenAI's: `type` and `param` added, the rest kept.
async fn openai_errors(request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, 1 << 20).await else {
        return Response::from_parts(parts, Body::empty());
    };
    let Ok(mut value) = serde_json::from_slice::<Value>(&bytes) else {
        return Response::from_parts(parts, Body::from(bytes));
    };
    if let Some(error) = value.get_mut("error").and_then(Value::as_object_mut) {
        let kind = match status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::FORBIDDEN => "permission_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            _ if status.is_server_error() => "server_error",
            _ => "invalid_request_error",
        };
        error.insert("type".into(), json!(kind));
        error.entry("param").or_insert(Value::Null);
    }
    let body = serde_json::to_vec(&value).unwrap_or_else(|_| bytes.to_vec());
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(body))
}

/// The agent a `model` names: [`DEFAULT_MODEL`] (the server's default agent), an agent id, or
/// the name of exactly one of the tenant's agents.
pub(crate) async fn resolve_model(
    state: &AppState,
    caller: &Caller,
    model: &str,
) -> Result<Option<AgentId>, ApiError> {
    if model == DEFAULT_MODEL {
        return Ok(None);
    }
    let tenant = &caller.owner.tenant_id;
    if let Ok(id) = model.parse::<AgentId>() {
        return if visible(state, caller, id).await? {
            Ok(Some(id))
        } else {
            Err(model_not_found(model))
        };
    }
    // A `private` agent is no model for a caller who may not use it: neither found by its name
    // nor counted against another of the same name (`find_by_name` answers at most 2).
    let mut named = Vec::new();
    for id in spool_shared::db::agents::find_by_name(&state.db, tenant, model).await? {
        if visible(state, caller, id).await? {
            named.push(id);
        }
    }
    match named.as_slice() {
        [id] => Ok(Some(*id)),
        [] => Err(model_not_found(model)),
        _ => Err(ApiError::bad_request(
            "ambiguous_model",
            format!("several agents are named {model:?}: name one by its id"),
        )
        .with("param", "model")),
    }
}

/// Whether the caller's tenant has the agent and the caller may use it (a `private` one only
/// with `agents:write`), as `GET /v1/models` lists it.
async fn visible(state: &AppState, caller: &Caller, id: AgentId) -> Result<bool, ApiError> {
    Ok(
        spool_shared::db::agents::find(&state.db, id, &caller.owner.tenant_id)
            .await?
            .is_some_and(|agent| crate::auth::public::may_use(caller, &agent.spec.0)),
    )
}

fn model_not_found(model: &str) -> ApiError {
    ApiError::not_found(
        "model_not_found",
        format!("no agent {model:?}: `GET /v1/models` lists the ones you may use"),
    )
}

/// The `model` a run is shown with: its agent's id, or [`DEFAULT_MODEL`].
pub(crate) fn model_of(run: &Run) -> String {
    run.agent_id
        .map_or_else(|| DEFAULT_MODEL.to_owned(), |id| id.to_string())
}

/// A run's status as a Responses status. A paused run (client tools, an approval) is
/// `in_progress`: it is answered through Spool's own routes.
pub(crate) fn response_status(status: RunStatus) -> &'static str {
    match status {
        RunStatus::Queued => "queued",
        RunStatus::Running
        | RunStatus::RequiresAction
        | RunStatus::AwaitingApproval
        | RunStatus::Waiting => "in_progress",
        RunStatus::Completed => "completed",
        RunStatus::Failed => "failed",
        RunStatus::Cancelled => "cancelled",
    }
}

/// The Responses object of a run: its status, and once it has ended the stored message as
/// `output` items (text as `message` items, tool steps as `function_call` items) with `usage`.
/// The fields its request decides are set by [`echo::apply`].
pub(crate) fn response_object(run: &Run, message: Option<&Message>, metadata: &Value) -> Value {
    let prefix = run.id.to_string().replace('-', "");
    let ended = run.status.is_terminal();
    let output: Vec<Value> = match message {
        Some(message) if ended => output_items(&prefix, &message.parts.0),
        _ => Vec::new(),
    };
    let usage = run
        .usage
        .as_ref()
        .filter(|_| ended)
        .map(|usage| response_usage(&usage.0));
    let error = run
        .error
        .as_ref()
        .filter(|_| run.status == RunStatus::Failed)
        .map(|error| response_error(&error.0));
    let mut response = json!({
        "id": run.id,
        "object": "response",
        "created_at": run.created_at.timestamp(),
        "completed_at": run.finished_at.map(|at| at.timestamp()),
        "status": response_status(run.status),
        "model": model_of(run),
        "output": output,
        "error": error,
        "incomplete_details": null,
        "metadata": metadata,
        "conversation": {"id": conversations::conversation_id(run.thread_id)},
    });
    // Absent until the run has ended (OpenAI's document has no null `usage`).
    if let Some(usage) = usage {
        response["usage"] = usage;
    }
    response
}

/// A failed run's error as the Responses `error`: `code` from OpenAI's enum (`server_error`;
/// `invalid_prompt` when the provider refused the request), the message led by Spool's code
/// (`invalid_output: ...`), which is also in `spool_code`.
pub(crate) fn response_error(failure: &RunFailure) -> Value {
    let code = match failure.code {
        FailureCode::ModelError | FailureCode::ContextOverflow => "invalid_prompt",
        _ => "server_error",
    };
    json!({"code": code, "message": format!("{}: {}", failure.code.as_str(), failure.message),
        "spool_code": failure.code})
}

/// A run's usage as the Responses `usage` (the provider's cached and reasoning tokens as it
/// reported them, 0 when it did not).
pub(crate) fn response_usage(usage: &Usage) -> Value {
    json!({
        "input_tokens": usage.input_tokens,
        "input_tokens_details": {
            "cached_tokens": usage.cached_input_tokens,
            "cache_write_tokens": usage.cache_write_tokens,
        },
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.input_tokens + usage.output_tokens,
    })
}

/// A run's usage as Chat Completions' `usage`.
pub(crate) fn chat_usage(usage: &Usage) -> Value {
    json!({
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.input_tokens + usage.output_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_input_tokens},
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
    })
}

/// A stored message's parts as Responses output items, with the ids the stream gave them and
/// the answer's citations as `url_citation` annotations on the texts that hold them.
pub(crate) fn output_items(prefix: &str, parts: &[MessagePart]) -> Vec<Value> {
    let mut items: Vec<Value> = Vec::new();
    let cited = citations::of_parts(parts);
    let mut offsets = citations::text_offsets(parts).into_iter();
    for part in parts {
        match part {
            MessagePart::Text { text } => {
                let id = format!("msg_{prefix}_{}", items.len());
                let mut item = translate::message_item(&id, text, "completed");
                if let Some((from, len)) = offsets.next() {
                    item["content"][0]["annotations"] =
                        json!(citations::url_citations(cited, from, len));
                }
                items.push(item);
            }
            MessagePart::ToolCall {
                tool_call_id,
                name,
                arguments,
                ..
            } => {
                // As the stream sent them: the JSON re-written compactly.
                let arguments = serde_json::from_str::<Value>(arguments)
                    .map_or_else(|_| arguments.clone(), |value| value.to_string());
                items.push(translate::call_item(
                    &format!("fc_{tool_call_id}"),
                    tool_call_id,
                    name,
                    &arguments,
                    "incomplete",
                    None,
                ));
            }
            MessagePart::ToolResult {
                tool_call_id,
                output,
                ..
            } => {
                let call = items
                    .iter_mut()
                    .find(|item| item["call_id"] == json!(tool_call_id));
                if let Some(call) = call {
                    call["status"] = json!("completed");
                    call["output"] = json!(output);
                }
            }
            MessagePart::Citations { .. } => {}
        }
    }
    items
}

/// How long a create that neither streams nor runs in the background waits for its run (the
/// SDKs' default timeout): after it, the run is answered as it is.
const BLOCKING_WAIT: std::time::Duration = std::time::Duration::from_secs(600);

/// The caller's run (an admin's: the tenant's); 404 `response_not_found` otherwise.
pub(crate) async fn find_run(
    state: &AppState,
    caller: &Caller,
    id: spool_shared::WorkflowId,
) -> Result<Run, ApiError> {
    spool_shared::db::runs::find_in(&state.db, id, caller.scope())
        .await?
        .ok_or_else(response_not_found)
}

/// 404 `response_not_found`.
pub(crate) fn response_not_found() -> ApiError {
    ApiError::not_found("response_not_found", "no such response")
}

/// The caller's run once it has ended or paused, or after [`BLOCKING_WAIT`] as it is then.
pub(crate) async fn wait_for_run(
    state: &AppState,
    caller: &Caller,
    id: spool_shared::WorkflowId,
) -> Result<Run, ApiError> {
    let deadline = tokio::time::Instant::now() + BLOCKING_WAIT;
    crate::runs::wait::until_settled(state, caller, id, Some(deadline)).await
}

/// The Responses object of the caller's run, from Postgres.
pub(crate) async fn load_response(state: &AppState, run: &Run) -> Result<Value, ApiError> {
    let message =
        messages::find_in_thread(&state.db, run.assistant_message_id, run.thread_id).await?;
    let request = messages::find_in_thread(&state.db, run.user_message_id, run.thread_id).await?;
    let metadata = request.map_or_else(|| json!({}), |m| m.metadata.0);
    let mut response = response_object(run, message.as_ref(), &metadata);
    let echo = echo::load(&state.db, run.id).await?;
    echo::apply(&mut response, echo.as_ref());
    Ok(response)
}
