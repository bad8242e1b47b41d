//! Workflows (runs): their status, attempt, timestamps and error, and cancel. The answers to a
//! paused run (client tool outputs, approvals) are in [`pauses`].

pub mod input;
pub mod pauses;
pub mod timeline;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use spool_shared::db::runs::{self, Run};
use spool_shared::ids::AgentId;
use spool_shared::run::{PendingAction, RunFailure, Usage};
use spool_shared::status::RunStatus;
use spool_shared::{MessageId, ThreadId, WorkflowId};

use crate::app::AppState;
use crate::auth::public::EndUser;
use crate::auth::{Caller, Permission};
use crate::error::ApiError;
use crate::error::{ErrorBody, MissingPermission, Unauthenticated};
use crate::extract::{ApiPath, ApiQuery};
use crate::routes::list::{self, List, ListQuery};
use crate::runs::cancel::cancel;
use crate::runs::wait::until_settled;
use utoipa_axum::{router::OpenApiRouter, routes};

/// `/v1/workflows/...`.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_workflows))
        .routes(routes!(get_workflow))
        .routes(routes!(timeline::get_steps))
        .routes(routes!(cancel_workflow))
        .routes(routes!(pauses::post_tool_outputs))
        .routes(routes!(pauses::post_approval))
        .routes(routes!(input::post_input))
}

/// A run as clients see it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct WorkflowResponse {
    /// The workflow id.
    pub workflow_id: WorkflowId,
    /// Its thread.
    pub thread_id: ThreadId,
    /// Where it is in its life.
    pub status: RunStatus,
    /// How many times a worker has claimed it.
    pub attempt: i32,
    /// The agent that answers (`null`: the default agent).
    pub agent_id: Option<AgentId>,
    /// The message that started it.
    pub user_message_id: MessageId,
    /// The assistant message it produces.
    pub message_id: MessageId,
    /// Why it failed (`null` unless `failed`).
    pub error: Option<RunFailure>,
    /// Token usage (once it has ended).
    pub usage: Option<Usage>,
    /// What it waits for while paused.
    pub pending_action: Option<PendingAction>,
    /// When cancellation was asked for.
    pub cancel_requested_at: Option<DateTime<Utc>>,
    /// Why cancellation was asked for (the `reason` given to cancel).
    pub cancel_reason: Option<String>,
    /// Who asked for the cancellation (the user, for a run cancelled on request; `null` unless
    /// cancellation was asked for).
    pub cancelled_by: Option<String>,
    /// The run whose agent tool call started this one (`null` for a thread's own run).
    pub parent_workflow_id: Option<WorkflowId>,
    /// That tool call's id.
    pub parent_tool_call_id: Option<String>,
    /// How deep it is in a tree of agent calls (0: a thread's own run).
    pub depth: i16,
    /// When it was enqueued.
    pub created_at: DateTime<Utc>,
    /// When it was first claimed.
    pub started_at: Option<DateTime<Utc>>,
    /// When it reached a terminal status.
    pub finished_at: Option<DateTime<Utc>>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
}

impl From<Run> for WorkflowResponse {
    fn from(run: Run) -> Self {
        Self {
            workflow_id: run.id,
            thread_id: run.thread_id,
            status: run.status,
            attempt: run.attempt,
            agent_id: run.agent_id,
            user_message_id: run.user_message_id,
            message_id: run.assistant_message_id,
            error: run.error.map(|e| e.0),
            usage: run.usage.map(|u| u.0),
            pending_action: run.pending_action.map(|a| a.0),
            cancel_requested_at: run.cancel_requested_at,
            cancel_reason: run.cancel_reason,
            cancelled_by: run.cancelled_by,
            parent_workflow_id: run.parent_workflow_id,
            parent_tool_call_id: run.parent_tool_call_id,
            depth: run.depth,
            created_at: run.created_at,
            started_at: run.started_at,
            finished_at: run.finished_at,
            updated_at: run.updated_at,
        }
    }
}

/// Query of `GET /v1/workflows/{workflow_id}`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct GetWorkflowQuery {
    /// Wait up to this many seconds (at most 60) for the run to end or pause; answer at once
    /// if it already has. Absent or 0: answer at once.
    #[serde(default)]
    #[param(minimum = 0, maximum = 60)]
    pub wait: Option<u64>,
}

/// The longest `?wait=`, in seconds.
pub const MAX_WAIT_SECS: u64 = 60;

/// A run: status, attempt, timestamps, error, usage, and what it waits for while paused.
///
/// With `?wait=S`, the answer comes as soon as the run is terminal or paused, or after S
/// seconds with the run as it is then. A waiting request holds no database connection: it marks
/// the run watched (so its end or pause is NOTIFYed) and the process's one LISTEN connection
/// wakes it.
#[utoipa::path(
    get,
    path = "/v1/workflows/{workflow_id}",
    tag = "workflows",
    security(("bearer" = ["runs:create"]), ("bearer" = ["runs:read:tenant"])),
    params(("workflow_id" = WorkflowId, Path, description = "The workflow (run)."), GetWorkflowQuery),
    responses(
        (status = 200, description = "The run.", body = WorkflowResponse),
        (status = 400, description = "`invalid_wait`", body = ErrorBody),
        Unauthenticated,
        MissingPermission,
        (status = 404, description = "`workflow_not_found`, `not_found`", body = ErrorBody),
        (status = 422, description = "`invalid_query`", body = ErrorBody),
    )
)]
async fn get_workflow(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(workflow_id): ApiPath<WorkflowId>,
    ApiQuery(query): ApiQuery<GetWorkflowQuery>,
) -> Result<Json<WorkflowResponse>, ApiError> {
    caller.require_any(Permission::RUNS_READ)?;
    let wait = query.wait.unwrap_or(0);
    if wait > MAX_WAIT_SECS {
        return Err(ApiError::bad_request(
            "invalid_wait",
            format!("wait must be from 0 to {MAX_WAIT_SECS} seconds"),
        ));
    }
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(wait);
    let run = until_settled(&state, &caller, workflow_id, (wait > 0).then_some(deadline)).await?;
    Ok(Json(run.into()))
}

