//! Tools as resources (DESIGN section 12, docs/tools.md): a tenant's HTTP, MCP, client and agent
//! tools, stored once and referenced by agents (`tool_ids`). Reading them needs `agents:read`;
//! writing them `tools:write`.
//!
//! What must stay true:
//! - A tool that fails validation is a 422 `invalid_tool` listing every problem by field;
//!   nothing is stored.
//! - Header values are write-only, as an agent's: every read shows `"<redacted>"`, and a write
//!   that sends `"<redacted>"` back keeps the stored value only for the same kind and URL origin
//!   (else 422 `secret_needs_reentry`).
//! - A change that would give a tool a name another tool of a referencing agent has is refused
//!   (422 `tool_conflict`, naming the agents); a referenced tool is never deleted (409
//!   `tool_in_use`, naming the agents). Both check under the tool's row lock, which an agent's
//!   save takes too (`spool_shared::db::tools`).
//! - Another tenant's ids are 404, as ids that do not exist.
//! - An MCP server (`type: "mcp"`) is probed when it is created or changed, in the background
//!   (the write answers at once, `status: "pending"`), and on `POST /v1/tools/{id}/probe`
//!   (which waits): initialize and `tools/list` through the network policy, within
//!   [`PROBE_TIMEOUT`]. A probe never blocks a save and its result lands only on the version it
//!   probed ([`tools::record_probe`]). Its error never carries the server's URL or a secret.
//! - A URL the network policy refuses outright (an address literal it refuses) is a 422
//!   `url_not_allowed` at save; a host name that resolves to a refused address probes
//!   `unhealthy`.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;

use spool_shared::agent::{FieldError, McpAuth, McpToolSpec, REDACTED, ToolResource, ToolSpec};
use spool_shared::db::{agents, is_unique_violation, tools};
use spool_shared::egress::GuardedClients;
use spool_shared::ids::{AgentId, ToolId};
use spool_worker::agent::tools::identity::Identity;
use spool_worker::agent::tools::mcp::{McpServer, McpSession};

use crate::app::AppState;
use crate::auth::{Caller, Permission};
use crate::error::{ApiError, BadBody, ErrorBody, MissingPermission, Unauthenticated};
use crate::extract::{ApiJson, ApiPath};
use crate::routes::list::{List, ListQuery};
use utoipa_axum::{router::OpenApiRouter, routes};

/// `/v1/tools/...`.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_tools, post_tool))
        .routes(routes!(get_tool, put_tool, patch_tool, delete_tool))
        .routes(routes!(probe_tool))
}

/// How long a probe of an MCP server may take, handshake and `tools/list` included.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

/// How many of a server's tools a probe lists at most.
const MAX_PROBED_TOOLS: usize = 1000;

/// An MCP server's health, as its last probe found it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct McpProbe {
    /// `pending` (a probe is due or running), `healthy` (the last probe initialized and listed
    /// the server's tools) or `unhealthy` (it could not: see `error`).
    #[schema(value_type = String, example = "healthy")]
    pub status: String,
    /// When the last probe ended (`null` before the first).
    pub last_probed_at: Option<DateTime<Utc>>,
    /// Why the last probe failed; `null` when it did not.
    pub error: Option<String>,
    /// The names (on the server) of the tools the last successful probe listed, whether or not
    /// `allowed_tools` offers them.
    pub discovered_tools: Vec<String>,
}

/// A tool as clients see it: the tool (header values redacted), plus `id` and timestamps.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ToolResponse {
    /// Its id: what agents name in `tool_ids`.
    pub id: ToolId,
    /// The tool.
    #[serde(flatten)]
    pub spec: ToolResource,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
    /// An MCP server's health (`status`, `last_probed_at`, `error`, `discovered_tools`); other
    /// kinds have none. Read-only: leave these fields out of a PUT.
    #[serde(flatten)]
    pub probe: Option<McpProbe>,
}

impl From<tools::Tool> for ToolResponse {
    fn from(tool: tools::Tool) -> Self {
        let mut spec = tool.spec.0;
        spec.tool = spec.tool.redacted();
        let probe = tool.probe_status.map(|status| McpProbe {
            status,
            last_probed_at: tool.last_probed_at,
            error: tool.probe_error,
            discovered_tools: tool.discovered_tools.map(|t| t.0).unwrap_or_default(),
        });
        Self {
            id: tool.id,
            spec,
            created_at: tool.created_at,
            updated_at: tool.updated_at,
            probe,
        }
    }
}

