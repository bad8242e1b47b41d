//! Model providers as resources, "bring your own key" (DESIGN section 12, docs/providers.md):
//! a tenant's OpenAI or Anthropic endpoint with its API key, which its agents name in
//! `provider` before the operator's (`SPOOL_PROVIDERS`). Reading and writing them needs
//! `providers:write`.
//!
//! What must stay true:
//! - The key is sealed with the operator's `SPOOL_SECRETS_KEY` before it is stored; without
//!   that key every write is a 503 `secrets_not_configured` and nothing is stored.
//! - The key is never shown: every read says `"<redacted>"`. A write that sends
//!   `"<redacted>"` or no key keeps the stored one only for the same destination (scheme, host
//!   and port of `base_url`), else 422 `secret_needs_reentry`. No response, log line or error
//!   message carries it (api/tests/api/providers.rs and the e2e test grep them).
//! - `base_url` passes the network policy at save (422 `url_not_allowed` for a refused scheme
//!   or literal address) and again at every call in the worker.
//! - A provider that fails validation is a 422 listing every problem by field.
//! - Another tenant's ids are 404, as ids that do not exist.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use spool_shared::agent::{AgentSpec, FieldError, REDACTED};
use spool_shared::db::is_unique_violation;
use spool_shared::db::providers::{self, ProviderSettings, StoredProvider};
use spool_shared::ids::ProviderId;
use spool_shared::pricing::Prices;
use spool_shared::provider::ProviderKind;
use spool_shared::secrets_key::{Sealed, SecretsKeys};

use crate::app::AppState;
use crate::auth::{Caller, Permission};
use crate::error::{ApiError, BadBody, ErrorBody, MissingPermission, Unauthenticated};
use crate::extract::{ApiJson, ApiPath};
use crate::routes::list::{List, ListQuery};
use utoipa_axum::{router::OpenApiRouter, routes};

/// `/v1/providers/...`.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_providers, post_provider))
        .routes(routes!(get_provider, patch_provider, delete_provider))
}

/// Body of `POST /v1/providers` (and what `PATCH` merges into): the settings and the key.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProviderRequest {
    /// The name agents use in `provider` (1 to 64 characters of a-z, A-Z, 0-9, `_`, `-`),
    /// unique in the tenant. It hides an operator provider of the same name from the tenant.
    #[schema(min_length = 1, max_length = 64, pattern = "^[A-Za-z0-9_-]+$")]
    pub name: String,
    /// Its wire format: `openai` (Chat Completions) or `anthropic` (Messages).
    pub kind: ProviderKind,
    /// What the provider's own SDK takes as its base URL (for `openai`, ending in `/v1`). It
    /// must pass the network policy, at save and at every call.
    #[schema(max_length = 2048)]
    pub base_url: String,
    /// The provider's API key (sent as OpenAI's bearer token or Anthropic's `x-api-key`):
    /// write-only. `"<redacted>"` or none keeps the stored key, for the same destination
    /// (scheme, host and port) only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(write_only, max_length = 4096)]
    pub api_key: Option<String>,
    /// The model of agents that name this provider and no `model`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_model: Option<String>,
    /// The models it serves, if it says: agents naming it may use only these.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<Vec<String>>,
    /// The prices of its models (`{model: {input_per_mtok, output_per_mtok,
    /// cached_input_per_mtok?}}`, US dollars per million tokens): its runs' `cost_usd`.
    #[serde(default, skip_serializing_if = "Prices::is_empty")]
    pub prices: Prices,
}

impl ProviderRequest {
    /// The settings and the key, apart.
    fn split(self) -> (ProviderSettings, Option<String>) {
        let settings = ProviderSettings {
            name: self.name,
            kind: self.kind,
            base_url: self.base_url,
            default_model: self.default_model,
            models: self.models,
            prices: self.prices,
        };
        (settings, self.api_key)
    }

    /// The request that reads as `settings` (its key `"<redacted>"`).
    fn reading(settings: ProviderSettings) -> Self {
        Self {
            name: settings.name,
            kind: settings.kind,
            base_url: settings.base_url,
            api_key: Some(REDACTED.to_owned()),
            default_model: settings.default_model,
            models: settings.models,
            prices: settings.prices,
        }
    }
}

