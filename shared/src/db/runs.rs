//! Runs: the durable job queue.
//!
//! - `claim` is one statement: it picks up to as many claimable runs as the worker has room
//!   for with `FOR UPDATE SKIP LOCKED` (queued, or running with an expired lease, or paused
//!   past its deadline), bumps each one's `attempt`, sets the lease from the database clock and
//!   marks the assistant message streaming. Concurrent workers never claim the same run at
//!   once. Expired leases and pauses go first; queued runs are taken fairly across tenants:
//!   each tenant's oldest, the tenant with the fewest running runs first (a batch takes turns
//!   between tenants), so one tenant's backlog never starves another tenant's run.
//! - `attempt` is the fencing token, and [`Claimed`] is the handle of the attempt that holds
//!   it: its methods (`save_step`, `pause`, `wait_for_children`, `finish`, `release`) are the
//!   only writes a worker makes to its run after the claim, and each binds the attempt and
//!   says `WHERE id = $1 AND attempt = $2 AND status = 'running'`. Once another worker has
//!   reclaimed the run, the old worker's writes match no row and come back [`Fence::Lost`]. The
//!   heartbeat renews every held `(run, attempt)` pair in one statement with the same fence.
//! - Lease times are `now() + lease` in SQL; a worker's own clock is never trusted (invariant 5).
//! - The API's writes (`resume`, `request_cancel`, `cancel_unclaimed`) touch only runs no
//!   worker holds, or only the cancel request, and are scoped by the owner.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgExecutor;
use sqlx::postgres::types::PgInterval;
use sqlx::types::Json;

use crate::agent::{AgentSpec, RunOverrides};
use crate::db::page::{self, Cursor, Page, Scope};
use crate::db::steps::{self, SavedStep};
use crate::db::threads::Owner;
use crate::ids::{AgentId, MessageId, ThreadId, WorkflowId};
use crate::quota::RunQuota;
use crate::run::{MessagePart, PendingAction, RunFailure, Usage};
use crate::status::RunStatus;

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
    let mut query = sqlx::QueryBuilder::new(concat!(
        "SELECT ",
        columns!("r."),
        " FROM runs r WHERE true"
    ));
    scope.push(&mut query, "r");
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
    page::push_after(&mut query, "r", after);
    page::push_order(&mut query, "r", limit);
    let rows: Vec<Run> = query.build_query_as().fetch_all(executor).await?;
    Ok(page::page(rows, limit, |r| (r.created_at, r.id.0)))
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

/// A run a worker has just claimed: the handle of its attempt. Only [`claim`] makes one,
/// and its methods are the only way a worker writes to the run afterwards, each fenced on the
/// attempt (a write of a stale attempt changes nothing and says [`Fence::Lost`]).
#[derive(Debug, sqlx::FromRow)]
pub struct Claimed {
    #[sqlx(flatten)]
    run: Run,
    previous_status: RunStatus,
}

/// What a fenced write found: this attempt still held the run (the write happened), or it did
/// not (nothing changed; another attempt holds the run, or it is no longer running).
#[must_use = "a lost lease must stop the attempt"]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fence {
    /// Written.
    Held,
    /// Not written: the lease is lost.
    Lost,
}

impl Fence {
    fn of(written: bool) -> Self {
        if written { Self::Held } else { Self::Lost }
    }

    /// Whether the lease is lost.
    pub fn is_lost(self) -> bool {
        self == Self::Lost
    }
}

impl Claimed {
    /// The run, with its new attempt and lease.
    pub fn run(&self) -> &Run {
        &self.run
    }

    /// The status before the claim: `running` means the previous holder's lease expired.
    pub fn previous_status(&self) -> RunStatus {
        self.previous_status
    }

    /// Saves step `step` (1-based) of the run: once with its calls before they run, once more
    /// with their results (the second save replaces the first).
    pub async fn save_step(
        &self,
        executor: impl PgExecutor<'_>,
        step: u32,
        data: &SavedStep,
    ) -> sqlx::Result<Fence> {
        let step = i32::try_from(step).unwrap_or(i32::MAX);
        steps::save(executor, self.run.id, self.run.attempt, step, data)
            .await
            .map(Fence::of)
    }

    /// Pauses the run (`requires_action` or `awaiting_approval`) for `action`, giving up its
    /// lease and its worker, for at most `timeout` from now by the database clock (the deadline
    /// is written into the action's `expires_at` too); unless someone asked to cancel it, which
    /// a pause would leave unapplied (no worker would hear it), or the lease is lost.
    pub async fn pause(
        &self,
        executor: impl PgExecutor<'_>,
        status: RunStatus,
        action: &PendingAction,
        timeout: Duration,
    ) -> sqlx::Result<Pause> {
        let (id, attempt) = (self.run.id, self.run.attempt);
        pause(executor, id, attempt, status, action, timeout).await
    }

    /// Ends the run and writes its assistant message, in one statement: the message is
    /// written exactly once however many attempts there were (invariant 8).
    pub async fn finish(
        &self,
        executor: impl PgExecutor<'_>,
        outcome: &Outcome<'_>,
    ) -> sqlx::Result<Fence> {
        finish(executor, self.run.id, self.run.attempt, outcome)
            .await
            .map(Fence::of)
    }

    /// Gives the run back to the queue without counting a crash (graceful shutdown).
    pub async fn release(&self, executor: impl PgExecutor<'_>) -> sqlx::Result<Fence> {
        release(executor, self.run.id, self.run.attempt)
            .await
            .map(Fence::of)
    }
}

