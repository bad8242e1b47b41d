//! `GET /v1/workflows/{workflow_id}/steps`: what an agent did, from Postgres, long after the
//! stream is gone: each step's model call, its tool calls with their arguments, results,
//! timings and the attempt that ran them, and every pause and decision, in order. Step payloads
//! expire `SPOOL_RETENTION_STEPS_DAYS` after the run ended; the answer then says so
//! (`steps_expired_at`) rather than looking like a run that saved no step.
//!
//! A page at a time (`?limit=`, `?cursor=`), and with `?results=cut` each result longer than
//! [`CUT_RESULT_CHARS`] cut with a marker: a run of 200 steps with many calls of 50,000
//! characters each is otherwise one answer of hundreds of megabytes (review B-L11).

use axum::Json;
use axum::extract::State;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use spool_shared::WorkflowId;
use spool_shared::citation::Source;
use spool_shared::db::runs;
use spool_shared::db::steps::{self, CallResult, CallState, Decision, ModelCall, Step};
use spool_shared::run::{PendingAction, Usage};
use spool_shared::status::RunStatus;

use crate::app::AppState;
use crate::auth::{Caller, Permission};
use crate::error::{ApiError, ErrorBody, MissingPermission, Unauthenticated};
use crate::extract::{ApiPath, ApiQuery};
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
    /// This page of its steps, in order (empty once they expired).
    pub steps: Vec<TimelineStep>,
    /// When retention deleted its steps (`SPOOL_RETENTION_STEPS_DAYS` after the run ended);
    /// `null` while they are kept.
    pub steps_expired_at: Option<DateTime<Utc>>,
    /// The `cursor` of the next page; `null` on the last.
    pub next_cursor: Option<String>,
}

/// Steps per page by default.
pub const DEFAULT_STEPS: i64 = 50;
/// Steps per page at most (a run's `max_steps` is at most 200).
pub const MAX_STEPS: i64 = 200;
/// The characters of a result `?results=cut` keeps.
pub const CUT_RESULT_CHARS: usize = 2_000;

/// How results are shown.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Results {
    /// Whole.
    #[default]
    Full,
    /// Each longer than 2,000 characters cut to them, with `… [cut: N more characters]`.
    Cut,
}

/// The query of `GET /v1/workflows/{id}/steps`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct StepsQuery {
    /// Steps per page (1 to 200, default 50).
    #[serde(default)]
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<i64>,
    /// The previous page's `next_cursor`.
    #[serde(default)]
    pub cursor: Option<String>,
    /// `full` (the default) or `cut`.
    #[serde(default)]
    pub results: Results,
}

impl StepsQuery {
    /// The page's size and the step it starts after; a 422 with a code for a bad one.
    fn page(&self) -> Result<(i64, i32), ApiError> {
        let limit = self.limit.unwrap_or(DEFAULT_STEPS);
        if !(1..=MAX_STEPS).contains(&limit) {
            return Err(ApiError::unprocessable(
                "invalid_limit",
                format!("limit must be between 1 and {MAX_STEPS}"),
            ));
        }
        let after = match &self.cursor {
            None => 0,
            Some(cursor) => cursor
                .parse::<i32>()
                .ok()
                .filter(|after| *after >= 1)
                .ok_or_else(|| {
                    ApiError::unprocessable(
                        "invalid_cursor",
                        "cursor must be the next_cursor of a previous page",
                    )
                })?,
        };
        Ok((limit, after))
    }
}

/// `result` cut to [`CUT_RESULT_CHARS`] characters with a marker saying how many were left out.
fn cut(result: String) -> String {
    match result.char_indices().nth(CUT_RESULT_CHARS) {
        None => result,
        Some((at, _)) => {
            let left_out = result[at..].chars().count();
            format!("{}… [cut: {left_out} more characters]", &result[..at])
        }
    }
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
    /// The chunks of its retrieval results, numbered for the model (`[n]`, counted over the
    /// run); what the answer cites is the message's `citations` part.
    pub sources: Vec<Source>,
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
            sources: saved.sources,
            settled,
        }
    }
}

/// The run's durable timeline: a page of its steps, in order.
#[utoipa::path(
    get,
    path = "/v1/workflows/{workflow_id}/steps",
    tag = "workflows",
    security(("bearer" = ["runs:create"]), ("bearer" = ["runs:read:tenant"])),
    params(("workflow_id" = WorkflowId, Path, description = "The workflow (run)."), StepsQuery),
    responses(
        (status = 200, description = "A page of the timeline.", body = StepsResponse),
        Unauthenticated,
        MissingPermission,
        (status = 404, description = "`workflow_not_found`, `not_found`", body = ErrorBody),
        (status = 422, description = "`invalid_limit`, `invalid_cursor`, `invalid_query`", body = ErrorBody),
    )
)]
pub(crate) async fn get_steps(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(workflow_id): ApiPath<WorkflowId>,
    ApiQuery(query): ApiQuery<StepsQuery>,
) -> Result<Json<StepsResponse>, ApiError> {
    caller.require_any(Permission::RUNS_READ)?;
    let (limit, after) = query.page()?;
    let run = runs::find_in(&state.db, workflow_id, caller.scope())
        .await?
        .ok_or_else(workflow_not_found)?;
    let size = usize::try_from(limit).unwrap_or(usize::MAX);
    let mut saved = steps::page(&state.db, workflow_id, after, limit + 1).await?;
    let mut more = saved.len() > size;
    saved.truncate(size);
    let mut steps: Vec<TimelineStep> = saved.into_iter().map(TimelineStep::from).collect();
    // The step that answered is kept on the run, after the others: on the page that reaches
    // the end of the saved ones.
    if !more && let Some(last) = runs::final_step(&state.db, workflow_id).await? {
        let number = steps::last_number(&state.db, workflow_id).await? + 1;
        if number > after {
            if steps.len() < size {
                let step = Step {
                    step: number,
                    attempt: run.attempt,
                    created_at: run.finished_at.unwrap_or(run.updated_at),
                    data: sqlx::types::Json(last),
                };
                steps.push(step.into());
            } else {
                more = true;
            }
        }
    }
    // Only a run with no step left can have had them expire (seen on its first page).
    let steps_expired_at = match steps.is_empty() && after == 0 {
        true => steps::expired_at(&state.db, workflow_id).await?,
        false => None,
    };
    if query.results == Results::Cut {
        for call in steps.iter_mut().flat_map(|s| s.tool_calls.iter_mut()) {
            call.result = call.result.take().map(cut);
        }
    }
    let next_cursor = more
        .then(|| steps.last().map(|s| s.step.to_string()))
        .flatten();
    Ok(Json(StepsResponse {
        workflow_id,
        status: run.status,
        pending_action: run.pending_action.map(|a| a.0),
        steps,
        steps_expired_at,
        next_cursor,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_result_is_cut_on_a_character_boundary_with_a_marker() {
        assert_eq!(cut("short".into()), "short");
        let exact = "é".repeat(CUT_RESULT_CHARS);
        assert_eq!(cut(exact.clone()), exact);
        let long = "é".repeat(CUT_RESULT_CHARS + 7);
        assert_eq!(
            cut(long),
            format!("{}… [cut: 7 more characters]", "é".repeat(CUT_RESULT_CHARS))
        );
    }
}
