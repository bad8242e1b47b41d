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
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

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
use crate::extract::{ApiJson, ApiPath, ApiQuery};
use utoipa_axum::{router::OpenApiRouter, routes};

/// `/v1/agents/...`.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_agents, post_agent))
        .routes(routes!(validate_agent))
        .routes(routes!(get_agent, put_agent, patch_agent, delete_agent))
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
    let mut ids: Vec<ToolId> = spec.tool_ids.iter().map(|r| r.tool_id).collect();
    if let Some(graph) = &spec.graph_spec {
        ids.extend(graph.tools.mcp_servers.iter().copied());
    }
    Ok(tools::lock_referenced(tx, &ids, tenant).await?)
}

/// What a write would store, or why it would not.
enum Checked {
    /// The spec to store.
    Valid(Box<AgentSpec>),
    /// Problems by field, answered with `code` (`invalid_agent`, or `secret_needs_reentry`).
    Invalid(&'static str, Vec<FieldError>),
    /// A public agent that offers anonymous users tools that may write, unacknowledged.
    Unacknowledged(Vec<String>),
}

impl Checked {
    /// The spec, or the error a write answers.
    fn into_result(self) -> Result<AgentSpec, ApiError> {
        match self {
            Self::Valid(spec) => Ok(*spec),
            Self::Invalid(code, errors) => Err(ApiError::invalid_fields(code, "the agent", errors)),
            Self::Unacknowledged(tools) => Err(ApiError::unprocessable(
                "safety_acknowledgement_required",
                unacknowledged_message(&tools),
            )),
        }
    }

    /// As `POST /v1/agents/validate` answers it.
    fn into_report(self) -> ValidationResponse {
        match self {
            Self::Valid(spec) => ValidationResponse {
                valid: true,
                errors: Vec::new(),
                agent: Some(Box::new((*spec).redacted())),
            },
            Self::Invalid(_, errors) => ValidationResponse::invalid(errors),
            Self::Unacknowledged(tools) => ValidationResponse::invalid(vec![FieldError {
                field: "safety_acknowledged".into(),
                message: unacknowledged_message(&tools),
            }]),
        }
    }
}

fn unacknowledged_message(tools: &[String]) -> String {
    format!(
        "a public agent offers anonymous users tools that may write ({}): set \
         `safety_acknowledged: true`, or mark them `read_only`",
        tools.join(", ")
    )
}

/// The spec to store: `"<redacted>"` header values replaced by what `stored` holds for them,
/// then validated with the tools it references (`referenced`).
/// Agent tools must name an agent of the tenant (`this`, the agent being saved, included).
async fn checked(
    state: &AppState,
    tenant: &str,
    this: Option<AgentId>,
    (mut spec, referenced): (AgentSpec, &[(ToolId, ToolResource)]),
    stored: Option<&AgentSpec>,
) -> Result<Checked, ApiError> {
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
    if let Some(graph) = &spec.graph_spec {
        for (i, name) in graph.tools.builtin.iter().enumerate() {
            if let Some(builtin) = spool_shared::agent::Builtin::parse(name)
                && !state.config.builtin_tools.enabled(builtin)
            {
                errors.push(FieldError {
                    field: format!("graph_spec.tools.builtin[{i}]"),
                    message: format!(
                        "the built-in tool `{name}` is not enabled on this server \
                         (SPOOL_BUILTIN_TOOLS)"
                    ),
                });
            }
        }
    }
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
        return Ok(Checked::Invalid(code, errors));
    }
    let offered = spec.with_referenced(referenced);
    let unacknowledged = offered.unacknowledged_write_tools();
    if !unacknowledged.is_empty() {
        return Ok(Checked::Unacknowledged(
            unacknowledged.into_iter().map(str::to_owned).collect(),
        ));
    }
    Ok(Checked::Valid(Box::new(spec)))
}

/// [`checked`], as a write answers it.
async fn validated(
    state: &AppState,
    tenant: &str,
    this: Option<AgentId>,
    spec: (AgentSpec, &[(ToolId, ToolResource)]),
    stored: Option<&AgentSpec>,
) -> Result<AgentSpec, ApiError> {
    checked(state, tenant, this, spec, stored)
        .await?
        .into_result()
}

