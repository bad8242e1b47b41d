//! Stream tokens (DESIGN section 13): `POST /v1/threads/{thread_id}/stream_token` answers a
//! token valid [`STREAM_TOKEN_TTL_SECS`] for that thread's stream only, in every format (the
//! native SSE and `?format=ai-sdk`; the OpenAI-compatible routes follow runs they start, not a
//! thread's stream). A browser puts it in the stream URL (`?access_token=`) instead of its
//! long-lived token, so a URL that leaks (history, a proxy's log, a screenshot) opens one
//! thread's stream for minutes. Its expiry is checked when a stream connects: a stream open at
//! the deadline goes on to its `done`.
//!
//! Anywhere else it is 401 `stream_token_refused` ([`super::scoped`]); on another thread's
//! stream too.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use spool_shared::ThreadId;
use spool_shared::db::page::Scope;
use spool_shared::db::threads::{self, Owner};
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::app::AppState;
use crate::error::{ApiError, ErrorBody, MissingPermission, Unauthenticated};
use crate::extract::ApiPath;
use crate::runs::thread_not_found;

use super::scoped::{Kind, now};
use super::{Caller, Permission, bearer, missing, unauthorized};

/// How long a stream token is valid, in seconds.
pub const STREAM_TOKEN_TTL_SECS: u64 = 300;

/// `POST /v1/threads/{thread_id}/stream_token`.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(post_stream_token))
}

/// What a stream token says.
#[derive(Debug, Serialize, Deserialize)]
struct StreamClaims {
    /// The user who asked for it.
    sub: String,
    /// Their tenant.
    tenant: String,
    /// The one thread whose stream it opens.
    thread: ThreadId,
    /// Whether it was minted with the tenant's view (an admin's): the thread is found in the
    /// tenant rather than among `sub`'s own.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    tenant_wide: bool,
    /// Expiry, seconds since the epoch.
    exp: u64,
}

/// A stream token.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct StreamTokenResponse {
    /// The token: `?access_token=` or `Authorization: Bearer` on this thread's stream only.
    pub token: String,
    /// When it stops opening streams (5 minutes from now).
    pub expires_at: DateTime<Utc>,
}

/// A token for this thread's stream only, valid 5 minutes: for URLs (`EventSource`), instead
/// of a long-lived token.
#[utoipa::path(
    post,
    path = "/v1/threads/{thread_id}/stream_token",
    tag = "threads",
    security(("bearer" = ["runs:create"]), ("bearer" = ["runs:read:tenant"])),
    params(("thread_id" = ThreadId, Path, description = "The thread.")),
    responses(
        (status = 201, description = "The token, with its expiry.", body = StreamTokenResponse),
        Unauthenticated,
        MissingPermission,
        (status = 404, description = "`thread_not_found` (also another owner's), `not_found` (not a UUID)", body = ErrorBody),
    )
)]
async fn post_stream_token(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(thread_id): ApiPath<ThreadId>,
) -> Result<(StatusCode, Json<StreamTokenResponse>), ApiError> {
    caller.require_any(Permission::RUNS_READ)?;
    threads::find(&state.db, thread_id, caller.scope())
        .await?
        .ok_or_else(thread_not_found)?;
    let exp = now() + STREAM_TOKEN_TTL_SECS;
    let claims = StreamClaims {
        sub: caller.owner.user_id.clone(),
        tenant: caller.owner.tenant_id.clone(),
        thread: thread_id,
        tenant_wide: matches!(caller.scope(), Scope::Tenant(_)),
        exp,
    };
    let token = state.jwt.scoped.sign(Kind::Stream, &claims)?;
    let expires_at = DateTime::from_timestamp(i64::try_from(exp).map_err(anyhow::Error::from)?, 0)
        .ok_or_else(|| anyhow::anyhow!("expiry out of range"))?;
    Ok((
        StatusCode::CREATED,
        Json(StreamTokenResponse { token, expires_at }),
    ))
}

/// The caller of `GET /v1/threads/{thread_id}/stream`, from the `Authorization` header or
/// `?access_token=`: a stream token for this thread, a public session's token (its own
/// threads), or an ordinary token; 404 `thread_not_found` unless the thread is theirs to read.
pub(crate) async fn authorize_stream(
    state: &AppState,
    headers: &HeaderMap,
    access_token: Option<&str>,
    thread_id: ThreadId,
) -> Result<Caller, ApiError> {
    let token = bearer(headers)?.or(access_token).ok_or_else(missing)?;
    let (caller, tenant_wide) = match Kind::of(token) {
        Some(Kind::Stream) => {
            let claims: StreamClaims = state.jwt.scoped.verify(Kind::Stream, token)?;
            if claims.thread != thread_id {
                tracing::info!(
                    auth.code = "stream_token_refused",
                    "a stream token for another thread"
                );
                return Err(unauthorized(
                    "stream_token_refused",
                    "this stream token is for another thread's stream",
                ));
            }
            let owner = Owner {
                tenant_id: claims.tenant,
                user_id: claims.sub,
            };
            (Caller::restricted(owner), claims.tenant_wide)
        }
        Some(Kind::Session) => (
            super::public::authenticate(state, headers, token).await?.0,
            false,
        ),
        None => {
            let caller = super::authenticate(state, token).await?;
            let tenant_wide = matches!(caller.scope(), Scope::Tenant(_));
            (caller, tenant_wide)
        }
    };
    caller.require_any(Permission::RUNS_READ)?;
    let scope = if tenant_wide {
        Scope::Tenant(&caller.owner.tenant_id)
    } else {
        Scope::Owner(&caller.owner)
    };
    threads::find(&state.db, thread_id, scope)
        .await?
        .ok_or_else(thread_not_found)?;
    Ok(caller)
}
