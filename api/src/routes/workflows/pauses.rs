//! Answers to a paused run: the client's tool outputs (`requires_action`) and a person's
//! decision on a tool call (`awaiting_approval`).
//!
//! Each answer is one transaction: the run is locked, its unsettled step is edited through the
//! typed [`spool_shared::db::steps::SavedStep`] (`answer_client`, `decide`), and the
//! run is re-queued with a NOTIFY; the next attempt settles the step and goes on. A run that is
//! not waiting for that answer (answered already, cancelled, or never paused) is a 409.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::Value;
use sqlx::{Postgres, Transaction};

use spool_shared::WorkflowId;
use spool_shared::agent::{
    AgentSpec, FieldError, RunDefaults, RunOverrides, StepRule, ToolChoice, ToolSpec,
};
use spool_shared::db::runs::{self, Run};
use spool_shared::db::steps::{self, AnswerError, DecideError, SavedStep};
use spool_shared::db::{self, agents, idempotency};
use spool_shared::run::PendingAction;
use spool_shared::status::RunStatus;

use super::{WorkflowResponse, accepted};
use crate::app::AppState;
use crate::auth::{Caller, Permission};
use crate::error::{ApiError, BadBody, ErrorBody, MissingPermission, Unauthenticated};
use crate::extract::{ApiJson, ApiPath};
use crate::runs::workflow_not_found;

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
// The overrides are spelled out, not `#[serde(flatten)]`ed from `RunOverrides`: serde cannot
// combine `flatten` with `deny_unknown_fields`, and an unknown field here must be a 422.
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
    ApiError::invalid_fields("invalid_overrides", "the overrides", errors)
}

/// 409: the run does not wait as `expected` says (answered already, cancelled, never paused).
fn not_waiting(run: &Run, expected: RunStatus) -> ApiError {
    let waits_for = match expected {
        RunStatus::AwaitingApproval => "an approval",
        _ => "tool outputs",
    };
    let message = format!(
        "the run is {}, not waiting for {waits_for}",
        run.status.as_str()
    );
    ApiError::conflict("run_not_waiting", message).with("status", run.status)
}

/// Answers a `requires_action` pause with every pending output and re-queues the run.
///
/// Partial or unknown tool call ids are a 422; the request may also steer the next steps.
#[utoipa::path(
    post,
    path = "/v1/workflows/{workflow_id}/tool_outputs",
    tag = "workflows",
    security(("bearer" = ["runs:create"])),
    params(("workflow_id" = WorkflowId, Path, description = "The workflow (run).")),
    request_body = ToolOutputsRequest,
    responses(
        (status = 202, description = "The run, queued again.", body = WorkflowResponse),
        BadBody,
        Unauthenticated,
        MissingPermission,
        (status = 404, description = "`workflow_not_found`, `not_found`", body = ErrorBody),
        (status = 409, description = "`run_not_waiting`, with the run's `status`", body = ErrorBody),
        (status = 422, description = "`invalid_body`, `unknown_tool_call`, `missing_tool_outputs` (with `missing`), `invalid_overrides` (with `errors: [{field, message}]`)", body = ErrorBody),
    )
)]
pub(crate) async fn post_tool_outputs(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<WorkflowId>,
    ApiJson(request): ApiJson<ToolOutputsRequest>,
) -> Result<(StatusCode, Json<WorkflowResponse>), ApiError> {
    caller.require(Permission::RunsCreate)?;
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
    let overrides = RunOverrides {
        tool_choice: request.tool_choice,
        active_tools: request.active_tools,
        step_rules: request.step_rules,
        defaults: request.defaults,
        ..RunOverrides::default()
    };
    let refuse = |err: AnswerError| match err {
        AnswerError::Unknown(_) => ApiError::unprocessable("unknown_tool_call", err.to_string()),
        AnswerError::Missing(ref missing) => {
            ApiError::unprocessable("missing_tool_outputs", err.to_string())
                .with("missing", missing)
        }
    };
    let run = answer_client_tools(&state, &caller, id, outputs, overrides, refuse, None).await?;
    Ok(accepted(run))
}