/// Claims up to `room` claimable runs for `worker` in one statement: first running runs whose
/// lease has expired and paused runs whose pause has expired (so an unanswered approval or
/// client tool is enforced even if no client ever calls again; `previous_status` says which),
/// earliest deadline first; then queued runs, fairly: tenants with the fewest running runs
/// first, counting the runs this claim gives each (a batch takes turns between tenants rather
/// than emptying one tenant's backlog), oldest first within a tenant. Bumps `attempt` (and
/// `reclaims` for an expired lease), sets a fresh lease and marks each run's assistant message
/// `streaming`. Fewer than `room` (none, say) when fewer were claimable or other workers hold
/// the rest locked at that moment.
pub async fn claim(
    executor: impl PgExecutor<'_>,
    worker: &str,
    lease: Duration,
    room: u32,
) -> sqlx::Result<Vec<Claimed>> {
    sqlx::query_as(CLAIM)
        .bind(worker)
        .bind(interval(lease))
        .bind(i64::from(room))
        .fetch_all(executor)
        .await
}

/// The claim's statement (`$1` worker, `$2` lease, `$3` room): see [`claim`]. A constant of its
/// own so a test can `EXPLAIN` it.
const CLAIM: &str = concat!(
    "WITH RECURSIVE
         -- Every tenant with a queued run: a loose index scan, one probe per tenant.
         tenants (tenant_id) AS (
             (SELECT tenant_id FROM runs WHERE status = 'queued' ORDER BY tenant_id LIMIT 1)
             UNION ALL
             SELECT (SELECT q.tenant_id FROM runs q
                      WHERE q.status = 'queued' AND q.tenant_id > t.tenant_id
                      ORDER BY q.tenant_id LIMIT 1)
               FROM tenants t WHERE t.tenant_id IS NOT NULL),
         -- Each tenant's oldest queued runs, ranked (more than there is room for: concurrent
         -- claims skip each other's locked rows and need the next ones); a run's turn is its
         -- tenant's running runs plus its rank.
         fair AS (
             SELECT h.id, h.queued_at,
                    c.running
                    + row_number() OVER (PARTITION BY t.tenant_id ORDER BY h.queued_at) AS turn
               FROM tenants t
               CROSS JOIN LATERAL (SELECT count(*) AS running FROM runs x
                                    WHERE x.tenant_id = t.tenant_id AND x.status = 'running') c
               CROSS JOIN LATERAL (SELECT q.id, q.queued_at FROM runs q
                                    WHERE q.status = 'queued' AND q.tenant_id = t.tenant_id
                                    ORDER BY q.queued_at LIMIT $3 + 16) h
              WHERE t.tenant_id IS NOT NULL
              ORDER BY turn, h.queued_at
              LIMIT 2 * $3 + 32),
         -- Expired leases (a crash) and expired pauses come first, earliest deadline first:
         -- the earliest deadlines, then those of them that have passed. Not `WHERE deadline <
         -- now()`, which the planner may answer with a bitmap scan: that reads the entry of
         -- every run that was running or paused with a deadline now past and has ended since
         -- the last vacuum (a plain scan in deadline order skips them once seen).
         rescue AS (
             SELECT id, queued_at FROM (
                 (SELECT id, queued_at, lease_expires_at AS deadline FROM runs
                   WHERE status = 'running'
                   ORDER BY lease_expires_at LIMIT $3 + 8)
                 UNION ALL
                 (SELECT id, queued_at, pause_expires_at FROM runs
                   WHERE status IN ('awaiting_approval', 'requires_action')
                   ORDER BY pause_expires_at LIMIT $3 + 8)) earliest
              WHERE deadline < now()),
         picks AS (
             SELECT id, 0 AS tier, 0::bigint AS turn, queued_at FROM rescue
             UNION ALL
             SELECT id, 1, turn, queued_at FROM fair),
         candidate AS (
             SELECT r.id, r.status AS previous_status
               FROM runs r JOIN picks p ON p.id = r.id
              -- Checked again on the locked row: another worker may have claimed it. One
              -- CASE, which no partial index's predicate matches: the planner finds the picks
              -- by primary key. Written as conditions on `status`, it could answer them with a
              -- bitmap scan of the partial indexes instead, which reads every dead entry that
              -- runs claimed or ended since the last vacuum left there.
              WHERE CASE r.status
                        WHEN 'queued' THEN true
                        WHEN 'running' THEN r.lease_expires_at < now()
                        WHEN 'awaiting_approval' THEN r.pause_expires_at < now()
                        WHEN 'requires_action' THEN r.pause_expires_at < now()
                        ELSE false
                    END
              ORDER BY p.tier, p.turn, p.queued_at
              LIMIT $3
                FOR UPDATE OF r SKIP LOCKED),
         claimed AS (
             UPDATE runs r
                SET status = 'running',
                    attempt = r.attempt + 1,
                    reclaims = r.reclaims + (candidate.previous_status = 'running')::int,
                    -- Continues cleanly (no attempt_restarted) only after an answered or
                    -- expired pause; after an expired lease (a crash) it restarts, whatever
                    -- came before.
                    resumed = CASE candidate.previous_status
                                  WHEN 'running' THEN false
                                  WHEN 'awaiting_approval' THEN true
                                  WHEN 'requires_action' THEN true
                                  ELSE r.resumed END,
                    pending_action = NULL,
                    pause_expires_at = NULL,
                    lease_owner = $1,
                    lease_expires_at = now() + $2,
                    heartbeat_at = now(),
                    started_at = coalesce(r.started_at, now()),
                    updated_at = now()
               FROM candidate
              WHERE r.id = candidate.id
          RETURNING ",
    columns!("r."),
    ", candidate.previous_status),
         streaming AS (
             UPDATE messages m
                SET status = 'streaming', updated_at = now()
               FROM claimed c
              WHERE m.id = c.assistant_message_id)
         SELECT * FROM claimed"
);

/// A lease the heartbeat renewed.
#[derive(Clone, Copy, Debug, sqlx::FromRow)]
pub struct Renewed {
    /// The run.
    pub id: WorkflowId,
    /// The attempt whose lease was renewed.
    pub attempt: i32,
    /// Whether someone asked to cancel the run.
    pub cancel_requested: bool,
}

/// Renews the leases of all `(run, attempt)` pairs still held, in one statement. A pair missing
/// from the result has lost its lease (reclaimed, or no longer running): its worker must stop.
pub async fn heartbeat(
    executor: impl PgExecutor<'_>,
    held: &[(WorkflowId, i32)],
    lease: Duration,
) -> sqlx::Result<Vec<Renewed>> {
    let ids: Vec<WorkflowId> = held.iter().map(|(id, _)| *id).collect();
    let attempts: Vec<i32> = held.iter().map(|(_, attempt)| *attempt).collect();
    sqlx::query_as(
        "UPDATE runs r
            SET lease_expires_at = now() + $3, heartbeat_at = now()
           FROM unnest($1::uuid[], $2::int[]) AS held(id, attempt)
          WHERE r.id = held.id AND r.attempt = held.attempt AND r.status = 'running'
      RETURNING r.id, r.attempt, r.cancel_requested_at IS NOT NULL AS cancel_requested",
    )
    .bind(ids)
    .bind(attempts)
    .bind(interval(lease))
    .fetch_all(executor)
    .await
}

/// What a pause found.
#[must_use = "a pause that did not happen must end the attempt"]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pause {
    /// The run waits, without a worker, until this deadline (database clock).
    Paused(DateTime<Utc>),
    /// Not paused: a cancel was requested; the attempt must end the run as cancelled.
    CancelRequested,
    /// Not paused: the lease is lost.
    Lost,
}

