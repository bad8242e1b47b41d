//! The queue's fenced writes: the claim, the lease, and every write of the attempt that holds a
//! run.
//!
//! - [`claim`] is one statement: it picks up to as many claimable runs as the worker has room
//!   for with `FOR UPDATE SKIP LOCKED` (queued, or running with an expired lease, or paused
//!   or waiting for its children past its deadline), bumps each one's `attempt`, sets the lease from the database clock and
//!   marks the assistant message streaming. Concurrent workers never claim the same run at
//!   once. Expired leases and pauses go first; queued runs are taken fairly across tenants:
//!   each tenant's oldest, the tenant with the fewest running runs first (a batch takes turns
//!   between tenants), so one tenant's backlog never starves another tenant's run.
//! - `attempt` is the fencing token, and [`Claimed`] is the handle of the attempt that holds
//!   it: its methods (`save_step`, `save_mcp_tools`, `pause`, `wait_for_children`, `finish`,
//!   `release`) are the
//!   only writes a worker makes to its run after the claim, and each binds the attempt and
//!   says `WHERE id = $1 AND attempt = $2 AND status = 'running'`. Once another worker has
//!   reclaimed the run, the old worker's writes match no row and come back [`Fence::Lost`]
//!   ([`Pause::Lost`], [`Wait::Lost`]). The heartbeat renews every held `(run, attempt)` pair
//!   in one statement with the same fence.
//! - Lease and pause deadlines are `now() + …` in SQL; a worker's own clock is never trusted
//!   (invariant 5).
//! - A run waits without a worker in two ways: paused for a client or a person
//!   (`requires_action`, `awaiting_approval`, until a deadline) and waiting for its child runs
//!   (`waiting`, until the last one ends or its own time limit passes). Both lock the row
//!   fenced and read the cancel request under the lock (`held!`), and both give up the same
//!   things (`parked!`): the two SQL pieces are written once. They are not one function: a pause is one statement on any
//!   executor, while a wait is a transaction that saves the step and starts the children
//!   between the lock and the status change, and the step's save needs the run still
//!   `running`.
//!
//! What must stay true: every write to a run after its claim goes through [`Claimed`] and says
//! `AND attempt = $2`. Nothing else makes a `Claimed` (its run is a private field; only
//! [`claim`] returns one), and the statements behind its methods are private here
//! (`steps::save` is `pub(crate)`). The test
//! `a_stale_attempt_is_fenced_out_of_every_write_after_a_reclaim` (in `claim/tests.rs`) calls
//! every method of a reclaimed attempt: a new write joins it.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgExecutor;
use sqlx::postgres::types::PgInterval;
use sqlx::types::Json;

use super::children::{NewChild, Wait, WaitBounds, insert_child, tree_size};
use super::{Run, columns};
use crate::db;
use crate::db::steps::{self, SavedStep};
use crate::ids::{MessageId, WorkflowId};
use crate::run::{MessagePart, PendingAction, RunFailure, Usage};
use crate::status::RunStatus;

// The `held` CTE of a write of attempt `$2` to run `$1` that must not race a cancel request:
// the run's row, locked, if this attempt still holds it, with `cancel`, whether a cancel was
// requested. The lock orders the write against the request, which updates the same row.
macro_rules! held {
    () => {
        "held AS (
             SELECT id, cancel_requested_at IS NOT NULL AS cancel
               FROM runs WHERE id = $1 AND attempt = $2 AND status = 'running' FOR UPDATE)"
    };
}

// What a run gives up when it waits without a worker (paused, or waiting for its children),
// as `SET` assignments: its lease, and a clean continuation (which the wait's end gives back);
// its place in the queue (`queued_at`) starts over.
macro_rules! parked {
    () => {
        "resumed = false, lease_expires_at = NULL, queued_at = now(), updated_at = now()"
    };
}

/// A run a worker has just claimed: the handle of its attempt. Only [`claim`] makes one,
/// and its methods are the only way a worker writes to the run afterwards, each fenced on the
/// attempt (a write of a stale attempt changes nothing and says [`Fence::Lost`]).
#[derive(Debug, sqlx::FromRow)]
pub struct Claimed {
    #[sqlx(flatten)]
    run: Run,
    previous_status: RunStatus,
    /// The last tenant the claim examined (see [`claim`]'s `after_tenant`).
    window_end: Option<String>,
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

