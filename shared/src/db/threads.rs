//! Threads: conversations owned by one user of one tenant.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::types::Json;
use sqlx::{PgConnection, PgExecutor};

use crate::ids::{AgentId, ThreadId, WorkflowId};

/// Who is asking: every read and write is scoped to this pair (invariant 9).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    /// The tenant (the `tenant` claim).
    pub tenant_id: String,
    /// The user within the tenant (the `sub` claim).
    pub user_id: String,
}

/// A thread as stored, with its active run if any.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct Thread {
    /// The thread's id.
    pub id: ThreadId,
    /// The agent that answers; `None` is the configured default.
    pub agent_id: Option<AgentId>,
    /// Caller-defined metadata.
    pub metadata: Json<Value>,
    /// The run in an active status (queued, running or paused), if any.
    pub active_workflow_id: Option<WorkflowId>,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
}

const SELECT_THREAD: &str = "
    SELECT t.id, t.agent_id, t.metadata, t.created_at, t.updated_at,
           (SELECT r.id FROM runs r
             WHERE r.thread_id = t.id
               AND r.status IN ('queued', 'running', 'requires_action', 'awaiting_approval')
           ) AS active_workflow_id
      FROM threads t
     WHERE t.id = $1 AND t.tenant_id = $2 AND t.owner_id = $3";

/// Creates a thread for the owner, or returns `None` if the id is taken (by anyone: the caller
/// must not learn by whom).
pub async fn create(
    executor: impl PgExecutor<'_>,
    id: ThreadId,
    owner: &Owner,
    agent_id: Option<AgentId>,
    metadata: &Value,
) -> sqlx::Result<Option<Thread>> {
    sqlx::query_as(
        "INSERT INTO threads (id, tenant_id, owner_id, agent_id, metadata)
         VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (id) DO NOTHING
         RETURNING id, agent_id, metadata, created_at, updated_at,
                   NULL::uuid AS active_workflow_id",
    )
    .bind(id)
    .bind(&owner.tenant_id)
    .bind(&owner.user_id)
    .bind(agent_id)
    .bind(Json(metadata))
    .fetch_optional(executor)
    .await
}

/// Ensures the thread exists: creates it for the owner (answered by `agent_id`) if the id is
/// unused. Returns `None` if it belongs to someone else, or the thread's agent.
///
/// When another transaction inserts the same new id first, the insert waits for it and then
/// does nothing, and the statement's own snapshot, taken before that commit, cannot see the
/// row. A second statement (a new snapshot under READ COMMITTED) reads it, so a client racing
/// itself onto a new thread gets the busy rule's 409, not a 404.
pub async fn ensure_owned(
    conn: &mut PgConnection,
    id: ThreadId,
    owner: &Owner,
    agent_id: Option<AgentId>,
) -> sqlx::Result<Option<Option<AgentId>>> {
    let row: Option<(Option<AgentId>,)> = sqlx::query_as(
        "WITH ins AS (
             INSERT INTO threads (id, tenant_id, owner_id, agent_id) VALUES ($1, $2, $3, $4)
             ON CONFLICT (id) DO NOTHING
             RETURNING agent_id)
         SELECT agent_id FROM ins
          UNION ALL
         SELECT agent_id FROM threads WHERE id = $1 AND tenant_id = $2 AND owner_id = $3
          LIMIT 1",
    )
    .bind(id)
    .bind(&owner.tenant_id)
    .bind(&owner.user_id)
    .bind(agent_id)
    .fetch_optional(&mut *conn)
    .await?;
    if let Some((agent,)) = row {
        return Ok(Some(agent));
    }
    let row: Option<(Option<AgentId>,)> = sqlx::query_as(
        "SELECT agent_id FROM threads WHERE id = $1 AND tenant_id = $2 AND owner_id = $3",
    )
    .bind(id)
    .bind(&owner.tenant_id)
    .bind(&owner.user_id)
    .fetch_optional(conn)
    .await?;
    Ok(row.map(|(agent,)| agent))
}

/// The owner's thread, or `None` if it does not exist or is someone else's.
pub async fn find(
    executor: impl PgExecutor<'_>,
    id: ThreadId,
    owner: &Owner,
) -> sqlx::Result<Option<Thread>> {
    sqlx::query_as(SELECT_THREAD)
        .bind(id)
        .bind(&owner.tenant_id)
        .bind(&owner.user_id)
        .fetch_optional(executor)
        .await
}
