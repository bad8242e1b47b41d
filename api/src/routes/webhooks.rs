//! Webhooks (docs/api.md, `webhooks:admin`): endpoints that receive a tenant's run events, and what
//! was delivered to them.
//!
//! An endpoint's URL passes the tools' network policy at creation (`SPOOL_TOOLS_ALLOW_NETWORKS`;
//! the scheme, an IP-literal host, and the addresses a host name resolves to now), and again
//! at every delivery, where the address connected to is the address checked. An `http://` URL
//! must also lie entirely in a network the operator allowed (clear text is for networks an
//! operator vouches for: signed payloads carry user ids and errors). The signing secret
//! (Standard Webhooks: `whsec_` and base64 of 24 to 64 bytes) is generated when absent and
//! shown only in the answer that makes it: the creation, or a rotation (after which the old one
//! signs too for [`ROTATION_GRACE`]). A tenant has at most `SPOOL_WEBHOOKS_MAX_PER_TENANT`
//! endpoints, because every run's end writes one outbox row per endpoint in its transaction.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use base64::Engine as _;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use spool_shared::WorkflowId;
use spool_shared::db::webhooks::{self, Delivery, EVENTS, Try, Webhook};
use spool_shared::egress;
use spool_shared::ids::WebhookId;

use crate::app::AppState;
use crate::auth::{Caller, Permission};
use crate::error::{ApiError, BadBody, ErrorBody, MissingPermission, Unauthenticated};
use crate::extract::{ApiJson, ApiPath};
use crate::routes::list::{List, ListQuery};
use utoipa_axum::{router::OpenApiRouter, routes};

/// The prefix of a Standard Webhooks secret.
pub const SECRET_PREFIX: &str = "whsec_";
/// Longest endpoint URL, in bytes.
pub const MAX_URL_BYTES: usize = 2048;
/// How long the secret a rotation replaces keeps signing deliveries.
pub const ROTATION_GRACE: Duration = Duration::from_secs(24 * 3600);

/// `/v1/webhooks/...`.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_webhooks, post_webhook))
        .routes(routes!(get_webhook, delete_webhook))
        .routes(routes!(rotate_secret))
        .routes(routes!(list_deliveries))
}

/// Body of `POST /v1/webhooks`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateWebhookRequest {
    /// Where deliveries go: https, or http only to networks the operator allowed
    /// (`SPOOL_TOOLS_ALLOW_NETWORKS`); the network policy must permit it.
    #[schema(max_length = 2048)]
    pub url: String,
    /// The events to deliver: `run.completed`, `run.failed`, `run.cancelled`,
    /// `run.requires_action`, `run.awaiting_approval` (at least one).
    #[schema(min_items = 1)]
    pub events: Vec<String>,
    /// The signing secret, `whsec_` and base64 of 24 to 64 bytes; generated when absent.
    #[serde(default)]
    pub secret: Option<String>,
}

/// An endpoint as clients see it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct WebhookResponse {
    /// Its id.
    pub id: WebhookId,
    /// Where deliveries go.
    pub url: String,
    /// The events it receives.
    pub events: Vec<String>,
    /// The signing secret: only in the answer to its creation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// The endpoint's circuit breaker.
    pub circuit: Circuit,
    /// Until when the secret replaced by the last rotation still signs deliveries (a second
    /// signature); absent when none does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_secret_expires_at: Option<DateTime<Utc>>,
}

/// An endpoint's circuit breaker: after 5 failed tries in a row it opens, and no delivery to
/// the endpoint is tried until `open_until` (30 s, doubling with each failure after, at most an
/// hour); then one at a time (`half_open`) until one gets a 2xx, which closes it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Circuit {
    /// `closed` (delivering), `open` (holding deliveries until `open_until`) or `half_open`
    /// (trying one delivery at a time).
    #[schema(pattern = "^(closed|open|half_open)$")]
    pub state: &'static str,
    /// Failed tries in a row.
    pub consecutive_failures: i32,
    /// While open: when the next try may be made.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub open_until: Option<DateTime<Utc>>,
}

impl WebhookResponse {
    fn new(webhook: Webhook, show_secret: bool) -> Self {
        let now = Utc::now();
        let open = webhook.circuit_open_until.filter(|until| *until > now);
        let state = if open.is_some() {
            "open"
        } else if webhook.consecutive_failures >= webhooks::BREAKER_THRESHOLD {
            "half_open"
        } else {
            "closed"
        };
        Self {
            id: webhook.id,
            url: webhook.url,
            events: webhook.events,
            secret: show_secret.then_some(webhook.secret),
            created_at: webhook.created_at,
            circuit: Circuit {
                state,
                consecutive_failures: webhook.consecutive_failures,
                open_until: open,
            },
            previous_secret_expires_at: webhook.previous_secret_expires_at.filter(|at| *at > now),
        }
    }
}