/// `?dry_run=true` on a write.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WriteQuery {
    /// Validate only: answer 200 with the report (an invalid body is the usual 422) and store
    /// nothing.
    #[serde(default)]
    pub dry_run: bool,
}

/// Whether a spec is valid, and every problem by field path.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ValidationResponse {
    /// Whether it would be stored.
    pub valid: bool,
    /// Every problem, by field path from the body's root (`graph_spec.edges[2].to`).
    pub errors: Vec<FieldError>,
    /// The agent as it would be stored (defaults filled in, header values redacted), when valid.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<Box<AgentSpec>>,
}

impl ValidationResponse {
    fn invalid(errors: Vec<FieldError>) -> Self {
        Self {
            valid: false,
            errors,
            agent: None,
        }
    }
}

/// A body as an agent spec; a problem of its shape (a field of the wrong type, one unknown) by
/// its path.
fn parse(body: Value) -> Result<AgentSpec, FieldError> {
    if !body.is_object() {
        return Err(FieldError {
            field: String::new(),
            message: "the body must be a JSON object".into(),
        });
    }
    serde_path_to_error::deserialize(body).map_err(|err| {
        let path = err.path().to_string();
        FieldError {
            field: if path == "." { String::new() } else { path },
            message: err.into_inner().to_string(),
        }
    })
}

