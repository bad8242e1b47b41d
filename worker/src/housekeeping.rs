//! Housekeeping: what no request or run cleans up by itself. Each worker does it at start and
//! every [`INTERVAL`], in short batches (several workers doing it at once skip each other's
//! rows), in this order (DESIGN section 15, docs/operations.md "Retention"):
//! 1. usage of ended runs rolled up by day (`db::usage::roll_up`), so the report keeps its
//!    totals once the detail below is gone;
//! 2. step payloads and timelines of runs that ended `SPOOL_RETENTION_STEPS_DAYS` ago, once
//!    their usage is rolled up;
//! 3. per-run usage figures older than `SPOOL_RETENTION_USAGE_DETAIL_DAYS`;
//! 4. idempotency keys older than `SPOOL_RETENTION_IDEMPOTENCY_HOURS`, which answer a repeated
//!    request and are worth nothing after;
//! 5. the webhook outbox's delivered and abandoned rows older than
//!    `SPOOL_RETENTION_WEBHOOKS_DAYS` ([`webhooks::purge`]).
//!
//! Each batch is one statement that commits by itself: a crash between two loses no work and
//! repeats none (the roll-up marks what it counted in the statement that counts it).

use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use spool_shared::config::RetentionArgs;
use spool_shared::db::{idempotency, steps, usage, webhooks};

/// How often a worker purges.
pub const INTERVAL: Duration = Duration::from_secs(600);
/// Rows deleted per statement.
const BATCH: i64 = 5_000;
/// Runs rolled up per statement (each with its steps read).
const ROLL_UP_BATCH: i64 = 1_000;
/// Runs whose steps are deleted per statement (each has at most 200 steps).
const STEPS_BATCH: i64 = 200;

/// What one pass did, in rows (runs for the roll-up and the steps).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Purged {
    /// Ended runs whose usage was rolled up.
    pub runs_rolled_up: u64,
    /// Runs whose step payloads were deleted.
    pub runs_steps_deleted: u64,
    /// Per-run usage rows deleted.
    pub usage_detail: u64,
    /// Idempotency keys deleted.
    pub idempotency_keys: u64,
}

/// Purges now and every [`INTERVAL`] until `shutdown` fires; webhook deliveries finished
/// more than `webhook_retention` ago go too.
pub async fn run(
    db: PgPool,
    retention: RetentionArgs,
    webhook_retention: Duration,
    shutdown: CancellationToken,
) {
    let mut ticks = tokio::time::interval(INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            () = shutdown.cancelled() => return,
        }
        match purge(&db, &retention, &shutdown).await {
            Ok(done) if done == Purged::default() => {}
            Ok(done) => tracing::info!(
                runs_rolled_up = done.runs_rolled_up,
                runs_steps_deleted = done.runs_steps_deleted,
                usage_detail = done.usage_detail,
                idempotency_keys = done.idempotency_keys,
                "housekeeping"
            ),
            Err(err) => tracing::warn!(error = %err, "housekeeping failed"),
        }
        match webhooks::purge(&db, webhook_retention, BATCH).await {
            Ok((0, 0)) => {}
            Ok((abandoned, deleted)) => {
                tracing::info!(abandoned, deleted, "webhook outbox purged");
            }
            Err(err) => tracing::warn!(error = %err, "purging the webhook outbox failed"),
        }
    }
}

/// One pass: everything due, a batch at a time, in the order of the module's docs. A stage
/// that fails does not stop the others (a roll-up that keeps failing must not keep idempotency
/// keys forever; steps only go from runs it counted anyway); the first error is returned after
/// all of them ran.
pub async fn purge(
    db: &PgPool,
    retention: &RetentionArgs,
    shutdown: &CancellationToken,
) -> sqlx::Result<Purged> {
    let mut first_error = None;
    let mut keep = |stage: sqlx::Result<u64>| {
        stage.unwrap_or_else(|err| {
            first_error.get_or_insert(err);
            0
        })
    };
    let runs_rolled_up = keep(
        batches(shutdown, ROLL_UP_BATCH, || {
            usage::roll_up(db, ROLL_UP_BATCH)
        })
        .await,
    );
    let runs_steps_deleted = match retention.steps() {
        Some(window) => keep(
            batches(shutdown, STEPS_BATCH, || {
                steps::purge_expired(db, window, STEPS_BATCH)
            })
            .await,
        ),
        None => 0,
    };
    let usage_detail = match retention.usage_detail() {
        Some(window) => {
            keep(batches(shutdown, BATCH, || usage::purge_detail(db, window, BATCH)).await)
        }
        None => 0,
    };
    let window = retention.idempotency();
    let idempotency_keys = keep(
        batches(shutdown, BATCH, || {
            idempotency::purge_expired(db, window, BATCH)
        })
        .await,
    );
    match first_error {
        Some(err) => Err(err),
        None => Ok(Purged {
            runs_rolled_up,
            runs_steps_deleted,
            usage_detail,
            idempotency_keys,
        }),
    }
}

/// Runs `batch` until one does less than `size` (or `shutdown` fires); returns the total.
async fn batches<F, Fut>(shutdown: &CancellationToken, size: i64, mut batch: F) -> sqlx::Result<u64>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = sqlx::Result<u64>>,
{
    let mut total = 0;
    loop {
        let done = batch().await?;
        total += done;
        if done < size.unsigned_abs() || shutdown.is_cancelled() {
            return Ok(total);
        }
    }
}
