//! The lease keeper: renews the leases of every run this worker holds, from its own OS thread
//! and Tokio runtime, so agent work that hogs the main runtime cannot starve the heartbeat.
//!
//! Every heartbeat interval it renews all held `(run, attempt)` pairs in one fenced statement.
//! A pair that is not renewed has lost its lease (another worker reclaimed the run, or it was
//! cancelled out of `running`): its [`Lease::lost`] token fires at once and the run stops. A
//! pair whose row another transaction holds locked (its thread being erased) is skipped, not
//! waited for, and is still held: one locked row never holds up the renewal of the others
//! (review B-H1); it is renewed next beat, or given up once its lease may have expired. When
//! Postgres cannot be reached, a lease is given up as soon as it may have expired by the
//! worker's own monotonic clock, counted from before the last successful renewal was sent, so
//! the worker never keeps acting on a lease the database may already consider expired.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use sqlx::postgres::PgPoolOptions;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use spool_shared::WorkflowId;
use spool_shared::db::{Timeouts, runs};

struct Held {
    attempt: i32,
    /// When the last renewal that succeeded (or the claim) was sent.
    renewed_from: Instant,
    lost: CancellationToken,
    cancel_requested: CancellationToken,
    beats: tokio::sync::watch::Sender<u64>,
}

type Table = Arc<Mutex<HashMap<WorkflowId, Held>>>;

/// Renews the leases this worker holds, on a dedicated thread.
pub struct LeaseKeeper {
    held: Table,
    stop: CancellationToken,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// One held lease. Dropping it stops renewing.
pub struct Lease {
    id: WorkflowId,
    attempt: i32,
    held: Table,
    /// Fires when the lease is lost: the run must stop at once and write nothing more.
    pub lost: CancellationToken,
    /// Fires when someone asks to cancel the run.
    pub cancel_requested: CancellationToken,
    /// Counts successful renewals (the heartbeat events follow it).
    pub beats: tokio::sync::watch::Receiver<u64>,
}

impl LeaseKeeper {
    /// Starts the keeper thread with its own small Postgres pool, whose connections carry
    /// `timeouts` none longer than one heartbeat ([`pool`]).
    pub fn start(
        database_url: &str,
        timeouts: Timeouts,
        lease: Duration,
        heartbeat: Duration,
    ) -> anyhow::Result<Self> {
        let held: Table = Arc::default();
        let stop = CancellationToken::new();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let pool = {
            let _guard = runtime.enter();
            pool(database_url, timeouts, heartbeat)?
        };
        let thread = std::thread::Builder::new()
            .name("spool-lease".into())
            .spawn({
                let held = held.clone();
                let stop = stop.clone();
                move || runtime.block_on(keep(pool, held, stop, lease, heartbeat))
            })?;
        Ok(Self {
            held,
            stop,
            thread: Some(thread),
        })
    }

    /// Starts renewing the lease a claim just took. `claimed_from` is when the claim was sent.
    pub fn hold(&self, id: WorkflowId, attempt: i32, claimed_from: Instant) -> Lease {
        let lost = CancellationToken::new();
        let cancel_requested = CancellationToken::new();
        let (beats_tx, beats) = tokio::sync::watch::channel(0);
        lock(&self.held).insert(
            id,
            Held {
                attempt,
                renewed_from: claimed_from,
                lost: lost.clone(),
                cancel_requested: cancel_requested.clone(),
                beats: beats_tx,
            },
        );
        Lease {
            id,
            attempt,
            held: self.held.clone(),
            lost,
            cancel_requested,
            beats,
        }
    }
}

/// The keeper's pool (connected lazily; call it inside the runtime that uses it): its session
/// timeouts are `timeouts`, none longer than one `heartbeat`. A renewal the keeper stopped
/// waiting for is cancelled by Postgres too, instead of renewing leases later, after the keeper
/// gave them up.
pub fn pool(
    database_url: &str,
    timeouts: Timeouts,
    heartbeat: Duration,
) -> anyhow::Result<sqlx::PgPool> {
    let timeouts = timeouts.at_most(heartbeat);
    let options: sqlx::postgres::PgConnectOptions = database_url.parse()?;
    let options = if options.get_application_name().is_none() {
        options.application_name("spool-worker")
    } else {
        options
    };
    Ok(PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(heartbeat)
        .after_connect(move |conn, _| Box::pin(async move { timeouts.apply(conn).await }))
        .connect_lazy_with(options))
}

impl LeaseKeeper {
    /// A handle that signals cancel requests to the runs this worker holds.
    pub fn canceller(&self) -> Canceller {
        Canceller {
            held: self.held.clone(),
        }
    }
}

/// Signals a cancel request to a held run (from a NOTIFY), ahead of the next heartbeat.
#[derive(Clone)]
pub struct Canceller {
    held: Table,
}

impl Canceller {
    /// Fires the run's `cancel_requested` token if this worker holds it.
    pub fn cancel(&self, id: WorkflowId) {
        if let Some(entry) = lock(&self.held).get(&id) {
            entry.cancel_requested.cancel();
        }
    }
}

impl Drop for LeaseKeeper {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // Only this attempt's entry: the same worker may already hold a later attempt of the
        // run (resumed after a pause, or released and claimed again) under the same id.
        let mut table = lock(&self.held);
        if table
            .get(&self.id)
            .is_some_and(|h| h.attempt == self.attempt)
        {
            table.remove(&self.id);
        }
    }
}