/// The dry run's answer: 200 with the report (the spec is valid; an invalid one was a 422).
fn dry_run(spec: AgentSpec) -> Response {
    let report = Checked::Valid(Box::new(spec)).into_report();
    (StatusCode::OK, Json(report)).into_response()
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
    params(WriteQuery),
    request_body = AgentSpec,
    responses(
        (status = 200, description = "`dry_run=true`: the spec is valid; nothing was stored.", body = ValidationResponse),
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
    ApiQuery(query): ApiQuery<WriteQuery>,
    ApiJson(spec): ApiJson<AgentSpec>,
) -> Result<Response, ApiError> {
    caller.require(Permission::AgentsWrite)?;
    let tenant = &caller.owner.tenant_id;
    let mut tx = state.db.begin().await?;
    let tools = referenced(&mut tx, tenant, &spec).await?;
    let spec = validated(&state, tenant, None, (spec, &tools), None).await?;
    if query.dry_run {
        return Ok(dry_run(spec));
    }
    let agent = agents::insert(&mut *tx, AgentId::new(), tenant, &spec).await?;
    tx.commit().await?;
    Ok((StatusCode::CREATED, Json(AgentResponse::from(agent))).into_response())
}

/// Validates an agent spec and stores nothing (`agents:write`): 200 with whether it is valid
/// and every problem by field path, the shape of the body's included.
#[utoipa::path(
    post,
    path = "/v1/agents/validate",
    tag = "agents",
    security(("bearer" = ["agents:write"])),
    request_body(content = Object, description = "An agent, as `POST /v1/agents` takes it."),
    responses(
        (status = 200, description = "Whether it is valid, and every problem.", body = ValidationResponse),
        BadBody,
        Unauthenticated,
        MissingPermission,
    )
)]
async fn validate_agent(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(body): ApiJson<Value>,
) -> Result<Json<ValidationResponse>, ApiError> {
    caller.require(Permission::AgentsWrite)?;
    let spec = match parse(body) {
        Ok(spec) => spec,
        Err(problem) => return Ok(Json(ValidationResponse::invalid(vec![problem]))),
    };
    let tenant = &caller.owner.tenant_id;
    // Read in a transaction that is rolled back: the locks of a write, nothing stored.
    let mut tx = state.db.begin().await?;
    let tools = referenced(&mut tx, tenant, &spec).await?;
    let report = checked(&state, tenant, None, (spec, &tools), None).await?;
    tx.rollback().await?;
    Ok(Json(report.into_report()))
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
    params(("agent_id" = AgentId, Path, description = "The agent."), WriteQuery),
    request_body = AgentSpec,
    responses(
        (status = 200, description = "The agent (with `dry_run=true`: the validation report, `ValidationResponse`, and nothing stored).", body = AgentResponse),
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
    ApiQuery(query): ApiQuery<WriteQuery>,
    ApiJson(spec): ApiJson<AgentSpec>,
) -> Result<Response, ApiError> {
    caller.require(Permission::AgentsWrite)?;
    let tenant = &caller.owner.tenant_id;
    let mut tx = state.db.begin().await?;
    let stored = agents::find(&mut *tx, agent_id, tenant)
        .await?
        .ok_or_else(not_found)?;
    replace(&state, tx, (agent_id, tenant), stored, spec, query.dry_run).await
}

/// Changes some top-level fields of an agent (`agents:write`): each field sent replaces the
/// stored one whole (a `graph_spec` or `limits` sent replaces the old one), `null` restores a
/// field's default, and the others stay. `kind` cannot change. Header values not sent, or sent
/// back as `"<redacted>"`, are kept as for PUT. Runs already enqueued keep the spec they started
/// with.
#[utoipa::path(
    patch,
    path = "/v1/agents/{agent_id}",
    tag = "agents",
    security(("bearer" = ["agents:write"])),
    params(("agent_id" = AgentId, Path, description = "The agent."), WriteQuery),
    request_body(content = Object, description = "The top-level fields to replace (`null` restores a field's default)."),
    responses(
        (status = 200, description = "The agent (with `dry_run=true`: the validation report, `ValidationResponse`, and nothing stored).", body = AgentResponse),
        BadBody,
        Unauthenticated,
        MissingPermission,
        (status = 404, description = "`agent_not_found`, `not_found`", body = ErrorBody),
        (status = 422, description = "`invalid_body`, `invalid_agent` (a change of `kind` included), `secret_needs_reentry`, `safety_acknowledgement_required`, as for PUT", body = ErrorBody),
    )
)]
async fn patch_agent(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(agent_id): ApiPath<AgentId>,
    ApiQuery(query): ApiQuery<WriteQuery>,
    ApiJson(patch): ApiJson<serde_json::Map<String, Value>>,
) -> Result<Response, ApiError> {
    caller.require(Permission::AgentsWrite)?;
    let tenant = &caller.owner.tenant_id;
    let mut tx = state.db.begin().await?;
    let stored = agents::find(&mut *tx, agent_id, tenant)
        .await?
        .ok_or_else(not_found)?;
    // Patched as it reads, so a header not sent stays `"<redacted>"` and is kept for the same
    // destination, exactly as a PUT of what was read.
    let read = stored.spec.0.clone().redacted();
    let mut value = serde_json::to_value(&read).map_err(anyhow::Error::from)?;
    let fields = value
        .as_object_mut()
        .ok_or_else(|| anyhow::anyhow!("a stored agent is a JSON object"))?;
    for (key, new) in patch {
        if new.is_null() {
            fields.remove(&key);
        } else {
            fields.insert(key, new);
        }
    }
    let spec = parse(value).map_err(|problem| {
        let message = if problem.field.is_empty() {
            problem.message
        } else {
            format!("{}: {}", problem.field, problem.message)
        };
        ApiError::unprocessable("invalid_body", message)
    })?;
    if spec.kind != read.kind {
        let problem = FieldError {
            field: "kind".into(),
            message: format!(
                "an agent's kind cannot change (it is `{}`): create a new agent",
                serde_json::to_value(read.kind)
                    .ok()
                    .and_then(|k| k.as_str().map(str::to_owned))
                    .unwrap_or_default()
            ),
        };
        return Err(ApiError::invalid_fields(
            "invalid_agent",
            "the agent",
            vec![problem],
        ));
    }
    replace(&state, tx, (agent_id, tenant), stored, spec, query.dry_run).await
}

/// Replaces the stored agent `stored` with `spec` in the transaction `tx` (which read it), once
/// validated; with `dry_run`, only validates.
async fn replace(
    state: &AppState,
    mut tx: sqlx::Transaction<'_, sqlx::Postgres>,
    (agent_id, tenant): (AgentId, &str),
    stored: Agent,
    spec: AgentSpec,
    dry_run_only: bool,
) -> Result<Response, ApiError> {
    let tools = referenced(&mut tx, tenant, &spec).await?;
    let spec = validated(
        state,
        tenant,
        Some(agent_id),
        (spec, &tools),
        Some(&stored.spec.0),
    )
    .await?;
    if dry_run_only {
        return Ok(dry_run(spec));
    }
    let agent = agents::update(&mut *tx, agent_id, tenant, &spec)
        .await?
        .ok_or_else(not_found)?;
    tx.commit().await?;
    Ok(Json(AgentResponse::from(agent)).into_response())
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