/// A page of tools.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ToolList {
    /// The tools, newest first.
    pub data: Vec<ToolResponse>,
    /// The `cursor` of the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

fn not_found() -> ApiError {
    ApiError::not_found("tool_not_found", "no such tool")
}

fn name_taken(name: &str) -> ApiError {
    ApiError::conflict(
        "name_taken",
        format!("the tenant already has a tool named `{name}`"),
    )
}

/// The tool to store: `"<redacted>"` header values replaced by what `stored` holds for them,
/// then validated (an agent tool's agent must be the tenant's).
async fn validated(
    state: &AppState,
    tenant: &str,
    mut tool: ToolResource,
    stored: Option<&ToolSpec>,
) -> Result<ToolResource, ApiError> {
    let secrets = tool.tool.keep_redacted(stored);
    let refused = refused_urls(state, &tool.tool);
    let code = if !secrets.is_empty() {
        "secret_needs_reentry"
    } else if !refused.is_empty() {
        "url_not_allowed"
    } else {
        "invalid_tool"
    };
    let mut errors = secrets;
    errors.extend(refused);
    errors.extend(tool.validate());
    errors.extend(builtin_problem(state, &tool.tool, "name"));
    if let ToolSpec::Agent(agent) = &tool.tool
        && !agents::exists(&state.db, agent.agent_id, tenant).await?
    {
        errors.push(FieldError {
            field: "agent_id".into(),
            message: format!("no agent {} in this tenant", agent.agent_id),
        });
    }
    if errors.is_empty() {
        Ok(tool)
    } else {
        Err(ApiError::invalid_fields(code, "the tool", errors))
    }
}

/// The problem of a built-in tool the operator does not enable (`SPOOL_BUILTIN_TOOLS`), at
/// `field`.
pub(crate) fn builtin_problem(
    state: &AppState,
    tool: &ToolSpec,
    field: &str,
) -> Option<FieldError> {
    let ToolSpec::Builtin(builtin) = tool else {
        return None;
    };
    (!state.config.builtin_tools.enabled(builtin.name)).then(|| FieldError {
        field: field.to_owned(),
        message: format!(
            "the built-in tool `{}` is not enabled on this server (SPOOL_BUILTIN_TOOLS)",
            builtin.name.as_str()
        ),
    })
}

/// The URLs of an MCP server (its own, its OAuth token endpoint's) that the network policy
/// refuses outright: a scheme other than http(s), or an address literal it refuses. (An
/// unparsable URL is validation's to report.)
fn refused_urls(state: &AppState, tool: &ToolSpec) -> Vec<FieldError> {
    let Some(mcp) = tool.as_mcp() else {
        return Vec::new();
    };
    let mut urls = vec![("url", mcp.url.as_str())];
    if let Some(McpAuth::OauthClientCredentials { token_url, .. }) = &mcp.auth {
        urls.push(("auth.token_url", token_url.as_str()));
    }
    urls.into_iter()
        .filter_map(|(field, url)| {
            let url = reqwest::Url::parse(url).ok()?;
            let reason = state.config.network_policy.check_url(&url).err()?;
            Some(FieldError {
                field: field.into(),
                message: format!("the network policy refuses it: {reason}"),
            })
        })
        .collect()
}

/// Probes the MCP server now, within [`PROBE_TIMEOUT`]: what it offers, or why it cannot be
/// used (without its URL or any secret).
pub async fn probe(
    policy: &std::sync::Arc<spool_shared::egress::NetworkPolicy>,
    tenant: &str,
    user: &str,
    mcp: &McpToolSpec,
) -> tools::Probed {
    let clients = match GuardedClients::new(policy, PROBE_TIMEOUT) {
        Ok(clients) => clients,
        Err(err) => return tools::Probed::Unhealthy(format!("no HTTP client: {err:#}")),
    };
    let identity = Identity::new(tenant, user, "probe", None);
    let server = McpServer::of(mcp);
    let connect = McpSession::connect(
        &server,
        &clients,
        &identity,
        PROBE_TIMEOUT,
        MAX_PROBED_TOOLS,
    );
    match tokio::time::timeout(PROBE_TIMEOUT, connect).await {
        Ok(Ok((session, found))) => {
            // Ending the session is no part of the probe's answer.
            tokio::spawn(session.close());
            tools::Probed::Healthy(found.into_iter().map(|t| t.remote_name).collect())
        }
        Ok(Err(err)) => tools::Probed::Unhealthy(scrubbed(&format!("{err:#}"), mcp)),
        Err(_) => tools::Probed::Unhealthy(format!(
            "MCP server {}: no answer within {} s",
            mcp.name,
            PROBE_TIMEOUT.as_secs()
        )),
    }
}

