//! Threads: create, read, list (the sidebar), rename or tag, erase; their messages; and
//! `POST user_message`, which hands the message to the enqueue ([`crate::runs::enqueue`]).
//!
//! Erasure ([`crate::runs::erase`]) is a legal duty, so it is thorough: the active run is
//! stopped, and the thread's messages, runs, steps, idempotency keys, webhook deliveries and
//! Redis stream are deleted. The row keeps only its id and `erased_at`, so the id is 404 for
//! everyone afterwards and a `user_message` can never create it again.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use spool_shared::db::idempotency;
use spool_shared::db::messages::{self, Message};
use spool_shared::db::threads::{self, Thread, ThreadFilter, ThreadPatch};
use spool_shared::ids::AgentId;
use spool_shared::run::{MessagePart, Usage};
use spool_shared::status::{MessageStatus, Role};
use spool_shared::{MessageId, ThreadId, WorkflowId};

use crate::app::AppState;
use crate::auth::public::EndUser;
use crate::auth::{Caller, Permission};
use crate::error::ApiError;
use crate::error::{BadBody, ErrorBody, MissingPermission, Unauthenticated};
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use crate::routes::list::{self, List, ListQuery};
use crate::routes::workflows::{MAX_WAIT_SECS, WorkflowResponse};
use crate::runs::enqueue::{
    UserMessageRequest, UserMessageResponse, check_agent, enqueue_message, idempotency_key,
};
use crate::runs::wait::{settled, until_settled};
use crate::runs::{erase, thread_not_found, workflow_url};
use utoipa_axum::{router::OpenApiRouter, routes};

/// `/v1/threads/...`.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(post_thread, list_threads))
        .routes(routes!(get_thread, patch_thread, delete_thread))
        .routes(routes!(list_messages))
        .routes(routes!(post_user_message))
}

/// Body of `POST /v1/threads`.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateThreadRequest {
    /// The agent that answers; the default agent if absent.
    #[serde(default)]
    pub agent_id: Option<AgentId>,
    /// Caller-defined metadata.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Map<String, Value>>,
}

/// A thread as clients see it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ThreadResponse {
    /// The thread's id.
    pub id: ThreadId,
    /// The agent that answers (`null`: the default agent).
    pub agent_id: Option<AgentId>,
    /// Caller-defined metadata.
    #[schema(value_type = Object)]
    pub metadata: Value,
    /// `busy` while a run is active, else `idle`.
    #[schema(schema_with = crate::openapi::thread_status)]
    pub status: &'static str,
    /// The active run, if any.
    pub active_workflow_id: Option<WorkflowId>,
    /// Its title (`null` until set with PATCH).
    pub title: Option<String>,
    /// When its last user message was sent.
    pub last_message_at: Option<DateTime<Utc>>,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
}

impl From<Thread> for ThreadResponse {
    fn from(thread: Thread) -> Self {
        Self {
            id: thread.id,
            agent_id: thread.agent_id,
            metadata: thread.metadata.0,
            status: if thread.active_workflow_id.is_some() {
                "busy"
            } else {
                "idle"
            },
            active_workflow_id: thread.active_workflow_id,
            title: thread.title,
            last_message_at: thread.last_message_at,
            created_at: thread.created_at,
            updated_at: thread.updated_at,
        }
    }
}

/// Creates a thread.
#[utoipa::path(
    post,
    path = "/v1/threads",
    tag = "threads",
    security(("bearer" = ["runs:create"])),
    request_body = CreateThreadRequest,
    responses(
        (status = 201, description = "The new thread.", body = ThreadResponse,
            links(
                ("GetThread" = (operation_id = "get_thread",
                    parameters(("thread_id" = "$response.body#/id")))),
                ("PostUserMessage" = (operation_id = "post_user_message",
                    parameters(("thread_id" = "$response.body#/id")))),
                ("PatchThread" = (operation_id = "patch_thread",
                    parameters(("thread_id" = "$response.body#/id")))),
                ("DeleteThread" = (operation_id = "delete_thread",
                    parameters(("thread_id" = "$response.body#/id")))),
            )),
        BadBody,
        Unauthenticated,
        MissingPermission,
        (status = 404, description = "`agent_not_found`", body = ErrorBody),
        (status = 422, description = "`invalid_body`", body = ErrorBody),
    )
)]
async fn post_thread(
    State(state): State<AppState>,
    user: EndUser,
    ApiJson(mut request): ApiJson<CreateThreadRequest>,
) -> Result<(StatusCode, Json<ThreadResponse>), ApiError> {
    request.agent_id = user.agent(request.agent_id)?;
    let caller = user.caller;
    caller.require(Permission::RunsCreate)?;
    check_agent(&state, &caller, request.agent_id).await?;
    let metadata = Value::Object(request.metadata.unwrap_or_default());
    let thread = threads::create(
        &state.db,
        ThreadId::new(),
        &caller.owner,
        request.agent_id,
        &metadata,
    )
    .await?
    .ok_or_else(|| anyhow::anyhow!("a fresh UUID v7 collided"))?;
    Ok((StatusCode::CREATED, Json(thread.into())))
}

