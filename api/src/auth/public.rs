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
//! Each client address (the socket's peer, or behind `SPOOL_TRUSTED_PROXIES` the last
//! untrusted `X-Forwarded-For` hop: [`client_address`]) is held to the agent's
//! `governance.ip`: its sessions' runs through the quota counters (section 8's 429 codes), and
//! the sessions it opens to `runs_per_hour` an hour (429 `rate_limited`).
//!
//! Browsers: a request carrying an `Origin` must come from one of the agent's `cors_origins`
//! (403 `origin_not_allowed`, before anything changes); the session remembers the origin that
//! opened it, and [`cors`] answers that origin's preflights and lets it read the answers.

use axum::Json;
use std::net::IpAddr;

use axum::extract::{ConnectInfo, FromRequestParts, Request, State};
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
        details: serde_json::Map::new(),
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
        (status = 429, description = "`rate_limited`: this address opened the agent's `governance.ip.runs_per_hour` sessions this hour; with `Retry-After`", body = ErrorBody,
            headers(("Retry-After" = u32, description = "Seconds to wait."))),
        (status = 503, description = "`quotas_unavailable` (Redis is down and the agent limits sessions per address)", body = ErrorBody),
    )
)]
async fn post_session(
    State(state): State<AppState>,
    ApiPath(agent_id): ApiPath<AgentId>,
    PeerIp(peer): PeerIp,
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
    if let Some(per_hour) = agent.spec.0.governance.ip.runs_per_hour {
        let client = client_address(peer, &headers, &state.config.trusted_proxies);
        count_session(&state, agent_id, client, per_hour).await?;
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

/// The socket peer's address, if the server records it (`crate::app::Peer`).
#[derive(Debug)]
pub struct PeerIp(pub Option<IpAddr>);

fn peer_ip(parts: &Parts) -> Option<IpAddr> {
    parts
        .extensions
        .get::<ConnectInfo<crate::app::Peer>>()
        .map(|info| info.0.0.ip())
}

impl<S: Send + Sync> FromRequestParts<S> for PeerIp {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Self(peer_ip(parts)))
    }
}

/// Counts a session opened by `client` in the agent's hourly window (a Redis counter per agent,
/// address and hour): past `per_hour`, 429 `rate_limited`.
async fn count_session(
    state: &AppState,
    agent: AgentId,
    client: IpAddr,
    per_hour: u32,
) -> Result<(), ApiError> {
    let hour = now() / 3600;
    let key = format!(
        "{}:public-sessions:{agent}:{client}:{hour}",
        state.streams.keys().prefix()
    );
    let mut conn = state.streams.conn();
    let count: redis::RedisResult<(u64, ())> = redis::pipe()
        .atomic()
        .incr(&key, 1)
        .expire(&key, 3600)
        .query_async(&mut conn)
        .await;
    let count = match count {
        Ok((count, ())) => count,
        Err(err) => {
            tracing::warn!(error = %err, "the public sessions' counter is unavailable");
            return Err(ApiError::Unavailable {
                code: "quotas_unavailable",
                message: "the quota counters are unavailable; retry".into(),
                retry_after: 2,
            });
        }
    };
    if count > u64::from(per_hour) {
        let retry_after = u32::try_from(3600 - now() % 3600).unwrap_or(3600);
        tracing::info!(agent.id = %agent, %client, "public sessions rate limited");
        return Err(ApiError::TooManyRequests {
            code: "rate_limited",
            message: format!("this address opened {per_hour} sessions of the agent this hour"),
            retry_after,
            details: serde_json::Map::new(),
        }
        .with("scope", "ip")
        .with("limit", per_hour)
        .with("retry_after", retry_after)
        .with("agent_id", agent));
    }
    Ok(())
}

/// The client of a request: the socket's peer, unless the peer is a trusted proxy; then the
/// last `X-Forwarded-For` hop that is not one (all trusted: the first hop). Hops that are not
/// addresses end the walk (what precedes them cannot be trusted either).
pub fn client_address(
    peer: Option<IpAddr>,
    headers: &HeaderMap,
    trusted: &[ipnet::IpNet],
) -> IpAddr {
    let unspecified = IpAddr::from([0, 0, 0, 0]);
    let Some(peer) = peer else {
        return unspecified;
    };
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|net| net.contains(ip));
    if !is_trusted(&peer) {
        return peer;
    }
    let hops: Vec<&str> = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(str::trim)
        .collect();
    let mut client = peer;
    for hop in hops.iter().rev() {
        let Ok(ip) = hop.parse::<IpAddr>() else {
            break;
        };
        client = ip;
        if !is_trusted(&ip) {
            break;
        }
    }
    client
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
/// agents (`agents:write`, or `admin`).
pub(crate) fn may_use(caller: &Caller, spec: &spool_shared::agent::AgentSpec) -> bool {
    spec.visibility != Visibility::Private || caller.holds(super::Permission::AgentsWrite)
}

/// The caller of a route a public session may use: an ordinary caller, or a session (its
/// anonymous user, and the agent its messages run).
#[derive(Debug)]
pub struct EndUser {
    /// Who calls.
    pub caller: Caller,
    /// The agent a public session is bound to (`None` for any other caller).
    pub agent: Option<AgentId>,
    /// A public session's client address, for its agent's `governance.ip`.
    pub client: Option<String>,
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
            let peer = peer_ip(parts);
            let client = client_address(peer, &parts.headers, &state.config.trusted_proxies);
            return Ok(Self {
                caller,
                agent: Some(agent),
                client: Some(client.to_string()),
            });
        }
        Ok(Self {
            caller: Caller::from_request_parts(parts, state).await?,
            agent: None,
            client: None,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("ip")
    }

    fn forwarded(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("x-forwarded-for", value.parse().expect("header"));
        headers
    }

    #[test]
    fn forwarded_for_is_believed_only_from_trusted_proxies() {
        let trusted: Vec<ipnet::IpNet> = vec![
            "10.0.0.0/8".parse().expect("cidr"),
            "127.0.0.1/32".parse().expect("cidr"),
        ];
        let chain = forwarded("198.51.100.7, 203.0.113.9, 10.1.2.3");
        // An untrusted peer: its header is ignored.
        assert_eq!(
            client_address(Some(ip("192.0.2.1")), &chain, &trusted),
            ip("192.0.2.1")
        );
        // Through trusted proxies: the last hop that is not one (not the spoofable first).
        assert_eq!(
            client_address(Some(ip("127.0.0.1")), &chain, &trusted),
            ip("203.0.113.9")
        );
        // A hop that is no address ends the walk at what was believed so far.
        assert_eq!(
            client_address(
                Some(ip("10.9.9.9")),
                &forwarded("203.0.113.9, garbage, 10.1.2.3"),
                &trusted
            ),
            ip("10.1.2.3")
        );
        // No header, or no trusted proxies at all: the peer.
        assert_eq!(
            client_address(Some(ip("127.0.0.1")), &HeaderMap::new(), &trusted),
            ip("127.0.0.1")
        );
        assert_eq!(
            client_address(Some(ip("127.0.0.1")), &chain, &[]),
            ip("127.0.0.1")
        );
    }
}
