//! Waiting for a run to settle (end, or pause for someone): `GET /v1/workflows/{id}?wait=` and
//! the OpenAI-compatible routes' blocking creates. A wait holds no database connection: it
//! listens to the run's status changes through [`crate::watch`].

use tokio::sync::broadcast;

use spool_shared::WorkflowId;
use spool_shared::db::runs::{self, Run};
use spool_shared::status::RunStatus;

use super::workflow_not_found;
use crate::app::AppState;
use crate::auth::Caller;
use crate::error::ApiError;

/// The caller's run once it is terminal or paused, or at `deadline` as it is then (at once
/// without a deadline). Holds no database connection while it waits (see [`crate::watch`]).
pub(crate) async fn until_settled(
    state: &AppState,
    caller: &Caller,
    workflow_id: WorkflowId,
    deadline: Option<tokio::time::Instant>,
) -> Result<Run, ApiError> {
    // Subscribed before the first read: a change between the read and the wait is not missed.
    let mut changes = state.runs.subscribe();
    let _waiting = deadline.is_some().then(Waiting::start);
    let find = || async {
        runs::find_in(&state.db, workflow_id, caller.scope())
            .await?
            .ok_or_else(workflow_not_found)
    };
    let Some(deadline) = deadline else {
        return find().await;
    };
    let mut run = runs::watch(&state.db, workflow_id, caller.scope())
        .await?
        .ok_or_else(workflow_not_found)?;
    while !settled(run.status) {
        tokio::select! {
            change = changes.recv() => match change {
                Ok(Some(id)) if id != workflow_id => continue,
                // Its change, a lost LISTEN connection, or a lag: read it again.
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => run = find().await?,
                Err(broadcast::error::RecvError::Closed) => {
                    tokio::time::sleep_until(deadline).await;
                    return find().await;
                }
            },
            () = tokio::time::sleep_until(deadline) => break,
            () = state.shutdown.cancelled() => break,
        }
    }
    if !settled(run.status) {
        run = find().await?;
    }
    Ok(run)
}

/// Counts a `?wait=` request in `spool_workflow_waits` while it lives.
struct Waiting;

impl Waiting {
    fn start() -> Self {
        metrics::gauge!("spool_workflow_waits").increment(1);
        Self
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        metrics::gauge!("spool_workflow_waits").decrement(1);
    }
}

/// Whether a `?wait=` is over: the run has ended or waits for someone.
pub(crate) fn settled(status: RunStatus) -> bool {
    status.is_terminal()
        || matches!(
            status,
            RunStatus::RequiresAction | RunStatus::AwaitingApproval
        )
}