/// `error` without the server's URL and without any of its secrets (header values, `auth`).
fn scrubbed(error: &str, mcp: &McpToolSpec) -> String {
    let mut text = spool_worker::agent::tools::without_urls(error, &mcp.url);
    let mut secrets: Vec<&str> = mcp.headers.values().map(String::as_str).collect();
    match &mcp.auth {
        Some(McpAuth::Bearer { token }) => secrets.push(token),
        Some(McpAuth::OauthClientCredentials { client_secret, .. }) => {
            secrets.push(client_secret);
        }
        None => {}
    }
    for secret in secrets.into_iter().filter(|s| s.len() >= 4) {
        text = text.replace(secret, REDACTED);
    }
    text
}

/// Probes the stored MCP server in the background and records what it finds on the version
/// probed; nothing for other kinds.
fn probe_later(state: &AppState, tool: &tools::Tool, tenant: &str, user: &str) {
    let Some(mcp) = tool.spec.0.tool.as_mcp().cloned() else {
        return;
    };
    let (state, id, version) = (state.clone(), tool.id, tool.updated_at);
    let (tenant, user) = (tenant.to_owned(), user.to_owned());
    tokio::spawn(async move {
        let probed = probe(&state.config.network_policy, &tenant, &user, &mcp).await;
        log_probe(id, &probed);
        if let Err(err) = tools::record_probe(&state.db, id, &tenant, version, &probed).await {
            tracing::warn!(tool.id = %id, error = %err, "storing an MCP server's probe failed");
        }
    });
}

fn log_probe(id: ToolId, probed: &tools::Probed) {
    match probed {
        tools::Probed::Healthy(found) => {
            tracing::info!(tool.id = %id, tools = found.len(), "MCP server probed: healthy");
        }
        tools::Probed::Unhealthy(error) => {
            tracing::info!(tool.id = %id, error, "MCP server probed: unhealthy");
        }
    }
}

/// Probes an MCP server now and answers with the tool once the probe is done (`tools:write`).
#[utoipa::path(
    post,
    path = "/v1/tools/{tool_id}/probe",
    tag = "tools",
    security(("bearer" = ["tools:write"])),
    params(("tool_id" = ToolId, Path, description = "The tool (an MCP server).")),
    responses(
        (status = 200, description = "The tool, with the probe's `status`, `last_probed_at`, `error` and `discovered_tools` (within 30 s).", body = ToolResponse),
        Unauthenticated,
        MissingPermission,
        (status = 404, description = "`tool_not_found`, `not_found`", body = ErrorBody),
        (status = 422, description = "`not_an_mcp_server`: only MCP servers are probed", body = ErrorBody),
    )
)]
async fn probe_tool(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(tool_id): ApiPath<ToolId>,
) -> Result<Json<ToolResponse>, ApiError> {
    caller.require(Permission::ToolsWrite)?;
    let tenant = &caller.owner.tenant_id;
    let tool = tools::find(&state.db, tool_id, tenant)
        .await?
        .ok_or_else(not_found)?;
    let Some(mcp) = tool.spec.0.tool.as_mcp() else {
        return Err(ApiError::unprocessable(
            "not_an_mcp_server",
            "only MCP servers (`type: \"mcp\"`) are probed",
        ));
    };
    let probed = probe(
        &state.config.network_policy,
        tenant,
        &caller.owner.user_id,
        mcp,
    )
    .await;
    log_probe(tool_id, &probed);
    let recorded =
        tools::record_probe(&state.db, tool_id, tenant, tool.updated_at, &probed).await?;
    // Changed meanwhile: the newer version is what there is (its own probe is under way).
    let tool = match recorded {
        Some(tool) => tool,
        None => tools::find(&state.db, tool_id, tenant)
            .await?
            .ok_or_else(not_found)?,
    };
    Ok(Json(tool.into()))
}