/// A provider as clients see it: its settings, `api_key: "<redacted>"`, `id` and timestamps.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ProviderResponse {
    /// Its id.
    pub id: ProviderId,
    /// The name agents use in `provider`.
    pub name: String,
    /// `openai` or `anthropic`.
    pub kind: ProviderKind,
    /// Its base URL.
    pub base_url: String,
    /// Always `"<redacted>"`: the key is write-only.
    #[schema(example = "<redacted>")]
    pub api_key: &'static str,
    /// The model of agents that name it and no `model`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_model: Option<String>,
    /// The models it serves, if it says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub models: Option<Vec<String>>,
    /// The prices of its models.
    #[serde(skip_serializing_if = "Prices::is_empty")]
    pub prices: Prices,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
}

impl From<StoredProvider> for ProviderResponse {
    fn from(provider: StoredProvider) -> Self {
        let settings = provider.settings;
        Self {
            id: provider.id,
            name: settings.name,
            kind: settings.kind,
            base_url: settings.base_url,
            api_key: REDACTED,
            default_model: settings.default_model,
            models: settings.models,
            prices: settings.prices,
            created_at: provider.created_at,
            updated_at: provider.updated_at,
        }
    }
}

/// A page of providers.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ProviderList {
    /// The providers, newest first.
    pub data: Vec<ProviderResponse>,
    /// The `cursor` of the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

fn not_found() -> ApiError {
    ApiError::not_found("provider_not_found", "no such provider")
}

fn name_taken(name: &str) -> ApiError {
    ApiError::conflict(
        "name_taken",
        format!("the tenant already has a provider named `{name}`"),
    )
}

/// The keys, or 503 `secrets_not_configured`.
fn keys(state: &AppState) -> Result<&SecretsKeys, ApiError> {
    state
        .config
        .secrets
        .as_deref()
        .ok_or_else(|| ApiError::Unavailable {
            code: "secrets_not_configured",
            message: "this server stores no provider keys: its operator has not set \
                      SPOOL_SECRETS_KEY"
                .into(),
            retry_after: 3600,
        })
}

/// What a write resolves to: the settings, validated, and the key in clear (sent, or the stored
/// one kept for the same destination).
fn validated(
    state: &AppState,
    keys: &SecretsKeys,
    request: ProviderRequest,
    stored: Option<&StoredProvider>,
) -> Result<(ProviderSettings, String), ApiError> {
    let (settings, api_key) = request.split();
    let (mut errors, refused) = settings.problems(&state.config.network_policy);
    let mut secret = Vec::new();
    let key = match api_key {
        Some(key) if key != REDACTED => {
            if key.trim().is_empty() || key.len() > providers::MAX_KEY_BYTES {
                errors.push(FieldError {
                    field: "api_key".into(),
                    message: format!("must be 1 to {} bytes", providers::MAX_KEY_BYTES),
                });
            } else if key.chars().any(char::is_control) {
                // Never echoed: the message says what is wrong, not what was sent.
                errors.push(FieldError {
                    field: "api_key".into(),
                    message: "must not contain control characters".into(),
                });
            }
            Some(key)
        }
        _ => match stored {
            Some(stored) if settings.same_destination(&stored.settings) => {
                Some(stored.api_key(keys).map_err(|err| {
                    anyhow::anyhow!("provider {}: the stored key: {err}", stored.id)
                })?)
            }
            Some(_) => {
                secret.push(FieldError {
                    field: "api_key".into(),
                    message: "the destination (scheme, host or port of `base_url`) changed: \
                              send the key again"
                        .into(),
                });
                None
            }
            None => {
                errors.push(FieldError {
                    field: "api_key".into(),
                    message: "is required".into(),
                });
                None
            }
        },
    };
    let code = if !secret.is_empty() {
        "secret_needs_reentry"
    } else if refused {
        "url_not_allowed"
    } else {
        "invalid_provider"
    };
    secret.extend(errors);
    match key {
        Some(key) if secret.is_empty() => Ok((settings, key)),
        _ => Err(ApiError::invalid_fields(code, "the provider", secret)),
    }
}