/// A thread, with its status and active run.
#[utoipa::path(
    get,
    path = "/v1/threads/{thread_id}",
    tag = "threads",
    security(("bearer" = ["runs:create"]), ("bearer" = ["runs:read:tenant"])),
    params(("thread_id" = ThreadId, Path, description = "The thread.")),
    responses(
        (status = 200, description = "The thread.", body = ThreadResponse),
        Unauthenticated,
        MissingPermission,
        (status = 404, description = "`thread_not_found` (also another owner's), `not_found` (not a UUID)", body = ErrorBody),
    )
)]
async fn get_thread(
    State(state): State<AppState>,
    EndUser { caller, .. }: EndUser,
    ApiPath(thread_id): ApiPath<ThreadId>,
) -> Result<Json<ThreadResponse>, ApiError> {
    caller.require_any(Permission::RUNS_READ)?;
    let thread = threads::find(&state.db, thread_id, caller.scope())
        .await?
        .ok_or_else(thread_not_found)?;
    Ok(Json(thread.into()))
}

/// Query of `GET /v1/threads/{thread_id}/messages`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListMessagesQuery {
    /// At most this many (1 to 200, default 50).
    #[serde(default)]
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<i64>,
    /// Only messages older than this one.
    #[serde(default)]
    pub before: Option<MessageId>,
}

/// A message as clients see it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct MessageResponse {
    /// The message's id.
    pub id: MessageId,
    /// Its thread.
    pub thread_id: ThreadId,
    /// Who wrote it.
    pub role: Role,
    /// Its text (an assistant message's is written once, when its run ends; partial for a
    /// failed or cancelled run).
    pub content: String,
    /// Structured content: text blocks, tool steps, citations (assistant messages).
    pub parts: Vec<MessagePart>,
    /// Whether the content is final.
    pub status: MessageStatus,
    /// Token usage (assistant messages, once their run has ended).
    pub usage: Option<Usage>,
    /// Caller-defined metadata (user messages).
    #[schema(value_type = Object)]
    pub metadata: Value,
    /// The run that produced it (assistant) or that it started (user).
    pub workflow_id: Option<WorkflowId>,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
    /// The answer as JSON, valid against the agent's `response_format` (assistant messages of
    /// agents that have one, once their run has completed; else null).
    pub output: Option<Value>,
    /// Whether a `pre_response` hook denied the answer (the content is then the hook's text).
    pub blocked: bool,
}

impl From<Message> for MessageResponse {
    fn from(message: Message) -> Self {
        Self {
            id: message.id,
            thread_id: message.thread_id,
            role: message.role,
            content: message.content,
            parts: message.parts.0,
            status: message.status,
            usage: message.usage.map(|u| u.0),
            metadata: message.metadata.0,
            workflow_id: message.workflow_id,
            created_at: message.created_at,
            updated_at: message.updated_at,
            output: message.output.map(|o| o.0),
            blocked: message.blocked,
        }
    }
}

/// A page of messages, oldest first.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct MessagesResponse {
    /// The messages.
    pub messages: Vec<MessageResponse>,
}

/// A thread's messages, oldest first.
#[utoipa::path(
    get,
    path = "/v1/threads/{thread_id}/messages",
    tag = "threads",
    security(("bearer" = ["runs:create"]), ("bearer" = ["runs:read:tenant"])),
    params(("thread_id" = ThreadId, Path, description = "The thread."), ListMessagesQuery),
    responses(
        (status = 200, description = "A page of messages.", body = MessagesResponse),
        Unauthenticated,
        MissingPermission,
        (status = 404, description = "`thread_not_found`, `not_found`", body = ErrorBody),
        (status = 422, description = "`invalid_limit`, `invalid_query`", body = ErrorBody),
    )
)]
async fn list_messages(
    State(state): State<AppState>,
    EndUser { caller, .. }: EndUser,
    ApiPath(thread_id): ApiPath<ThreadId>,
    ApiQuery(query): ApiQuery<ListMessagesQuery>,
) -> Result<Json<MessagesResponse>, ApiError> {
    caller.require_any(Permission::RUNS_READ)?;
    let limit = query.limit.unwrap_or(50);
    if !(1..=200).contains(&limit) {
        return Err(ApiError::unprocessable(
            "invalid_limit",
            "limit must be between 1 and 200",
        ));
    }
    threads::find(&state.db, thread_id, caller.scope())
        .await?
        .ok_or_else(thread_not_found)?;
    let messages = messages::list(&state.db, thread_id, limit, query.before).await?;
    Ok(Json(MessagesResponse {
        messages: messages.into_iter().map(Into::into).collect(),
    }))
}

