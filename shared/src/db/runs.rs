//! Runs: the durable jobs, as the API reads and changes them.
//!
//! A run is a row of `runs` ([`Run`]); its queue protocol and its child runs have files of
//! their own:
//!
//! | what | where |
//! |---|---|
//! | the row, the enqueue insert, reads and lists for the API, the API's transitions | here |
//! | the claim, the lease, and every write of the attempt that holds a run ([`Claimed`]) | [`claim`](mod@claim) |
//! | child runs: agents called as tools | [`children`](mod@children) |
//!
//! Their items are re-exported here, so callers name one module (`runs::Claimed`,
//! `runs::NewChild`).
//!
//! What must stay true:
//! - A worker writes to a run only through the [`Claimed`] handle of its attempt, and every
//!   such write says `WHERE id = $1 AND attempt = $2`: a reclaimed attempt's writes change
//!   nothing ([`claim`](mod@claim) explains the fence).
//! - The API's writes (`resume`, `request_cancel`, `cancel_unclaimed`) touch only runs no
//!   worker holds, or only the cancel request, and are scoped by the owner; every status change
//!   is guarded by the current status, so a terminal run never changes again.

mod children;
mod claim;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgExecutor;
use sqlx::types::Json;

use crate::agent::{AgentSpec, RunOverrides};
use crate::db::page::{self, Cursor, Page, Scope};
use crate::db::steps::SavedStep;
use crate::db::threads::Owner;
use crate::ids::{AgentId, MessageId, ThreadId, WorkflowId};
use crate::quota::RunQuota;
use crate::run::{PendingAction, RunFailure, Usage};
use crate::status::RunStatus;

pub use children::{
    ChildEnd, NewChild, Wait, WaitBounds, active_descendants, children, root_of, tree_size,
};
pub use claim::{Claimed, Fence, Outcome, Pause, Renewed, claim, heartbeat, pause_expired};

/// The name of the unique index that allows one active run per thread.
pub const ONE_ACTIVE_PER_THREAD: &str = "runs_one_active_per_thread";

/// A run as stored.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct Run {
    /// The workflow id clients see.
    pub id: WorkflowId,
    /// Its thread.
    pub thread_id: ThreadId,
    /// The tenant that owns the thread.
    pub tenant_id: String,
    /// The user that owns the thread.
    pub owner_id: String,
    /// The agent that answers; `None` is the configured default.
    pub agent_id: Option<AgentId>,
    /// The message that started it.
    pub user_message_id: MessageId,
    /// The assistant message it produces.
    pub assistant_message_id: MessageId,
    /// Where it is in its life.
    pub status: RunStatus,
    /// The fencing token: how many times it has been claimed.
    pub attempt: i32,
    /// How many claims took it from a worker whose lease had expired.
    pub reclaims: i32,
    /// The worker holding the lease (after the run ends: the last one that held it).
    pub lease_owner: Option<String>,
    /// When the lease runs out (database clock).
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// The last renewal.
    pub heartbeat_at: Option<DateTime<Utc>>,
    /// When cancellation was asked for.
    pub cancel_requested_at: Option<DateTime<Utc>>,
    /// Why a failed run failed.
    pub error: Option<Json<RunFailure>>,
    /// Token usage.
    pub usage: Option<Json<Usage>>,
    /// W3C traceparent of the request that enqueued it.
    pub trace_context: Option<String>,
    /// When it was enqueued.
    pub created_at: DateTime<Utc>,
    /// When it was first claimed.
    pub started_at: Option<DateTime<Utc>>,
    /// When it reached a terminal status.
    pub finished_at: Option<DateTime<Utc>>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
    /// What a paused run waits for.
    pub pending_action: Option<Json<PendingAction>>,
    /// When the pause runs out (database clock): an unanswered approval counts as denied,
    /// missing client tool outputs fail the run (`human_timeout`).
    pub pause_expires_at: Option<DateTime<Utc>>,
    /// Whether the next attempt continues after a pause (rather than after a crash).
    pub resumed: bool,
    /// Overrides given with tool outputs.
    pub overrides: Option<Json<RunOverrides>>,
    /// Why cancellation was asked for.
    pub cancel_reason: Option<String>,
    /// Who asked for cancellation.
    pub cancelled_by: Option<String>,
    /// When it last became claimable.
    pub queued_at: DateTime<Utc>,
    /// The agent's spec as it was at enqueue (`None`: the worker's default agent).
    pub agent_spec: Option<Json<AgentSpec>>,
    /// The quota counters it was admitted against (`None`: no quota applied).
    pub quota: Option<Json<RunQuota>>,
    /// The run whose agent tool call started it (agents as tools), if any.
    pub parent_workflow_id: Option<WorkflowId>,
    /// That call's id.
    pub parent_tool_call_id: Option<String>,
    /// How deep it is in a tree of agent calls (0: the thread's own run).
    pub depth: i16,
}

