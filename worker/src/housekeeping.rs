//! Housekeeping: what no request or run cleans up by itself. The API's idempotency keys,
//! which answer a repeated request for 24 hours and are worth nothing after; and the webhook
//! outbox, whose delivered and abandoned rows are kept for `SPOOL_RETENTION_WEBHOOKS_DAYS`
//! ([`webhooks::purge`]). Each worker purges at start and every [`INTERVAL`], in short
//! batches (several workers doing it at once skip each other's rows).

use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use spool_shared::db::{idempotency, webhooks};

/// How often a worker purges.
pub const INTERVAL: Duration = Duration::from_secs(600);
/// Rows deleted per statement.
const BATCH: i64 = 5_000;

/// Purges now and every [`INTERVAL`] until `shutdown` fires; webhook deliveries finished
/// more than `webhook_retention` ago go too.
pub async fn run(db: PgPool, webhook_retention: Duration, shutdown: CancellationToken) {
    let mut ticks = tokio::time::interval(INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            () = shutdown.cancelled() => return,
        }
        match purge(&db, &shutdown).await {
            Ok(0) => {}
            Ok(purged) => tracing::info!(purged, "expired idempotency keys purged"),
            Err(err) => tracing::warn!(error = %err, "purging expired idempotency keys failed"),
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

/// Deletes every expired key, a batch at a time; returns how many.
pub async fn purge(db: &PgPool, shutdown: &CancellationToken) -> sqlx::Result<u64> {
    let mut purged = 0;
    loop {
        let batch = idempotency::purge_expired(db, BATCH).await?;
        purged += batch;
        if batch < BATCH.unsigned_abs() || shutdown.is_cancelled() {
            return Ok(purged);
        }
    }
}