/// Pauses a running run (fenced): `requires_action` or `awaiting_approval`, releasing its lease,
/// unless a cancel was requested meanwhile.
async fn pause(
    executor: impl PgExecutor<'_>,
    id: WorkflowId,
    attempt: i32,
    status: RunStatus,
    pending_action: &PendingAction,
    timeout: Duration,
) -> sqlx::Result<Pause> {
    // The row lock orders this against a cancel request: either the request came first (and
    // the run is not paused) or the API finds the run paused and cancels it itself.
    let row: Option<(bool, DateTime<Utc>)> = sqlx::query_as(
        "WITH held AS (
             SELECT id, cancel_requested_at IS NOT NULL AS cancel, now() + $5 AS deadline
               FROM runs WHERE id = $1 AND attempt = $2 AND status = 'running' FOR UPDATE),
         paused AS (
             UPDATE runs r
                SET status = $3, pause_expires_at = held.deadline,
                    pending_action = jsonb_set($4, '{expires_at}', to_jsonb(held.deadline)),
                    resumed = false, lease_expires_at = NULL, queued_at = now(),
                    updated_at = now()
               FROM held
              WHERE r.id = held.id AND NOT held.cancel)
         SELECT cancel, deadline FROM held",
    )
    .bind(id)
    .bind(attempt)
    .bind(status)
    .bind(super::storable(pending_action)?)
    .bind(interval(timeout))
    .fetch_optional(executor)
    .await?;
    Ok(match row {
        None => Pause::Lost,
        Some((true, _)) => Pause::CancelRequested,
        Some((false, deadline)) => Pause::Paused(deadline),
    })
}

/// Whether the paused run's deadline has passed, by the database clock.
pub async fn pause_expired(executor: impl PgExecutor<'_>, id: WorkflowId) -> sqlx::Result<bool> {
    let (expired,): (bool,) =
        sqlx::query_as("SELECT coalesce(pause_expires_at <= now(), false) FROM runs WHERE id = $1")
            .bind(id)
            .fetch_one(executor)
            .await?;
    Ok(expired)
}

/// Re-queues a paused run after its pause was answered. `overrides`, if given, replace the
/// run's (the caller has merged them with what earlier pauses posted); `None` keeps them.
/// `false` if it is not in `expected` status (answered twice, cancelled meanwhile).
pub async fn resume(
    executor: impl PgExecutor<'_>,
    id: WorkflowId,
    expected: RunStatus,
    overrides: Option<&RunOverrides>,
) -> sqlx::Result<bool> {
    let result = sqlx::query(
        "UPDATE runs
            SET status = 'queued', pending_action = NULL, pause_expires_at = NULL,
                resumed = true, overrides = coalesce($3, overrides), queued_at = now(),
                updated_at = now()
          WHERE id = $1 AND status = $2",
    )
    .bind(id)
    .bind(expected)
    .bind(overrides.map(Json))
    .execute(executor)
    .await?;
    Ok(result.rows_affected() == 1)
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
}

