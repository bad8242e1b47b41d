//! Child runs: agents called as tools.
//!
//! An agent tool call starts a child run of the called agent on the parent's thread, one level
//! deeper, under the parent's trace and its root's quota counters (concurrency and token
//! budgets); the parent waits for its children without a worker (`waiting`), until they have
//! all ended or its own time limit passes. The parent's attempt starts them in the transaction of its
//! fenced wait ([`Claimed::wait_for_children`](super::Claimed::wait_for_children), with the
//! claim's other fenced writes), the migration's `runs_child_ended` trigger re-queues the
//! parent when its last child ends, and its next attempt reads how they ended ([`children`]).
//! The API's cancel walks the tree below a run ([`active_descendants`]).
//!
//! What must stay true: a child is inserted only with its parent's fenced wait, so a crash
//! leaves either the step unsettled with no child or every child started; the wait counts the
//! root's tree under the root's row lock, so runs of one tree starting children at once never
//! take it past `limits.max_tree_runs`; a child's messages carry its depth, so thread listings
//! and later turns' history leave them out.

use serde_json::Value;
use sqlx::PgExecutor;
use sqlx::types::Json;

use super::{Run, columns};
use crate::agent::AgentSpec;
use crate::db;
use crate::ids::{AgentId, MessageId, WorkflowId};
use crate::quota::RunQuota;
use crate::run::RunFailure;
use crate::status::RunStatus;

/// A child run an agent tool call starts: the agent, its spec as the call found it, and the
/// call's input as the child's user message.
#[derive(Clone, Debug)]
pub struct NewChild<'a> {
    /// The child's workflow id.
    pub id: WorkflowId,
    /// The call that starts it.
    pub tool_call_id: &'a str,
    /// The agent that answers.
    pub agent_id: AgentId,
    /// Its spec, which the child executes whatever happens to the agent later.
    pub agent_spec: &'a AgentSpec,
    /// The call's `input`: the child's user message.
    pub input: &'a str,
    /// The W3C traceparent its attempts join (the parent attempt's span: one trace covers
    /// the tree); `None`: the parent's own.
    pub trace_context: Option<&'a str>,
}

/// What a wait on child runs found.
#[must_use = "a wait that did not happen must end the attempt"]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// The children were started; the run waits for them without a worker.
    Waiting,
    /// Nothing was written: a cancel was requested; the attempt must end the run as cancelled.
    CancelRequested,
    /// Nothing was written: the lease is lost.
    Lost,
    /// Nothing was written: the root's tree holds this many runs already (counted under the
    /// root's lock), too many to add the children within its bound. Another run of the tree
    /// started children since the attempt counted; it must count again.
    TreeFull(u32),
}

/// What a wait for child runs must keep within: the tree the children join, and the waiting
/// run's own time limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitBounds {
    /// The tree's root run (the run itself when it is a thread's own run).
    pub root: WorkflowId,
    /// The most runs the tree may hold below its root (`limits.max_tree_runs`).
    pub max_tree_runs: u32,
    /// The waiting run's time limit, in seconds from its enqueue (`limits.timeout_secs`): its
    /// wait's deadline. `None`: it waits until its last child ends.
    pub time_limit_secs: Option<u32>,
}

/// The root of the tree of agent calls `run` belongs to (the run itself when it has no
/// parent): at most `max_call_depth` (10) steps up.
pub async fn root_of(executor: impl PgExecutor<'_>, run: WorkflowId) -> sqlx::Result<WorkflowId> {
    sqlx::query_scalar(
        "WITH RECURSIVE up (id, parent) AS (
             SELECT id, parent_workflow_id FROM runs WHERE id = $1
             UNION ALL
             SELECT r.id, r.parent_workflow_id FROM runs r JOIN up ON r.id = up.parent)
         SELECT id FROM up WHERE parent IS NULL",
    )
    .bind(run)
    .fetch_one(executor)
    .await
}

