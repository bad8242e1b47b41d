//! `GET /v1/workflows/{workflow_id}/steps`: what an agent did, from Postgres, long after the
//! stream is gone: each step's model call, its tool calls with their arguments, results,
//! timings and the attempt that ran them, and every pause and decision, in order. Step payloads
//! expire `SPOOL_RETENTION_STEPS_DAYS` after the run ended; the answer then says so
//! (`steps_expired_at`) rather than looking like a run that saved no step.

use axum::Json;
use axum::extract::State;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;

use spool_shared::WorkflowId;
use spool_shared::db::runs;
use spool_shared::db::steps::{self, CallResult, CallState, Decision, ModelCall, Step};
use spool_shared::run::{Citation, PendingAction, Usage};
use spool_shared::status::RunStatus;

use crate::app::AppState;
use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody, Unauthenticated};
use crate::extract::ApiPath;
use crate::runs::workflow_not_found;

/// A run's durable timeline.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct StepsResponse {
    /// The run.
    pub workflow_id: WorkflowId,
    /// Its status now.
    pub status: RunStatus,
    /// What it waits for, while paused.
    pub pending_action: Option<PendingAction>,
    /// Its steps, in order (empty once they expired).
    pub steps: Vec<TimelineStep>,
    /// When retention deleted its steps (`SPOOL_RETENTION_STEPS_DAYS` after the run ended);
    /// `null` while they are kept.
    pub steps_expired_at: Option<DateTime<Utc>>,
}

/// One step: a model call and the tool calls it asked for.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TimelineStep {
    /// Its number (from 1).
    pub step: i32,
    /// The attempt that saved it last.
    pub attempt: i32,
    /// When it was first saved (database clock).
    pub saved_at: DateTime<Utc>,
    /// The model call: which model, when, why it stopped (`null` for steps saved by an older
    /// version).
    pub model_call: Option<ModelCall>,
    /// The model's text.
    pub text: String,
    /// Tokens of the model call.
    pub usage: Usage,
    /// Its tool calls, in the model's order.
    pub tool_calls: Vec<TimelineToolCall>,
    /// Sources its results cite.
    pub citations: Vec<Citation>,
    /// Whether every call is done (a step is unsettled while it waits for the client or a
    /// person, or when a crash cut it short).
    pub settled: bool,
}

/// One tool call of a step.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TimelineToolCall {
    /// The provider's id of the call.
    pub tool_call_id: String,
    /// The tool.
    pub name: String,
    /// The arguments the model wrote (as JSON; text that is not JSON as a string).
    #[schema(value_type = Object)]
    pub arguments: Value,
    /// Where it stands: `done`, or waiting (`pending_client`, `pending_approval`,
    /// `pending_agent`), or decided and not yet run (`approved`, `denied`, `client_output`).
    pub state: CallState,
    /// The result the model saw, once done.
    pub result: Option<String>,
    /// Whether the result is an error.
    pub is_error: bool,
    /// When it started executing (`null` if it was not executed by the worker: refused,
    /// denied, a client tool).
    pub started_at: Option<DateTime<Utc>>,
    /// When its execution ended.
    pub ended_at: Option<DateTime<Utc>>,
    /// The attempt that executed it.
    pub attempt: Option<i32>,
    /// Who decided its fate besides the tool policy (a person, a hook, the deadline, the
    /// client), if anyone.
    pub decision: Option<Decision>,
    /// The child run that answered a call of an agent tool (`GET /v1/workflows/{id}` and its
    /// own timeline).
    pub workflow_id: Option<WorkflowId>,
}

impl From<(&steps::ToolCall, CallResult)> for TimelineToolCall {
    fn from((call, result): (&steps::ToolCall, CallResult)) -> Self {
        let done = result.state == CallState::Done;
        Self {
            tool_call_id: result.tool_call_id,
            name: result.name,
            arguments: call.parsed_arguments(),
            state: result.state,
            result: done.then_some(result.output),
            is_error: result.is_error,
            started_at: result.started_at,
            ended_at: result.ended_at,
            attempt: result.attempt,
            decision: result.decision,
            workflow_id: result.workflow_id,
        }
    }
}

impl From<Step> for TimelineStep {
    fn from(step: Step) -> Self {
        let saved = step.data.0;
        let settled = saved.is_settled();
        let tool_calls = saved
            .assistant
            .tool_calls
            .iter()
            .zip(saved.results)
            .map(TimelineToolCall::from)
            .collect();
        Self {
            step: step.step,
            attempt: step.attempt,
            saved_at: step.created_at,
            model_call: saved.model_call,
            text: saved.assistant.text,
            usage: saved.usage,
            tool_calls,
            citations: saved.citations,
            settled,
        }
    }
}

/// The run's durable timeline: every saved step, in order.
#[utoipa::path(
    get,
    path = "/v1/workflows/{workflow_id}/steps",
    tag = "workflows",
    security(("bearer" = [])),
    params(("workflow_id" = WorkflowId, Path, description = "The workflow (run).")),
    responses(
        (status = 200, description = "The timeline.", body = StepsResponse),
        Unauthenticated,
        (status = 404, description = "`workflow_not_found`, `not_found`", body = ErrorBody),
    )
)]
pub(crate) async fn get_steps(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(workflow_id): ApiPath<WorkflowId>,
) -> Result<Json<StepsResponse>, ApiError> {
    let run = runs::find_in(&state.db, workflow_id, caller.scope())
        .await?
        .ok_or_else(workflow_not_found)?;
    let saved = steps::load(&state.db, workflow_id).await?;
    let mut steps: Vec<TimelineStep> = saved.into_iter().map(TimelineStep::from).collect();
    // The step that answered is kept on the run, after the others.
    if let Some(last) = runs::final_step(&state.db, workflow_id).await? {
        let step = Step {
            step: steps.last().map_or(1, |s| s.step + 1),
            attempt: run.attempt,
            created_at: run.finished_at.unwrap_or(run.updated_at),
            data: sqlx::types::Json(last),
        };
        steps.push(step.into());
    }
    // Only a run with no step left can have had them expire.
    let steps_expired_at = match steps.is_empty() {
        true => steps::expired_at(&state.db, workflow_id).await?,
        false => None,
    };
    Ok(Json(StepsResponse {
        workflow_id,
        status: run.status,
        pending_action: run.pending_action.map(|a| a.0),
        steps,
        steps_expired_at,
    }))
}
