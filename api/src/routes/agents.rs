//! Agents: stored configurations, per tenant. Reading them needs `agents:read` (which tokens
//! without a permissions claim hold); writing them `agents:write`. A spec is validated before
//! it is saved, and every problem comes back at once, by field path: `422 invalid_agent` with
//! `errors: [{field, message}]`.
//!
//! Header values (of HTTP tools, MCP servers and hooks; often credentials) are write-only:
//! every read shows `"<redacted>"`, and a write that sends `"<redacted>"` back keeps the stored
//! value, so a client can read an agent, change it and write it back.
//!
//! Tools the agent references (`tool_ids`, the tenant's `/v1/tools`) are validated with it: a
//! reference to no tool of the tenant, or a name two tools share, is a problem like any other.
//! The save locks the referenced tools' rows until it commits, so none is deleted or renamed
//! meanwhile (`spool_shared::db::tools`).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::Serialize;

use spool_shared::AgentId;
use spool_shared::agent::{AgentSpec, FieldError, ToolResource, ToolSpec};
use spool_shared::db::agents::{self, Agent};
use spool_shared::db::tools;
use spool_shared::ids::ToolId;

use crate::app::AppState;
use crate::auth::public::may_use;
use crate::auth::{Caller, Permission};
use crate::error::ApiError;
use crate::error::{BadBody, ErrorBody, MissingPermission, Unauthenticated};
use crate::extract::{ApiJson, ApiPath};
use utoipa_axum::{router::OpenApiRouter, routes};

/// `/v1/agents/...`.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_agents, post_agent))
        .routes(routes!(get_agent, put_agent, delete_agent))
}

/// An agent as clients see it: its spec, plus `id` and timestamps.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct AgentResponse {
    /// Its id.
    pub id: AgentId,
    /// Its configuration.
    #[serde(flatten)]
    pub spec: AgentSpec,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
}

impl From<Agent> for AgentResponse {
    fn from(agent: Agent) -> Self {
        Self {
            id: agent.id,
            spec: agent.spec.0.redacted(),
            created_at: agent.created_at,
            updated_at: agent.updated_at,
        }
    }
}

/// A list of agents.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct AgentsResponse {
    /// The agents, oldest first.
    pub agents: Vec<AgentResponse>,
}

/// The tenant's tools `spec` references, locked until the transaction `tx` ends.
async fn referenced(
    tx: &mut sqlx::PgConnection,
    tenant: &str,
    spec: &AgentSpec,
) -> Result<Vec<(ToolId, ToolResource)>, ApiError> {
    let ids: Vec<ToolId> = spec.tool_ids.iter().map(|r| r.tool_id).collect();
    Ok(tools::lock_referenced(tx, &ids, tenant).await?)
}

/// The spec to store: `"<redacted>"` header values replaced by what `stored` holds for them,
/// then validated with the tools it references (`referenced`).
/// Agent tools must name an agent of the tenant (`this`, the agent being saved, included).
async fn validated(
    state: &AppState,
    tenant: &str,
    this: Option<AgentId>,
    (mut spec, referenced): (AgentSpec, &[(ToolId, ToolResource)]),
    stored: Option<&AgentSpec>,
) -> Result<AgentSpec, ApiError> {
    // A `<redacted>` with no value kept for its destination must be resent: its own code, so a
    // client can tell it from a spec that is wrong (the other problems are listed with it).
    let secrets = spec.keep_redacted(stored);
    let code = if secrets.is_empty() {
        "invalid_agent"
    } else {
        "secret_needs_reentry"
    };
    let mut errors = secrets;
    errors.extend(spec.validate_with(referenced));
    errors.extend(crate::routes::providers::agent_problems(state, tenant, &spec).await?);
    for (i, tool) in spec.tools.iter().enumerate() {
        errors.extend(super::tools::builtin_problem(
            state,
            tool,
            &format!("tools[{i}].name"),
        ));
    }
    for (i, tool) in spec.tools.iter().enumerate() {
        let ToolSpec::Agent(tool) = tool else {
            continue;
        };
        if Some(tool.agent_id) != this
            && agents::find(&state.db, tool.agent_id, tenant)
                .await?
                .is_none()
        {
            errors.push(FieldError {
                field: format!("tools[{i}].agent_id"),
                message: format!("no agent {} in this tenant", tool.agent_id),
            });
        }
    }
    if !errors.is_empty() {
        return Err(ApiError::invalid_fields(code, "the agent", errors));
    }
    let offered = spec.with_referenced(referenced);
    let unacknowledged = offered.unacknowledged_write_tools();
    if !unacknowledged.is_empty() {
        return Err(ApiError::unprocessable(
            "safety_acknowledgement_required",
            format!(
                "a public agent offers anonymous users tools that may write ({}): set \
                 `safety_acknowledged: true`, or mark them `read_only`",
                unacknowledged.join(", ")
            ),
        ));
    }
    Ok(spec)
}

fn not_found() -> ApiError {
    ApiError::not_found("agent_not_found", "no such agent")
}

