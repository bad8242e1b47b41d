//! Workflows (runs): their status, attempt, timestamps and error.

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use spool_shared::agent::{AgentSpec, FieldError, RunDefaults, RunOverrides, StepRule, ToolChoice};
use spool_shared::db::runs::{self, Run};
use spool_shared::db::steps::{AnswerError, DecideError};
use spool_shared::db::{self, agents, steps};
use spool_shared::event::{EventType, Origin};
use spool_shared::ids::AgentId;
use spool_shared::run::{PendingAction, RunFailure, Usage};
use spool_shared::status::RunStatus;
use spool_shared::stream;
use spool_shared::{MessageId, ThreadId, WorkflowId};

use crate::app::AppState;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath};
use crate::openapi::ErrorBody;

/// `/v1/workflows/...`.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/workflows/{workflow_id}", get(get_workflow))
        .route("/v1/workflows/{workflow_id}/cancel", post(cancel_workflow))
        .route(
            "/v1/workflows/{workflow_id}/tool_outputs",
            post(post_tool_outputs),
        )
        .route(
            "/v1/workflows/{workflow_id}/approvals/{tool_call_id}",
            post(post_approval),
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
        (status = 401, description = "`missing_token`, `invalid_token`, `token_expired`", body = ErrorBody),
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

async fn current(state: &AppState, id: WorkflowId, caller: &Caller) -> Result<Run, ApiError> {
    runs::find(&state.db, id, &caller.owner)
        .await?
        .ok_or_else(workflow_not_found)
}

fn workflow_not_found() -> ApiError {
    ApiError::not_found("workflow_not_found", "no such workflow")
}

fn accepted(run: Run) -> (StatusCode, Json<WorkflowResponse>) {
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
        (status = 401, description = "`missing_token`, `invalid_token`, `token_expired`", body = ErrorBody),
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
    let mut events = vec![origin.event(EventType::MessageStart, json!({"role": "assistant"}))];
    events.push(origin.event(
        EventType::MessageEnd,
        json!({"status": "cancelled",
        "usage": {"input_tokens": 0, "output_tokens": 0}}),
    ));
    events.push(origin.event(EventType::Done, json!({"status": "cancelled"})));
    let mut conn = state.streams.conn();
    let result = stream::publish(
        &mut conn,
        state.streams.keys(),
        run.thread_id,
        run.id,
        attempt,
        &events,
        state.config.stream_retention,
    )
    .await;
    if let Err(err) = result {
        tracing::warn!(workflow.id = %run.id, error = %err, "could not publish the cancellation");
    }
}

/// One client tool output.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolOutput {
    /// The call it answers.
    pub tool_call_id: String,
    /// The output: a string, or any JSON (sent to the model as JSON text).
    #[schema(value_type = Value)]
    pub output: Value,
}

/// Body of `POST .../tool_outputs`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolOutputsRequest {
    /// Every pending call's output.
    pub tool_outputs: Vec<ToolOutput>,
    /// The tool choice of the next step.
    #[serde(default)]
    pub tool_choice: Option<ToolChoice>,
    /// The tools offered in the next step.
    #[serde(default)]
    pub active_tools: Option<Vec<String>>,
    /// Rules for later steps (they take precedence over the agent's).
    #[serde(default)]
    pub step_rules: Option<Vec<StepRule>>,
    /// Defaults for the rest of the run.
    #[serde(default)]
    pub defaults: Option<RunDefaults>,
}

fn invalid_overrides(errors: Vec<FieldError>) -> ApiError {
    let mut details = Map::new();
    details.insert("errors".into(), json!(errors));
    ApiError::Unprocessable {
        code: "invalid_overrides",
        message: format!(
            "the overrides have {} problem(s); see `errors`",
            errors.len()
        ),
        details,
    }
}

fn not_waiting(run: &Run, waits_for: &str) -> ApiError {
    let mut details = Map::new();
    details.insert("status".into(), json!(run.status));
    ApiError::Conflict {
        code: "run_not_waiting",
        message: format!(
            "the run is {}, not waiting for {waits_for}",
            run.status.as_str()
        ),
        details,
    }
}