// One list for every statement that returns whole runs (`r.`-prefixed where a join needs it).
#[rustfmt::skip]
macro_rules! columns {
    ("") => {
        "id, thread_id, tenant_id, owner_id, agent_id, user_message_id, assistant_message_id, \
         status, attempt, reclaims, lease_owner, lease_expires_at, heartbeat_at, \
         cancel_requested_at, error, usage, trace_context, created_at, started_at, finished_at, \
         updated_at, pending_action, pause_expires_at, resumed, overrides, cancel_reason, \
         cancelled_by, queued_at, agent_spec, quota, parent_workflow_id, parent_tool_call_id, \
         depth"
    };
    ("r.") => {
        "r.id, r.thread_id, r.tenant_id, r.owner_id, r.agent_id, r.user_message_id, \
         r.assistant_message_id, r.status, r.attempt, r.reclaims, r.lease_owner, \
         r.lease_expires_at, r.heartbeat_at, r.cancel_requested_at, r.error, r.usage, \
         r.trace_context, r.created_at, r.started_at, r.finished_at, r.updated_at, \
         r.pending_action, r.pause_expires_at, r.resumed, r.overrides, r.cancel_reason, \
         r.cancelled_by, r.queued_at, r.agent_spec, r.quota, r.parent_workflow_id, \
         r.parent_tool_call_id, r.depth"
    };
}
use columns;

/// What a new run is made of.
#[derive(Clone, Debug)]
pub struct NewRun<'a> {
    /// The workflow id.
    pub id: WorkflowId,
    /// Its thread.
    pub thread_id: ThreadId,
    /// The thread's owner.
    pub owner: &'a Owner,
    /// The agent that answers.
    pub agent_id: Option<AgentId>,
    /// Its spec, which the run executes whatever happens to the agent later.
    pub agent_spec: Option<&'a AgentSpec>,
    /// The message that starts it.
    pub user_message_id: MessageId,
    /// The assistant message it will produce.
    pub assistant_message_id: MessageId,
    /// The request's Idempotency-Key, if any.
    pub idempotency_key: Option<&'a str>,
    /// The request's W3C traceparent, if any.
    pub trace_context: Option<&'a str>,
    /// The quota counters it is admitted against, if any.
    pub quota: Option<&'a RunQuota>,
    /// What its message posted to steer it (`user_message` overrides), if anything.
    pub overrides: Option<&'a RunOverrides>,
}

