//! The claim loop and graceful shutdown.
//!
//! The loop waits for room (a concurrency permit), takes all the room there is, and claims up
//! to that many runs in one statement ([`runs::claim`]). When the claim fills less than its
//! room, the queue had no more for this worker: it sleeps until a NOTIFY on [`RUNS_CHANNEL`] or
//! the polling interval, whichever comes first (expired leases never notify). A wake-up first
//! reads every notification that has already arrived, since the one claim after it sees all
//! their runs; notifications that arrive later wake it again. In-flight runs live in a
//! `TaskTracker`, each holding its permit.
//!
//! On shutdown it stops claiming, lets in-flight runs finish for the grace period, then tells
//! the rest to stop and give their runs back to the queue without counting a crash.
//!
//! [`run_next`] is the same work one run at a time: claim, execute the attempt to its end,
//! return. Tests drive the agent loop with it, with no HTTP and no claim loop in between.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use spool_shared::WorkflowId;
use spool_shared::db::runs::{self, Claimed};
use spool_shared::db::{CANCEL_CHANNEL, RUNS_CHANNEL};
use spool_shared::status::RunStatus;

use crate::attempt::{self, Ended};
use crate::lease::{Canceller, Lease, LeaseKeeper};
use crate::worker::Worker;

/// An attempt [`run_next`] executed.
#[derive(Debug)]
pub struct Executed {
    /// The run.
    pub workflow_id: WorkflowId,
    /// The attempt.
    pub attempt: i32,
    /// How it ended; `None` if it failed and left its lease to expire (the run is retried).
    pub ended: Option<Ended>,
}

/// Claims the next claimable run, if any, and executes that attempt to its end. `keeper`
/// renews its lease meanwhile; nothing releases it early (no shutdown), and cancel requests
/// reach it through the heartbeat.
pub async fn run_next(worker: &Worker, keeper: &LeaseKeeper) -> anyhow::Result<Option<Executed>> {
    let Some((claimed, lease)) = claim(worker, keeper).await? else {
        return Ok(None);
    };
    let (workflow_id, attempt) = (claimed.run().id, claimed.run().attempt);
    let ended = attempt::execute(worker.clone(), claimed, lease, CancellationToken::new()).await;
    Ok(Some(Executed {
        workflow_id,
        attempt,
        ended,
    }))
}

/// Claims one run (one statement) and starts holding its lease.
async fn claim(worker: &Worker, keeper: &LeaseKeeper) -> sqlx::Result<Option<(Claimed, Lease)>> {
    Ok(claim_batch(worker, keeper, 1).await?.pop())
}

/// Claims up to `room` runs (one statement) and starts holding their leases.
async fn claim_batch(
    worker: &Worker,
    keeper: &LeaseKeeper,
    room: usize,
) -> sqlx::Result<Vec<(Claimed, Lease)>> {
    let claimed_from = Instant::now();
    let lease = worker.args.lease.lease();
    let room = u32::try_from(room).unwrap_or(u32::MAX);
    let after = worker.claim_cursor.lock().await.clone();
    let claimed = runs::claim(&worker.claims, &worker.id, lease, room, after.as_deref()).await?;
    // The next claim's window starts after this one's; a claim that took nothing starts over.
    *worker.claim_cursor.lock().await = claimed
        .first()
        .and_then(|c| c.window_end().map(str::to_owned));
    Ok(claimed
        .into_iter()
        .map(|claimed| {
            record_claim(&claimed);
            let held = keeper.hold(claimed.run().id, claimed.run().attempt, claimed_from);
            (claimed, held)
        })
        .collect())
}