/// Creates a tool (`tools:write`).
#[utoipa::path(
    post,
    path = "/v1/tools",
    tag = "tools",
    security(("bearer" = ["tools:write"])),
    request_body = ToolResource,
    responses(
        (status = 201, description = "The new tool.", body = ToolResponse,
            links(
                ("GetTool" = (operation_id = "get_tool",
                    parameters(("tool_id" = "$response.body#/id")))),
                ("DeleteTool" = (operation_id = "delete_tool",
                    parameters(("tool_id" = "$response.body#/id")))),
            )),
        BadBody,
        Unauthenticated,
        MissingPermission,
        (status = 409, description = "`name_taken`: the tenant has a tool of that name", body = ErrorBody),
        (status = 422, description = "`invalid_body`, `invalid_tool`, `secret_needs_reentry` (a `\"<redacted>\"` header value or `auth` secret) or `url_not_allowed` (an MCP server's URL the network policy refuses outright), with `errors: [{field, message}]`", body = ErrorBody),
    )
)]
async fn post_tool(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(tool): ApiJson<ToolResource>,
) -> Result<(StatusCode, Json<ToolResponse>), ApiError> {
    caller.require(Permission::ToolsWrite)?;
    let tenant = &caller.owner.tenant_id;
    let tool = validated(&state, tenant, tool, None).await?;
    let stored = tools::insert(&state.db, ToolId::new(), tenant, &tool)
        .await
        .map_err(|err| {
            if is_unique_violation(&err, tools::NAME_INDEX) {
                name_taken(tool.tool.name())
            } else {
                err.into()
            }
        })?;
    probe_later(&state, &stored, tenant, &caller.owner.user_id);
    Ok((StatusCode::CREATED, Json(stored.into())))
}

/// The tenant's tools, newest first.
#[utoipa::path(
    get,
    path = "/v1/tools",
    tag = "tools",
    security(("bearer" = ["agents:read"])),
    params(
        ("limit" = Option<i64>, Query, minimum = 1, maximum = 100, description = "Rows per page (default 20; over 100 is a 400)."),
        ("cursor" = Option<String>, Query, description = "The `next_cursor` of the previous page."),
    ),
    responses(
        (status = 200, description = "A page of tools.", body = ToolList),
        (status = 400, description = "`invalid_limit`, `invalid_cursor`, `unknown_parameter`", body = ErrorBody),
        Unauthenticated,
        MissingPermission,
    )
)]
async fn list_tools(
    State(state): State<AppState>,
    caller: Caller,
    mut query: ListQuery,
) -> Result<Json<List<ToolResponse>>, ApiError> {
    caller.require(Permission::AgentsRead)?;
    query.filters(|_, _| Ok(false))?;
    let page = tools::list(
        &state.db,
        &caller.owner.tenant_id,
        query.cursor,
        query.limit,
    )
    .await?;
    Ok(Json(List::of(page, Into::into)))
}

/// A tool.
#[utoipa::path(
    get,
    path = "/v1/tools/{tool_id}",
    tag = "tools",
    security(("bearer" = ["agents:read"])),
    params(("tool_id" = ToolId, Path, description = "The tool.")),
    responses(
        (status = 200, description = "The tool.", body = ToolResponse),
        Unauthenticated,
        MissingPermission,
        (status = 404, description = "`tool_not_found`, `not_found`", body = ErrorBody),
    )
)]
async fn get_tool(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(tool_id): ApiPath<ToolId>,
) -> Result<Json<ToolResponse>, ApiError> {
    caller.require(Permission::AgentsRead)?;
    let tool = tools::find(&state.db, tool_id, &caller.owner.tenant_id)
        .await?
        .ok_or_else(not_found)?;
    Ok(Json(tool.into()))
}

