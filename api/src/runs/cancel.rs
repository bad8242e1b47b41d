//! Cancelling a run and the agent runs it started: `POST /v1/workflows/{id}/cancel` and the
//! OpenAI-compatible cancel. A run no worker holds is ended here (its quota room given back,
//! its stream ended); a held one is told through `NOTIFY` and its worker ends it. A tree of
//! agent runs ends from the deepest up, so every run ends after its children.

use spool_shared::WorkflowId;
use spool_shared::db;
use spool_shared::db::runs::{self, Run};
use spool_shared::event::{MessageEnd, MessageStart, Origin, end_of_message};
use spool_shared::run::Usage;
use spool_shared::status::RunStatus;
use spool_shared::stream;

use super::find_own;
use crate::app::AppState;
use crate::auth::Caller;
use crate::error::ApiError;

/// Cancels the caller's run (`POST /v1/workflows/{id}/cancel`) and returns it as it is then.
pub(crate) async fn cancel(
    state: &AppState,
    caller: &Caller,
    id: WorkflowId,
    reason: Option<&str>,
) -> Result<Run, ApiError> {
    let status = runs::request_cancel(&state.db, id, &caller.owner, reason).await?;
    let run = find_own(state, id, caller).await?;
    let Some(status) = status else {
        return Ok(run);
    };
    // The agent runs it started, deepest first. A run waiting for a child that a worker
    // holds is not ended here: the child's end re-queues it, and the worker that claims it
    // finds the cancel request and ends it, so every run of the tree ends after its children
    // (and the thread's stream ends with the parent's `done`).
    let mut held_below = std::collections::HashSet::new();
    for child in runs::active_descendants(&state.db, id).await? {
        let Some(child_status) =
            runs::request_cancel(&state.db, child.id, &caller.owner, reason).await?
        else {
            continue;
        };
        let ended =
            !held_below.contains(&child.id) && end_cancelled(state, &child, child_status).await?;
        if !ended && let Some(parent) = child.parent_workflow_id {
            held_below.insert(parent);
        }
    }
    if held_below.contains(&id) {
        tracing::info!(workflow.id = %id, "cancel requested; ends after its agent runs");
    } else {
        end_cancelled(state, &run, status).await?;
        tracing::info!(workflow.id = %id, "cancel requested");
    }
    find_own(state, id, caller).await
}

/// Ends a run whose cancel was just requested: one no worker holds is cancelled here, and its
/// stream ended (`true`); a worker holding it hears it, and ends it (`false`).
async fn end_cancelled(state: &AppState, run: &Run, status: RunStatus) -> Result<bool, ApiError> {
    // Not running: cancelled here, unless a worker claimed it in between (it sees the
    // request as it starts).
    if status != RunStatus::Running
        && let Some(attempt) = runs::cancel_unclaimed(&state.db, run.id).await?
    {
        // Its room in its quotas goes back (a worker's end of a run does the same).
        if let Some(quota) = &run.quota {
            state.admission.release(&run.tenant_id, run.id, quota).await;
        }
        publish_cancelled(state, run, attempt).await;
        return Ok(true);
    }
    db::notify_cancel(&state.db, run.id).await?;
    Ok(false)
}

/// Ends the stream of a run cancelled without a worker (best effort: with Redis down, the
/// gateway's followers learn from Postgres that the run is over).
async fn publish_cancelled(state: &AppState, run: &Run, attempt: i32) {
    let origin = Origin::of(run, attempt);
    let end = MessageEnd {
        status: RunStatus::Cancelled,
        usage: Usage::default(),
        blocked: false,
        output: None,
    };
    let events: Vec<_> = std::iter::once(MessageStart::new(None).into())
        .chain(end_of_message(end, None))
        .map(|data| origin.event(data))
        .collect();
    let mut conn = state.streams.conn();
    let id = uuid::Uuid::new_v4().simple().to_string();
    let batch = stream::Batch {
        thread: run.thread_id,
        workflow: run.id,
        attempt,
        id: &id,
        previous: None,
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
