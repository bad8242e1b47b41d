//! Wakes the workers after enqueues commit: one `NOTIFY spool_runs` at a time per API process,
//! each one sent after every enqueue it answers for had committed.
//!
//! The NOTIFY used to ride in the enqueue's own statement. Postgres commits notifying
//! transactions one at a time (`PreCommit_Notify` takes a database-wide lock and holds it through
//! the commit's WAL flush), so enqueues could not share a flush: pgbench ran the enqueue
//! statement at 2,100–2,400 a second with it and 4,400 without it (16 clients, this machine).
//! Here the enqueue commits alone and calls [`Wake::wake`]; one task sends the NOTIFY. Wakes
//! that come while it is sending, or within [`MIN_GAP`] of its start, are folded into the next
//! one, so under load there are at most 500 NOTIFYs a second per API process, not one per run
//! (each one wakes every listening worker, which then claims), and an idle system's first
//! enqueue still wakes the workers within a round trip of its commit.
//!
//! A wake is a hint, not the record: the run is committed before it. A NOTIFY lost to a crash
//! of this process or of Postgres delays a run by at most the workers' poll interval
//! (`SPOOL_POLL_INTERVAL_MS`), as it always could. That is also why the NOTIFY commits with
//! `synchronous_commit` off: its transaction holds nothing worth a flush. (Hence not
//! [`spool_shared::db::notify_runs`]: its callers notify inside transactions whose commit must
//! stay synchronous, and `set_config(..., true)` there would make that whole commit
//! asynchronous.)

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use spool_shared::db::RUNS_CHANNEL;

/// The least time between the starts of two NOTIFYs: wakes within it share the second one.
pub const MIN_GAP: Duration = Duration::from_millis(2);

/// The process's worker waker; cheap to clone.
#[derive(Clone, Debug)]
pub struct Wake {
    pending: mpsc::Sender<()>,
}

impl Wake {
    /// Starts the task that sends the NOTIFYs; it stops when `shutdown` fires or every `Wake`
    /// is dropped.
    pub fn start(db: sqlx::PgPool, shutdown: CancellationToken) -> Self {
        // One slot: a wake while a NOTIFY is in flight waits there for the next one; more are
        // the same wake.
        let (pending, mut woken) = mpsc::channel(1);
        tokio::spawn(async move {
            let mut last: Option<Instant> = None;
            loop {
                let next = tokio::select! {
                    next = woken.recv() => next,
                    () = shutdown.cancelled() => None,
                };
                if next.is_none() {
                    break;
                }
                if let Some(last) = last {
                    // Wakes that come meanwhile fill the slot: this NOTIFY answers for them.
                    tokio::time::sleep_until(last + MIN_GAP).await;
                    let _ = woken.try_recv();
                }
                last = Some(Instant::now());
                let sent = sqlx::query(
                    "SELECT set_config('synchronous_commit', 'off', true), pg_notify($1, '')",
                )
                .bind(RUNS_CHANNEL)
                .execute(&db)
                .await;
                if let Err(err) = sent {
                    tracing::warn!(error = %err, "could not wake the workers; they poll");
                }
            }
        });
        Self { pending }
    }

    /// Asks for a NOTIFY after this moment: call it once an enqueue has committed.
    pub fn wake(&self) {
        // Full: a NOTIFY is already due after this moment.
        let _ = self.pending.try_send(());
    }
}