/// Inserts a turn in one statement, if the thread takes it: the thread on first use (for the
/// owner, answered by `thread_agent`, the agent the message names), or else the owner's thread,
/// which must not be erased and, when the message names no agent, must be answered by the run's
/// agent (the one whose spec the run carries); then the user message (`input`, completed, with
/// `metadata`), the assistant message that will stream (empty, queued) and the queued run that
/// answers. The caller wakes the workers once it has committed (the API's `wake` task; see
/// [`crate::db::enqueue`]): a NOTIFY here would make Postgres commit enqueues one at a time.
/// Returns `false`, with nothing inserted, when the thread does not take it (someone else's,
/// erased, or answered by another agent than the run's). The two messages are one `INSERT`, the user's first, so it
/// has the lower `seq`. Fails with a unique violation of [`ONE_ACTIVE_PER_THREAD`] if the
/// thread already has an active run (nothing is inserted).
///
/// The thread is an upsert: it either inserts the row or locks the existing one and touches it
/// only if it takes the message. `ON CONFLICT DO UPDATE` sees the latest committed row, so a
/// client racing itself onto a new thread gets the busy rule's violation, not a `false`, and a
/// message racing the thread's erasure waits for it and gets `false`.
pub async fn insert_with_thread(
    executor: impl PgExecutor<'_>,
    run: &NewRun<'_>,
    thread_agent: Option<AgentId>,
    input: &str,
    metadata: &Value,
) -> sqlx::Result<bool> {
    let row = sqlx::query(
        "WITH thread AS (
             INSERT INTO threads AS t (id, tenant_id, owner_id, agent_id, last_message_at)
             VALUES ($2, $3, $4, $15, now())
             ON CONFLICT (id) DO UPDATE SET last_message_at = now()
              WHERE t.tenant_id = $3 AND t.owner_id = $4 AND t.erased_at IS NULL
                AND ($15::uuid IS NOT NULL OR t.agent_id IS NOT DISTINCT FROM $5::uuid)
             RETURNING t.id),
         turn AS (
             INSERT INTO messages (id, thread_id, role, content, status, metadata, workflow_id)
             SELECT m.id, thread.id, m.role, m.content, m.status, m.metadata, $1
               FROM thread,
                    (VALUES (1, $6::uuid, 'user', $13::text, 'completed', $14::jsonb),
                            (2, $7::uuid, 'assistant', '', 'queued', '{}'::jsonb))
                      AS m (turn, id, role, content, status, metadata)
              ORDER BY m.turn),
         run AS (
             INSERT INTO runs (id, thread_id, tenant_id, owner_id, agent_id, user_message_id,
                               assistant_message_id, idempotency_key, trace_context,
                               agent_spec, quota, overrides)
             SELECT $1, thread.id, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12 FROM thread)
         SELECT true FROM thread",
    )
    .bind(run.id)
    .bind(run.thread_id)
    .bind(&run.owner.tenant_id)
    .bind(&run.owner.user_id)
    .bind(run.agent_id)
    .bind(run.user_message_id)
    .bind(run.assistant_message_id)
    .bind(run.idempotency_key)
    .bind(run.trace_context)
    .bind(run.agent_spec.map(Json))
    .bind(run.quota.map(Json))
    .bind(run.overrides.map(Json))
    .bind(input)
    .bind(Json(metadata))
    .bind(thread_agent)
    .fetch_optional(executor)
    .await?;
    Ok(row.is_some())
}

// The owner's run by id.
macro_rules! find_owned {
    () => {
        concat!(
            "SELECT ",
            columns!(""),
            " FROM runs WHERE id = $1 AND tenant_id = $2 AND owner_id = $3"
        )
    };
}

/// The owner's run, or `None` if it does not exist or is someone else's.
pub async fn find(
    executor: impl PgExecutor<'_>,
    id: WorkflowId,
    owner: &Owner,
) -> sqlx::Result<Option<Run>> {
    find_with(executor, find_owned!(), id, owner).await
}

/// The owner's run locked for an update, if it exists.
pub async fn find_for_update(
    executor: impl PgExecutor<'_>,
    id: WorkflowId,
    owner: &Owner,
) -> sqlx::Result<Option<Run>> {
    find_with(executor, concat!(find_owned!(), " FOR UPDATE"), id, owner).await
}

async fn find_with(
    executor: impl PgExecutor<'_>,
    sql: &'static str,
    id: WorkflowId,
    owner: &Owner,
) -> sqlx::Result<Option<Run>> {
    sqlx::query_as(sql)
        .bind(id)
        .bind(&owner.tenant_id)
        .bind(&owner.user_id)
        .fetch_optional(executor)
        .await
}