/// Answers the caller's run paused as `requires_action` with every pending call's output
/// (`(tool_call_id, output)`) and the `overrides` the answer posts (checked against the run's
/// agent, its client tools included), and re-queues it, in one transaction; nothing changes
/// on an error. `refuse` words outputs that do not answer the pending calls. With a `key`, the
/// same transaction takes the `Idempotency-Key` and records what a retry with it replays.
/// Returns the run as the transaction left it (queued).
pub(crate) async fn answer_client_tools(
    state: &AppState,
    caller: &Caller,
    id: WorkflowId,
    outputs: Vec<(String, String)>,
    overrides: RunOverrides,
    refuse: impl FnOnce(AnswerError) -> ApiError,
    key: Option<AnswerKey<'_>>,
) -> Result<Run, ApiError> {
    let mut paused = Paused::lock(state, caller, id, RunStatus::RequiresAction).await?;
    paused.step.answer_client(outputs).map_err(refuse)?;
    // Checked against the agent as the worker will run it: a tool the agent does not have
    // would otherwise fail the run at its next model call, after the outputs were accepted.
    let run = &paused.run;
    let agent = match (&run.agent_spec, run.agent_id) {
        (Some(spec), _) => Some(spec.0.clone()),
        (None, Some(agent_id)) => agents::find(&mut *paused.tx, agent_id, &run.tenant_id)
            .await?
            .map(|agent| agent.spec.0),
        (None, None) => Some(AgentSpec::default_agent("default", "")),
    };
    let earlier = run.overrides.clone().map(|stored| stored.0);
    // The paused step is settled by these outputs; the next model call is the one after it.
    let next_step = u32::try_from(paused.number).unwrap_or(0).saturating_add(1);
    // `None` only for a run enqueued before specs were stored with runs, whose agent was since
    // deleted: it fails when it resumes, whatever is posted. The run's client tools (posted
    // with its message) are among the tools a choice may name.
    let errors = agent.as_ref().map_or_else(Vec::new, |agent| {
        let mut offered = agent.clone();
        // Later steps go up to the run's max_steps (its message's, if it posted one).
        if let Some(earlier) = &earlier {
            offered.max_steps = earlier.run_steps(agent);
        }
        let clients = earlier.as_ref().and_then(|e| e.client_tools.clone());
        offered
            .tools
            .extend(clients.into_iter().flatten().map(ToolSpec::Client));
        overrides.validate(&offered, next_step)
    });
    if !errors.is_empty() {
        return Err(invalid_overrides(errors));
    }
    // Kept with what earlier pauses of the run posted: their rules and defaults last.
    let overrides = overrides.accumulate(earlier, next_step);
    let clashes = agent.map_or_else(Vec::new, |agent| overrides.clashes(&agent, next_step));
    if !clashes.is_empty() {
        return Err(invalid_overrides(clashes));
    }
    if let Some(key) = key {
        let (tenant, window) = (
            &caller.owner.tenant_id,
            state.config.retention.idempotency(),
        );
        if !idempotency::reserve(&mut *paused.tx, tenant, key.key, key.hash, window).await? {
            return Err(ApiError::conflict(
                "idempotency_key_in_use",
                "this Idempotency-Key is taken by another request",
            ));
        }
        idempotency::record(&mut *paused.tx, tenant, key.key, 200, &key.replay, id).await?;
    }
    paused.resume(Some(&overrides)).await
}

/// The `Idempotency-Key` an answer takes: the request's hash, and what a retry replays.
pub(crate) struct AnswerKey<'a> {
    /// The key.
    pub key: &'a str,
    /// The hash of the request that takes it.
    pub hash: &'a str,
    /// What a retry with it is answered from.
    pub replay: Value,
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
    security(("bearer" = ["runs:create"])),
    params(
        ("workflow_id" = WorkflowId, Path, description = "The workflow (run)."),
        ("tool_call_id" = String, Path, description = "The tool call awaiting approval."),
    ),
    request_body = ApprovalRequest,
    responses(
        (status = 202, description = "The run, queued again.", body = WorkflowResponse),
        BadBody,
        Unauthenticated,
        MissingPermission,
        (status = 404, description = "`workflow_not_found`, `tool_call_not_found`, `not_found`", body = ErrorBody),
        (status = 409, description = "`run_not_waiting` (with `status`), `approval_expired`", body = ErrorBody),
        (status = 422, description = "`invalid_body`", body = ErrorBody),
    )
)]
pub(crate) async fn post_approval(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath((id, tool_call_id)): ApiPath<(WorkflowId, String)>,
    ApiJson(request): ApiJson<ApprovalRequest>,
) -> Result<(StatusCode, Json<WorkflowResponse>), ApiError> {
    caller.require(Permission::RunsCreate)?;
    let mut paused = Paused::lock(&state, &caller, id, RunStatus::AwaitingApproval).await?;
    // Only the approval presented has a deadline running, and the database clock judges it.
    let presented = matches!(&paused.run.pending_action,
        Some(action) if matches!(&action.0, PendingAction::Approval { tool_call_id: p, .. } if *p == tool_call_id));
    let expired = presented && runs::pause_expired(&mut *paused.tx, id).await?;
    let decided = paused
        .step
        .decide(&tool_call_id, request.approved, request.reason, expired);
    decided.map_err(|err| match err {
        DecideError::NotPending => ApiError::not_found("tool_call_not_found", err.to_string()),
        DecideError::Expired => ApiError::conflict("approval_expired", err.to_string()),
    })?;
    Ok(accepted(paused.resume(None).await?))
}

/// A paused run locked in its transaction, with the step it paused on.
struct Paused {
    tx: Transaction<'static, Postgres>,
    run: Run,
    /// The step's number.
    number: i32,
    /// The step, as the answer edits it.
    step: SavedStep,
}

impl Paused {
    /// Locks the caller's run (404 if it is not theirs) and its last step; 409 unless the run
    /// waits as `status` says.
    async fn lock(
        state: &AppState,
        caller: &Caller,
        id: WorkflowId,
        status: RunStatus,
    ) -> Result<Self, ApiError> {
        let mut tx = state.db.begin().await?;
        let run = runs::find_for_update(&mut *tx, id, &caller.owner)
            .await?
            .ok_or_else(workflow_not_found)?;
        if run.status != status {
            return Err(not_waiting(&run, status));
        }
        let step = steps::last_for_update(&mut *tx, id)
            .await?
            .ok_or_else(|| anyhow::anyhow!("a paused run without a saved step"))?;
        Ok(Self {
            tx,
            run,
            number: step.step,
            step: step.data.0,
        })
    }

    /// Saves the answered step, re-queues the run (with `overrides`, if given) and wakes a
    /// worker, in one commit; the run as that commit left it (a read after it could already
    /// find a worker's `running`).
    async fn resume(mut self, overrides: Option<&RunOverrides>) -> Result<Run, ApiError> {
        let id = self.run.id;
        steps::replace(&mut *self.tx, id, self.number, &self.step).await?;
        let Some(queued) = runs::resume(&mut *self.tx, id, self.run.status, overrides).await?
        else {
            return Err(not_waiting(&self.run, self.run.status));
        };
        db::notify_runs(&mut *self.tx).await?;
        self.tx.commit().await?;
        Ok(queued)
    }
}
