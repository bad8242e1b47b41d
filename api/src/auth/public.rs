//! Agents for end users (DESIGN section 13): a public agent (`visibility: "public"`) has
//! `POST /v1/public/agents/{agent_id}/sessions` (no auth; 404 unless the agent is public),
//! which answers a token for a new anonymous user (`anon:<uuid>` of the agent's tenant), valid
//! [`SESSION_TTL_SECS`] and bound to that agent: its messages always run it.
//!
//! With it a caller may create threads, send messages, stream, cancel and read its own threads
//! and messages (the routes that take [`EndUser`] rather than [`Caller`]); anywhere else it is
//! 401 `session_token_refused` ([`super::scoped`]). Other users' ids are 404 as for anyone,
//! so one session never reads another's thread. Every use checks that the agent is still
//! public.
//!
//! Browsers: a request carrying an `Origin` must come from one of the agent's `cors_origins`
//! (403 `origin_not_allowed`, before anything changes); the session remembers the origin that
//! opened it, and [`cors`] answers that origin's preflights and lets it read the answers.

use axum::Json;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use spool_shared::AgentId;
use spool_shared::agent::Visibility;
use spool_shared::db::agents;
use spool_shared::db::threads::Owner;
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::app::AppState;
use crate::error::{ApiError, ErrorBody};
use crate::extract::ApiPath;

use super::scoped::{Kind, now};
use super::{Caller, bearer, missing, unauthorized};

/// How long a public session's token is valid, in seconds.
pub const SESSION_TTL_SECS: u64 = 3600;

/// `POST /v1/public/agents/{agent_id}/sessions`.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(post_session))
}

/// What a session's token says.
#[derive(Debug, Serialize, Deserialize)]
struct SessionClaims {
    /// The anonymous user, `anon:<uuid>`.
    sub: String,
    /// The agent's tenant.
    tenant: String,
    /// The agent every message of the session runs.
    agent: AgentId,
    /// The browser origin that opened the session, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    origin: Option<String>,
    /// Expiry, seconds since the epoch.
    exp: u64,
}

/// A public session.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SessionResponse {
    /// The session's token (`Authorization: Bearer`, or `?access_token=` on a stream).
    pub token: String,
    /// The anonymous user it stands for.
    pub user_id: String,
    /// When it expires (an hour from now).
    pub expires_at: DateTime<Utc>,
}

fn origin_of(headers: &HeaderMap) -> Result<Option<&str>, ApiError> {
    headers
        .get(header::ORIGIN)
        .map(|value| {
            value
                .to_str()
                .map_err(|_| ApiError::bad_request("invalid_origin", "malformed Origin header"))
        })
        .transpose()
}

fn origin_refused(origin: &str) -> ApiError {
    tracing::info!(
        auth.code = "origin_not_allowed",
        origin,
        "public session origin refused"
    );
    ApiError::Forbidden {
        code: "origin_not_allowed",
        message: format!("the origin {origin} is not among the agent's cors_origins"),
    }
}

