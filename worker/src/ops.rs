//! The worker's own HTTP port for operators: `GET /metrics` (Prometheus), `GET /healthz`
//! (the process answers), `GET /readyz` (Postgres answers). Workers take no API traffic; this
//! port exists so probes and scrapers can reach them.

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Serves the ops routes on `listener` until `shutdown` fires.
pub async fn serve(
    listener: TcpListener,
    db: PgPool,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(db);
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

async fn metrics(State(db): State<PgPool>) -> impl IntoResponse {
    let handle = spool_shared::metrics::install();
    let body = spool_shared::metrics::render(&handle, &db).await;
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body)
}

async fn readyz(State(db): State<PgPool>) -> impl IntoResponse {
    match sqlx::query("SELECT 1").execute(&db).await {
        Ok(_) => (StatusCode::OK, "ready"),
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "Postgres is not reachable"),
    }
}
