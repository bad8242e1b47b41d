//! Liveness and readiness.

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{Value, json};

use crate::app::AppState;
use crate::error::ApiError;
use crate::error::ErrorBody;

/// `/healthz` and `/readyz`.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
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

/// Readiness: Postgres and Redis answer.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "health",
    responses(
        (status = 200, description = "Both answer.", body = Object,
            example = json!({"status": "ready", "postgres": "ok", "redis": "ok"})),
        (status = 503, description = "`not_ready`", body = ErrorBody,
            headers(("Retry-After" = u32, description = "Seconds to wait."))),
    )
)]
async fn readyz(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let postgres = sqlx::query("SELECT 1").execute(&state.db).await.is_ok();
    let redis = redis::cmd("PING")
        .query_async::<String>(&mut state.streams.conn())
        .await
        .is_ok();
    if !(postgres && redis) {
        let down: Vec<&str> = [(postgres, "Postgres"), (redis, "Redis")]
            .into_iter()
            .filter_map(|(up, name)| (!up).then_some(name))
            .collect();
        return Err(ApiError::Unavailable {
            code: "not_ready",
            message: format!("not reachable: {}", down.join(", ")),
            retry_after: 1,
        });
    }
    Ok(Json(
        json!({"status": "ready", "postgres": "ok", "redis": "ok"}),
    ))
}
