//! Prometheus metrics: one process-wide recorder, rendered at `GET /metrics` by the API and by
//! the worker's own port. Names are `spool_*`; labels are few and bounded (route templates,
//! statuses, tool kinds, model names), never ids.

use std::sync::OnceLock;

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

/// Renders every metric in the Prometheus text format, with the queue's depth and the age of
/// its oldest run read from Postgres at scrape time. Those two gauges are the fleet's (every
/// process reads the same table): aggregate them with `max`, not `sum`.
pub async fn render(handle: &PrometheusHandle, db: &PgPool) -> String {
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
    handle.render()
}
