//! `GET /metrics` (Prometheus text format) and the middleware that counts requests by route
//! template and status. The route is the matched template (`/v1/threads/{thread_id}`), never
//! the concrete path, so label values stay bounded.
//!
//! `/metrics` shows fleet data (queue depth, model names of every tenant): with
//! `SPOOL_METRICS_TOKEN` set it answers only a request bearing that token (review B-L12). The
//! gauges it reads from Postgres are read at most every few seconds however often it is
//! scraped ([`spool_shared::metrics::QueueGauges`]).

use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use secrecy::ExposeSecret as _;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::app::AppState;
use crate::error::{ApiError, ErrorBody};

/// `/metrics`.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(get_metrics))
}

/// Prometheus metrics.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "health",
    responses(
        (status = 200, description = "Metrics in the Prometheus text format.",
            content_type = "text/plain", body = String),
        (status = 401, description = "`invalid_token`: `SPOOL_METRICS_TOKEN` is set and the \
            request does not bear it (`Authorization: Bearer <token>`)", body = ErrorBody),
    )
)]
async fn get_metrics(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if let Some(token) = &state.config.metrics_token {
        let authorization = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        if !spool_shared::metrics::bears(authorization, token.expose_secret()) {
            return ApiError::Unauthorized {
                code: "invalid_token",
                message: "/metrics requires the metrics token".into(),
            }
            .into_response();
        }
    }
    let handle = spool_shared::metrics::install();
    let body = spool_shared::metrics::render(&handle, &state.db).await;
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

/// Counts every request and times it, by method, route template and status.
pub async fn track(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let method = request.method().as_str().to_owned();
    let started = Instant::now();
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    metrics::counter!("spool_http_requests_total", "method" => method.clone(), "route" => route.clone(),
        "status" => status)
    .increment(1);
    metrics::histogram!("spool_http_request_duration_seconds", "method" => method, "route" => route)
        .record(started.elapsed().as_secs_f64());
    response
}