/// The run in `scope` (the owner's, or for an admin the tenant's), if it exists.
pub async fn find_in(
    executor: impl PgExecutor<'_>,
    id: WorkflowId,
    scope: Scope<'_>,
) -> sqlx::Result<Option<Run>> {
    let mut query = sqlx::QueryBuilder::new(concat!(
        "SELECT ",
        columns!("r."),
        " FROM runs r WHERE r.id = "
    ));
    query.push_bind(id);
    scope.push(&mut query, "r");
    query.build_query_as().fetch_optional(executor).await
}

/// Marks the run in `scope` as waited on (its end or pause is then NOTIFYed on
/// `spool_run_status`) and returns it as it is, if it exists. The mark is one UPDATE returning
/// the row: a run ending at the same moment either sees the mark (and notifies) or is returned
/// ended. A run marked before (a committed mark any later end sees) is only read, so a client
/// polling `?wait=` does not write a row version per request.
pub async fn watch(
    executor: &sqlx::PgPool,
    id: WorkflowId,
    scope: Scope<'_>,
) -> sqlx::Result<Option<Run>> {
    let mut query = sqlx::QueryBuilder::new("UPDATE runs r SET watched = true WHERE r.id = ");
    query.push_bind(id);
    scope.push(&mut query, "r");
    query.push(concat!(" AND NOT r.watched RETURNING ", columns!("r.")));
    let marked: Option<Run> = query.build_query_as().fetch_optional(executor).await?;
    match marked {
        Some(run) => Ok(Some(run)),
        None => find_in(executor, id, scope).await,
    }
}

/// The run's final step (the model call that answered without tool calls), once it ended.
pub async fn final_step(
    executor: impl PgExecutor<'_>,
    id: WorkflowId,
) -> sqlx::Result<Option<SavedStep>> {
    let row: Option<(Option<Json<SavedStep>>,)> =
        sqlx::query_as("SELECT final_step FROM runs WHERE id = $1")
            .bind(id)
            .fetch_optional(executor)
            .await?;
    Ok(row.and_then(|(step,)| step).map(|step| step.0))
}

/// Filters of a run list.
#[derive(Clone, Debug, Default)]
pub struct RunFilter {
    /// Only this thread's runs.
    pub thread_id: Option<ThreadId>,
    /// Only runs of this agent.
    pub agent_id: Option<AgentId>,
    /// Only runs in one of these statuses (empty: any).
    pub statuses: Vec<RunStatus>,
}

/// A page of the runs in `scope`, newest first.
pub async fn list(
    executor: impl PgExecutor<'_>,
    scope: Scope<'_>,
    filter: &RunFilter,
    after: Option<Cursor>,
    limit: i64,
) -> sqlx::Result<Page<Run>> {
    let mut query = sqlx::QueryBuilder::new("");
    push_list(&mut query, scope, filter, after, limit);
    let rows: Vec<Run> = query.build_query_as().fetch_all(executor).await?;
    Ok(page::page(rows, limit, |r| (r.created_at, r.id.0)))
}

/// Appends [`list`]'s statement to `query` (public so a test can `EXPLAIN` exactly what the
/// list runs: `tests/tests/e2e/growth.rs`).
pub fn push_list(
    query: &mut sqlx::QueryBuilder<sqlx::Postgres>,
    scope: Scope<'_>,
    filter: &RunFilter,
    after: Option<Cursor>,
    limit: i64,
) {
    query.push(concat!(
        "SELECT ",
        columns!("r."),
        " FROM runs r WHERE true"
    ));
    scope.push(query, "r");
    if let Some(thread_id) = filter.thread_id {
        query.push(" AND r.thread_id = ");
        query.push_bind(thread_id);
    }
    if let Some(agent_id) = filter.agent_id {
        query.push(" AND r.agent_id = ");
        query.push_bind(agent_id);
    }
    if !filter.statuses.is_empty() {
        let statuses: Vec<&'static str> = filter.statuses.iter().map(|s| s.as_str()).collect();
        query.push(" AND r.status = ANY(");
        query.push_bind(statuses);
        query.push(")");
    }
    page::push_after(query, "r", after);
    page::push_order(query, "r", limit);
}