/// Opens a session with a public agent, for a new anonymous user: no auth.
#[utoipa::path(
    post,
    path = "/v1/public/agents/{agent_id}/sessions",
    tag = "public",
    params(("agent_id" = AgentId, Path, description = "The public agent.")),
    responses(
        (status = 201, description = "The session's token, its user and expiry.", body = SessionResponse),
        (status = 400, description = "`invalid_origin`", body = ErrorBody),
        (status = 403, description = "`origin_not_allowed`: the request's `Origin` is not among the agent's `cors_origins`", body = ErrorBody),
        (status = 404, description = "`agent_not_found` (also an agent that is not public), `not_found`", body = ErrorBody),
    )
)]
async fn post_session(
    State(state): State<AppState>,
    ApiPath(agent_id): ApiPath<AgentId>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (tenant, agent) = agents::find_public(&state.db, agent_id)
        .await?
        .ok_or_else(|| ApiError::not_found("agent_not_found", "no such public agent"))?;
    let origin = origin_of(&headers)?;
    if let Some(origin) = origin
        && !agent.spec.0.cors_origins.iter().any(|o| o == origin)
    {
        return Err(origin_refused(origin));
    }
    let exp = now() + SESSION_TTL_SECS;
    let claims = SessionClaims {
        sub: format!("anon:{}", uuid::Uuid::new_v4()),
        tenant,
        agent: agent_id,
        origin: origin.map(str::to_owned),
        exp,
    };
    let token = state.jwt.scoped.sign(Kind::Session, &claims)?;
    let expires_at = DateTime::from_timestamp(i64::try_from(exp).map_err(anyhow::Error::from)?, 0)
        .ok_or_else(|| anyhow::anyhow!("expiry out of range"))?;
    tracing::info!(agent.id = %agent_id, user = %claims.sub, "public session opened");
    let body = SessionResponse {
        token,
        user_id: claims.sub,
        expires_at,
    };
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// Verifies a session's token for a request: signature, expiry, the agent still public, and
/// the request's `Origin` (if any) the one that opened the session and still listed.
pub(crate) async fn authenticate(
    state: &AppState,
    headers: &HeaderMap,
    token: &str,
) -> Result<(Caller, AgentId), ApiError> {
    let claims: SessionClaims = state.jwt.scoped.verify(Kind::Session, token)?;
    let agent = agents::find(&state.db, claims.agent, &claims.tenant)
        .await?
        .filter(|agent| agent.spec.0.visibility == Visibility::Public);
    let Some(agent) = agent else {
        tracing::info!(
            auth.code = "invalid_token",
            "the session's agent is no longer public"
        );
        return Err(unauthorized(
            "invalid_token",
            "the session's agent is no longer public",
        ));
    };
    if let Some(origin) = origin_of(headers)?
        && (claims.origin.as_deref() != Some(origin)
            || !agent.spec.0.cors_origins.iter().any(|o| o == origin))
    {
        return Err(origin_refused(origin));
    }
    let owner = Owner {
        tenant_id: claims.tenant,
        user_id: claims.sub,
    };
    Ok((Caller::restricted(owner), claims.agent))
}

/// Whether `caller` may see and use an agent: a `private` one only with the right to write
/// agents (`admin`).
pub(crate) fn may_use(caller: &Caller, spec: &spool_shared::agent::AgentSpec) -> bool {
    spec.visibility != Visibility::Private || caller.admin
}

/// The caller of a route a public session may use: an ordinary caller, or a session (its
/// anonymous user, and the agent its messages run).
#[derive(Debug)]
pub struct EndUser {
    /// Who calls.
    pub caller: Caller,
    /// The agent a public session is bound to (`None` for any other caller).
    pub agent: Option<AgentId>,
}

impl EndUser {
    /// The agent a request names, given the session's binding: a session's own agent (another
    /// one is 404 `agent_not_found`, as an agent it cannot see).
    pub fn agent(&self, requested: Option<AgentId>) -> Result<Option<AgentId>, ApiError> {
        match (self.agent, requested) {
            (Some(bound), Some(requested)) if bound != requested => {
                Err(ApiError::not_found("agent_not_found", "no such agent"))
            }
            (Some(bound), _) => Ok(Some(bound)),
            (None, requested) => Ok(requested),
        }
    }
}

impl FromRequestParts<AppState> for EndUser {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let token = bearer(&parts.headers)?.ok_or_else(missing)?;
        if Kind::of(token) == Some(Kind::Session) {
            let (caller, agent) = authenticate(state, &parts.headers, token).await?;
            return Ok(Self {
                caller,
                agent: Some(agent),
            });
        }
        Ok(Self {
            caller: Caller::from_request_parts(parts, state).await?,
            agent: None,
        })
    }
}

/// Whether a public session may use `path` at all (what [`EndUser`] routes serve).
fn session_path(path: &str) -> bool {
    let Some(rest) = path.strip_prefix("/v1/") else {
        return false;
    };
    let parts: Vec<&str> = rest.split('/').collect();
    matches!(
        parts.as_slice(),
        ["threads"]
            | ["threads", _]
            | ["threads", _, "messages" | "user_message" | "stream"]
            | ["workflows", _, "cancel"]
            | ["public", "agents", _, "sessions"]
    )
}

/// CORS for public sessions' browsers, outside the server-wide `SPOOL_CORS_ORIGINS` layer: a
/// preflight (which carries no credentials) to a route sessions use is answered for an origin
/// some public agent lists (the request itself is then checked against its session's agent,
/// 403 `origin_not_allowed`); the answer to a session's request carries
/// `Access-Control-Allow-Origin` for its origin (checked by [`authenticate`]).
pub async fn cors(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let origin = request.headers().get(header::ORIGIN).cloned();
    let path = request.uri().path().to_owned();
    let Some(origin) = origin.filter(|_| session_path(&path)) else {
        return next.run(request).await;
    };
    let preflight = request.method() == Method::OPTIONS
        && request
            .headers()
            .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    let from_session = path.starts_with("/v1/public/")
        || bearer(request.headers())
            .ok()
            .flatten()
            .or_else(|| access_token(request.uri().query()))
            .is_some_and(|token| Kind::of(token) == Some(Kind::Session));
    if preflight {
        let listed = match origin.to_str() {
            Ok(text) => agents::origin_listed(&state.db, text).await,
            Err(_) => Ok(false),
        };
        match listed {
            Ok(true) => {
                let mut response = StatusCode::NO_CONTENT.into_response();
                allow(response.headers_mut(), origin, true);
                return response;
            }
            // Not a public agent's: the server-wide CORS layer answers.
            Ok(false) => return next.run(request).await,
            Err(err) => return ApiError::from(err).into_response(),
        }
    }
    let mut response = next.run(request).await;
    if from_session
        && !response
            .headers()
            .contains_key(header::ACCESS_CONTROL_ALLOW_ORIGIN)
    {
        allow(response.headers_mut(), origin, false);
    }
    response
}

fn access_token(query: Option<&str>) -> Option<&str> {
    query?
        .split('&')
        .find_map(|pair| pair.strip_prefix("access_token="))
}

fn allow(headers: &mut HeaderMap, origin: HeaderValue, preflight: bool) {
    headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    headers.append(header::VARY, HeaderValue::from_static("origin"));
    if preflight {
        headers.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("GET, POST"),
        );
        headers.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static("authorization, content-type, last-event-id, idempotency-key"),
        );
        headers.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static("600"),
        );
    }
}