fn lock(table: &Table) -> std::sync::MutexGuard<'_, HashMap<WorkflowId, Held>> {
    // The table stays consistent even if a holder panicked: every update is a single insert
    // or remove.
    table.lock().unwrap_or_else(PoisonError::into_inner)
}

async fn keep(
    pool: sqlx::PgPool,
    held: Table,
    stop: CancellationToken,
    lease: Duration,
    heartbeat: Duration,
) {
    let mut ticks = tokio::time::interval(heartbeat);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    // Give a lease up this long after the last renewal that surely reached the database.
    let safe_for = lease.saturating_sub(heartbeat / 2);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            () = stop.cancelled() => break,
        }
        let pairs: Vec<(WorkflowId, i32)> =
            lock(&held).iter().map(|(id, h)| (*id, h.attempt)).collect();
        if pairs.is_empty() {
            continue;
        }
        let sent = Instant::now();
        let result = tokio::time::timeout(heartbeat, runs::heartbeat(&pool, &pairs, lease)).await;
        let mut table = lock(&held);
        match result {
            Ok(Ok(renewed)) => {
                let renewed: HashMap<WorkflowId, runs::Renewed> =
                    renewed.into_iter().map(|r| (r.id, r)).collect();
                for (id, attempt) in pairs {
                    let Some(entry) = table.get_mut(&id).filter(|h| h.attempt == attempt) else {
                        continue;
                    };
                    match renewed.get(&id) {
                        Some(r) if r.attempt == attempt => {
                            if r.cancel_requested {
                                entry.cancel_requested.cancel();
                            }
                            if r.renewed {
                                entry.renewed_from = sent;
                                entry.beats.send_modify(|n| *n += 1);
                            } else {
                                // Still held, its row locked by another transaction (an
                                // erasure, a cancel): renewed next beat. Until then its lease
                                // runs from the last renewal that happened.
                                tracing::info!(workflow.id = %id, run.attempt = attempt,
                                    "lease not renewed this beat: its row is locked");
                                give_up_if_expired(&id, entry, safe_for);
                            }
                        }
                        _ => {
                            tracing::warn!(workflow.id = %id, run.attempt = attempt, "lease lost");
                            entry.lost.cancel();
                        }
                    }
                }
            }
            Ok(Err(err)) => give_up_expired(&mut table, &err.to_string(), safe_for),
            Err(_) => give_up_expired(&mut table, "heartbeat timed out", safe_for),
        }
    }
}

fn give_up_expired(table: &mut HashMap<WorkflowId, Held>, error: &str, safe_for: Duration) {
    tracing::warn!(error, "lease renewal failed");
    for (id, entry) in table.iter() {
        give_up_if_expired(id, entry, safe_for);
    }
}

/// Stops the run if its lease may have expired: `safe_for` has passed since the last renewal
/// that surely reached the database.
fn give_up_if_expired(id: &WorkflowId, entry: &Held, safe_for: Duration) {
    if entry.renewed_from.elapsed() >= safe_for && !entry.lost.is_cancelled() {
        tracing::warn!(workflow.id = %id, run.attempt = entry.attempt,
            "lease may have expired without a renewal; stopping the run");
        entry.lost.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_keeper_s_connections_carry_the_timeouts_none_longer_than_a_heartbeat() {
        let db = spool_tests::TestDb::new().await.expect("db");
        let timeouts = Timeouts {
            statement: Duration::from_secs(30),
            lock: Duration::from_secs(1),
            idle_in_transaction: Duration::from_secs(60),
        };
        let pool = pool(&db.url, timeouts, Duration::from_secs(2)).expect("pool");
        let (statement, lock, idle): (String, String, String) = sqlx::query_as(
            "SELECT current_setting('statement_timeout'), current_setting('lock_timeout'),
                    current_setting('idle_in_transaction_session_timeout')",
        )
        .fetch_one(&pool)
        .await
        .expect("settings");
        assert_eq!([statement, lock, idle], ["2s", "1s", "2s"]);
    }

    #[test]
    fn dropping_an_attempt_s_lease_leaves_a_later_attempt_of_the_run_held() {
        // Nothing here reaches the database: the pool is lazy and the heartbeat far away.
        let hour = Duration::from_secs(3600);
        let keeper = LeaseKeeper::start(
            "postgres://nobody@127.0.0.1:1/none",
            Timeouts::default(),
            hour,
            hour,
        )
        .expect("keeper");
        let id = WorkflowId::new();
        let first = keeper.hold(id, 1, Instant::now());
        // Resumed after a pause and claimed again by this worker before the first attempt has
        // let go of its lease (it drops it after its final flush).
        let second = keeper.hold(id, 2, Instant::now());
        drop(first);
        keeper.canceller().cancel(id);
        assert!(
            second.cancel_requested.is_cancelled(),
            "the second attempt is still held"
        );
        drop(second);
        assert!(lock(&keeper.held).is_empty());
    }
}