impl Claimed {
    /// Saves step `step` with its agent calls, starts a child run for each of `children` (on
    /// the run's thread, one level deeper, under the run's trace and token budgets), and pauses
    /// the run (`waiting`, `action`) until they have all ended: in one transaction fenced on
    /// the attempt, so a crash leaves either the step unsettled with no child or every child
    /// started. Unless a cancel was requested meanwhile or the lease is lost: then nothing is
    /// written.
    pub async fn wait_for_children(
        &self,
        pool: &sqlx::PgPool,
        step: u32,
        data: &SavedStep,
        children: &[NewChild<'_>],
        action: &PendingAction,
    ) -> sqlx::Result<Wait> {
        let run = &self.run;
        let mut tx = pool.begin().await?;
        let held: Option<(bool,)> = sqlx::query_as(
            "SELECT cancel_requested_at IS NOT NULL FROM runs
              WHERE id = $1 AND attempt = $2 AND status = 'running' FOR UPDATE",
        )
        .bind(run.id)
        .bind(run.attempt)
        .fetch_optional(&mut *tx)
        .await?;
        match held {
            None => return Ok(Wait::Lost),
            Some((true,)) => return Ok(Wait::CancelRequested),
            Some((false,)) => {}
        }
        let step = i32::try_from(step).unwrap_or(i32::MAX);
        if !steps::save(&mut *tx, run.id, run.attempt, step, data).await? {
            return Ok(Wait::Lost);
        }
        let quota = run.quota.as_ref().map(|q| q.0.budgets_only());
        let quota = quota.filter(|q| !q.counters.is_empty());
        for child in children {
            insert_child(&mut tx, run, child, quota.as_ref()).await?;
        }
        sqlx::query(
            "UPDATE runs
                SET status = 'waiting', pending_action = $3, pause_expires_at = NULL,
                    resumed = false, lease_expires_at = NULL, queued_at = now(),
                    updated_at = now()
              WHERE id = $1 AND attempt = $2",
        )
        .bind(run.id)
        .bind(run.attempt)
        .bind(super::storable(action)?)
        .execute(&mut *tx)
        .await?;
        // The children are claimable at the commit: wake idle workers then.
        super::notify_runs(&mut *tx).await?;
        tx.commit().await?;
        Ok(Wait::Waiting)
    }
}

/// Inserts a child run of `parent` with its user message (the input) and its queued assistant
/// message, both marked with the child's depth (thread listings and later turns' history
/// leave them out).
async fn insert_child(
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
    .bind(super::storable_text(child.input))
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

/// How a run ended, with the assistant message it leaves.
#[derive(Clone, Debug)]
pub struct Outcome<'a> {
    /// `Completed`, `Failed` or `Cancelled`.
    pub status: RunStatus,
    /// The assistant message's final text (partial for failed and cancelled runs).
    pub content: &'a str,
    /// Its structured parts.
    pub parts: &'a [MessagePart],
    /// Token usage.
    pub usage: Usage,
    /// Why, for a failed run.
    pub error: Option<&'a RunFailure>,
    /// The step that answered without tool calls, kept on the run (`runs.final_step`) for the
    /// timeline: a row of its own in `run_steps` cost a fifth of the run lifecycle's SQL
    /// throughput (pgbench, tests/bench/lifecycle.sql).
    pub final_step: Option<&'a SavedStep>,
    /// The answer as JSON, when the agent has a `response_format` and it validated.
    pub output: Option<&'a Value>,
    /// Whether a `pre_response` hook denied the answer (its text is the content).
    pub blocked: bool,
}

/// Finishes the run and writes its assistant message, in one statement fenced on the attempt:
/// the message is written exactly once however many attempts there were (invariant 8). Returns
/// `false` (and changes nothing) if this attempt no longer holds the run.
async fn finish(
    executor: impl PgExecutor<'_>,
    id: WorkflowId,
    attempt: i32,
    outcome: &Outcome<'_>,
) -> sqlx::Result<bool> {
    debug_assert!(outcome.status.is_terminal());
    let updated: Option<(MessageId,)> = sqlx::query_as(
        "WITH finished AS (
             UPDATE runs
                SET status = $3, error = $7, usage = $6, finished_at = now(), updated_at = now(),
                    lease_expires_at = NULL, final_step = $8
              WHERE id = $1 AND attempt = $2 AND status = 'running'
          RETURNING assistant_message_id)
         UPDATE messages m
            SET content = $4, parts = $5, usage = $6, status = $3, updated_at = now(),
                output = $9, blocked = $10
           FROM finished
          WHERE m.id = finished.assistant_message_id
      RETURNING m.id",
    )
    .bind(id)
    .bind(attempt)
    .bind(outcome.status)
    .bind(super::storable_text(outcome.content))
    .bind(super::storable(outcome.parts)?)
    .bind(Json(outcome.usage))
    .bind(outcome.error.map(super::storable).transpose()?)
    .bind(outcome.final_step.map(super::storable).transpose()?)
    .bind(outcome.output.map(Json))
    .bind(outcome.blocked)
    .fetch_optional(executor)
    .await?;
    Ok(updated.is_some())
}

/// Gives a running run back to the queue without counting a crash (graceful shutdown). Fenced;
/// returns `false` if this attempt no longer holds it.
async fn release(
    executor: impl PgExecutor<'_>,
    id: WorkflowId,
    attempt: i32,
) -> sqlx::Result<bool> {
    let result = sqlx::query(
        "UPDATE runs
            SET status = 'queued', lease_owner = NULL, lease_expires_at = NULL, resumed = false,
                updated_at = now()
          WHERE id = $1 AND attempt = $2 AND status = 'running'",
    )
    .bind(id)
    .bind(attempt)
    .execute(executor)
    .await?;
    Ok(result.rows_affected() == 1)
}