    /// The last tenant the claim that took this run examined: where the worker's next claim
    /// starts (`after_tenant`), so that its window of tenants rotates over all of them.
    pub fn window_end(&self) -> Option<&str> {
        self.window_end.as_deref()
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

    /// Saves step `step` with its agent calls, starts a child run for each of `children` (on
    /// the run's thread, one level deeper, under the run's trace and its root's quota counters:
    /// concurrency and token budgets), and pauses the run (`waiting`, `action`) until they have
    /// all ended, or until its own time limit (`bounds.time_limit_secs` from its enqueue)
    /// passes: the claim then takes it back to fail it. In one transaction fenced on the
    /// attempt, so a crash leaves either the step unsettled with no child or every child
    /// started. Nothing is written when a cancel was requested meanwhile, the lease is lost, or
    /// the children would take the root's tree past `bounds.max_tree_runs`: the tree is counted
    /// under the root's row lock, so runs of one tree starting children at once never pass it
    /// together (the locks go from the run up to its root, as a child's end re-queueing its
    /// parent takes them).
    pub async fn wait_for_children(
        &self,
        pool: &sqlx::PgPool,
        step: u32,
        data: &SavedStep,
        children: &[NewChild<'_>],
        action: &PendingAction,
        bounds: WaitBounds,
    ) -> sqlx::Result<Wait> {
        let run = &self.run;
        let mut tx = pool.begin().await?;
        // As for a pause: a cancel request that came first means nothing is written; one that
        // comes later finds the run waiting, and the API cancels it and its children itself.
        let held: Option<(bool,)> =
            sqlx::query_as(concat!("WITH ", held!(), " SELECT cancel FROM held"))
                .bind(run.id)
                .bind(run.attempt)
                .fetch_optional(&mut *tx)
                .await?;
        match held {
            None => return Ok(Wait::Lost),
            Some((true,)) => return Ok(Wait::CancelRequested),
            Some((false,)) => {}
        }
        if bounds.root != run.id {
            sqlx::query("SELECT 1 FROM runs WHERE id = $1 FOR UPDATE")
                .bind(bounds.root)
                .execute(&mut *tx)
                .await?;
        }
        let size = tree_size(&mut *tx, bounds.root).await?;
        let adding = u32::try_from(children.len()).unwrap_or(u32::MAX);
        if size.saturating_add(adding) > bounds.max_tree_runs {
            return Ok(Wait::TreeFull(size));
        }
        let step = i32::try_from(step).unwrap_or(i32::MAX);
        if !steps::save(&mut *tx, run.id, run.attempt, step, data).await? {
            return Ok(Wait::Lost);
        }
        let quota = run.quota.as_ref().map(|q| q.0.for_child());
        let quota = quota.filter(|q| !q.counters.is_empty());
        for child in children {
            insert_child(&mut tx, run, child, quota.as_ref()).await?;
        }
        sqlx::query(concat!(
            "UPDATE runs SET status = 'waiting', pending_action = $3,
                    pause_expires_at = created_at + make_interval(secs => $4), ",
            parked!(),
            " WHERE id = $1 AND attempt = $2"
        ))
        .bind(run.id)
        .bind(run.attempt)
        .bind(db::storable(action)?)
        .bind(bounds.time_limit_secs.map(f64::from))
        .execute(&mut *tx)
        .await?;
        // The children are claimable at the commit: wake idle workers then.
        db::notify_runs(&mut *tx).await?;
        tx.commit().await?;
        Ok(Wait::Waiting)
    }

    /// Keeps the tools the run's MCP servers offered (`tools`, by server) for the run's later
    /// attempts, which offer the same ones without discovering them again.
    pub async fn save_mcp_tools(
        &self,
        executor: impl PgExecutor<'_>,
        tools: &Value,
    ) -> sqlx::Result<Fence> {
        let saved = sqlx::query(
            "UPDATE runs SET mcp_tools = $3
              WHERE id = $1 AND attempt = $2 AND status = 'running'",
        )
        .bind(self.run.id)
        .bind(self.run.attempt)
        .bind(db::storable(tools)?)
        .execute(executor)
        .await?;
        Ok(Fence::of(saved.rows_affected() == 1))
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

/// The most tenants with queued runs one claim examines (more when the claim has more room).
pub(crate) const TENANTS_PER_CLAIM: u32 = 64;

/// Claims up to `room` claimable runs for `worker` in one statement: first running runs whose
/// lease has expired, paused runs whose pause has expired (so an unanswered approval or
/// client tool is enforced even if no client ever calls again) and runs waiting for their
/// children past their own time limit (`previous_status` says which),
/// earliest deadline first; then queued runs, fairly: tenants with the fewest running runs
/// first, counting the runs this claim gives each (a batch takes turns between tenants rather
/// than emptying one tenant's backlog), oldest first within a tenant. Bumps `attempt` (and
/// `reclaims` for an expired lease), sets a fresh lease and marks each run's assistant message
/// `streaming`. Fewer than `room` (none, say) when fewer were claimable or other workers hold
/// the rest locked at that moment.
///
/// Queued runs are taken from a window of at most [`TENANTS_PER_CLAIM`] tenants (or `room`,
/// if more): those after `after_tenant` in tenant order, then from the first on. A claim then
/// costs the same with ten thousand tenants queueing as with ten (review B-L10). The worker
/// passes the previous claim's [`Claimed::window_end`], so its windows rotate over every
/// tenant with queued runs and each comes into one in turn; within a window the tenants with
/// the fewest running runs go first. `None` starts from the first tenant.
pub async fn claim(
    executor: impl PgExecutor<'_>,
    worker: &str,
    lease: Duration,
    room: u32,
    after_tenant: Option<&str>,
) -> sqlx::Result<Vec<Claimed>> {
    sqlx::query_as(CLAIM)
        .bind(worker)
        .bind(interval(lease))
        .bind(i64::from(room))
        // No tenant id is empty: '' is before them all.
        .bind(after_tenant.unwrap_or(""))
        .bind(i64::from(room.max(TENANTS_PER_CLAIM)))
        .fetch_all(executor)
        .await
}

/// The claim's statement (`$1` worker, `$2` lease, `$3` room, `$4` the tenant after which the
/// window starts, `$5` the window's size): see [`claim`]. A constant of its own so a test can
/// `EXPLAIN` it.
const CLAIM: &str = concat!(
    "WITH RECURSIVE
         -- The window: at most $5 tenants with a queued run, those after $4 and then from the
         -- first on, each numbered in that order (`n`). A loose index scan, one probe per
         -- tenant; the second walk starts only if the first found fewer than $5.
         after_cursor (tenant_id, n) AS (
             (SELECT tenant_id, 1 FROM runs WHERE status = 'queued' AND tenant_id > $4
               ORDER BY tenant_id LIMIT 1)
             UNION ALL
             SELECT (SELECT q.tenant_id FROM runs q
                      WHERE q.status = 'queued' AND q.tenant_id > t.tenant_id
                      ORDER BY q.tenant_id LIMIT 1), t.n + 1
               FROM after_cursor t WHERE t.tenant_id IS NOT NULL AND t.n < $5),
         from_first (tenant_id, n) AS (
             (SELECT tenant_id, (SELECT count(tenant_id) FROM after_cursor) + 1 FROM runs
               WHERE status = 'queued' AND tenant_id <= $4
                 AND (SELECT count(tenant_id) FROM after_cursor) < $5
               ORDER BY tenant_id LIMIT 1)
             UNION ALL
             SELECT (SELECT q.tenant_id FROM runs q
                      WHERE q.status = 'queued' AND q.tenant_id > t.tenant_id
                        AND q.tenant_id <= $4
                      ORDER BY q.tenant_id LIMIT 1), t.n + 1
               FROM from_first t WHERE t.tenant_id IS NOT NULL AND t.n < $5),
         tenants (tenant_id, n) AS (
             SELECT tenant_id, n FROM after_cursor WHERE tenant_id IS NOT NULL
             UNION ALL
             SELECT tenant_id, n FROM from_first WHERE tenant_id IS NOT NULL),
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
                   ORDER BY pause_expires_at LIMIT $3 + 8)
                 UNION ALL
                 -- Runs waiting for their children past their own time limit.
                 (SELECT id, queued_at, pause_expires_at FROM runs
                   WHERE status = 'waiting' AND pause_expires_at IS NOT NULL
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
                        WHEN 'waiting' THEN r.pause_expires_at < now()
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
                                  WHEN 'waiting' THEN true
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
         SELECT *, (SELECT tenant_id FROM tenants ORDER BY n DESC LIMIT 1) AS window_end
           FROM claimed"
);

/// A lease the heartbeat found still held: renewed, or skipped because another transaction
/// had its row locked.
#[derive(Clone, Copy, Debug, sqlx::FromRow)]
pub struct Renewed {
    /// The run.
    pub id: WorkflowId,
    /// The attempt that holds it.
    pub attempt: i32,
    /// Whether someone asked to cancel the run.
    pub cancel_requested: bool,
    /// Whether the lease was renewed. `false`: the row was locked (an erasure of its thread, a
    /// cancel in flight), so it was skipped rather than waited for; the attempt still holds
    /// the run, and the next beat renews it.
    pub renewed: bool,
}

/// Renews the leases of all `(run, attempt)` pairs still held, in one statement that never
/// waits for a row lock. A pair missing from the result has lost its lease (reclaimed, or no
/// longer running): its worker must stop. A pair whose row another transaction holds locked is
/// skipped (`FOR NO KEY UPDATE SKIP LOCKED`) and comes back not [`Renewed::renewed`]: one locked
/// row (a thread being erased) must not hold up the renewal of every other run the worker
/// holds, other tenants' included (review B-H1).
pub async fn heartbeat(
    executor: impl PgExecutor<'_>,
    held: &[(WorkflowId, i32)],
    lease: Duration,
) -> sqlx::Result<Vec<Renewed>> {
    let ids: Vec<WorkflowId> = held.iter().map(|(id, _)| *id).collect();
    let attempts: Vec<i32> = held.iter().map(|(_, attempt)| *attempt).collect();
    // The skipped rows are read without a lock, from the statement's snapshot: a plain read
    // never waits.
    sqlx::query_as(
        "WITH held AS (SELECT * FROM unnest($1::uuid[], $2::int[]) AS held(id, attempt)),
              free AS (
                  SELECT r.id FROM runs r JOIN held ON r.id = held.id
                   WHERE r.attempt = held.attempt AND r.status = 'running'
                     FOR NO KEY UPDATE OF r SKIP LOCKED),
              renewed AS (
                  UPDATE runs r
                     SET lease_expires_at = now() + $3, heartbeat_at = now()
                    FROM free
                   WHERE r.id = free.id
               RETURNING r.id, r.attempt, r.cancel_requested_at IS NOT NULL AS cancel_requested)
         SELECT id, attempt, cancel_requested, true AS renewed FROM renewed
         UNION ALL
         SELECT r.id, r.attempt, r.cancel_requested_at IS NOT NULL, false
           FROM runs r JOIN held ON r.id = held.id
          WHERE r.attempt = held.attempt AND r.status = 'running'
            AND r.id NOT IN (SELECT id FROM renewed)",
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
    // the run is not paused) or the API finds the run paused and cancels it itself. `now()` is
    // the transaction's start: one deadline throughout.
    let row: Option<(bool, DateTime<Utc>)> = sqlx::query_as(concat!(
        "WITH ",
        held!(),
        ",
         paused AS (
             UPDATE runs r
                SET status = $3, pause_expires_at = now() + $5,
                    pending_action = jsonb_set($4, '{expires_at}', to_jsonb(now() + $5)), ",
        parked!(),
        "
               FROM held
              WHERE r.id = held.id AND NOT held.cancel)
         SELECT cancel, now() + $5 FROM held"
    ))
    .bind(id)
    .bind(attempt)
    .bind(status)
    .bind(db::storable(pending_action)?)
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
    .bind(db::storable_text(outcome.content))
    .bind(db::storable(outcome.parts)?)
    .bind(Json(outcome.usage))
    .bind(outcome.error.map(db::storable).transpose()?)
    .bind(outcome.final_step.map(db::storable).transpose()?)
    .bind(outcome.output.map(db::storable).transpose()?)
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
mod tests;
