//! Prometheus metrics: one process-wide recorder, rendered at `GET /metrics` by the API and by
//! the worker's own port. Names are `spool_*`; labels are few and bounded (route templates,
//! statuses, tool kinds, model names), never ids.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use sqlx::PgPool;

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the process-wide recorder (once; later calls return the same handle).
pub fn install() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new();
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            // Fails only if another recorder was installed first; then ours just stays unused.
            let _ = ::metrics::set_global_recorder(recorder);
            handle
        })
        .clone()
}

/// Renders every metric in the Prometheus text format, with the queue's depth and the age of
/// its oldest run read from Postgres at scrape time.
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