/// Claims and executes runs until `shutdown` fires, then drains. Returns when every in-flight
/// run has finished or been released.
pub async fn run(worker: Worker, shutdown: CancellationToken) -> anyhow::Result<()> {
    let args = worker.args.clone();
    let keeper = LeaseKeeper::start(
        &worker.database_url,
        worker.db_timeouts,
        args.lease.lease(),
        args.lease.heartbeat(),
    )
    .context("starting the lease keeper")?;
    let mut listener = PgListener::connect_with(&worker.db)
        .await
        .context("LISTEN connection")?;
    listener.listen(RUNS_CHANNEL).await.context("LISTEN")?;
    let background = background(&worker, &keeper, &shutdown);
    let permits = Arc::new(Semaphore::new(args.concurrency));
    let tracker = TaskTracker::new();
    let release = CancellationToken::new();
    tracing::info!(worker.id = %worker.id, concurrency = args.concurrency, "worker started");

    loop {
        let first = tokio::select! {
            permit = permits.clone().acquire_owned() => permit.context("permits closed")?,
            () = shutdown.cancelled() => break,
        };
        let mut room = vec![first];
        while let Ok(permit) = permits.clone().try_acquire_owned() {
            room.push(permit);
        }
        let wanted = room.len();
        let claimed = claim_batch(&worker, &keeper, wanted).await;
        let queue_emptied = match claimed {
            Ok(claimed) => {
                let emptied = claimed.len() < wanted;
                for ((claimed, held), permit) in claimed.into_iter().zip(room) {
                    let execute = attempt::execute(worker.clone(), claimed, held, release.clone());
                    tracker.spawn(async move {
                        // Held for as long as the attempt runs.
                        let _permit = permit;
                        execute.await
                    });
                }
                emptied
            }
            Err(err) => {
                tracing::warn!(error = %err, "claim failed");
                tokio::select! {
                    () = tokio::time::sleep(args.poll_interval()) => {}
                    () = shutdown.cancelled() => break,
                }
                continue;
            }
        };
        if !queue_emptied {
            continue;
        }
        tokio::select! {
            notification = listener.recv() => match notification {
                // What else has arrived is served by the same next claim.
                Ok(_) => while listener.next_buffered().is_some() {},
                Err(err) => {
                    // The listener reconnects on the next call; poll meanwhile.
                    tracing::warn!(error = %err, "LISTEN connection failed");
                    tokio::time::sleep(args.poll_interval()).await;
                }
            },
            () = tokio::time::sleep(args.poll_interval()) => {}
            () = shutdown.cancelled() => break,
        }
    }

    drain(&tracker, &release, args.shutdown_grace()).await;
    for task in background {
        task.abort();
    }
    drop(keeper);
    tracing::info!("worker stopped");
    Ok(())
}

/// The tasks a worker runs beside its claim loop: cancel requests forwarded to the lease
/// keeper, housekeeping, webhook deliveries.
fn background(
    worker: &Worker,
    keeper: &LeaseKeeper,
    shutdown: &CancellationToken,
) -> [tokio::task::JoinHandle<()>; 3] {
    [
        tokio::spawn(listen_for_cancels(worker.db.clone(), keeper.canceller())),
        tokio::spawn(crate::housekeeping::run(
            worker.db.clone(),
            worker.args.retention.clone(),
            worker.args.webhooks.retention(),
            shutdown.clone(),
        )),
        tokio::spawn(crate::webhooks::run(
            worker.db.clone(),
            Arc::clone(&worker.egress),
            crate::webhooks::Pace {
                concurrency: worker.args.webhooks.webhooks_concurrency,
                per_tenant: worker.args.webhooks.in_flight_per_tenant(),
                lease: worker.args.lease.lease(),
                idle_poll: worker.args.poll_interval(),
            },
            shutdown.clone(),
        )),
    ]
}

/// Waits for the attempts in flight, for at most `grace`; then releases the rest to the queue
/// and waits for them to let go.
async fn drain(tracker: &TaskTracker, release: &CancellationToken, grace: Duration) {
    tracker.close();
    tracing::info!(in_flight = tracker.len(), "worker draining");
    if tokio::time::timeout(grace, tracker.wait()).await.is_err() {
        tracing::info!(
            in_flight = tracker.len(),
            "grace period over; releasing in-flight runs"
        );
        release.cancel();
        tracker.wait().await;
    }
}

/// Forwards cancel requests (NOTIFY on [`CANCEL_CHANNEL`], payload: the workflow id) to the runs
/// this worker holds, on a connection of its own so a busy claim loop never delays them. Lost
/// notifications are covered by the heartbeat, which reads the request from the run's row.
async fn listen_for_cancels(db: PgPool, canceller: Canceller) {
    loop {
        let mut listener = match PgListener::connect_with(&db).await {
            Ok(listener) => listener,
            Err(err) => {
                tracing::warn!(error = %err, "cancel LISTEN connection failed; retrying");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                continue;
            }
        };
        if let Err(err) = listener.listen(CANCEL_CHANNEL).await {
            tracing::warn!(error = %err, "LISTEN for cancels failed; retrying");
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            continue;
        }
        while let Ok(notification) = listener.recv().await {
            if let Ok(id) = notification.payload().parse::<WorkflowId>() {
                canceller.cancel(id);
            }
        }
    }
}

/// Counts a claim by kind and, for runs that waited in the queue, how long they waited.
fn record_claim(claimed: &Claimed) {
    let kind = match claimed.previous_status() {
        RunStatus::Running => "reclaim",
        RunStatus::AwaitingApproval => "approval_expired",
        _ if claimed.run().resumed => "resume",
        _ => "new",
    };
    metrics::counter!("spool_claims_total", "kind" => kind).increment(1);
    if matches!(kind, "new" | "resume") {
        // Both ends from the database clock: the claim set `heartbeat_at` to its now().
        let run = claimed.run();
        let claimed_at = run.heartbeat_at.unwrap_or_else(chrono::Utc::now);
        let waited = (claimed_at - run.queued_at).to_std().unwrap_or_default();
        metrics::histogram!("spool_claim_latency_seconds").record(waited.as_secs_f64());
    }
}
