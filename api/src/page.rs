//! The chat page at `/` (docs/clients.md): three static files compiled into the binary (no build
//! step, no CDN, no framework). It signs in with `/#token=T` (kept in the tab's
//! `sessionStorage`), opens `/?thread=ID`, lists threads, sends (the page's only `textarea`;
//! Enter sends), streams each reply (its URL carrying a stream token, never the signed-in token) into an element with `data-role="assistant"` (dropping a
//! crashed attempt's tentative text on `attempt_restarted`, resuming a dropped network with
//! `Last-Event-ID`, following a reply in progress after a reload), answers approvals and client
//! tools, and cancels. A refused token shows the sign-in form again.

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

use crate::app::AppState;
use utoipa_axum::{router::OpenApiRouter, routes};

const INDEX: &str = include_str!("page/index.html");
const SCRIPT: &str = include_str!("page/app.js");
const STYLE: &str = include_str!("page/app.css");

/// `/`, `/app.js`, `/app.css`.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(index))
        .routes(routes!(script))
        .routes(routes!(style))
}

fn file(body: &'static str, content_type: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // Only this origin's own files and API: no inline script, nothing from elsewhere.
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; script-src 'self'; style-src 'self'; connect-src 'self'; \
             img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
        ),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

/// The chat page.
#[utoipa::path(get, path = "/", tag = "page",
    responses((status = 200, description = "The chat page (HTML).", content_type = "text/html", body = String)))]
pub(crate) async fn index() -> Response {
    file(INDEX, "text/html; charset=utf-8")
}

/// The chat page's script.
#[utoipa::path(get, path = "/app.js", tag = "page",
    responses((status = 200, description = "The page's script.", content_type = "text/javascript", body = String)))]
pub(crate) async fn script() -> Response {
    file(SCRIPT, "text/javascript; charset=utf-8")
}

/// The chat page's style sheet.
#[utoipa::path(get, path = "/app.css", tag = "page",
    responses((status = 200, description = "The page's style sheet.", content_type = "text/css", body = String)))]
pub(crate) async fn style() -> Response {
    file(STYLE, "text/css; charset=utf-8")
}
