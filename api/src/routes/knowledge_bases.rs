//! Knowledge bases (DESIGN section 12, docs/tools.md): a tenant's retrieval endpoints, which the
//! built-in `knowledge_search` tool asks. Reading them needs `agents:read`; writing them
//! `tools:write`.
//!
//! A knowledge base is `{name, url, headers}`: a search POSTs `{"query", "top_k"}` to `url` with
//! the headers and reads `{"chunks": [{id?, text, title?, url?}]}` back.
//!
//! What must stay true:
//! - A knowledge base that fails validation is a 422 `invalid_knowledge_base` listing every
//!   problem by field (a URL the network policy refuses outright, by scheme or literal address,
//!   is a 422 `url_not_allowed`); nothing is stored.
//! - Header values are write-only: every read shows `"<redacted>"`.
//! - Another tenant's ids are 404, as ids that do not exist.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use spool_shared::agent::{FieldError, REDACTED};
use spool_shared::db::{is_unique_violation, knowledge_bases};
use spool_shared::ids::KnowledgeBaseId;

use crate::app::AppState;
use crate::auth::{Caller, Permission};
use crate::error::{ApiError, BadBody, ErrorBody, MissingPermission, Unauthenticated};
use crate::extract::{ApiJson, ApiPath};
use crate::routes::list::{List, ListQuery};
use utoipa_axum::{router::OpenApiRouter, routes};

/// The longest URL accepted, in bytes.
const MAX_URL_BYTES: usize = 2048;
/// The most headers a knowledge base sends.
const MAX_HEADERS: usize = 20;

/// `/v1/knowledge_bases/...`.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_knowledge_bases, post_knowledge_base))
        .routes(routes!(get_knowledge_base, delete_knowledge_base))
}

/// A knowledge base as posted.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct KnowledgeBaseRequest {
    /// Its name, unique in the tenant: what `knowledge_search` takes to search only this one.
    #[schema(pattern = "^[a-zA-Z0-9_-]{1,64}$")]
    pub name: String,
    /// The retrieval endpoint: it receives `POST {"query", "top_k"}` and answers
    /// `{"chunks": [{id?, text, title?, url?}]}`.
    pub url: String,
    /// Headers sent with every search (write-only: read back as `"<redacted>"`).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

/// A knowledge base as clients see it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct KnowledgeBaseResponse {
    /// Its id.
    pub id: KnowledgeBaseId,
    /// Its name.
    pub name: String,
    /// The retrieval endpoint.
    pub url: String,
    /// The headers sent with every search, each value `"<redacted>"`.
    pub headers: BTreeMap<String, String>,
    /// When it was created.
    pub created_at: DateTime<Utc>,
}

impl From<knowledge_bases::KnowledgeBase> for KnowledgeBaseResponse {
    fn from(kb: knowledge_bases::KnowledgeBase) -> Self {
        Self {
            id: kb.id,
            name: kb.name,
            url: kb.url,
            headers: kb
                .headers
                .0
                .into_keys()
                .map(|name| (name, REDACTED.to_owned()))
                .collect(),
            created_at: kb.created_at,
        }
    }
}

/// A page of knowledge bases.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct KnowledgeBaseList {
    /// The knowledge bases, newest first.
    pub data: Vec<KnowledgeBaseResponse>,
    /// The `cursor` of the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

fn not_found() -> ApiError {
    ApiError::not_found("knowledge_base_not_found", "no such knowledge base")
}

/// Every problem of `request`, by field; the URL's refusal by the network policy apart (its
/// own code).
fn problems(state: &AppState, request: &KnowledgeBaseRequest) -> Result<Vec<FieldError>, ApiError> {
    let mut errors = Vec::new();
    let mut add = |field: &str, message: String| {
        errors.push(FieldError {
            field: field.to_owned(),
            message,
        });
    };
    if !spool_shared::agent::validate::valid_tool_name(&request.name) {
        add(
            "name",
            "must be 1 to 64 characters of a-z, A-Z, 0-9, _ or -".into(),
        );
    }
    if request.url.len() > MAX_URL_BYTES {
        add("url", format!("must be at most {MAX_URL_BYTES} bytes"));
    } else {
        match reqwest::Url::parse(&request.url) {
            Err(err) => add("url", format!("not a URL: {err}")),
            Ok(url) if !matches!(url.scheme(), "http" | "https") => {
                add("url", "must be an http or https URL".into());
            }
            Ok(url) => {
                if let Err(reason) = state.config.network_policy.check_url(&url) {
                    return Err(ApiError::invalid_fields(
                        "url_not_allowed",
                        "the knowledge base",
                        vec![FieldError {
                            field: "url".into(),
                            message: format!("the network policy refuses it: {reason}"),
                        }],
                    ));
                }
            }
        }
    }
    if request.headers.len() > MAX_HEADERS {
        add("headers", format!("at most {MAX_HEADERS} headers"));
    }
    for (name, value) in &request.headers {
        if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
            add(&format!("headers.{name}"), "not a valid header name".into());
        } else if value == REDACTED || reqwest::header::HeaderValue::from_str(value).is_err() {
            // The value stays out of the message: it may be a secret.
            add(
                &format!("headers.{name}"),
                "not a valid header value (and never `<redacted>`: write the value)".into(),
            );
        }
    }
    Ok(errors)
}

