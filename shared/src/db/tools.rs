//! A tenant's tool resources (`/v1/tools`), and what references them: agents, by id in their
//! spec's `tool_ids` (found through the GIN index `agents_tool_ids_idx`).
//!
//! What must stay true:
//! - A referenced tool is never deleted: the delete locks the tool's row and checks for
//!   references in one transaction, and a save of an agent locks the rows of the tools it
//!   references ([`lock_referenced`], `FOR SHARE`) in its own, so of a delete and a save that
//!   race, one sees the other.
//! - Every query is scoped to the tenant: another tenant's id reads as no tool.

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;
use sqlx::types::Json;

use crate::agent::{AgentSpec, ToolResource};
use crate::db::page::{self, Cursor, Page};
use crate::ids::{AgentId, ToolId};

/// How many referencing agents a check reads at most (a DELETE's refusal names them, a change
/// checks each for collisions).
pub const MAX_REFERENCING: i64 = 500;

/// A stored tool.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct Tool {
    /// Its id.
    pub id: ToolId,
    /// The tool as posted (header values in clear: redact before showing).
    pub spec: Json<ToolResource>,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it last changed (a probe's result is not a change): the version a probe's
    /// result is written against ([`record_probe`]).
    pub updated_at: DateTime<Utc>,
    /// An MCP server's last probe: `pending`, `healthy` or `unhealthy` (`None` for other kinds).
    pub probe_status: Option<String>,
    /// When an MCP server was last probed.
    pub last_probed_at: Option<DateTime<Utc>>,
    /// Why the last probe failed.
    pub probe_error: Option<String>,
    /// The names of the tools the server listed at the last successful probe.
    pub discovered_tools: Option<Json<Vec<String>>>,
}

/// The columns of [`Tool`].
const COLUMNS: &str = "id, spec, created_at, updated_at, probe_status, last_probed_at, \
                       probe_error, discovered_tools";

/// What a probe found, as [`record_probe`] stores it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Probed {
    /// The server answered `initialize` and `tools/list`, listing these tools.
    Healthy(Vec<String>),
    /// It did not, for this reason.
    Unhealthy(String),
}

/// The name of the unique index that refuses a second tool of a name in a tenant.
pub const NAME_INDEX: &str = "tools_tenant_name_idx";

/// Stores a new tool for the tenant (a taken name is a unique violation of [`NAME_INDEX`]).
pub async fn insert(
    executor: impl PgExecutor<'_>,
    id: ToolId,
    tenant_id: &str,
    spec: &ToolResource,
) -> sqlx::Result<Tool> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "INSERT INTO tools (id, tenant_id, name, spec, probe_status)
         VALUES ($1, $2, $3, $4, $5)
         RETURNING {COLUMNS}"
    )))
    .bind(id)
    .bind(tenant_id)
    .bind(spec.tool.name())
    .bind(Json(spec))
    .bind(spec.tool.as_mcp().map(|_| "pending"))
    .fetch_one(executor)
    .await
}

/// Replaces a tool; `None` if the tenant has no such tool. An MCP server is `pending` again
/// (to be probed); another kind has no probe state.
pub async fn update(
    executor: impl PgExecutor<'_>,
    id: ToolId,
    tenant_id: &str,
    spec: &ToolResource,
) -> sqlx::Result<Option<Tool>> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "UPDATE tools SET name = $3, spec = $4, updated_at = clock_timestamp(),
                probe_status = $5,
                last_probed_at = CASE WHEN $5 IS NULL THEN NULL ELSE last_probed_at END,
                probe_error = CASE WHEN $5 IS NULL THEN NULL ELSE probe_error END,
                discovered_tools = CASE WHEN $5 IS NULL THEN NULL ELSE discovered_tools END
          WHERE id = $1 AND tenant_id = $2 RETURNING {COLUMNS}"
    )))
    .bind(id)
    .bind(tenant_id)
    .bind(spec.tool.name())
    .bind(Json(spec))
    .bind(spec.tool.as_mcp().map(|_| "pending"))
    .fetch_optional(executor)
    .await
}

/// Stores a probe's result on the tool, if it is still the version probed (`updated_at` as
/// it was when the probe began): the tool as it now is, or `None` if it changed (or is gone)
/// meanwhile, in which case the newer version's own probe tells.
pub async fn record_probe(
    executor: impl PgExecutor<'_>,
    id: ToolId,
    tenant_id: &str,
    version: DateTime<Utc>,
    probed: &Probed,
) -> sqlx::Result<Option<Tool>> {
    let (status, error, tools) = match probed {
        Probed::Healthy(tools) => ("healthy", None, Some(Json(tools))),
        Probed::Unhealthy(error) => ("unhealthy", Some(error.as_str()), None),
    };
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "UPDATE tools SET probe_status = $4, last_probed_at = now(), probe_error = $5,
                discovered_tools = COALESCE($6, discovered_tools)
          WHERE id = $1 AND tenant_id = $2 AND updated_at = $3 AND probe_status IS NOT NULL
          RETURNING {COLUMNS}"
    )))
    .bind(id)
    .bind(tenant_id)
    .bind(version)
    .bind(status)
    .bind(error)
    .bind(tools)
    .fetch_optional(executor)
    .await
}

/// The tenant's tool, if it exists.
pub async fn find(
    executor: impl PgExecutor<'_>,
    id: ToolId,
    tenant_id: &str,
) -> sqlx::Result<Option<Tool>> {
    select(executor, id, tenant_id, "").await
}