/// The run in `scope` paused as `requires_action` with a pending client call of id `call_id`,
/// if any (the newest, should ids repeat): one probe of the partial index on pending calls.
pub async fn find_waiting_for_call(
    executor: impl PgExecutor<'_>,
    call_id: &str,
    scope: Scope<'_>,
) -> sqlx::Result<Option<Run>> {
    let mut query = sqlx::QueryBuilder::new(concat!(
        "SELECT ",
        columns!("r."),
        " FROM runs r WHERE r.status = 'requires_action' AND (r.pending_action -> 'tool_calls') @> "
    ));
    query.push_bind(sqlx::types::Json(
        serde_json::json!([{ "tool_call_id": call_id }]),
    ));
    scope.push(&mut query, "r");
    query.push(" ORDER BY r.updated_at DESC LIMIT 1");
    query.build_query_as().fetch_optional(executor).await
}

/// The thread's active run, if any.
pub async fn find_active(
    executor: impl PgExecutor<'_>,
    thread_id: ThreadId,
) -> sqlx::Result<Option<Run>> {
    sqlx::query_as(concat!(
        "SELECT ",
        columns!(""),
        " FROM runs WHERE thread_id = $1 AND parent_workflow_id IS NULL
            AND status IN ('queued', 'running', 'requires_action', 'awaiting_approval',
                           'waiting')"
    ))
    .bind(thread_id)
    .fetch_optional(executor)
    .await
}

/// Where a run stands, as a stream follower needs it: its status and, while paused, what it
/// waits for (with the deadline filled in).
#[derive(Debug, sqlx::FromRow)]
pub struct Standing {
    /// The status.
    pub status: RunStatus,
    /// The attempt.
    pub attempt: i32,
    /// The assistant message.
    pub assistant_message_id: MessageId,
    /// What a paused run waits for.
    pub pending_action: Option<Json<PendingAction>>,
}