fn interval(duration: Duration) -> PgInterval {
    PgInterval {
        months: 0,
        days: 0,
        microseconds: i64::try_from(duration.as_micros()).unwrap_or(i64::MAX),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use spool_tests::TestDb;

    use super::*;
    use crate::db::enqueue::{NewMessage, enqueue};
    use crate::db::messages;
    use crate::run::PendingCall;

    const WORKER: &str = "worker-a";
    const HOUR: Duration = Duration::from_secs(3600);

    /// A queued run on a thread of its own, as the enqueue leaves it.
    async fn queued(db: &TestDb) -> (WorkflowId, MessageId) {
        let owner = Owner {
            tenant_id: "acme".into(),
            user_id: "alice".into(),
        };
        let message = NewMessage {
            thread_id: ThreadId::new(),
            owner: &owner,
            agent_id: None,
            input_text: "hi",
            metadata: &json!({}),
            idempotency_key: None,
            trace_context: None,
            quotas: &crate::quota::Quotas::default(),
            admission: &crate::db::enqueue::tests::admission(),
            overrides: None,
            history: &[],
        };
        let mut tx = db.pool.begin().await.expect("begin");
        let enqueued = enqueue(&mut crate::db::LazyConn::Held(&mut tx), &message)
            .await
            .expect("enqueue");
        tx.commit().await.expect("commit");
        (enqueued.workflow_id, enqueued.message_id)
    }

    fn completed(content: &str) -> Outcome<'_> {
        Outcome {
            status: RunStatus::Completed,
            content,
            parts: &[],
            usage: Usage::default(),
            error: None,
            final_step: None,
            output: None,
            blocked: false,
        }
    }

    async fn claim(db: &TestDb, lease: Duration) -> Option<Claimed> {
        super::claim(&db.pool, WORKER, lease, 1)
            .await
            .expect("claim")
            .pop()
    }

    /// `count` queued runs of `tenant` (one thread each), queued an hour ago, oldest first:
    /// a backlog, written in three statements.
    async fn backlog(db: &TestDb, tenant: &str, count: i32) {
        for sql in [
            "INSERT INTO threads (id, tenant_id, owner_id)
             SELECT md5($1 || 't' || n)::uuid, $1, 'u' FROM generate_series(1, $2) n",
            "INSERT INTO messages (id, thread_id, role, status)
             SELECT md5($1 || 'm' || n)::uuid, md5($1 || 't' || n)::uuid, 'user', 'completed'
               FROM generate_series(1, $2) n",
            "INSERT INTO runs (id, thread_id, tenant_id, owner_id, user_message_id,
                               assistant_message_id, queued_at)
             SELECT md5($1 || 'r' || n)::uuid, md5($1 || 't' || n)::uuid, $1, 'u',
                    md5($1 || 'm' || n)::uuid, md5($1 || 'm' || n)::uuid,
                    now() - interval '1 hour' + n * interval '1 ms'
               FROM generate_series(1, $2) n",
        ] {
            sqlx::query(sql)
                .bind(tenant)
                .bind(count)
                .execute(&db.pool)
                .await
                .expect("backlog");
        }
    }

    #[tokio::test]
    async fn one_tenants_backlog_does_not_starve_another_tenants_run() {
        let db = TestDb::new().await.expect("db");
        backlog(&db, "big", 10_000).await;
        // acme's run is the newest of all: a global FIFO would take it after 10,000 others.
        let (small, _) = queued(&db).await;
        let mut order = Vec::new();
        for _ in 0..3 {
            let claimed = claim(&db, HOUR).await.expect("a claim");
            order.push(claimed.run().tenant_id.clone());
        }
        assert_eq!(order, ["big", "acme", "big"], "acme's run goes second");
        let run = find_in(&db.pool, small, Scope::Tenant("acme"))
            .await
            .expect("find")
            .expect("run");
        assert_eq!(run.status, RunStatus::Running);
        // Within a tenant, the oldest first.
        let (first_of_big,): (WorkflowId,) = sqlx::query_as(
            "SELECT id FROM runs WHERE tenant_id = 'big' AND status = 'running' ORDER BY queued_at LIMIT 1",
        )
        .fetch_one(&db.pool)
        .await
        .expect("big's");
        let (oldest,): (WorkflowId,) = sqlx::query_as("SELECT md5('big' || 'r' || 1)::uuid")
            .fetch_one(&db.pool)
            .await
            .expect("id");
        assert_eq!(first_of_big, oldest);
    }

    /// The index entries a plan's index scans returned, loops included (a bitmap index scan
    /// returns dead entries too: it cannot tell them apart).
    fn index_entries_read(plan: &Value) -> f64 {
        let own = if plan["Node Type"].as_str().unwrap_or("").contains("Index") {
            plan["Actual Rows"].as_f64().unwrap_or(0.0)
                * plan["Actual Loops"].as_f64().unwrap_or(1.0)
        } else {
            0.0
        };
        let children = plan["Plans"]
            .as_array()
            .map_or(0.0, |plans| plans.iter().map(index_entries_read).sum());
        own + children
    }

    /// Runs that ended since the last vacuum leave dead entries in the indexes their queued and
    /// running versions were in; a claim must not read them (it did, through a bitmap scan of
    /// an index no query needed, reading every one of them on every claim).
    #[tokio::test]
    async fn a_claim_reads_the_runs_it_may_take_not_those_that_ended() {
        let db = without_autovacuum().await;
        let plan = plan_of_a_claim_past_ended_runs(&db, async || {
            let (Json(plan),): (Json<Value>,) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "EXPLAIN (ANALYZE, FORMAT JSON) {CLAIM}"
            )))
            .bind(WORKER)
            .bind(interval(HOUR))
            .bind(1_i64)
            .fetch_one(&db.pool)
            .await
            .expect("explain the claim");
            plan
        })
        .await;
        let read = index_entries_read(&plan[0]["Plan"]);
        assert!(
            read <= 100.0,
            "the claim read {read} index entries to take one of one queued runs: {plan:#}"
        );
    }

    /// The plan `explain` returns for a claim of one queued run, made once 5,000 runs have
    /// ended; checks that the claim took the run.
    async fn plan_of_a_claim_past_ended_runs(
        db: &TestDb,
        explain: impl AsyncFnOnce() -> Value,
    ) -> Value {
        ended(db, 5_000).await;
        let (run, _) = queued(db).await;
        let plan = explain().await;
        assert_eq!(
            status_of(db, run).await,
            RunStatus::Running,
            "the claim took it"
        );
        plan
    }

    /// `count` runs of tenant `big` that were claimed and have ended, more than a lease ago.
    async fn ended(db: &TestDb, count: i32) {
        backlog(db, "big", count).await;
        for sql in [
            "UPDATE runs SET status = 'running', attempt = 1,
                    lease_expires_at = now() - interval '1 minute' WHERE tenant_id = 'big'",
            "UPDATE runs SET status = 'completed', lease_expires_at = NULL, finished_at = now()
              WHERE tenant_id = 'big'",
        ] {
            sqlx::query(sql)
                .execute(&db.pool)
                .await
                .expect("claimed and ended");
        }
    }

    /// The status of acme's run.
    async fn status_of(db: &TestDb, run: WorkflowId) -> RunStatus {
        find_in(&db.pool, run, Scope::Tenant("acme"))
            .await
            .expect("find")
            .expect("run")
            .status
    }

    /// A database whose `runs` and `messages` autovacuum leaves alone (their dead entries and
    /// statistics stay as the test leaves them).
    async fn without_autovacuum() -> TestDb {
        let db = TestDb::new().await.expect("db");
        for sql in [
            "ALTER TABLE runs SET (autovacuum_enabled = false)",
            "ALTER TABLE messages SET (autovacuum_enabled = false)",
        ] {
            sqlx::query(sql).execute(&db.pool).await.expect("no vacuum");
        }
        db
    }

    /// How many sequential scans of `relation` the plan holds.
    fn seq_scans(plan: &Value, relation: &str) -> usize {
        let own = plan["Node Type"] == "Seq Scan" && plan["Relation Name"] == relation;
        usize::from(own)
            + plan["Plans"].as_array().map_or(0, |plans| {
                plans.iter().map(|plan| seq_scans(plan, relation)).sum()
            })
    }

    /// Postgres keeps a prepared statement's generic plan while the tables it reads grow: the
    /// claim, planned on a `runs` table of a few rows, looked its picks up with a sequential
    /// scan, and went on reading the whole table at every claim until autovacuum's next
    /// analyze. The claim's own connection plans without sequential scans.
    #[tokio::test]
    async fn a_claim_planned_while_the_table_was_small_does_not_read_all_of_it_once_it_grew() {
        let db = without_autovacuum().await;
        let claims = crate::db::claim_pool(&db.url, "claims").expect("claim pool");
        let mut conn = claims.acquire().await.expect("connection");
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "PREPARE claim (text, interval, bigint) AS {CLAIM}"
        )))
        .execute(&mut *conn)
        .await
        .expect("prepare");
        let execute = format!("claim ('{WORKER}', interval '1 hour', 1)");
        // Postgres plans the first five executions for their parameters, then keeps one
        // generic plan: made here, on a table of a few runs.
        for _ in 0..8 {
            queued(&db).await;
            sqlx::query(sqlx::AssertSqlSafe(format!("EXECUTE {execute}")))
                .execute(&mut *conn)
                .await
                .expect("a claim");
        }
        let plan = plan_of_a_claim_past_ended_runs(&db, async || {
            let (Json(plan),): (Json<Value>,) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE {execute}"
            )))
            .fetch_one(&mut *conn)
            .await
            .expect("explain the claim");
            plan
        })
        .await;
        assert_eq!(
            seq_scans(&plan[0]["Plan"], "runs"),
            0,
            "the claim read the whole table to take one run: {plan:#}"
        );
    }

    #[tokio::test]
    async fn a_batch_takes_turns_between_tenants_and_marks_each_message_streaming() {
        let db = TestDb::new().await.expect("db");
        backlog(&db, "big", 1_000).await;
        let (small, message) = queued(&db).await;
        let batch = super::claim(&db.pool, WORKER, HOUR, 3)
            .await
            .expect("claim");
        let mut tenants: Vec<&str> = batch.iter().map(|c| c.run().tenant_id.as_str()).collect();
        tenants.sort_unstable();
        // Turns: big's oldest and acme's run first, then big's second; not big's three oldest.
        assert_eq!(tenants, ["acme", "big", "big"]);
        let mine = batch
            .iter()
            .find(|c| c.run().id == small)
            .expect("acme's run");
        assert_eq!(
            (mine.run().attempt, mine.run().status),
            (1, RunStatus::Running)
        );
        let (status,): (String,) = sqlx::query_as("SELECT status FROM messages WHERE id = $1")
            .bind(message)
            .fetch_one(&db.pool)
            .await
            .expect("message");
        assert_eq!(status, "streaming", "the claim marks the answer streaming");
        // Room for more than is claimable: what there is, each run once.
        let rest = super::claim(&db.pool, WORKER, HOUR, 2_000)
            .await
            .expect("claim");
        assert_eq!(rest.len(), 998);
        assert!(rest.iter().all(|c| c.run().attempt == 1));
        assert!(claim(&db, HOUR).await.is_none());
    }

    #[tokio::test]
    async fn an_expired_lease_is_reclaimed_before_any_queued_run() {
        let db = TestDb::new().await.expect("db");
        let (crashed, _) = queued(&db).await;
        let first = claim(&db, HOUR).await.expect("a claim");
        assert_eq!(first.run().id, crashed);
        backlog(&db, "big", 100).await;
        expire(&db, crashed).await;
        let next = claim(&db, HOUR).await.expect("a claim");
        assert_eq!(next.run().id, crashed, "the crashed run first");
        assert_eq!(next.previous_status(), RunStatus::Running);
    }

    /// Ends the lease now, as time passing would.
    async fn expire(db: &TestDb, id: WorkflowId) {
        sqlx::query("UPDATE runs SET lease_expires_at = now() - interval '1 second' WHERE id = $1")
            .bind(id)
            .execute(&db.pool)
            .await
            .expect("expire");
    }

    #[tokio::test]
    async fn a_claim_bumps_the_attempt_and_takes_a_lease_of_the_database_s_now_plus_the_lease() {
        let db = TestDb::new().await.expect("db");
        let (id, _) = queued(&db).await;
        let lease = Duration::from_millis(2_500);
        let a = claim(&db, lease).await.expect("a run");
        assert_eq!(
            (a.run().id, a.run().attempt, a.previous_status()),
            (id, 1, RunStatus::Queued)
        );
        assert_eq!(a.run().lease_owner.as_deref(), Some(WORKER));
        // Set by the claim statement itself: expiry minus heartbeat is exactly the lease.
        let (lease_us,): (i64,) = sqlx::query_as(
            "SELECT (extract(epoch FROM lease_expires_at - heartbeat_at) * 1e6)::bigint
               FROM runs WHERE id = $1",
        )
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .expect("lease");
        assert_eq!(lease_us, 2_500_000);
        assert!(
            claim(&db, lease).await.is_none(),
            "a leased run is not claimable"
        );
    }

    #[tokio::test]
    async fn a_stale_attempt_is_fenced_out_of_every_write_after_a_reclaim() {
        let db = TestDb::new().await.expect("db");
        let (id, message) = queued(&db).await;
        let pool = &db.pool;
        let lease = Duration::from_secs(60);
        let a = claim(&db, lease).await.expect("a run");
        expire(&db, id).await;
        let b = claim(&db, lease).await.expect("a reclaim");
        assert_eq!(
            (b.run().attempt, b.run().reclaims, b.previous_status()),
            (2, 1, RunStatus::Running)
        );

        assert!(
            heartbeat(pool, &[(id, 1)], lease)
                .await
                .expect("hb")
                .is_empty()
        );
        assert_eq!(
            a.save_step(pool, 1, &SavedStep::default())
                .await
                .expect("save"),
            Fence::Lost
        );
        let action = PendingAction::SubmitToolOutputs {
            tool_calls: vec![PendingCall {
                tool_call_id: "c1".into(),
                tool_name: "t".into(),
                arguments: json!({}),
            }],
            expires_at: None,
        };
        let paused = a.pause(pool, RunStatus::RequiresAction, &action, HOUR);
        assert_eq!(paused.await.expect("pause"), Pause::Lost);
        assert_eq!(a.release(pool).await.expect("release"), Fence::Lost);
        assert_eq!(
            a.finish(pool, &completed("stale")).await.expect("finish"),
            Fence::Lost
        );
        assert_eq!(steps::load(pool, id).await.expect("steps").len(), 0);

        let renewed = heartbeat(pool, &[(id, 2)], Duration::from_secs(30))
            .await
            .expect("hb");
        assert_eq!(renewed.len(), 1);
        assert_eq!(
            b.finish(pool, &completed("fresh")).await.expect("finish"),
            Fence::Held
        );
        // Terminal: nothing changes it again, not even the attempt that finished it.
        assert_eq!(
            b.finish(pool, &completed("again")).await.expect("finish"),
            Fence::Lost
        );
        assert_eq!(b.release(pool).await.expect("release"), Fence::Lost);
        assert!(claim(&db, lease).await.is_none());
        let stored = messages::find_in_thread(pool, message, b.run().thread_id)
            .await
            .expect("message")
            .expect("exists");
        assert_eq!(
            (stored.status, stored.content.as_str()),
            (crate::status::MessageStatus::Completed, "fresh")
        );
    }

    #[tokio::test]
    async fn an_approval_is_claimable_once_it_expires_and_a_release_is_not_a_crash() {
        let db = TestDb::new().await.expect("db");
        let (id, _) = queued(&db).await;
        let pool = &db.pool;
        let lease = Duration::from_secs(60);
        let a = claim(&db, lease).await.expect("a run");
        let action = PendingAction::Approval {
            tool_call_id: "c1".into(),
            tool_name: "t".into(),
            arguments: json!({}),
            expires_at: None,
        };
        let paused = a.pause(pool, RunStatus::AwaitingApproval, &action, HOUR);
        assert!(matches!(paused.await.expect("pause"), Pause::Paused(_)));
        assert!(
            claim(&db, lease).await.is_none(),
            "the approval has not expired"
        );
        sqlx::query("UPDATE runs SET pause_expires_at = now() - interval '1 second'")
            .execute(pool)
            .await
            .expect("expire");
        let b = claim(&db, lease).await.expect("the expired approval");
        assert_eq!(
            (b.run().attempt, b.run().reclaims, b.previous_status()),
            (2, 0, RunStatus::AwaitingApproval)
        );
        assert!(b.run().pending_action.is_none());
        assert_eq!(b.release(pool).await.expect("release"), Fence::Held);
        let c = claim(&db, lease).await.expect("the released run");
        assert_eq!(
            (c.run().id, c.run().attempt, c.run().reclaims),
            (id, 3, 0),
            "a release is not counted as a crash"
        );
    }

    #[tokio::test]
    async fn only_the_attempt_right_after_a_pause_continues_cleanly() {
        let db = TestDb::new().await.expect("db");
        let (id, _) = queued(&db).await;
        let pool = &db.pool;
        let lease = Duration::from_secs(60);
        let a = claim(&db, lease).await.expect("a run");
        assert!(!a.run().resumed, "a first attempt starts");
        let action = PendingAction::SubmitToolOutputs {
            tool_calls: vec![],
            expires_at: None,
        };
        let paused = a.pause(pool, RunStatus::RequiresAction, &action, HOUR);
        assert!(matches!(paused.await.expect("pause"), Pause::Paused(_)));
        assert!(
            resume(pool, id, RunStatus::RequiresAction, None)
                .await
                .expect("resume")
        );
        let b = claim(&db, lease).await.expect("the answered run");
        assert!(
            b.run().resumed,
            "the attempt after an answered pause continues"
        );
        // It crashes: the next attempt restarts, although a pause came before.
        expire(&db, id).await;
        let c = claim(&db, lease).await.expect("a reclaim");
        assert!(!c.run().resumed, "an attempt after a crash restarts");
        // A release after a resume: the next attempt restarts too.
        let paused = c.pause(pool, RunStatus::RequiresAction, &action, HOUR);
        assert!(matches!(paused.await.expect("pause"), Pause::Paused(_)));
        assert!(
            resume(pool, id, RunStatus::RequiresAction, None)
                .await
                .expect("resume")
        );
        let d = claim(&db, lease).await.expect("the answered run");
        assert!(d.run().resumed);
        assert_eq!(d.release(pool).await.expect("release"), Fence::Held);
        let e = claim(&db, lease).await.expect("the released run");
        assert!(!e.run().resumed, "an attempt after a release restarts");
    }

    #[tokio::test]
    async fn a_run_whose_cancel_was_requested_is_not_paused() {
        let db = TestDb::new().await.expect("db");
        let (id, _) = queued(&db).await;
        let pool = &db.pool;
        let a = claim(&db, Duration::from_secs(60)).await.expect("a run");
        let owner = Owner {
            tenant_id: "acme".into(),
            user_id: "alice".into(),
        };
        let requested = request_cancel(pool, id, &owner, Some("stop"))
            .await
            .expect("cancel");
        assert_eq!(
            requested,
            Some(RunStatus::Running),
            "the API only signals a running run"
        );
        let action = PendingAction::SubmitToolOutputs {
            tool_calls: vec![],
            expires_at: None,
        };
        let paused = a.pause(pool, RunStatus::RequiresAction, &action, HOUR);
        assert_eq!(paused.await.expect("pause"), Pause::CancelRequested);
        let run = find(pool, id, &owner).await.expect("find").expect("run");
        assert_eq!(run.status, RunStatus::Running, "still the worker's to end");
        assert!(run.pending_action.is_none());
    }

    #[tokio::test]
    async fn a_pause_s_deadline_is_the_database_s_now_plus_its_timeout_and_it_expires_by_itself() {
        let db = TestDb::new().await.expect("db");
        let (id, _) = queued(&db).await;
        let pool = &db.pool;
        let a = claim(&db, HOUR).await.expect("a run");
        let action = PendingAction::SubmitToolOutputs {
            tool_calls: vec![],
            expires_at: None,
        };
        let timeout = Duration::from_millis(86_400_250);
        let Pause::Paused(deadline) = a
            .pause(pool, RunStatus::RequiresAction, &action, timeout)
            .await
            .expect("pause")
        else {
            panic!("not paused");
        };
        // Set in the pause's own statement: the deadline minus the pause's time is exactly the
        // timeout, and clients see the same deadline in the pending action.
        let (timeout_us, shown): (i64, String) = sqlx::query_as(
            "SELECT (extract(epoch FROM pause_expires_at - updated_at) * 1e6)::bigint,
                    pending_action->>'expires_at'
               FROM runs WHERE id = $1",
        )
        .bind(id)
        .fetch_one(pool)
        .await
        .expect("deadline");
        assert_eq!(timeout_us, 86_400_250_000);
        assert_eq!(shown.parse::<DateTime<Utc>>().ok(), Some(deadline));
        assert!(!pause_expired(pool, id).await.expect("expired?"));
        assert!(
            claim(&db, HOUR).await.is_none(),
            "a pause in time is not claimable"
        );
        sqlx::query("UPDATE runs SET pause_expires_at = now() - interval '1 second'")
            .execute(pool)
            .await
            .expect("expire");
        assert!(pause_expired(pool, id).await.expect("expired?"));
        let b = claim(&db, HOUR).await.expect("the expired pause");
        assert_eq!(
            (
                b.previous_status(),
                b.run().resumed,
                b.run().pause_expires_at
            ),
            (RunStatus::RequiresAction, true, None)
        );
    }
}