/// The tenant's tool, its row locked until the transaction ends (`FOR UPDATE`): what a change
/// or a delete reads first.
pub async fn lock(
    executor: impl PgExecutor<'_>,
    id: ToolId,
    tenant_id: &str,
) -> sqlx::Result<Option<Tool>> {
    select(executor, id, tenant_id, " FOR UPDATE").await
}

/// The tenant's tool by its primary key, read with `locking` (`""` or a locking clause).
async fn select(
    executor: impl PgExecutor<'_>,
    id: ToolId,
    tenant_id: &str,
    locking: &'static str,
) -> sqlx::Result<Option<Tool>> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM tools WHERE id = $1 AND tenant_id = $2{locking}"
    )))
    .bind(id)
    .bind(tenant_id)
    .fetch_optional(executor)
    .await
}

/// The tenant's tools among `ids` (others' and unknown ids left out), by primary key.
pub async fn find_many(
    executor: impl PgExecutor<'_>,
    ids: &[ToolId],
    tenant_id: &str,
) -> sqlx::Result<Vec<(ToolId, ToolResource)>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let rows: Vec<(ToolId, Json<ToolResource>)> =
        sqlx::query_as("SELECT id, spec FROM tools WHERE id = ANY($1) AND tenant_id = $2")
            .bind(ids)
            .bind(tenant_id)
            .fetch_all(executor)
            .await?;
    Ok(rows.into_iter().map(|(id, spec)| (id, spec.0)).collect())
}

/// Like [`find_many`], each row locked `FOR SHARE` until the transaction ends: a save of an
/// agent that references them, so none is deleted before it commits.
pub async fn lock_referenced(
    executor: impl PgExecutor<'_>,
    ids: &[ToolId],
    tenant_id: &str,
) -> sqlx::Result<Vec<(ToolId, ToolResource)>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let rows: Vec<(ToolId, Json<ToolResource>)> = sqlx::query_as(
        "SELECT id, spec FROM tools WHERE id = ANY($1) AND tenant_id = $2 ORDER BY id FOR SHARE",
    )
    .bind(ids)
    .bind(tenant_id)
    .fetch_all(executor)
    .await?;
    Ok(rows.into_iter().map(|(id, spec)| (id, spec.0)).collect())
}

/// A page of the tenant's tools, newest first.
pub async fn list(
    executor: impl PgExecutor<'_>,
    tenant_id: &str,
    after: Option<Cursor>,
    limit: i64,
) -> sqlx::Result<Page<Tool>> {
    let mut query = sqlx::QueryBuilder::new(
        "SELECT t.id, t.spec, t.created_at, t.updated_at, t.probe_status, t.last_probed_at,
                t.probe_error, t.discovered_tools
           FROM tools t WHERE t.tenant_id = ",
    );
    query.push_bind(tenant_id.to_owned());
    page::push_after(&mut query, "t", after);
    page::push_order(&mut query, "t", limit);
    let rows: Vec<Tool> = query.build_query_as().fetch_all(executor).await?;
    Ok(page::page(rows, limit, |t| (t.created_at, t.id.0)))
}

/// Deletes the tenant's tool; `false` if there was none.
pub async fn delete(
    executor: impl PgExecutor<'_>,
    id: ToolId,
    tenant_id: &str,
) -> sqlx::Result<bool> {
    let result = sqlx::query("DELETE FROM tools WHERE id = $1 AND tenant_id = $2")
        .bind(id)
        .bind(tenant_id)
        .execute(executor)
        .await?;
    Ok(result.rows_affected() == 1)
}

/// The tenant's agents that reference the tool (at most [`MAX_REFERENCING`], oldest first),
/// with their specs: by `tool_ids`, or as one of a graph's MCP servers (each found through its
/// GIN index, `agents_tool_ids_idx` and `agents_graph_mcp_servers_idx`).
pub async fn referencing_agents(
    executor: impl PgExecutor<'_>,
    id: ToolId,
    tenant_id: &str,
) -> sqlx::Result<Vec<(AgentId, AgentSpec)>> {
    let rows: Vec<(AgentId, Json<AgentSpec>)> = sqlx::query_as(
        "SELECT id, spec FROM agents
          WHERE tenant_id = $1
            AND (spec -> 'tool_ids' @> $2
                 OR spec -> 'graph_spec' -> 'tools' -> 'mcp_servers' @> $4)
          ORDER BY created_at, id LIMIT $3",
    )
    .bind(tenant_id)
    .bind(Json(serde_json::json!([{"tool_id": id}])))
    .bind(MAX_REFERENCING)
    .bind(Json(serde_json::json!([id])))
    .fetch_all(executor)
    .await?;
    Ok(rows.into_iter().map(|(id, spec)| (id, spec.0)).collect())
}

/// `spec` as a run of it executes: its referenced tools read and resolved into `tools`
/// ([`AgentSpec::resolve_tools`]). What every enqueue snapshots.
pub async fn resolve(
    executor: impl PgExecutor<'_>,
    tenant_id: &str,
    spec: AgentSpec,
) -> sqlx::Result<AgentSpec> {
    if spec.tool_ids.is_empty() && spec.graph_spec.is_none() {
        return Ok(spec);
    }
    let mut ids: Vec<ToolId> = spec.tool_ids.iter().map(|r| r.tool_id).collect();
    if let Some(graph) = &spec.graph_spec {
        ids.extend(&graph.tools.mcp_servers);
    }
    let resolved = find_many(executor, &ids, tenant_id).await?;
    Ok(spec.resolve_tools(&resolved))
}