/// A page of runs.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct WorkflowList {
    /// The runs, newest first.
    pub data: Vec<WorkflowResponse>,
    /// The `cursor` of the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

/// The caller's runs (with `runs:read:tenant`: the tenant's), newest first.
#[utoipa::path(
    get,
    path = "/v1/workflows",
    tag = "workflows",
    security(("bearer" = ["runs:create"]), ("bearer" = ["runs:read:tenant"])),
    params(
        ("limit" = Option<i64>, Query, minimum = 1, maximum = 100, description = "Rows per page (default 20; over 100 is a 400)."),
        ("cursor" = Option<String>, Query, description = "The `next_cursor` of the previous page."),
        ("thread_id" = Option<ThreadId>, Query, description = "Only this thread's runs."),
        ("agent_id" = Option<AgentId>, Query, description = "Only this agent's runs."),
        ("status" = Option<Vec<RunStatus>>, Query, explode = true, description = "Only runs in one of these statuses (repeatable)."),
    ),
    responses(
        (status = 200, description = "A page of runs.", body = WorkflowList),
        (status = 400, description = "`invalid_limit`, `invalid_cursor`, `invalid_filter`, `unknown_parameter`", body = ErrorBody),
        Unauthenticated,
        MissingPermission,
    )
)]
async fn list_workflows(
    State(state): State<AppState>,
    caller: Caller,
    mut query: ListQuery,
) -> Result<Json<List<WorkflowResponse>>, ApiError> {
    caller.require_any(Permission::RUNS_READ)?;
    let mut filter = runs::RunFilter::default();
    query.filters(|key, value| {
        match key {
            "thread_id" if filter.thread_id.is_some() => return Err(list::repeated(key)),
            "thread_id" => {
                filter.thread_id = Some(
                    value
                        .parse()
                        .map_err(|_| list::invalid(key, "a thread id (UUID)"))?,
                );
            }
            "agent_id" if filter.agent_id.is_some() => return Err(list::repeated(key)),
            "agent_id" => {
                filter.agent_id = Some(
                    value
                        .parse()
                        .map_err(|_| list::invalid(key, "an agent id (UUID)"))?,
                );
            }
            "status" => filter.statuses.push(
                value
                    .parse()
                    .map_err(|_| list::invalid(key, "a run status"))?,
            ),
            _ => return Ok(false),
        }
        Ok(true)
    })?;
    let page = runs::list(
        &state.db,
        caller.scope(),
        &filter,
        query.cursor,
        query.limit,
    )
    .await?;
    Ok(Json(List::of(page, WorkflowResponse::from)))
}

/// 202 with the run.
pub(crate) fn accepted(run: Run) -> (StatusCode, Json<WorkflowResponse>) {
    (StatusCode::ACCEPTED, Json(run.into()))
}

/// Body of `POST .../cancel` (optional).
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelRequest {
    /// Why; recorded on the run.
    #[serde(default)]
    pub reason: Option<String>,
}

/// Cancels a run: idempotent; a terminal run is returned as it is.
///
/// The request is recorded in Postgres first (it survives a Redis outage and any restart). A
/// run no worker holds (queued, paused) is cancelled here at once; a running one is signalled
/// (NOTIFY, and its worker's next heartbeat reads the request) and its worker stops the model
/// call or the tools, keeps the partial message and ends the run as `cancelled`.
#[utoipa::path(
    post,
    path = "/v1/workflows/{workflow_id}/cancel",
    tag = "workflows",
    security(("bearer" = ["runs:create"])),
    params(("workflow_id" = WorkflowId, Path, description = "The workflow (run).")),
    request_body(content = ref("#/components/schemas/CancelRequest"),
        content_type = "application/json", description = "Optional: an empty body gives no reason."),
    responses(
        (status = 202, description = "The run, cancelled or being cancelled (or terminal as it was).", body = WorkflowResponse),
        Unauthenticated,
        MissingPermission,
        (status = 404, description = "`workflow_not_found`, `not_found`", body = ErrorBody),
        (status = 422, description = "`invalid_body`", body = ErrorBody),
    )
)]
async fn cancel_workflow(
    State(state): State<AppState>,
    EndUser { caller, .. }: EndUser,
    ApiPath(id): ApiPath<WorkflowId>,
    body: Bytes,
) -> Result<(StatusCode, Json<WorkflowResponse>), ApiError> {
    caller.require(Permission::RunsCreate)?;
    let request: CancelRequest = if body.iter().all(u8::is_ascii_whitespace) {
        CancelRequest::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|err| ApiError::unprocessable("invalid_body", err.to_string()))?
    };
    let reason = request
        .reason
        .as_deref()
        .map(|r| r.chars().take(1000).collect::<String>());
    Ok(accepted(
        cancel(&state, &caller, id, reason.as_deref()).await?,
    ))
}
