//! Stored agent configurations, per tenant.

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;
use sqlx::types::Json;

use crate::agent::AgentSpec;
use crate::ids::AgentId;

/// A stored agent.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct Agent {
    /// Its id.
    pub id: AgentId,
    /// Its configuration.
    pub spec: Json<AgentSpec>,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
}

/// Stores a new agent for the tenant.
pub async fn insert(
    executor: impl PgExecutor<'_>,
    id: AgentId,
    tenant_id: &str,
    spec: &AgentSpec,
) -> sqlx::Result<Agent> {
    sqlx::query_as(
        "INSERT INTO agents (id, tenant_id, name, spec) VALUES ($1, $2, $3, $4)
         RETURNING id, spec, created_at, updated_at",
    )
    .bind(id)
    .bind(tenant_id)
    .bind(&spec.name)
    .bind(Json(spec))
    .fetch_one(executor)
    .await
}

/// Replaces an agent's configuration; `None` if the tenant has no such agent.
pub async fn update(
    executor: impl PgExecutor<'_>,
    id: AgentId,
    tenant_id: &str,
    spec: &AgentSpec,
) -> sqlx::Result<Option<Agent>> {
    sqlx::query_as(
        "UPDATE agents SET name = $3, spec = $4, updated_at = now()
          WHERE id = $1 AND tenant_id = $2
      RETURNING id, spec, created_at, updated_at",
    )
    .bind(id)
    .bind(tenant_id)
    .bind(&spec.name)
    .bind(Json(spec))
    .fetch_optional(executor)
    .await
}

/// The tenant's agent, if it exists.
pub async fn find(
    executor: impl PgExecutor<'_>,
    id: AgentId,
    tenant_id: &str,
) -> sqlx::Result<Option<Agent>> {
    sqlx::query_as(
        "SELECT id, spec, created_at, updated_at FROM agents WHERE id = $1 AND tenant_id = $2",
    )
    .bind(id)
    .bind(tenant_id)
    .fetch_optional(executor)
    .await
}

/// A public agent's row: its tenant, then [`Agent`]'s columns.
type PublicRow = (
    String,
    AgentId,
    Json<AgentSpec>,
    DateTime<Utc>,
    DateTime<Utc>,
);

/// A public agent (`visibility: "public"`) of any tenant, with its tenant: what an anonymous
/// caller may open a session with. By primary key.
pub async fn find_public(
    executor: impl PgExecutor<'_>,
    id: AgentId,
) -> sqlx::Result<Option<(String, Agent)>> {
    let row: Option<PublicRow> = sqlx::query_as(
        "SELECT tenant_id, id, spec, created_at, updated_at FROM agents
              WHERE id = $1 AND spec->>'visibility' = 'public'",
    )
    .bind(id)
    .fetch_optional(executor)
    .await?;
    Ok(row.map(|(tenant, id, spec, created_at, updated_at)| {
        (
            tenant,
            Agent {
                id,
                spec,
                created_at,
                updated_at,
            },
        )
    }))
}

/// Whether any public agent lists `origin` among its `cors_origins` (the partial GIN index
/// `agents_public_cors_origins`).
pub async fn origin_listed(executor: impl PgExecutor<'_>, origin: &str) -> sqlx::Result<bool> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM agents
          WHERE spec -> 'cors_origins' ? $1 AND spec ->> 'visibility' = 'public')",
    )
    .bind(origin)
    .fetch_one(executor)
    .await
}

/// The tenant's agents, oldest first.
pub async fn list(executor: impl PgExecutor<'_>, tenant_id: &str) -> sqlx::Result<Vec<Agent>> {
    sqlx::query_as(
        "SELECT id, spec, created_at, updated_at FROM agents WHERE tenant_id = $1
          ORDER BY created_at, id",
    )
    .bind(tenant_id)
    .fetch_all(executor)
    .await
}

/// The ids of the tenant's agents named `name`, oldest first.
pub async fn find_by_name(
    executor: impl PgExecutor<'_>,
    tenant_id: &str,
    name: &str,
) -> sqlx::Result<Vec<AgentId>> {
    sqlx::query_scalar(
        "SELECT id FROM agents WHERE tenant_id = $1 AND name = $2 ORDER BY created_at, id LIMIT 2",
    )
    .bind(tenant_id)
    .bind(name)
    .fetch_all(executor)
    .await
}

/// Deletes the tenant's agent; `false` if there was none.
pub async fn delete(
    executor: impl PgExecutor<'_>,
    id: AgentId,
    tenant_id: &str,
) -> sqlx::Result<bool> {
    let result = sqlx::query("DELETE FROM agents WHERE id = $1 AND tenant_id = $2")
        .bind(id)
        .bind(tenant_id)
        .execute(executor)
        .await?;
    Ok(result.rows_affected() == 1)
}

/// Whether the tenant has an agent with this id.
pub async fn exists(
    executor: impl PgExecutor<'_>,
    id: AgentId,
    tenant_id: &str,
) -> sqlx::Result<bool> {
    let (exists,): (bool,) =
        sqlx::query_as("SELECT EXISTS (SELECT 1 FROM agents WHERE id = $1 AND tenant_id = $2)")
            .bind(id)
            .bind(tenant_id)
            .fetch_one(executor)
            .await?;
    Ok(exists)
}