/// Creates a provider (`providers:write`).
#[utoipa::path(
    post,
    path = "/v1/providers",
    tag = "providers",
    security(("bearer" = ["providers:write"])),
    request_body = ProviderRequest,
    responses(
        (status = 201, description = "The new provider (its key `\"<redacted>\"`).", body = ProviderResponse,
            links(
                ("GetProvider" = (operation_id = "get_provider",
                    parameters(("provider_id" = "$response.body#/id")))),
                ("DeleteProvider" = (operation_id = "delete_provider",
                    parameters(("provider_id" = "$response.body#/id")))),
            )),
        BadBody,
        Unauthenticated,
        MissingPermission,
        (status = 409, description = "`name_taken`: the tenant has a provider of that name", body = ErrorBody),
        (status = 422, description = "`invalid_body`, `invalid_provider`, `url_not_allowed` (the network policy refuses `base_url`), with `errors: [{field, message}]`", body = ErrorBody),
        (status = 503, description = "`secrets_not_configured`: the operator has not set `SPOOL_SECRETS_KEY`", body = ErrorBody),
    )
)]
async fn post_provider(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(request): ApiJson<ProviderRequest>,
) -> Result<(StatusCode, Json<ProviderResponse>), ApiError> {
    caller.require(Permission::ProvidersWrite)?;
    let keys = keys(&state)?;
    let tenant = &caller.owner.tenant_id;
    let (settings, key) = validated(&state, keys, request, None)?;
    let id = ProviderId::new();
    let sealed = keys.seal(&key, &providers::bound_to(tenant, id));
    let stored = providers::insert(&state.db, id, tenant, &settings, &sealed)
        .await
        .map_err(|err| unique(err, &settings.name))?;
    Ok((StatusCode::CREATED, Json(stored.into())))
}

fn unique(err: sqlx::Error, name: &str) -> ApiError {
    if is_unique_violation(&err, providers::NAME_INDEX) {
        name_taken(name)
    } else {
        err.into()
    }
}

/// The tenant's providers, newest first (`providers:write`).
#[utoipa::path(
    get,
    path = "/v1/providers",
    tag = "providers",
    security(("bearer" = ["providers:write"])),
    params(
        ("limit" = Option<i64>, Query, minimum = 1, maximum = 100, description = "Rows per page (default 20; over 100 is a 400)."),
        ("cursor" = Option<String>, Query, description = "The `next_cursor` of the previous page."),
    ),
    responses(
        (status = 200, description = "A page of providers.", body = ProviderList),
        (status = 400, description = "`invalid_limit`, `invalid_cursor`, `unknown_parameter`", body = ErrorBody),
        Unauthenticated,
        MissingPermission,
    )
)]
async fn list_providers(
    State(state): State<AppState>,
    caller: Caller,
    mut query: ListQuery,
) -> Result<Json<List<ProviderResponse>>, ApiError> {
    caller.require(Permission::ProvidersWrite)?;
    query.filters(|_, _| Ok(false))?;
    let page = providers::list(
        &state.db,
        &caller.owner.tenant_id,
        query.cursor,
        query.limit,
    )
    .await?;
    Ok(Json(List::of(page, Into::into)))
}

/// A provider (`providers:write`).
#[utoipa::path(
    get,
    path = "/v1/providers/{provider_id}",
    tag = "providers",
    security(("bearer" = ["providers:write"])),
    params(("provider_id" = ProviderId, Path, description = "The provider.")),
    responses(
        (status = 200, description = "The provider.", body = ProviderResponse),
        Unauthenticated,
        MissingPermission,
        (status = 404, description = "`provider_not_found`, `not_found`", body = ErrorBody),
    )
)]
async fn get_provider(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(provider_id): ApiPath<ProviderId>,
) -> Result<Json<ProviderResponse>, ApiError> {
    caller.require(Permission::ProvidersWrite)?;
    let provider = providers::find(&state.db, provider_id, &caller.owner.tenant_id)
        .await?
        .ok_or_else(not_found)?;
    Ok(Json(provider.into()))
}