/// Where a run stands, if it exists.
pub async fn standing(
    executor: impl PgExecutor<'_>,
    id: WorkflowId,
) -> sqlx::Result<Option<Standing>> {
    sqlx::query_as(
        "SELECT status, attempt, assistant_message_id, pending_action FROM runs WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(executor)
    .await
}

/// Seconds since a run of `thread` last changed (by the database clock), if it exists.
pub async fn seconds_since_update(
    executor: impl PgExecutor<'_>,
    id: WorkflowId,
    thread: ThreadId,
) -> sqlx::Result<Option<f64>> {
    let row: Option<(f64,)> = sqlx::query_as(
        "SELECT extract(epoch FROM now() - updated_at)::float8 FROM runs \
         WHERE id = $1 AND thread_id = $2",
    )
    .bind(id)
    .bind(thread)
    .fetch_optional(executor)
    .await?;
    Ok(row.map(|(age,)| age))
}

/// A thread's latest run of its own, as [`latest_on_thread`] reads it.
#[derive(Debug, sqlx::FromRow)]
pub struct Latest {
    /// The run.
    pub id: WorkflowId,
    /// Its status.
    pub status: RunStatus,
    /// Seconds since it last changed (by the database clock).
    pub age: f64,
}

/// The thread's latest run of its own (not an agent call's), if the thread has had a run.
pub async fn latest_on_thread(
    executor: impl PgExecutor<'_>,
    thread: ThreadId,
) -> sqlx::Result<Option<Latest>> {
    sqlx::query_as(
        "SELECT id, status, extract(epoch FROM now() - updated_at)::float8 AS age FROM runs \
         WHERE thread_id = $1 AND parent_workflow_id IS NULL \
         ORDER BY created_at DESC LIMIT 1",
    )
    .bind(thread)
    .fetch_optional(executor)
    .await
}

/// Re-queues a paused run after its pause was answered. `overrides`, if given, replace the
/// run's (the caller has merged them with what earlier pauses posted); `None` keeps them.
/// The run as this statement left it (queued), or `None` if it is not in `expected` status
/// (answered twice, cancelled meanwhile). The caller answers with this row, not a read after
/// its commit, which may already see a worker's `running`.
pub async fn resume(
    executor: impl PgExecutor<'_>,
    id: WorkflowId,
    expected: RunStatus,
    overrides: Option<&RunOverrides>,
) -> sqlx::Result<Option<Run>> {
    sqlx::query_as(concat!(
        "UPDATE runs
            SET status = 'queued', pending_action = NULL, pause_expires_at = NULL,
                resumed = true, overrides = coalesce($3, overrides), queued_at = now(),
                updated_at = now()
          WHERE id = $1 AND status = $2
      RETURNING ",
        columns!("")
    ))
    .bind(id)
    .bind(expected)
    .bind(overrides.map(Json))
    .fetch_optional(executor)
    .await
}

/// Records a cancel request (the first reason and requester stick) on a run that is not
/// terminal. Returns the run's status, or `None` if it is terminal (or not the owner's).
pub async fn request_cancel(
    executor: impl PgExecutor<'_>,
    id: WorkflowId,
    owner: &Owner,
    reason: Option<&str>,
) -> sqlx::Result<Option<RunStatus>> {
    let row: Option<(RunStatus,)> = sqlx::query_as(
        "UPDATE runs
            SET cancel_requested_at = coalesce(cancel_requested_at, now()),
                cancel_reason = coalesce(cancel_reason, $4),
                cancelled_by = coalesce(cancelled_by, $3),
                updated_at = now()
          WHERE id = $1 AND tenant_id = $2 AND owner_id = $3
            AND status NOT IN ('completed', 'failed', 'cancelled')
      RETURNING status",
    )
    .bind(id)
    .bind(&owner.tenant_id)
    .bind(&owner.user_id)
    .bind(reason)
    .fetch_optional(executor)
    .await?;
    Ok(row.map(|(status,)| status))
}

/// The tools the run's MCP servers offered its first attempt, by server (`None`: not
/// discovered yet), as [`Claimed::save_mcp_tools`] kept them.
pub async fn mcp_tools(
    executor: impl PgExecutor<'_>,
    id: WorkflowId,
) -> sqlx::Result<Option<serde_json::Value>> {
    let tools: Option<Option<Json<serde_json::Value>>> =
        sqlx::query_scalar("SELECT mcp_tools FROM runs WHERE id = $1")
            .bind(id)
            .fetch_optional(executor)
            .await?;
    Ok(tools.flatten().map(|tools| tools.0))
}

/// Cancels a run that no worker holds (queued or paused), with its message (the text of its
/// saved steps). Returns the attempt whose stream it ends, or `None` if a worker holds it now.
pub async fn cancel_unclaimed(
    executor: impl PgExecutor<'_>,
    id: WorkflowId,
) -> sqlx::Result<Option<i32>> {
    let row: Option<(i32,)> = sqlx::query_as(
        "WITH cancelled AS (
             UPDATE runs
                SET status = 'cancelled', finished_at = now(), updated_at = now(),
                    pending_action = NULL, pause_expires_at = NULL
              WHERE id = $1
                AND status IN ('queued', 'requires_action', 'awaiting_approval', 'waiting')
          RETURNING id, attempt, assistant_message_id),
         partial AS (
             SELECT coalesce(string_agg(s.text, E'\n\n' ORDER BY s.step)
                        FILTER (WHERE s.text <> ''), '') AS content
               FROM run_steps s, cancelled c WHERE s.workflow_id = c.id)
         UPDATE messages m
            SET status = 'cancelled', content = partial.content, updated_at = now()
           FROM cancelled, partial
          WHERE m.id = cancelled.assistant_message_id
      RETURNING cancelled.attempt",
    )
    .bind(id)
    .fetch_optional(executor)
    .await?;
    Ok(row.map(|(attempt,)| attempt))
}
