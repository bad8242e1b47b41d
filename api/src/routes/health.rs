//! Liveness and readiness.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use serde_json::{Value, json};

use crate::app::AppState;
use crate::error::ApiError;
use crate::error::ErrorBody;
use utoipa_axum::{router::OpenApiRouter, routes};

/// `/healthz` and `/readyz`.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(readyz))
}

/// Liveness: the process answers.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "health",
    responses(
        (status = 200, description = "`{\"status\": \"ok\"}`", body = Object,
            example = json!({"status": "ok"})),
    )
)]
async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// How long readiness waits for each store.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Readiness: Postgres answers. Redis is only the stream's replay buffer: without it messages,
/// runs and cancels still work (streams answer 503), so its absence is reported as `degraded`
/// and does not take the API out of service.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "health",
    responses(
        (status = 200, description = "Postgres answers; `status` is `degraded` (and `redis` \
            `unreachable`) while Redis does not.", body = Object,
            example = json!({"status": "ready", "postgres": "ok", "redis": "ok"})),
        (status = 503, description = "`not_ready`: Postgres does not answer.", body = ErrorBody,
            headers(("Retry-After" = u32, description = "Seconds to wait."))),
    )
)]
async fn readyz(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let postgres = tokio::time::timeout(PROBE_TIMEOUT, sqlx::query("SELECT 1").execute(&state.db));
    let mut conn = state.streams.conn();
    let ping = redis::cmd("PING");
    let redis = tokio::time::timeout(PROBE_TIMEOUT, ping.query_async::<String>(&mut conn));
    let (postgres, redis) = tokio::join!(postgres, redis);
    if !matches!(postgres, Ok(Ok(_))) {
        return Err(ApiError::Unavailable {
            code: "not_ready",
            message: "not reachable: Postgres".to_owned(),
            retry_after: 1,
        });
    }
    Ok(Json(if matches!(redis, Ok(Ok(_))) {
        json!({"status": "ready", "postgres": "ok", "redis": "ok"})
    } else {
        json!({"status": "degraded", "postgres": "ok", "redis": "unreachable"})
    }))
}
