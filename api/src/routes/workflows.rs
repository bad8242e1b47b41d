//! Workflows (runs): their status, attempt, timestamps and error, and cancel. The answers to a
//! paused run (client tool outputs, approvals) are in [`pauses`].

pub mod pauses;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::json;

use spool_shared::db;
use spool_shared::db::runs::{self, Run};
use spool_shared::event::{EventType, Origin, end_of_message};
use spool_shared::ids::AgentId;
use spool_shared::run::{PendingAction, RunFailure, Usage};
use spool_shared::status::RunStatus;
use spool_shared::stream;
use spool_shared::{MessageId, ThreadId, WorkflowId};

use crate::app::AppState;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::error::{ErrorBody, Unauthenticated};
use crate::extract::ApiPath;

/// `/v1/workflows/...`.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/workflows/{workflow_id}", get(get_workflow))
        .route("/v1/workflows/{workflow_id}/cancel", post(cancel_workflow))
        .route(
            "/v1/workflows/{workflow_id}/tool_outputs",
            post(pauses::post_tool_outputs),
        )
        .route(
            "/v1/workflows/{workflow_id}/approvals/{tool_call_id}",
            post(pauses::post_approval),
        )
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
            created_at: run.created_at,
            started_at: run.started_at,
            finished_at: run.finished_at,
            updated_at: run.updated_at,
        }
    }
}

/// A run: status, attempt, timestamps, error, usage, and what it waits for while paused.
#[utoipa::path(
    get,
    path = "/v1/workflows/{workflow_id}",
    tag = "workflows",
    security(("bearer" = [])),
    params(("workflow_id" = WorkflowId, Path, description = "The workflow (run).")),
    responses(
        (status = 200, description = "The run.", body = WorkflowResponse),
        Unauthenticated,
        (status = 404, description = "`workflow_not_found`, `not_found`", body = ErrorBody),
    )
)]
async fn get_workflow(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(workflow_id): ApiPath<WorkflowId>,
) -> Result<Json<WorkflowResponse>, ApiError> {
    let run = runs::find(&state.db, workflow_id, &caller.owner)
        .await?
        .ok_or_else(|| ApiError::not_found("workflow_not_found", "no such workflow"))?;
    Ok(Json(run.into()))
}

/// The caller's run, as it is now.
pub(crate) async fn current(
    state: &AppState,
    id: WorkflowId,
    caller: &Caller,
) -> Result<Run, ApiError> {
    runs::find(&state.db, id, &caller.owner)
        .await?
        .ok_or_else(workflow_not_found)
}

/// 404 `workflow_not_found`.
pub(crate) fn workflow_not_found() -> ApiError {
    ApiError::not_found("workflow_not_found", "no such workflow")
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
    security(("bearer" = [])),
    params(("workflow_id" = WorkflowId, Path, description = "The workflow (run).")),
    request_body(content = ref("#/components/schemas/CancelRequest"),
        content_type = "application/json", description = "Optional: an empty body gives no reason."),
    responses(
        (status = 202, description = "The run, cancelled or being cancelled (or terminal as it was).", body = WorkflowResponse),
        Unauthenticated,
        (status = 404, description = "`workflow_not_found`, `not_found`", body = ErrorBody),
        (status = 422, description = "`invalid_body`", body = ErrorBody),
    )
)]
async fn cancel_workflow(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<WorkflowId>,
    body: Bytes,
) -> Result<(StatusCode, Json<WorkflowResponse>), ApiError> {
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
    let status = runs::request_cancel(&state.db, id, &caller.owner, reason.as_deref()).await?;
    let run = current(&state, id, &caller).await?;
    match status {
        None => return Ok(accepted(run)),
        Some(RunStatus::Running) => db::notify_cancel(&state.db, id).await?,
        Some(_) => match runs::cancel_unclaimed(&state.db, id).await? {
            Some(attempt) => publish_cancelled(&state, &run, attempt).await,
            // A worker claimed it in between: it sees the request as it starts.
            None => db::notify_cancel(&state.db, id).await?,
        },
    }
    tracing::info!(workflow.id = %id, "cancel requested");
    Ok(accepted(current(&state, id, &caller).await?))
}

/// Ends the stream of a run cancelled without a worker (best effort: with Redis down, the
/// gateway's followers learn from Postgres that the run is over).
async fn publish_cancelled(state: &AppState, run: &Run, attempt: i32) {
    let origin = Origin {
        thread_id: run.thread_id,
        workflow_id: run.id,
        message_id: run.assistant_message_id,
        attempt,
    };
    let start = (EventType::MessageStart, json!({"role": "assistant"}));
    let end = end_of_message(RunStatus::Cancelled, Usage::default(), None);
    let events: Vec<_> = std::iter::once(start)
        .chain(end)
        .map(|(kind, data)| origin.event(kind, data))
        .collect();
    let mut conn = state.streams.conn();
    let id = uuid::Uuid::new_v4().simple().to_string();
    let batch = stream::Batch {
        thread: run.thread_id,
        workflow: run.id,
        attempt,
        id: &id,
        events: &events,
    };
    let result = stream::publish(
        &mut conn,
        state.streams.keys(),
        &batch,
        state.config.stream_retention,
    )
    .await;
    if let Err(err) = result {
        tracing::warn!(workflow.id = %run.id, error = %err, "could not publish the cancellation");
    }
}