/// Replaces a tool (`tools:write`).
#[utoipa::path(
    put,
    path = "/v1/tools/{tool_id}",
    tag = "tools",
    security(("bearer" = ["tools:write"])),
    params(("tool_id" = ToolId, Path, description = "The tool.")),
    request_body = ToolResource,
    responses(
        (status = 200, description = "The tool.", body = ToolResponse),
        BadBody,
        Unauthenticated,
        MissingPermission,
        (status = 404, description = "`tool_not_found`, `not_found`", body = ErrorBody),
        (status = 409, description = "`name_taken`: the tenant has another tool of that name", body = ErrorBody),
        (status = 422, description = "`invalid_body`, `invalid_tool`, `url_not_allowed`, `secret_needs_reentry` (a `\"<redacted>\"` or omitted secret with no value stored for the same kind and URL origin), `tool_conflict` (an agent that references the tool would offer two tools of one name; `errors` names the agents), with `errors: [{field, message}]`", body = ErrorBody),
    )
)]
async fn put_tool(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(tool_id): ApiPath<ToolId>,
    ApiJson(tool): ApiJson<ToolResource>,
) -> Result<Json<ToolResponse>, ApiError> {
    caller.require(Permission::ToolsWrite)?;
    replace(&state, &caller, tool_id, |_| Ok(tool)).await
}

/// Changes some fields of a tool (`tools:write`): a JSON merge patch (RFC 7396) of the tool as
/// it reads, so header values not sent stay as stored (for the same kind and URL origin).
#[utoipa::path(
    patch,
    path = "/v1/tools/{tool_id}",
    tag = "tools",
    security(("bearer" = ["tools:write"])),
    params(("tool_id" = ToolId, Path, description = "The tool.")),
    request_body(content = Object, description = "The fields to change (`null` removes an optional one)."),
    responses(
        (status = 200, description = "The tool.", body = ToolResponse),
        BadBody,
        Unauthenticated,
        MissingPermission,
        (status = 404, description = "`tool_not_found`, `not_found`", body = ErrorBody),
        (status = 409, description = "`name_taken`: the tenant has another tool of that name", body = ErrorBody),
        (status = 422, description = "`invalid_body`, `invalid_tool`, `secret_needs_reentry`, `tool_conflict`, as for PUT", body = ErrorBody),
    )
)]
async fn patch_tool(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(tool_id): ApiPath<ToolId>,
    ApiJson(patch): ApiJson<Value>,
) -> Result<Json<ToolResponse>, ApiError> {
    caller.require(Permission::ToolsWrite)?;
    replace(&state, &caller, tool_id, |stored| {
        // Patched as it reads, so a header not sent stays `"<redacted>"` and is kept only for
        // the same destination, exactly as a PUT of what was read.
        let mut read = stored.clone();
        read.tool = read.tool.redacted();
        let mut value = serde_json::to_value(read).map_err(anyhow::Error::from)?;
        merge_patch(&mut value, patch);
        serde_json::from_value(value)
            .map_err(|err| ApiError::unprocessable("invalid_body", err.to_string()))
    })
    .await
}

/// Replaces the tool with what `change` makes of the stored one, in one transaction that holds
/// the tool's row: validated, and checked against every agent that references it.
async fn replace(
    state: &AppState,
    caller: &Caller,
    tool_id: ToolId,
    change: impl FnOnce(&ToolResource) -> Result<ToolResource, ApiError>,
) -> Result<Json<ToolResponse>, ApiError> {
    let tenant = &caller.owner.tenant_id;
    let mut tx = state.db.begin().await?;
    let stored = tools::lock(&mut *tx, tool_id, tenant)
        .await?
        .ok_or_else(not_found)?;
    let tool = change(&stored.spec.0)?;
    let tool = validated(state, tenant, tool, Some(&stored.spec.0.tool)).await?;
    let conflicts = conflicts(&mut tx, tenant, tool_id, &tool).await?;
    if !conflicts.is_empty() {
        return Err(ApiError::invalid_fields(
            "tool_conflict",
            "agents that reference the tool",
            conflicts,
        ));
    }
    let updated = tools::update(&mut *tx, tool_id, tenant, &tool)
        .await
        .map_err(|err| {
            if is_unique_violation(&err, tools::NAME_INDEX) {
                name_taken(tool.tool.name())
            } else {
                err.into()
            }
        })?
        .ok_or_else(not_found)?;
    tx.commit().await?;
    probe_later(state, &updated, tenant, &caller.owner.user_id);
    Ok(Json(updated.into()))
}

