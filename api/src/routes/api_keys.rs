//! API keys (docs/security.md "API keys", `api_keys:admin`): a tenant's long-lived credentials
//! for servers, `Authorization: Bearer spk_...`.
//!
//! What must stay true:
//! - The key is shown once, in the answer that creates it; only its SHA-256 is stored
//!   (`spool_shared::db::api_keys`), and no other answer, log or list carries it.
//! - A key holds only permissions its creator holds: asking for one more is 403 `forbidden`
//!   naming it, and nothing is stored.
//! - A revoked key is refused (401 `api_key_revoked`) by every API process from the moment
//!   `DELETE` answers: each request reads the key's row ([`crate::auth::api_key`]).
//! - Another tenant's key ids are 404, as ids that do not exist.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use spool_shared::db::api_keys::{self, ApiKey};
use spool_shared::ids::ApiKeyId;

use crate::app::AppState;
use crate::auth::permission::forbidden;
use crate::auth::{Caller, Permission, api_key};
use crate::error::{ApiError, BadBody, ErrorBody, MissingPermission, Unauthenticated};
use crate::extract::{ApiJson, ApiPath};
use crate::routes::list::{List, ListQuery};
use utoipa_axum::{router::OpenApiRouter, routes};

/// Longest key name, in characters.
pub const MAX_NAME_CHARS: usize = 100;

/// `/v1/api_keys/...`.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_api_keys, post_api_key))
        .routes(routes!(delete_api_key))
}

/// Body of `POST /v1/api_keys`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateApiKeyRequest {
    /// What the key is for (1 to 100 characters), for people reading the list.
    #[schema(min_length = 1, max_length = 100)]
    pub name: String,
    /// What the key may do: at least one permission, each one the caller holds (`admin`
    /// only from an `admin` caller).
    #[schema(value_type = Vec<Permission>, min_items = 1)]
    pub permissions: Vec<String>,
}

/// A key as clients see it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ApiKeyResponse {
    /// Its id.
    pub id: ApiKeyId,
    /// Its name.
    pub name: String,
    /// What it may do.
    #[schema(value_type = Vec<Permission>)]
    pub permissions: Vec<String>,
    /// The user it acts as (`apikey:<id>`): the owner of the threads and runs it creates.
    pub user_id: String,
    /// The user whose token created it.
    pub created_by: String,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it was last used (updated at most once a minute); `null` if never.
    pub last_used_at: Option<DateTime<Utc>>,
    /// The key itself (`spk_...`): only in the answer to its creation. Keep it now; it cannot
    /// be shown again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

impl ApiKeyResponse {
    fn new(key: ApiKey, secret: Option<String>) -> Self {
        Self {
            user_id: api_key::user_id(key.id),
            id: key.id,
            name: key.name,
            permissions: key.permissions,
            created_by: key.created_by,
            created_at: key.created_at,
            last_used_at: key.last_used_at,
            key: secret,
        }
    }
}

