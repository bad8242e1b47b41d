//! The worker's own HTTP port for operators: `GET /metrics` (Prometheus), `GET /healthz`
//! (the process answers), `GET /readyz` (Postgres answers). Workers take no API traffic; this
//! port exists so probes and scrapers can reach them. With `SPOOL_METRICS_TOKEN` set,
//! `/metrics` answers only a request bearing it, as the API's does; the probes stay open.

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use secrecy::{ExposeSecret as _, SecretString};
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// What the ops routes read.
#[derive(Clone)]
struct Ops {
    db: PgPool,
    metrics_token: Option<std::sync::Arc<SecretString>>,
}

/// Serves the ops routes on `listener` until `shutdown` fires; `/metrics` requires
/// `metrics_token` as a bearer token when it is set.
pub async fn serve(
    listener: TcpListener,
    db: PgPool,
    metrics_token: Option<SecretString>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let ops = Ops {
        db: db.clone(),
        metrics_token: metrics_token.map(std::sync::Arc::new),
    };
    let app = Router::new()
        .route("/metrics", get(metrics).with_state(ops))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(db);
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

async fn metrics(State(ops): State<Ops>, headers: HeaderMap) -> axum::response::Response {
    if let Some(token) = &ops.metrics_token {
        let authorization = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        if !spool_shared::metrics::bears(authorization, token.expose_secret()) {
            let body = serde_json::json!({"error": {"code": "invalid_token",
                "message": "/metrics requires the metrics token"}});
            return (StatusCode::UNAUTHORIZED, axum::Json(body)).into_response();
        }
    }
    let handle = spool_shared::metrics::install();
    let body = spool_shared::metrics::render(&handle, &ops.db).await;
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

async fn readyz(State(db): State<PgPool>) -> impl IntoResponse {
    match sqlx::query("SELECT 1").execute(&db).await {
        Ok(_) => (StatusCode::OK, "ready"),
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "Postgres is not reachable"),
    }
}