/// Registers a knowledge base (`tools:write`).
#[utoipa::path(
    post,
    path = "/v1/knowledge_bases",
    tag = "tools",
    security(("bearer" = ["tools:write"])),
    request_body = KnowledgeBaseRequest,
    responses(
        (status = 201, description = "The new knowledge base.", body = KnowledgeBaseResponse),
        BadBody,
        Unauthenticated,
        MissingPermission,
        (status = 409, description = "`name_taken`: the tenant has a knowledge base of that name; `knowledge_base_limit`: the tenant has 50", body = ErrorBody),
        (status = 422, description = "`invalid_body`, `invalid_knowledge_base` or `url_not_allowed` (the network policy refuses the URL's scheme or address), with `errors: [{field, message}]`", body = ErrorBody),
    )
)]
async fn post_knowledge_base(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(request): ApiJson<KnowledgeBaseRequest>,
) -> Result<(StatusCode, Json<KnowledgeBaseResponse>), ApiError> {
    caller.require(Permission::ToolsWrite)?;
    let errors = problems(&state, &request)?;
    if !errors.is_empty() {
        return Err(ApiError::invalid_fields(
            "invalid_knowledge_base",
            "the knowledge base",
            errors,
        ));
    }
    let stored = knowledge_bases::insert(
        &state.db,
        KnowledgeBaseId::new(),
        &caller.owner.tenant_id,
        &request.name,
        &request.url,
        &request.headers,
    )
    .await
    .map_err(|err| {
        if is_unique_violation(&err, knowledge_bases::NAME_INDEX) {
            ApiError::conflict(
                "name_taken",
                format!(
                    "the tenant already has a knowledge base named `{}`",
                    request.name
                ),
            )
        } else {
            err.into()
        }
    })?
    .ok_or_else(|| {
        ApiError::conflict(
            "knowledge_base_limit",
            format!(
                "the tenant has {} knowledge bases, the most it may have: delete one first",
                knowledge_bases::MAX_PER_TENANT
            ),
        )
    })?;
    Ok((StatusCode::CREATED, Json(stored.into())))
}

/// The tenant's knowledge bases, newest first.
#[utoipa::path(
    get,
    path = "/v1/knowledge_bases",
    tag = "tools",
    security(("bearer" = ["agents:read"])),
    params(
        ("limit" = Option<i64>, Query, minimum = 1, maximum = 100, description = "Rows per page (default 20; over 100 is a 400)."),
        ("cursor" = Option<String>, Query, description = "The `next_cursor` of the previous page."),
    ),
    responses(
        (status = 200, description = "A page of knowledge bases.", body = KnowledgeBaseList),
        (status = 400, description = "`invalid_limit`, `invalid_cursor`, `unknown_parameter`", body = ErrorBody),
        Unauthenticated,
        MissingPermission,
    )
)]
async fn list_knowledge_bases(
    State(state): State<AppState>,
    caller: Caller,
    mut query: ListQuery,
) -> Result<Json<List<KnowledgeBaseResponse>>, ApiError> {
    caller.require(Permission::AgentsRead)?;
    query.filters(|_, _| Ok(false))?;
    let page = knowledge_bases::list(
        &state.db,
        &caller.owner.tenant_id,
        query.cursor,
        query.limit,
    )
    .await?;
    Ok(Json(List::of(page, Into::into)))
}

/// A knowledge base.
#[utoipa::path(
    get,
    path = "/v1/knowledge_bases/{knowledge_base_id}",
    tag = "tools",
    security(("bearer" = ["agents:read"])),
    params(("knowledge_base_id" = KnowledgeBaseId, Path, description = "The knowledge base.")),
    responses(
        (status = 200, description = "The knowledge base.", body = KnowledgeBaseResponse),
        Unauthenticated,
        MissingPermission,
        (status = 404, description = "`knowledge_base_not_found`, `not_found`", body = ErrorBody),
    )
)]
async fn get_knowledge_base(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<KnowledgeBaseId>,
) -> Result<Json<KnowledgeBaseResponse>, ApiError> {
    caller.require(Permission::AgentsRead)?;
    let kb = knowledge_bases::find(&state.db, id, &caller.owner.tenant_id)
        .await?
        .ok_or_else(not_found)?;
    Ok(Json(kb.into()))
}

/// Deletes a knowledge base (`tools:write`): searches no longer ask it.
#[utoipa::path(
    delete,
    path = "/v1/knowledge_bases/{knowledge_base_id}",
    tag = "tools",
    security(("bearer" = ["tools:write"])),
    params(("knowledge_base_id" = KnowledgeBaseId, Path, description = "The knowledge base.")),
    responses(
        (status = 204, description = "Deleted."),
        Unauthenticated,
        MissingPermission,
        (status = 404, description = "`knowledge_base_not_found`, `not_found`", body = ErrorBody),
    )
)]
async fn delete_knowledge_base(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(id): ApiPath<KnowledgeBaseId>,
) -> Result<StatusCode, ApiError> {
    caller.require(Permission::ToolsWrite)?;
    if knowledge_bases::delete(&state.db, id, &caller.owner.tenant_id).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(not_found())
    }
}