/// Creates a key; the answer is the only one that shows it.
#[utoipa::path(
    post,
    path = "/v1/api_keys",
    tag = "api_keys",
    security(("bearer" = ["api_keys:admin"])),
    request_body = CreateApiKeyRequest,
    responses(
        (status = 201, description = "The key, with `key` (shown once).", body = ApiKeyResponse,
            links(
                ("DeleteApiKey" = (operation_id = "delete_api_key",
                    parameters(("api_key_id" = "$response.body#/id")))),
            )),
        BadBody,
        Unauthenticated,
        (status = 403, description = "`forbidden`: the caller lacks `api_keys:admin`, or one of the permissions asked for (`permission` says which); nothing is stored", body = ErrorBody),
        (status = 422, description = "`invalid_body`, `invalid_name`, `invalid_permissions` (none, or a name that is not a permission)", body = ErrorBody),
    )
)]
async fn post_api_key(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(request): ApiJson<CreateApiKeyRequest>,
) -> Result<(StatusCode, Json<ApiKeyResponse>), ApiError> {
    caller.require(Permission::ApiKeysAdmin)?;
    let name = request.name.trim();
    if name.is_empty() || name.chars().count() > MAX_NAME_CHARS {
        return Err(ApiError::unprocessable(
            "invalid_name",
            format!("name must be 1 to {MAX_NAME_CHARS} characters"),
        ));
    }
    let mut permissions = request
        .permissions
        .iter()
        .map(|name| {
            Permission::parse(name).ok_or_else(|| {
                ApiError::unprocessable(
                    "invalid_permissions",
                    format!("`{name}` is not a permission"),
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if permissions.is_empty() {
        return Err(ApiError::unprocessable(
            "invalid_permissions",
            "a key needs at least one permission",
        ));
    }
    if let Some(lacking) = permissions.iter().find(|p| !caller.holds(**p)) {
        return Err(forbidden(
            *lacking,
            format!("a key cannot hold `{lacking}`, which the caller does not hold"),
        ));
    }
    permissions.sort();
    permissions.dedup();
    let names: Vec<String> = permissions.iter().map(|p| p.as_str().to_owned()).collect();
    let key = api_keys::generate()?;
    let stored = api_keys::create(
        &state.db,
        &caller.owner.tenant_id,
        name,
        &names,
        &api_keys::hash(&key),
        &caller.owner.user_id,
    )
    .await?;
    tracing::info!(api_key.id = %stored.id, "API key created");
    Ok((
        StatusCode::CREATED,
        Json(ApiKeyResponse::new(stored, Some(key))),
    ))
}

/// A page of keys.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ApiKeyList {
    /// The keys not revoked, newest first (without the keys themselves).
    pub data: Vec<ApiKeyResponse>,
    /// The `cursor` of the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

/// The tenant's keys that are not revoked, newest first, without the keys themselves.
#[utoipa::path(
    get,
    path = "/v1/api_keys",
    tag = "api_keys",
    security(("bearer" = ["api_keys:admin"])),
    params(
        ("limit" = Option<i64>, Query, minimum = 1, maximum = 100, description = "Rows per page (default 20; over 100 is a 400)."),
        ("cursor" = Option<String>, Query, description = "The `next_cursor` of the previous page."),
    ),
    responses(
        (status = 200, description = "A page of keys.", body = ApiKeyList),
        (status = 400, description = "`invalid_limit`, `invalid_cursor`, `unknown_parameter`", body = ErrorBody),
        Unauthenticated,
        MissingPermission,
    )
)]
async fn list_api_keys(
    State(state): State<AppState>,
    caller: Caller,
    mut query: ListQuery,
) -> Result<Json<List<ApiKeyResponse>>, ApiError> {
    caller.require(Permission::ApiKeysAdmin)?;
    query.filters(|_, _| Ok(false))?;
    let page = api_keys::list(
        &state.db,
        &caller.owner.tenant_id,
        query.cursor,
        query.limit,
    )
    .await?;
    Ok(Json(List::of(page, |key| ApiKeyResponse::new(key, None))))
}

/// Revokes a key: every API process refuses it from this answer on (401 `api_key_revoked`).
#[utoipa::path(
    delete,
    path = "/v1/api_keys/{api_key_id}",
    tag = "api_keys",
    security(("bearer" = ["api_keys:admin"])),
    params(("api_key_id" = ApiKeyId, Path, description = "The key's id.")),
    responses(
        (status = 204, description = "Revoked."),
        Unauthenticated,
        MissingPermission,
        (status = 404, description = "`api_key_not_found` (also another tenant's, or already revoked), `not_found`", body = ErrorBody),
    )
)]
async fn delete_api_key(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<ApiKeyId>,
) -> Result<StatusCode, ApiError> {
    caller.require(Permission::ApiKeysAdmin)?;
    if !api_keys::revoke(&state.db, id, &caller.owner.tenant_id).await? {
        return Err(ApiError::not_found("api_key_not_found", "no such API key"));
    }
    tracing::info!(api_key.id = %id, "API key revoked");
    Ok(StatusCode::NO_CONTENT)
}
