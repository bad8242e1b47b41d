//! `GET /.well-known/jwks.json`: the public keys that verify `X-Spool-Identity`, the token
//! every tool, MCP and hook call carries (`spool_shared::identity`). Public and unauthenticated
//! by design: tools fetch it to verify, and a public key lets nobody sign.

use axum::Json;
use axum::extract::State;
use axum::http::header::{CACHE_CONTROL, HeaderValue};
use axum::response::IntoResponse;
use utoipa_axum::{router::OpenApiRouter, routes};

use spool_shared::identity::Jwks;

use crate::app::AppState;

/// `/.well-known/jwks.json`.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(get_identity_jwks))
}

/// The identity keys: the current one (whose `kid` new tokens carry) and the retired ones
/// still accepted. A tool verifies `X-Spool-Identity` (EdDSA, `typ: "spool-identity+jwt"`,
/// `iss: "spool"`, `aud` = its own origin) with the key whose `kid` the token names.
#[utoipa::path(
    get,
    path = "/.well-known/jwks.json",
    tag = "identity",
    responses(
        (status = 200, description = "A JSON Web Key Set of Ed25519 public keys (RFC 8037); \
            cacheable for 5 minutes.", body = Jwks),
    )
)]
async fn get_identity_jwks(State(state): State<AppState>) -> impl IntoResponse {
    // Short enough that a rotation reaches tools within a token's lifetime.
    let cache = HeaderValue::from_static("public, max-age=300");
    (
        [(CACHE_CONTROL, cache)],
        Json(state.config.identity_jwks.clone()),
    )
}