/// Creates an endpoint; the answer is the only one that shows its secret.
#[utoipa::path(
    post,
    path = "/v1/webhooks",
    tag = "webhooks",
    security(("bearer" = ["webhooks:admin"])),
    request_body = CreateWebhookRequest,
    responses(
        (status = 201, description = "The endpoint, with its secret (shown once).", body = WebhookResponse,
            links(
                ("ListDeliveries" = (operation_id = "list_deliveries",
                    parameters(("webhook_id" = "$response.body#/id")))),
                ("DeleteWebhook" = (operation_id = "delete_webhook",
                    parameters(("webhook_id" = "$response.body#/id")))),
            )),
        BadBody,
        Unauthenticated,
        MissingPermission,
        (status = 422, description = "`invalid_body`, `invalid_url`, `url_refused` (the network policy), `insecure_url` (http:// outside the networks the operator allowed), `invalid_events`, `invalid_secret`", body = ErrorBody),
        (status = 429, description = "`too_many_webhooks`: the tenant has `SPOOL_WEBHOOKS_MAX_PER_TENANT` endpoints already (`limit` says how many); delete one first", body = ErrorBody),
    )
)]
async fn post_webhook(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(request): ApiJson<CreateWebhookRequest>,
) -> Result<(StatusCode, Json<WebhookResponse>), ApiError> {
    caller.require(Permission::WebhooksAdmin)?;
    check_events(&request.events)?;
    check_url(&state, &request.url).await?;
    let secret = match request.secret {
        Some(secret) => {
            check_secret(&secret)?;
            secret
        }
        None => new_secret(),
    };
    let mut events = request.events;
    events.sort();
    events.dedup();
    let max = state.config.max_webhooks_per_tenant;
    let webhook = webhooks::create(
        &state.db,
        &caller.owner.tenant_id,
        &request.url,
        &events,
        &secret,
        max,
    )
    .await?
    .ok_or_else(|| {
        ApiError::TooManyRequests {
            code: "too_many_webhooks",
            message: format!("a tenant may have at most {max} webhook endpoints; delete one first"),
            retry_after: 60,
            details: serde_json::Map::new(),
        }
        .with("limit", max)
    })?;
    Ok((
        StatusCode::CREATED,
        Json(WebhookResponse::new(webhook, true)),
    ))
}

fn check_events(events: &[String]) -> Result<(), ApiError> {
    if events.is_empty() {
        return Err(ApiError::unprocessable(
            "invalid_events",
            "events must name at least one event",
        ));
    }
    if let Some(unknown) = events.iter().find(|e| !EVENTS.contains(&e.as_str())) {
        return Err(ApiError::unprocessable(
            "invalid_events",
            format!(
                "unknown event `{unknown}`; expected one of {}",
                EVENTS.join(", ")
            ),
        ));
    }
    Ok(())
}

/// The URL must parse, be at most [`MAX_URL_BYTES`], and pass the network policy: its scheme
/// and IP-literal host, and every address its host name resolves to now must be permitted
/// (the worker checks again, on the address it connects to, at every delivery).
async fn check_url(state: &AppState, url: &str) -> Result<(), ApiError> {
    if url.len() > MAX_URL_BYTES {
        return Err(ApiError::unprocessable(
            "invalid_url",
            format!("url is over {MAX_URL_BYTES} bytes"),
        ));
    }
    let parsed = reqwest::Url::parse(url)
        .map_err(|err| ApiError::unprocessable("invalid_url", format!("url: {err}")))?;
    let policy = &state.config.network_policy;
    let refused = |reason: String| {
        ApiError::unprocessable(
            "url_refused",
            format!("the network policy refuses it: {reason}"),
        )
    };
    policy.check_url(&parsed).map_err(refused)?;
    let host = parsed.host_str().unwrap_or_default();
    let literal = host.starts_with('[') || host.parse::<std::net::IpAddr>().is_ok();
    let resolved: Vec<SocketAddr> = if literal {
        Vec::new()
    } else {
        let port = parsed.port_or_known_default().unwrap_or(443);
        tokio::time::timeout(
            Duration::from_secs(5),
            tokio::net::lookup_host((host, port)),
        )
        .await
        .ok()
        .and_then(Result::ok)
        .map(Iterator::collect)
        .unwrap_or_default()
    };
    if !literal {
        egress::screen(policy, host, resolved.clone())
            .map_err(|r| refused(r.reason().to_owned()))?;
    }
    if parsed.scheme() == "http" {
        // Every address must be one the operator allowed: the worker's clear-text client
        // connects to nothing else, so a URL that passes here is one it can reach.
        let cleartext = policy.cleartext();
        let insecure = || {
            ApiError::unprocessable(
                "insecure_url",
                "http:// is accepted only for networks the operator allowed \
                 (SPOOL_TOOLS_ALLOW_NETWORKS); use https://",
            )
        };
        cleartext.check_url(&parsed).map_err(|_| insecure())?;
        if !literal && resolved.iter().any(|addr| !cleartext.permits(addr.ip())) {
            return Err(insecure());
        }
    }
    Ok(())
}

