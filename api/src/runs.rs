//! What the API does to runs, whichever surface asks: Spool's own routes and the
//! OpenAI-compatible ones call the same operations, so each rule (invariant 1's commit, the
//! cancel cascade, erasure's order) has one home.
//!
//! - [`enqueue`]: a user message and the run that answers it.
//! - [`wait`]: a run, once it ends or pauses.
//! - [`cancel`]: a run and the agent runs it started.
//! - [`erase`]: a thread and everything of it.

pub mod cancel;
pub mod enqueue;
pub mod erase;
pub mod wait;

use spool_shared::db::runs::{self, Run};
use spool_shared::{ThreadId, WorkflowId};

use crate::app::AppState;
use crate::auth::Caller;
use crate::error::ApiError;

/// The path clients stream a thread's events from.
pub fn stream_url(thread_id: ThreadId) -> String {
    format!("/v1/threads/{thread_id}/stream")
}

/// The path of a workflow (run).
pub fn workflow_url(workflow_id: WorkflowId) -> String {
    format!("/v1/workflows/{workflow_id}")
}

/// 404 `thread_not_found`.
pub(crate) fn thread_not_found() -> ApiError {
    ApiError::not_found("thread_not_found", "no such thread")
}

/// 404 `workflow_not_found`.
pub(crate) fn workflow_not_found() -> ApiError {
    ApiError::not_found("workflow_not_found", "no such workflow")
}

/// The caller's run, as it is now.
pub(crate) async fn find_own(
    state: &AppState,
    id: WorkflowId,
    caller: &Caller,
) -> Result<Run, ApiError> {
    runs::find(&state.db, id, &caller.owner)
        .await?
        .ok_or_else(workflow_not_found)
}