/// Creates an agent (`agents:write`).
#[utoipa::path(
    post,
    path = "/v1/agents",
    tag = "agents",
    security(("bearer" = ["agents:write"])),
    request_body = AgentSpec,
    responses(
        (status = 201, description = "The new agent.", body = AgentResponse,
            links(
                ("GetAgent" = (operation_id = "get_agent",
                    parameters(("agent_id" = "$response.body#/id")))),
                ("PutAgent" = (operation_id = "put_agent",
                    parameters(("agent_id" = "$response.body#/id")))),
                ("DeleteAgent" = (operation_id = "delete_agent",
                    parameters(("agent_id" = "$response.body#/id")))),
            )),
        BadBody,
        Unauthenticated,
        MissingPermission,
        (status = 422, description = "`invalid_body`, `invalid_agent` (a `tool_ids` entry that names no tool of the tenant, or a tool name taken twice included), `secret_needs_reentry` (a `\"<redacted>\"` header with no value stored for its destination) (with `errors: [{field, message}]`), `safety_acknowledgement_required` (a public agent with a tool that may write, without `safety_acknowledged: true`)", body = ErrorBody),
    )
)]
async fn post_agent(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(spec): ApiJson<AgentSpec>,
) -> Result<(StatusCode, Json<AgentResponse>), ApiError> {
    caller.require(Permission::AgentsWrite)?;
    let tenant = &caller.owner.tenant_id;
    let mut tx = state.db.begin().await?;
    let tools = referenced(&mut tx, tenant, &spec).await?;
    let spec = validated(&state, tenant, None, (spec, &tools), None).await?;
    let agent = agents::insert(&mut *tx, AgentId::new(), tenant, &spec).await?;
    tx.commit().await?;
    Ok((StatusCode::CREATED, Json(agent.into())))
}

/// The tenant's agents, oldest first.
#[utoipa::path(
    get,
    path = "/v1/agents",
    tag = "agents",
    security(("bearer" = ["agents:read"])),
    responses(
        (status = 200, description = "The agents.", body = AgentsResponse),
        Unauthenticated,
        MissingPermission,
    )
)]
async fn list_agents(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<Json<AgentsResponse>, ApiError> {
    caller.require(Permission::AgentsRead)?;
    let agents = agents::list(&state.db, &caller.owner.tenant_id).await?;
    Ok(Json(AgentsResponse {
        agents: agents
            .into_iter()
            .filter(|agent| may_use(&caller, &agent.spec.0))
            .map(Into::into)
            .collect(),
    }))
}

/// An agent.
#[utoipa::path(
    get,
    path = "/v1/agents/{agent_id}",
    tag = "agents",
    security(("bearer" = ["agents:read"])),
    params(("agent_id" = AgentId, Path, description = "The agent.")),
    responses(
        (status = 200, description = "The agent.", body = AgentResponse),
        Unauthenticated,
        MissingPermission,
        (status = 404, description = "`agent_not_found`, `not_found`", body = ErrorBody),
    )
)]
async fn get_agent(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(agent_id): ApiPath<AgentId>,
) -> Result<Json<AgentResponse>, ApiError> {
    caller.require(Permission::AgentsRead)?;
    let agent = agents::find(&state.db, agent_id, &caller.owner.tenant_id)
        .await?
        .filter(|agent| may_use(&caller, &agent.spec.0))
        .ok_or_else(not_found)?;
    Ok(Json(agent.into()))
}

/// Replaces an agent's spec (`agents:write`).
#[utoipa::path(
    put,
    path = "/v1/agents/{agent_id}",
    tag = "agents",
    security(("bearer" = ["agents:write"])),
    params(("agent_id" = AgentId, Path, description = "The agent.")),
    request_body = AgentSpec,
    responses(
        (status = 200, description = "The agent.", body = AgentResponse),
        BadBody,
        Unauthenticated,
        MissingPermission,
        (status = 404, description = "`agent_not_found`, `not_found`", body = ErrorBody),
        (status = 422, description = "`invalid_body`, `invalid_agent` (a `tool_ids` entry that names no tool of the tenant, or a tool name taken twice included), `secret_needs_reentry` (a `\"<redacted>\"` header with no value stored for its destination) (with `errors: [{field, message}]`), `safety_acknowledgement_required` (a public agent with a tool that may write, without `safety_acknowledged: true`)", body = ErrorBody),
    )
)]
async fn put_agent(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(agent_id): ApiPath<AgentId>,
    ApiJson(spec): ApiJson<AgentSpec>,
) -> Result<Json<AgentResponse>, ApiError> {
    caller.require(Permission::AgentsWrite)?;
    let tenant = &caller.owner.tenant_id;
    let mut tx = state.db.begin().await?;
    let stored = agents::find(&mut *tx, agent_id, tenant)
        .await?
        .ok_or_else(not_found)?;
    let tools = referenced(&mut tx, tenant, &spec).await?;
    let spec = validated(
        &state,
        tenant,
        Some(agent_id),
        (spec, &tools),
        Some(&stored.spec.0),
    )
    .await?;
    let agent = agents::update(&mut *tx, agent_id, tenant, &spec)
        .await?
        .ok_or_else(not_found)?;
    tx.commit().await?;
    Ok(Json(agent.into()))
}

/// Deletes an agent (`agents:write`).
#[utoipa::path(
    delete,
    path = "/v1/agents/{agent_id}",
    tag = "agents",
    security(("bearer" = ["agents:write"])),
    params(("agent_id" = AgentId, Path, description = "The agent.")),
    responses(
        (status = 204, description = "Deleted."),
        Unauthenticated,
        MissingPermission,
        (status = 404, description = "`agent_not_found`, `not_found`", body = ErrorBody),
    )
)]
async fn delete_agent(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(agent_id): ApiPath<AgentId>,
) -> Result<StatusCode, ApiError> {
    caller.require(Permission::AgentsWrite)?;
    if agents::delete(&state.db, agent_id, &caller.owner.tenant_id).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(not_found())
    }
}