fn check_secret(secret: &str) -> Result<(), ApiError> {
    let bytes = secret
        .strip_prefix(SECRET_PREFIX)
        .and_then(|b64| base64::engine::general_purpose::STANDARD.decode(b64).ok());
    match bytes {
        Some(bytes) if (24..=64).contains(&bytes.len()) => Ok(()),
        _ => Err(ApiError::unprocessable(
            "invalid_secret",
            "secret must be `whsec_` followed by the base64 of 24 to 64 bytes",
        )),
    }
}

/// A new secret: 32 random bytes (two v4 UUIDs: 244 random bits).
fn new_secret() -> String {
    let mut bytes = Vec::with_capacity(32);
    bytes.extend_from_slice(Uuid::new_v4().as_bytes());
    bytes.extend_from_slice(Uuid::new_v4().as_bytes());
    format!(
        "{SECRET_PREFIX}{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

/// A page of endpoints.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct WebhookList {
    /// The endpoints, newest first (without their secrets).
    pub data: Vec<WebhookResponse>,
    /// The `cursor` of the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

/// The tenant's endpoints, newest first.
#[utoipa::path(
    get,
    path = "/v1/webhooks",
    tag = "webhooks",
    security(("bearer" = ["webhooks:admin"])),
    params(
        ("limit" = Option<i64>, Query, minimum = 1, maximum = 100, description = "Rows per page (default 20; over 100 is a 400)."),
        ("cursor" = Option<String>, Query, description = "The `next_cursor` of the previous page."),
    ),
    responses(
        (status = 200, description = "A page of endpoints.", body = WebhookList),
        (status = 400, description = "`invalid_limit`, `invalid_cursor`, `unknown_parameter`", body = ErrorBody),
        Unauthenticated,
        MissingPermission,
    )
)]
async fn list_webhooks(
    State(state): State<AppState>,
    caller: Caller,
    mut query: ListQuery,
) -> Result<Json<List<WebhookResponse>>, ApiError> {
    caller.require(Permission::WebhooksAdmin)?;
    query.filters(|_, _| Ok(false))?;
    let page = webhooks::list(
        &state.db,
        &caller.owner.tenant_id,
        query.cursor,
        query.limit,
    )
    .await?;
    Ok(Json(List::of(page, |w| WebhookResponse::new(w, false))))
}

/// One endpoint (without its secret), with the state of its circuit breaker.
#[utoipa::path(
    get,
    path = "/v1/webhooks/{webhook_id}",
    tag = "webhooks",
    security(("bearer" = ["webhooks:admin"])),
    params(("webhook_id" = WebhookId, Path, description = "The endpoint.")),
    responses(
        (status = 200, description = "The endpoint.", body = WebhookResponse),
        Unauthenticated,
        MissingPermission,
        (status = 404, description = "`webhook_not_found`, `not_found`", body = ErrorBody),
    )
)]
async fn get_webhook(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<WebhookId>,
) -> Result<Json<WebhookResponse>, ApiError> {
    caller.require(Permission::WebhooksAdmin)?;
    let webhook = webhooks::find(&state.db, id, &caller.owner.tenant_id)
        .await?
        .ok_or_else(webhook_not_found)?;
    Ok(Json(WebhookResponse::new(webhook, false)))
}

/// Gives an endpoint a new signing secret, shown only in this answer. The previous secret
/// keeps signing deliveries beside it (two signatures in `webhook-signature`) for 24 hours,
/// so receivers can switch over without a failed delivery; rotating again drops it at once.
#[utoipa::path(
    post,
    path = "/v1/webhooks/{webhook_id}/rotate-secret",
    tag = "webhooks",
    security(("bearer" = ["webhooks:admin"])),
    params(("webhook_id" = WebhookId, Path, description = "The endpoint.")),
    responses(
        (status = 200, description = "The endpoint with its new secret (shown once) and `previous_secret_expires_at`.", body = WebhookResponse),
        Unauthenticated,
        MissingPermission,
        (status = 404, description = "`webhook_not_found`, `not_found`", body = ErrorBody),
    )
)]
async fn rotate_secret(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<WebhookId>,
) -> Result<Json<WebhookResponse>, ApiError> {
    caller.require(Permission::WebhooksAdmin)?;
    let secret = new_secret();
    let webhook = webhooks::rotate_secret(
        &state.db,
        id,
        &caller.owner.tenant_id,
        &secret,
        ROTATION_GRACE,
    )
    .await?
    .ok_or_else(webhook_not_found)?;
    Ok(Json(WebhookResponse::new(webhook, true)))
}