/// How many runs the tree below `root` holds, whatever their status (a bound on what one root
/// run starts, not on what runs at once).
pub async fn tree_size(executor: impl PgExecutor<'_>, root: WorkflowId) -> sqlx::Result<u32> {
    let count: i64 = sqlx::query_scalar(
        "WITH RECURSIVE tree (id) AS (
             SELECT id FROM runs WHERE parent_workflow_id = $1
             UNION ALL
             SELECT r.id FROM runs r JOIN tree t ON r.parent_workflow_id = t.id)
         SELECT count(*) FROM tree",
    )
    .bind(root)
    .fetch_one(executor)
    .await?;
    Ok(u32::try_from(count).unwrap_or(u32::MAX))
}

/// Inserts a child run of `parent` with its user message (the input) and its queued assistant
/// message, both marked with the child's depth (thread listings and later turns' history
/// leave them out).
pub(super) async fn insert_child(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    parent: &Run,
    child: &NewChild<'_>,
    quota: Option<&RunQuota>,
) -> sqlx::Result<()> {
    let depth = parent.depth.saturating_add(1);
    let (user_message, assistant_message) = (MessageId::new(), MessageId::new());
    sqlx::query(
        "INSERT INTO messages (id, thread_id, role, content, status, workflow_id, depth)
         VALUES ($1, $3, 'user', $4, 'completed', $5, $6),
                ($2, $3, 'assistant', '', 'queued', $5, $6)",
    )
    .bind(user_message)
    .bind(assistant_message)
    .bind(parent.thread_id)
    .bind(db::storable_text(child.input))
    .bind(child.id)
    .bind(depth)
    .execute(&mut **tx)
    .await?;
    sqlx::query(
        "INSERT INTO runs (id, thread_id, tenant_id, owner_id, agent_id, user_message_id,
                           assistant_message_id, trace_context, agent_spec, quota,
                           parent_workflow_id, parent_tool_call_id, depth)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
    )
    .bind(child.id)
    .bind(parent.thread_id)
    .bind(&parent.tenant_id)
    .bind(&parent.owner_id)
    .bind(child.agent_id)
    .bind(user_message)
    .bind(assistant_message)
    .bind(child.trace_context.or(parent.trace_context.as_deref()))
    .bind(Json(child.agent_spec))
    .bind(quota.map(Json))
    .bind(parent.id)
    .bind(child.tool_call_id)
    .bind(depth)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// How a child run ended, as its parent's next attempt reads it.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct ChildEnd {
    /// The child.
    pub id: WorkflowId,
    /// Its status (terminal once the parent is re-queued).
    pub status: RunStatus,
    /// Why it failed.
    pub error: Option<Json<RunFailure>>,
    /// Its final text.
    pub content: String,
    /// Its structured answer, when its agent has a `response_format`.
    pub output: Option<Json<Value>>,
}

/// The child runs of `parent` with how they stand and their messages' text.
pub async fn children(
    executor: impl PgExecutor<'_>,
    parent: WorkflowId,
) -> sqlx::Result<Vec<ChildEnd>> {
    sqlx::query_as(
        "SELECT r.id, r.status, r.error, m.content, m.output
           FROM runs r JOIN messages m ON m.id = r.assistant_message_id
          WHERE r.parent_workflow_id = $1",
    )
    .bind(parent)
    .fetch_all(executor)
    .await
}

/// The runs in the tree of agent calls below `root` that have not ended, deepest first.
pub async fn active_descendants(
    executor: impl PgExecutor<'_>,
    root: WorkflowId,
) -> sqlx::Result<Vec<Run>> {
    sqlx::query_as(concat!(
        "WITH RECURSIVE tree (id) AS (
             SELECT id FROM runs WHERE parent_workflow_id = $1
             UNION ALL
             SELECT r.id FROM runs r JOIN tree t ON r.parent_workflow_id = t.id)
         SELECT ",
        columns!("r."),
        " FROM runs r JOIN tree t ON t.id = r.id
          WHERE r.status NOT IN ('completed', 'failed', 'cancelled')
          ORDER BY r.depth DESC, r.created_at"
    ))
    .bind(root)
    .fetch_all(executor)
    .await
}