/// Answers a `requires_action` pause with every pending output and re-queues the run.
///
/// Partial or unknown tool call ids are a 422; the request may also steer the next steps.
#[utoipa::path(
    post,
    path = "/v1/workflows/{workflow_id}/tool_outputs",
    tag = "workflows",
    security(("bearer" = [])),
    params(("workflow_id" = WorkflowId, Path, description = "The workflow (run).")),
    request_body = ToolOutputsRequest,
    responses(
        (status = 202, description = "The run, queued again.", body = WorkflowResponse),
        (status = 400, description = "`invalid_json`", body = ErrorBody),
        (status = 401, description = "`missing_token`, `invalid_token`, `token_expired`", body = ErrorBody),
        (status = 404, description = "`workflow_not_found`, `not_found`", body = ErrorBody),
        (status = 409, description = "`run_not_waiting`, with the run's `status`", body = ErrorBody),
        (status = 413, description = "`body_too_large`", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`", body = ErrorBody),
        (status = 422, description = "`invalid_body`, `unknown_tool_call`, `missing_tool_outputs` (with `missing`), `invalid_overrides` (with `errors: [{field, message}]`)", body = ErrorBody),
    )
)]
async fn post_tool_outputs(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<WorkflowId>,
    ApiJson(request): ApiJson<ToolOutputsRequest>,
) -> Result<(StatusCode, Json<WorkflowResponse>), ApiError> {
    let mut tx = state.db.begin().await?;
    let run = runs::find_for_update(&mut *tx, id, &caller.owner)
        .await?
        .ok_or_else(workflow_not_found)?;
    if run.status != RunStatus::RequiresAction {
        return Err(not_waiting(&run, "tool outputs"));
    }
    let step = steps::last_for_update(&mut *tx, id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("a paused run without a saved step"))?;
    let mut data = step.data.0;
    let outputs = request
        .tool_outputs
        .into_iter()
        .map(|output| {
            let text = match output.output {
                Value::String(text) => text,
                other => other.to_string(),
            };
            (output.tool_call_id, text)
        })
        .collect();
    data.answer_client(outputs).map_err(|err| match err {
        AnswerError::Unknown(_) => ApiError::unprocessable("unknown_tool_call", err.to_string()),
        AnswerError::Missing(missing) => {
            let mut details = Map::new();
            details.insert("missing".into(), json!(missing));
            ApiError::Unprocessable {
                code: "missing_tool_outputs",
                message: "every pending tool call needs an output".into(),
                details,
            }
        }
    })?;
    let overrides = RunOverrides {
        tool_choice: request.tool_choice,
        active_tools: request.active_tools,
        step_rules: request.step_rules,
        defaults: request.defaults,
    };
    // Checked against the agent as the worker will load it: a tool the agent does not have
    // would otherwise fail the run at its next model call, after the outputs were accepted.
    let agent = match run.agent_id {
        Some(agent_id) => agents::find(&mut *tx, agent_id, &run.tenant_id)
            .await?
            .map(|agent| agent.spec.0),
        None => Some(AgentSpec::default_agent("default", "")),
    };
    // The paused step is settled by these outputs; the next model call is the one after it.
    let next_step = u32::try_from(step.step).unwrap_or(0).saturating_add(1);
    // An agent deleted while its run waited fails the run when it resumes, whatever is posted.
    let errors = agent
        .as_ref()
        .map_or_else(Vec::new, |agent| overrides.validate(agent, next_step));
    if !errors.is_empty() {
        return Err(invalid_overrides(errors));
    }
    // Kept with what earlier pauses of the run posted: their rules and defaults last.
    let earlier = run.overrides.clone().map(|stored| stored.0);
    let overrides = overrides.accumulate(earlier, next_step);
    let clashes = agent.map_or_else(Vec::new, |agent| overrides.clashes(&agent, next_step));
    if !clashes.is_empty() {
        return Err(invalid_overrides(clashes));
    }
    steps::replace(&mut *tx, id, step.step, &data).await?;
    if !runs::resume(&mut *tx, id, RunStatus::RequiresAction, Some(&overrides)).await? {
        return Err(not_waiting(&run, "tool outputs"));
    }
    db::notify_runs(&mut *tx).await?;
    tx.commit().await?;
    Ok(accepted(current(&state, id, &caller).await?))
}

/// Body of `POST .../approvals/{tool_call_id}`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalRequest {
    /// Whether the call may be made.
    pub approved: bool,
    /// Why (a denial's reason reaches the model).
    #[serde(default)]
    pub reason: Option<String>,
}

/// Decides a pending approval and re-queues the run.
#[utoipa::path(
    post,
    path = "/v1/workflows/{workflow_id}/approvals/{tool_call_id}",
    tag = "workflows",
    security(("bearer" = [])),
    params(
        ("workflow_id" = WorkflowId, Path, description = "The workflow (run)."),
        ("tool_call_id" = String, Path, description = "The tool call awaiting approval."),
    ),
    request_body = ApprovalRequest,
    responses(
        (status = 202, description = "The run, queued again.", body = WorkflowResponse),
        (status = 400, description = "`invalid_json`", body = ErrorBody),
        (status = 401, description = "`missing_token`, `invalid_token`, `token_expired`", body = ErrorBody),
        (status = 404, description = "`workflow_not_found`, `tool_call_not_found`, `not_found`", body = ErrorBody),
        (status = 409, description = "`run_not_waiting` (with `status`), `approval_expired`", body = ErrorBody),
        (status = 413, description = "`body_too_large`", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`", body = ErrorBody),
        (status = 422, description = "`invalid_body`", body = ErrorBody),
    )
)]
async fn post_approval(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath((id, tool_call_id)): ApiPath<(WorkflowId, String)>,
    ApiJson(request): ApiJson<ApprovalRequest>,
) -> Result<(StatusCode, Json<WorkflowResponse>), ApiError> {
    let mut tx = state.db.begin().await?;
    let run = runs::find_for_update(&mut *tx, id, &caller.owner)
        .await?
        .ok_or_else(workflow_not_found)?;
    if run.status != RunStatus::AwaitingApproval {
        return Err(not_waiting(&run, "an approval"));
    }
    let step = steps::last_for_update(&mut *tx, id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("a paused run without a saved step"))?;
    let mut data = step.data.0;
    data.decide(&tool_call_id, request.approved, request.reason, Utc::now())
        .map_err(|err| match err {
            DecideError::NotPending => ApiError::not_found("tool_call_not_found", err.to_string()),
            DecideError::Expired => ApiError::Conflict {
                code: "approval_expired",
                message: err.to_string(),
                details: Map::new(),
            },
        })?;
    steps::replace(&mut *tx, id, step.step, &data).await?;
    if !runs::resume(&mut *tx, id, RunStatus::AwaitingApproval, None).await? {
        return Err(not_waiting(&run, "an approval"));
    }
    db::notify_runs(&mut *tx).await?;
    tx.commit().await?;
    Ok(accepted(current(&state, id, &caller).await?))
}