/// Changes some fields of a provider (`providers:write`): a JSON merge patch (RFC 7396) of the
/// provider as it reads, so a key not sent is kept, for the same destination only.
#[utoipa::path(
    patch,
    path = "/v1/providers/{provider_id}",
    tag = "providers",
    security(("bearer" = ["providers:write"])),
    params(("provider_id" = ProviderId, Path, description = "The provider.")),
    request_body(content = Object, description = "The fields to change (`null` removes an optional one)."),
    responses(
        (status = 200, description = "The provider.", body = ProviderResponse),
        BadBody,
        Unauthenticated,
        MissingPermission,
        (status = 404, description = "`provider_not_found`, `not_found`", body = ErrorBody),
        (status = 409, description = "`name_taken`: the tenant has another provider of that name", body = ErrorBody),
        (status = 422, description = "`invalid_body`, `invalid_provider`, `url_not_allowed`, `secret_needs_reentry` (`base_url` moved to another destination without a new `api_key`), with `errors: [{field, message}]`", body = ErrorBody),
        (status = 503, description = "`secrets_not_configured`", body = ErrorBody),
    )
)]
async fn patch_provider(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(provider_id): ApiPath<ProviderId>,
    ApiJson(patch): ApiJson<Value>,
) -> Result<Json<ProviderResponse>, ApiError> {
    caller.require(Permission::ProvidersWrite)?;
    let keys = keys(&state)?;
    let tenant = &caller.owner.tenant_id;
    let mut tx = state.db.begin().await?;
    let stored = providers::lock(&mut *tx, provider_id, tenant)
        .await?
        .ok_or_else(not_found)?;
    // Patched as it reads, so a key not sent stays `"<redacted>"`.
    let read = ProviderRequest::reading(stored.settings.clone());
    let mut value = serde_json::to_value(read).map_err(anyhow::Error::from)?;
    super::tools::merge_patch(&mut value, patch);
    let request: ProviderRequest = serde_json::from_value(value).map_err(|err| {
        // serde's message names the field, never a value of it.
        ApiError::unprocessable("invalid_body", err.to_string())
    })?;
    let (settings, key) = validated(&state, keys, request, Some(&stored))?;
    let sealed: Sealed = keys.seal(&key, &providers::bound_to(tenant, provider_id));
    let updated = providers::update(&mut *tx, provider_id, tenant, &settings, &sealed)
        .await
        .map_err(|err| unique(err, &settings.name))?
        .ok_or_else(not_found)?;
    tx.commit().await?;
    Ok(Json(updated.into()))
}

/// Deletes a provider (`providers:write`). Agents that name it fall back to an operator
/// provider of the name, if any; runs of it not yet called fail with the provider gone.
#[utoipa::path(
    delete,
    path = "/v1/providers/{provider_id}",
    tag = "providers",
    security(("bearer" = ["providers:write"])),
    params(("provider_id" = ProviderId, Path, description = "The provider.")),
    responses(
        (status = 204, description = "Deleted."),
        Unauthenticated,
        MissingPermission,
        (status = 404, description = "`provider_not_found`, `not_found`", body = ErrorBody),
    )
)]
async fn delete_provider(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(provider_id): ApiPath<ProviderId>,
) -> Result<StatusCode, ApiError> {
    caller.require(Permission::ProvidersWrite)?;
    if providers::delete(&state.db, provider_id, &caller.owner.tenant_id).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(not_found())
    }
}

/// What an agent's `provider`, `model` and `fallback_models` get wrong, by field: against the
/// tenant's provider of that name, else the operator's (a name neither has is a problem of
/// `provider`). A spec that carries `provider_id` (the server sets it on runs) is refused.
pub async fn agent_problems(
    state: &AppState,
    tenant: &str,
    spec: &AgentSpec,
) -> Result<Vec<FieldError>, ApiError> {
    let mut problems = Vec::new();
    if spec.provider_id.is_some() {
        problems.push(FieldError {
            field: "provider_id".into(),
            message: "is set by the server on runs: name the provider with `provider`".into(),
        });
    }
    if let Some(name) = spec.provider.as_deref()
        && let Some(provider) = providers::find_by_name(&state.db, tenant, name).await?
    {
        problems.extend(provider.settings.agent_problems(spec));
        return Ok(problems);
    }
    problems.extend(state.config.providers.problems(spec));
    Ok(problems)
}