/// Query of `POST /v1/threads/{thread_id}/user_message`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UserMessageQuery {
    /// Wait up to this many seconds (at most 60) for the run to end or pause: `200` with the
    /// run if it does in time, else the usual `202`. Absent or 0: `202` at once.
    #[serde(default)]
    #[param(minimum = 0, maximum = 60)]
    pub wait: Option<u64>,
}

/// Enqueues a run that answers the message; answers 202 at once (or, with `?wait=S`, 200 with
/// the run once it ends or pauses within S seconds).
///
/// The thread is created on first use. With an `Idempotency-Key`, a repeat of the same request
/// replays the first 202 (with `Idempotent-Replayed: true`). The message may steer its own run
/// (`tool_choice`, `active_tools`, `step_rules`, `stop_conditions`, `max_steps`,
/// `max_call_depth`, `instructions`, earlier turns in `messages`): kept with the run, so every
/// attempt of it (after a crash or a pause) applies the same.
#[utoipa::path(
    post,
    path = "/v1/threads/{thread_id}/user_message",
    tag = "threads",
    security(("bearer" = ["runs:create"])),
    params(
        ("thread_id" = ThreadId, Path, description = "The thread (any UUID: created on first use)."),
        ("Idempotency-Key" = Option<String>, Header, min_length = 1, max_length = 255,
            description = "Replays the first 202 of a request with this key (1 to 255 visible ASCII characters)."),
        UserMessageQuery,
    ),
    request_body = UserMessageRequest,
    responses(
        (status = 200, description = "With `?wait=S`: the run ended or paused (`pending_action`) within S seconds.", body = crate::routes::workflows::WorkflowResponse,
            headers(
                ("Location" = String, description = "The workflow: `/v1/workflows/{workflow_id}`."),
            )),
        (status = 202, description = "The run is queued.", body = UserMessageResponse,
            headers(
                ("Location" = String, description = "The workflow: `/v1/workflows/{workflow_id}`."),
                ("Idempotent-Replayed" = Option<String>, description = "`true` on a replay."),
            ),
            links(
                ("GetWorkflow" = (operation_id = "get_workflow",
                    parameters(("workflow_id" = "$response.body#/workflow_id")))),
                ("CancelWorkflow" = (operation_id = "cancel_workflow",
                    parameters(("workflow_id" = "$response.body#/workflow_id")))),
                ("ListMessages" = (operation_id = "list_messages",
                    parameters(("thread_id" = "$response.body#/thread_id")))),
                ("GetSteps" = (operation_id = "get_steps",
                    parameters(("workflow_id" = "$response.body#/workflow_id")))),
            )),
        (status = 400, description = "`invalid_json`, `invalid_idempotency_key`, `invalid_wait`", body = ErrorBody),
        Unauthenticated,
        (status = 403, description = "`forbidden`: the token lacks `runs:create` (`permission` says which); `agent_disabled`: the agent is disabled", body = ErrorBody),
        (status = 404, description = "`thread_not_found` (another owner's), `agent_not_found`, `not_found`", body = ErrorBody),
        (status = 409, description = "`thread_busy`, with `active_workflow_id` and `stream_url`", body = ErrorBody),
        (status = 413, description = "`input_too_large`, `body_too_large`", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`", body = ErrorBody),
        (status = 422, description = "`invalid_body`, `invalid_input_text`, `idempotency_key_reused`, `invalid_overrides` (with `errors: [{field, message}]`, every problem at once: a field of the wrong type; `tool_choice`, `active_tools`, `step_rules` or `stop_conditions` naming tools the agent that answers does not have; `max_steps` above the agent's ceiling; `max_call_depth` above the agent's; `messages` too many, blank or too long; `instructions` too long, or to an agent without `allow_instruction_override` from a token without `admin`); `invalid_query`", body = ErrorBody),
        (status = 429, description = "A quota refuses the run: `rate_limited` (runs per hour), `concurrency_limited` (active runs), `budget_exceeded` (daily tokens); with `scope`, `limit`, `agent_id` (an agent's own quota) and `retry_after`. Nothing is created.",
            body = ErrorBody,
            headers(("Retry-After" = u32, description = "Seconds until the window or the UTC day ends (5 for `concurrency_limited`: a hint)."))),
    )
)]
async fn post_user_message(
    State(state): State<AppState>,
    user: EndUser,
    ApiPath(thread_id): ApiPath<ThreadId>,
    headers: HeaderMap,
    ApiQuery(query): ApiQuery<UserMessageQuery>,
    ApiJson(body): ApiJson<Value>,
) -> Result<Response, ApiError> {
    let wait = query.wait.unwrap_or(0);
    if wait > MAX_WAIT_SECS {
        return Err(ApiError::bad_request(
            "invalid_wait",
            format!("wait must be from 0 to {MAX_WAIT_SECS} seconds"),
        ));
    }
    let mut request = UserMessageRequest::parse(body)?;
    request.agent_id = user.agent(request.agent_id)?;
    request.client = user.client;
    let caller = user.caller;
    caller.require(Permission::RunsCreate)?;
    let key = idempotency_key(&headers)?;
    let hash = idempotency::request_hash(&[
        caller.owner.user_id.as_bytes(),
        thread_id.to_string().as_bytes(),
        &serde_json::to_vec(&request).map_err(anyhow::Error::from)?,
    ]);
    let enqueued = enqueue_message(&state, &caller, thread_id, &request, key, &hash, &[]).await?;
    // With a wait: the run as soon as it ends or pauses, if that is within the wait.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(wait);
    let run = match wait {
        0 => None,
        _ => Some(until_settled(&state, &caller, enqueued.workflow_id, Some(deadline)).await?),
    };
    let mut response = match run {
        Some(run) if settled(run.status) => accepted(
            StatusCode::OK,
            WorkflowResponse::from(run),
            enqueued.workflow_id,
        ),
        _ => accepted(enqueued.status, enqueued.body, enqueued.workflow_id),
    };
    if enqueued.replayed {
        response
            .headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    Ok(response)
}

fn accepted(status: StatusCode, body: impl Serialize, workflow_id: WorkflowId) -> Response {
    let location = HeaderValue::try_from(workflow_url(workflow_id)).ok();
    let mut response = (status, Json(body)).into_response();
    if let Some(location) = location {
        response.headers_mut().insert(header::LOCATION, location);
    }
    response
}

/// Longest thread title, in characters.
pub const MAX_TITLE_CHARS: usize = 200;

/// A page of threads.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ThreadList {
    /// The threads, newest first.
    pub data: Vec<ThreadResponse>,
    /// The `cursor` of the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

/// The caller's threads (with `runs:read:tenant`: the tenant's), newest first.
#[utoipa::path(
    get,
    path = "/v1/threads",
    tag = "threads",
    security(("bearer" = ["runs:create"]), ("bearer" = ["runs:read:tenant"])),
    params(
        ("limit" = Option<i64>, Query, minimum = 1, maximum = 100, description = "Rows per page (default 20; over 100 is a 400)."),
        ("cursor" = Option<String>, Query, description = "The `next_cursor` of the previous page."),
        ("status" = Option<String>, Query, description = "`idle` or `busy`."),
        ("agent_id" = Option<AgentId>, Query, description = "Only threads answered by this agent."),
        ("metadata" = Option<Object>, Query, style = DeepObject, explode = true,
            description = "`metadata[key]=value`: only threads whose metadata has the key with this value (compared as text); repeatable with other keys."),
    ),
    responses(
        (status = 200, description = "A page of threads.", body = ThreadList),
        (status = 400, description = "`invalid_limit`, `invalid_cursor`, `invalid_filter`, `unknown_parameter`", body = ErrorBody),
        Unauthenticated,
        MissingPermission,
    )
)]
pub(crate) async fn list_threads(
    State(state): State<AppState>,
    EndUser { caller, .. }: EndUser,
    mut query: ListQuery,
) -> Result<Json<List<ThreadResponse>>, ApiError> {
    caller.require_any(Permission::RUNS_READ)?;
    let mut filter = ThreadFilter::default();
    query.filters(|key, value| {
        match key {
            "status" if filter.busy.is_some() => return Err(list::repeated(key)),
            "status" => {
                filter.busy = Some(match &*value {
                    "busy" => true,
                    "idle" => false,
                    _ => return Err(list::invalid(key, "`idle` or `busy`")),
                });
            }
            "agent_id" if filter.agent_id.is_some() => return Err(list::repeated(key)),
            "agent_id" => {
                filter.agent_id = Some(
                    value
                        .parse()
                        .map_err(|_| list::invalid(key, "an agent id (UUID)"))?,
                );
            }
            _ => match key
                .strip_prefix("metadata[")
                .and_then(|k| k.strip_suffix(']'))
            {
                Some(name) if !name.is_empty() => filter.metadata.push((name.to_owned(), value)),
                _ => return Ok(false),
            },
        }
        Ok(true)
    })?;
    let page = threads::list(
        &state.db,
        caller.scope(),
        &filter,
        query.cursor,
        query.limit,
    )
    .await?;
    Ok(Json(List::of(page, ThreadResponse::from)))
}

/// Body of `PATCH /v1/threads/{thread_id}` (the handler reads it as a JSON object, to tell a
/// `null` that clears from an absent field; this type documents it).
#[derive(Debug, utoipa::ToSchema)]
pub struct PatchThreadRequest {
    /// The new title (at most 200 characters); `null` clears it.
    #[schema(max_length = 200)]
    pub title: Option<String>,
    /// Merged into the metadata: each key is set, or removed when its value is `null`.
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Map<String, Value>>,
}

/// Renames a thread or changes its metadata.
#[utoipa::path(
    patch,
    path = "/v1/threads/{thread_id}",
    tag = "threads",
    security(("bearer" = ["runs:create"])),
    params(("thread_id" = ThreadId, Path, description = "The thread.")),
    request_body = PatchThreadRequest,
    responses(
        (status = 200, description = "The thread as it is now.", body = ThreadResponse),
        (status = 400, description = "`invalid_json`", body = ErrorBody),
        Unauthenticated,
        MissingPermission,
        (status = 404, description = "`thread_not_found` (also another owner's, or erased), `not_found`", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`", body = ErrorBody),
        (status = 422, description = "`invalid_body`, `invalid_title`: nothing is changed", body = ErrorBody),
    )
)]
pub(crate) async fn patch_thread(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(thread_id): ApiPath<ThreadId>,
    ApiJson(body): ApiJson<Map<String, Value>>,
) -> Result<Json<ThreadResponse>, ApiError> {
    caller.require(Permission::RunsCreate)?;
    let mut patch = ThreadPatch::default();
    for (key, value) in body {
        match (key.as_str(), value) {
            ("title", Value::Null) => patch.title = Some(None),
            ("title", Value::String(title)) => {
                if title.chars().count() > MAX_TITLE_CHARS {
                    return Err(ApiError::unprocessable(
                        "invalid_title",
                        format!("title is over {MAX_TITLE_CHARS} characters"),
                    ));
                }
                patch.title = Some(Some(title));
            }
            ("metadata", Value::Object(metadata)) => patch.metadata = Some(metadata),
            ("title", _) => {
                return Err(ApiError::unprocessable(
                    "invalid_body",
                    "title must be a string or null",
                ));
            }
            ("metadata", _) => {
                return Err(ApiError::unprocessable(
                    "invalid_body",
                    "metadata must be an object",
                ));
            }
            (other, _) => {
                return Err(ApiError::unprocessable(
                    "invalid_body",
                    format!("unknown field `{other}`, expected `title` or `metadata`"),
                ));
            }
        }
    }
    let thread = threads::update(&state.db, thread_id, caller.write_scope(), &patch)
        .await?
        .ok_or_else(thread_not_found)?;
    Ok(Json(thread.into()))
}

/// Erases a thread: stops its active run, deletes its messages, runs, steps, idempotency keys,
/// webhook deliveries and stream. The id is 404 for everyone afterwards, and a `user_message`
/// to it is refused (404), never a new thread.
#[utoipa::path(
    delete,
    path = "/v1/threads/{thread_id}",
    tag = "threads",
    security(("bearer" = ["runs:create"])),
    params(("thread_id" = ThreadId, Path, description = "The thread.")),
    responses(
        (status = 204, description = "Erased."),
        Unauthenticated,
        MissingPermission,
        (status = 404, description = "`thread_not_found` (also another owner's, or already erased), `not_found`", body = ErrorBody),
        (status = 503, description = "`redis_unavailable`, `erasure_timed_out` (its locks or statements took too long): nothing was erased; try again after `Retry-After`", body = ErrorBody),
    )
)]
pub(crate) async fn delete_thread(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(thread_id): ApiPath<ThreadId>,
) -> Result<StatusCode, ApiError> {
    caller.require(Permission::RunsCreate)?;
    erase::erase_thread(&state, &caller, thread_id).await?;
    Ok(StatusCode::NO_CONTENT)
}
