//! Prometheus metrics: one process-wide recorder, rendered at `GET /metrics` by the API and by
//! the worker's own port. Names are `spool_*`; labels are few and bounded (route templates,
//! statuses, tool kinds, model names), never ids.

use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use sqlx::PgPool;

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// The upper bounds (seconds) of every latency histogram's buckets.
const BUCKETS: [f64; 16] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0,
    600.0,
];

/// Installs the process-wide recorder (once; later calls return the same handle).
pub fn install() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            // Histograms with buckets, not summaries: a summary's quantiles cannot be added up
            // across processes, a histogram's buckets can (`histogram_quantile` over the
            // fleet). From 1 ms to 10 min, for HTTP requests up to whole runs.
            let builder = PrometheusBuilder::new()
                .set_buckets(&BUCKETS)
                .expect("the buckets are not empty");
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            // Fails only if another recorder was installed first; then ours just stays unused.
            let _ = ::metrics::set_global_recorder(recorder);
            handle
        })
        .clone()
}

/// Whether an `Authorization` header value bears `token` (`Bearer <token>`), compared in a time
/// that depends only on the lengths: the check of `SPOOL_METRICS_TOKEN`.
pub fn bears(authorization: Option<&str>, token: &str) -> bool {
    let given = authorization
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default()
        .as_bytes();
    let token = token.as_bytes();
    given.len() == token.len()
        && given
            .iter()
            .zip(token)
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// How long the gauges read from Postgres are reused between scrapes.
pub const QUEUE_GAUGES_EVERY: Duration = Duration::from_secs(5);

/// The gauges read from Postgres (the queue's depth and the age of its oldest run), read at
/// most once per interval however often, and however many at once, `/metrics` is scraped: a
/// scrape storm (the endpoint may be public) costs Postgres one aggregate per interval, not one
/// per scrape (review B-L12).
pub struct QueueGauges {
    every: Duration,
    /// When the gauges may be read again.
    next: Mutex<Option<Instant>>,
}

impl QueueGauges {
    /// Gauges read at most once per `every`.
    pub const fn new(every: Duration) -> Self {
        Self {
            every,
            next: Mutex::new(None),
        }
    }

    /// Reads the gauges from Postgres if the last read is `every` old; returns whether it read
    /// them. Concurrent callers within the interval keep the values already set (at most one
    /// interval old) and do not wait for the read.
    pub async fn refresh(&self, db: &PgPool) -> bool {
        {
            let mut next = self.next.lock().unwrap_or_else(PoisonError::into_inner);
            let now = Instant::now();
            if next.is_some_and(|at| now < at) {
                return false;
            }
            *next = Some(now + self.every);
        }
        let queue: Result<(i64, Option<f64>), _> = sqlx::query_as(
            "SELECT count(*), extract(epoch FROM now() - min(queued_at))::float8
               FROM runs WHERE status = 'queued'",
        )
        .fetch_one(db)
        .await;
        if let Ok((depth, oldest)) = queue {
            ::metrics::gauge!("spool_queue_depth").set(depth as f64);
            ::metrics::gauge!("spool_queue_oldest_age_seconds").set(oldest.unwrap_or(0.0));
        }
        true
    }
}

/// The process's gauges read from Postgres, refreshed every [`QUEUE_GAUGES_EVERY`].
static QUEUE_GAUGES: QueueGauges = QueueGauges::new(QUEUE_GAUGES_EVERY);

/// Renders every metric in the Prometheus text format, with the queue's depth and the age of
/// its oldest run read from Postgres at most every [`QUEUE_GAUGES_EVERY`]. Those two gauges are
/// the fleet's (every process reads the same table): aggregate them with `max`, not `sum`.
pub async fn render(handle: &PrometheusHandle, db: &PgPool) -> String {
    QUEUE_GAUGES.refresh(db).await;
    handle.render()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_bearer_token_passes() {
        assert!(bears(Some("Bearer secret-token"), "secret-token"));
        for wrong in [
            None,
            Some("secret-token"),
            Some("Bearer secret-tokeN"),
            Some("Bearer "),
        ] {
            assert!(!bears(wrong, "secret-token"), "{wrong:?}");
        }
    }

    #[tokio::test]
    async fn a_scrape_storm_reads_postgres_once_per_interval() {
        let db = spool_tests::TestDb::new().await.expect("db");
        let gauges = QueueGauges::new(Duration::from_secs(3600));
        let storm = (0..50).map(|_| gauges.refresh(&db.pool));
        let read = futures::future::join_all(storm).await;
        assert_eq!(read.iter().filter(|read| **read).count(), 1, "{read:?}");
        assert!(!gauges.refresh(&db.pool).await, "still within the interval");
        // Past the interval, the next scrape reads them again.
        let brief = QueueGauges::new(Duration::ZERO);
        assert!(brief.refresh(&db.pool).await);
        assert!(brief.refresh(&db.pool).await);
    }
}