/// The problems the change from `before` to `after` makes in the agents that reference the tool
/// (a problem they had already is not the change's): one per problem, on `name`, naming the
/// agent.
async fn conflicts(
    tx: &mut sqlx::PgConnection,
    tenant: &str,
    tool_id: ToolId,
    after: &ToolResource,
) -> Result<Vec<FieldError>, ApiError> {
    let mut conflicts = Vec::new();
    for (agent_id, agent) in tools::referencing_agents(&mut *tx, tool_id, tenant).await? {
        let mut ids: Vec<ToolId> = agent.tool_ids.iter().map(|r| r.tool_id).collect();
        if let Some(graph) = &agent.graph_spec {
            ids.extend(graph.tools.mcp_servers.iter().copied());
        }
        let mut referenced = tools::find_many(&mut *tx, &ids, tenant).await?;
        let old = agent.validate_with(&referenced);
        for (id, tool) in &mut referenced {
            if *id == tool_id {
                tool.clone_from(after);
            }
        }
        for problem in agent.validate_with(&referenced) {
            if !old.contains(&problem) {
                conflicts.push(conflict(agent_id, &agent.name, problem));
            }
        }
    }
    Ok(conflicts)
}

fn conflict(agent_id: AgentId, name: &str, problem: FieldError) -> FieldError {
    FieldError {
        field: "name".into(),
        message: format!(
            "agent `{name}` ({agent_id}): {}: {}",
            problem.field, problem.message
        ),
    }
}

/// Deletes a tool (`tools:write`); one that an agent references is refused.
#[utoipa::path(
    delete,
    path = "/v1/tools/{tool_id}",
    tag = "tools",
    security(("bearer" = ["tools:write"])),
    params(("tool_id" = ToolId, Path, description = "The tool.")),
    responses(
        (status = 204, description = "Deleted."),
        Unauthenticated,
        MissingPermission,
        (status = 404, description = "`tool_not_found`, `not_found`", body = ErrorBody),
        (status = 409, description = "`tool_in_use`: agents reference it (`agents: [{id, name}]`); remove it from them first", body = ErrorBody),
    )
)]
async fn delete_tool(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(tool_id): ApiPath<ToolId>,
) -> Result<StatusCode, ApiError> {
    caller.require(Permission::ToolsWrite)?;
    let tenant = &caller.owner.tenant_id;
    let mut tx = state.db.begin().await?;
    tools::lock(&mut *tx, tool_id, tenant)
        .await?
        .ok_or_else(not_found)?;
    let users = tools::referencing_agents(&mut *tx, tool_id, tenant).await?;
    if !users.is_empty() {
        let names: Vec<String> = users
            .iter()
            .map(|(id, agent)| format!("`{}` ({id})", agent.name))
            .collect();
        let agents: Vec<Value> = users
            .iter()
            .map(|(id, agent)| serde_json::json!({"id": id, "name": agent.name}))
            .collect();
        return Err(ApiError::conflict(
            "tool_in_use",
            format!(
                "agents reference the tool: {}; remove it from them first",
                names.join(", ")
            ),
        )
        .with("agents", agents));
    }
    tools::delete(&mut *tx, tool_id, tenant).await?;
    tx.commit().await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Applies a JSON merge patch (RFC 7396) to `target`.
pub(crate) fn merge_patch(target: &mut Value, patch: Value) {
    let Value::Object(patch) = patch else {
        *target = patch;
        return;
    };
    if !target.is_object() {
        *target = Value::Object(serde_json::Map::new());
    }
    if let Value::Object(map) = target {
        for (key, value) in patch {
            if value.is_null() {
                map.remove(&key);
            } else {
                merge_patch(map.entry(key).or_insert(Value::Null), value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::merge_patch;
    use serde_json::json;

    #[test]
    fn a_merge_patch_replaces_merges_and_removes() {
        let mut target = json!({"a": 1, "h": {"x": "1", "y": "2"}, "keep": true});
        merge_patch(&mut target, json!({"a": 2, "h": {"x": null, "z": "3"}}));
        assert_eq!(
            target,
            json!({"a": 2, "h": {"y": "2", "z": "3"}, "keep": true})
        );
    }
}
