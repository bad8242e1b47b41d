//! The user's answer to a graph agent's `human_input` node (`POST /v1/workflows/{id}/input`).
//!
//! One transaction, as for the other answers to a pause (`super::pauses`): the run is locked,
//! the step it waits on is answered through [`SavedStep::answer_input`], and the run is
//! re-queued with a NOTIFY; the next attempt takes the answer as the node's output and goes on.
//! A run that is not waiting for input (answered already, cancelled, waiting for something
//! else, never paused) is a 409 `not_waiting_for_input`.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;

use spool_shared::WorkflowId;
use spool_shared::db::steps::{self, SavedStep};
use spool_shared::db::{self, runs};
use spool_shared::status::RunStatus;

use super::{WorkflowResponse, accepted};
use crate::app::AppState;
use crate::auth::{Caller, Permission};
use crate::error::{ApiError, BadBody, ErrorBody, MissingPermission, Unauthenticated};
use crate::extract::{ApiJson, ApiPath};
use crate::runs::workflow_not_found;

/// Longest answer, in bytes (the limit of a message's `input_text`).
const MAX_INPUT_BYTES: usize = 32 * 1024;

/// Body of `POST .../input`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InputRequest {
    /// The answer: the `human_input` node's output.
    #[schema(max_length = 32768)]
    pub text: String,
}

/// Answers the `human_input` node a graph agent's run waits on, and re-queues the run.
#[utoipa::path(
    post,
    path = "/v1/workflows/{workflow_id}/input",
    tag = "workflows",
    security(("bearer" = ["runs:create"])),
    params(("workflow_id" = WorkflowId, Path, description = "The workflow (run).")),
    request_body = InputRequest,
    responses(
        (status = 202, description = "The run, queued again.", body = WorkflowResponse),
        BadBody,
        Unauthenticated,
        MissingPermission,
        (status = 404, description = "`workflow_not_found`, `not_found`", body = ErrorBody),
        (status = 409, description = "`not_waiting_for_input`, with the run's `status`", body = ErrorBody),
        (status = 422, description = "`invalid_body` (a `text` over 32 KiB included)", body = ErrorBody),
    )
)]
pub(crate) async fn post_input(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<WorkflowId>,
    ApiJson(request): ApiJson<InputRequest>,
) -> Result<(StatusCode, Json<WorkflowResponse>), ApiError> {
    caller.require(Permission::RunsCreate)?;
    if request.text.len() > MAX_INPUT_BYTES {
        return Err(ApiError::unprocessable(
            "invalid_body",
            format!("`text` must be at most {MAX_INPUT_BYTES} bytes"),
        ));
    }
    let mut tx = state.db.begin().await?;
    let run = runs::find_for_update(&mut *tx, id, &caller.owner)
        .await?
        .ok_or_else(workflow_not_found)?;
    let not_waiting = || {
        ApiError::conflict(
            "not_waiting_for_input",
            format!("the run is {}, not waiting for input", run.status.as_str()),
        )
        .with("status", run.status)
    };
    if run.status != RunStatus::RequiresAction {
        return Err(not_waiting());
    }
    let Some(step) = steps::last_for_update(&mut *tx, id).await? else {
        return Err(not_waiting());
    };
    let mut data: SavedStep = step.data.0;
    if !data.answer_input(&request.text) {
        return Err(not_waiting());
    }
    steps::replace(&mut *tx, id, step.step, &data).await?;
    let Some(queued) = runs::resume(&mut *tx, id, RunStatus::RequiresAction, None).await? else {
        return Err(not_waiting());
    };
    db::notify_runs(&mut *tx).await?;
    tx.commit().await?;
    // The run as this transaction left it: a read after the commit may find a worker on it.
    Ok(accepted(queued))
}