/// Deletes an endpoint and all its deliveries: those still pending are discarded, never sent
/// (`X-Discarded-Deliveries` says how many).
#[utoipa::path(
    delete,
    path = "/v1/webhooks/{webhook_id}",
    tag = "webhooks",
    security(("bearer" = ["webhooks:admin"])),
    params(("webhook_id" = WebhookId, Path, description = "The endpoint.")),
    responses(
        (status = 204, description = "Deleted, with its deliveries; the pending ones are discarded.",
            headers(("X-Discarded-Deliveries" = i64, description = "How many pending deliveries were discarded."))),
        Unauthenticated,
        MissingPermission,
        (status = 404, description = "`webhook_not_found`, `not_found`", body = ErrorBody),
    )
)]
async fn delete_webhook(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<WebhookId>,
) -> Result<(StatusCode, [(&'static str, String); 1]), ApiError> {
    caller.require(Permission::WebhooksAdmin)?;
    let discarded = webhooks::delete(&state.db, id, &caller.owner.tenant_id)
        .await?
        .ok_or_else(webhook_not_found)?;
    if discarded > 0 {
        tracing::info!(webhook.id = %id, discarded, "webhook deleted; pending deliveries discarded");
    }
    Ok((
        StatusCode::NO_CONTENT,
        [("x-discarded-deliveries", discarded.to_string())],
    ))
}

fn webhook_not_found() -> ApiError {
    ApiError::not_found("webhook_not_found", "no such webhook")
}

/// One delivery and its tries.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct DeliveryResponse {
    /// Its id: the `webhook-id` header of every try.
    pub id: Uuid,
    /// The event.
    pub event: String,
    /// The run it is about.
    pub workflow_id: WorkflowId,
    /// `pending` (will be tried, or again), `delivered` (a 2xx) or `abandoned` (24 h of
    /// tries without a 2xx).
    #[schema(pattern = "^(pending|delivered|abandoned)$")]
    pub status: &'static str,
    /// The body sent.
    #[schema(value_type = Object)]
    pub payload: Value,
    /// Each try: its status code or error, and when.
    pub attempts: Vec<Try>,
    /// When the next try is due (while pending).
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// When it was delivered.
    pub delivered_at: Option<DateTime<Utc>>,
    /// When the event happened.
    pub created_at: DateTime<Utc>,
}

impl From<Delivery> for DeliveryResponse {
    fn from(d: Delivery) -> Self {
        let status = if d.delivered_at.is_some() {
            "delivered"
        } else if d.abandoned_at.is_some() {
            "abandoned"
        } else {
            "pending"
        };
        Self {
            id: d.id,
            event: d.event,
            workflow_id: d.workflow_id,
            status,
            payload: d.payload.0,
            attempts: d.tries.0,
            next_attempt_at: (status == "pending").then_some(d.next_attempt_at),
            delivered_at: d.delivered_at,
            created_at: d.created_at,
        }
    }
}

/// A page of deliveries.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct DeliveryList {
    /// The deliveries, newest first.
    pub data: Vec<DeliveryResponse>,
    /// The `cursor` of the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

/// An endpoint's deliveries, newest first, each with its tries.
#[utoipa::path(
    get,
    path = "/v1/webhooks/{webhook_id}/deliveries",
    tag = "webhooks",
    security(("bearer" = ["webhooks:admin"])),
    params(
        ("webhook_id" = WebhookId, Path, description = "The endpoint."),
        ("limit" = Option<i64>, Query, minimum = 1, maximum = 100, description = "Rows per page (default 20; over 100 is a 400)."),
        ("cursor" = Option<String>, Query, description = "The `next_cursor` of the previous page."),
    ),
    responses(
        (status = 200, description = "A page of deliveries.", body = DeliveryList),
        (status = 400, description = "`invalid_limit`, `invalid_cursor`, `unknown_parameter`", body = ErrorBody),
        Unauthenticated,
        MissingPermission,
        (status = 404, description = "`webhook_not_found`, `not_found`", body = ErrorBody),
    )
)]
async fn list_deliveries(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<WebhookId>,
    mut query: ListQuery,
) -> Result<Json<List<DeliveryResponse>>, ApiError> {
    caller.require(Permission::WebhooksAdmin)?;
    query.filters(|_, _| Ok(false))?;
    webhooks::find(&state.db, id, &caller.owner.tenant_id)
        .await?
        .ok_or_else(webhook_not_found)?;
    let page = webhooks::deliveries(&state.db, id, query.cursor, query.limit).await?;
    Ok(Json(List::of(page, DeliveryResponse::from)))
}
