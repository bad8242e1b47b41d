//! The HTTP routes, one module per resource, each with its own `router()`.

pub mod agents;
pub mod health;
pub mod list;
pub mod threads;
pub mod usage;
pub mod webhooks;
pub mod workflows;

/// The path clients stream a thread's events from.
pub fn stream_url(thread_id: spool_shared::ThreadId) -> String {
    format!("/v1/threads/{thread_id}/stream")
}

/// The path of a workflow (run).
pub fn workflow_url(workflow_id: spool_shared::WorkflowId) -> String {
    format!("/v1/workflows/{workflow_id}")
}
