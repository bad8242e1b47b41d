//! Threads: conversations owned by one user of one tenant.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::types::Json;
use sqlx::{PgConnection, PgExecutor};

use crate::db::page::{self, Cursor, Page, Scope};
use crate::ids::{AgentId, ThreadId, WorkflowId};

/// Who is asking: every read and write is scoped to this pair (invariant 9).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
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
    /// Its title (`None` until set).
    pub title: Option<String>,
    /// When its last user message was sent.
    pub last_message_at: Option<DateTime<Utc>>,
    /// The run in an active status (queued, running or paused), if any.
    pub active_workflow_id: Option<WorkflowId>,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
}

/// The columns of [`Thread`], from `threads t`.
macro_rules! columns {
    () => {
        "t.id, t.agent_id, t.metadata, t.title, t.last_message_at, t.created_at, t.updated_at,
         (SELECT r.id FROM runs r
           WHERE r.thread_id = t.id AND r.parent_workflow_id IS NULL
             AND r.status IN ('queued', 'running', 'requires_action', 'awaiting_approval',
                              'waiting')
         ) AS active_workflow_id"
    };
}

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
         RETURNING id, agent_id, metadata, title, last_message_at, created_at, updated_at,
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

/// Ensures the thread exists and records the new message's time: creates it for the owner
/// (answered by `agent_id`) if the id is unused. Returns `None` if it belongs to someone else or
/// was erased, or the thread's agent.
///
/// One statement: the upsert either inserts the row or locks the existing one and updates it
/// only if it is the owner's and not erased. `ON CONFLICT DO UPDATE` sees the latest committed
/// row, so a client racing itself onto a new thread gets the busy rule's 409, not a 404, and a
/// message racing the thread's erasure waits for it and is refused.
pub async fn ensure_owned(
    conn: &mut PgConnection,
    id: ThreadId,
    owner: &Owner,
    agent_id: Option<AgentId>,
) -> sqlx::Result<Option<Option<AgentId>>> {
    let row: Option<(Option<AgentId>,)> = sqlx::query_as(
        "INSERT INTO threads AS t (id, tenant_id, owner_id, agent_id, last_message_at)
         VALUES ($1, $2, $3, $4, now())
         ON CONFLICT (id) DO UPDATE SET last_message_at = now()
          WHERE t.tenant_id = $2 AND t.owner_id = $3 AND t.erased_at IS NULL
         RETURNING t.agent_id",
    )
    .bind(id)
    .bind(&owner.tenant_id)
    .bind(&owner.user_id)
    .bind(agent_id)
    .fetch_optional(conn)
    .await?;
    Ok(row.map(|(agent,)| agent))
}

/// What a thread id is to an owner about to post to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadFor {
    /// The owner's thread, answered by this agent (`None`: the default).
    Owned(Option<AgentId>),
    /// No thread has the id: a message makes it.
    New,
    /// Someone else's thread, or an erased one.
    Other,
}

/// What thread `id` is to `owner` (see [`ThreadFor`]).
pub async fn agent_for(
    executor: impl PgExecutor<'_>,
    id: ThreadId,
    owner: &Owner,
) -> sqlx::Result<ThreadFor> {
    let row: Option<(bool, Option<AgentId>)> = sqlx::query_as(
        "SELECT tenant_id = $2 AND owner_id = $3 AND erased_at IS NULL, agent_id
           FROM threads WHERE id = $1",
    )
    .bind(id)
    .bind(&owner.tenant_id)
    .bind(&owner.user_id)
    .fetch_optional(executor)
    .await?;
    Ok(match row {
        None => ThreadFor::New,
        Some((true, agent_id)) => ThreadFor::Owned(agent_id),
        Some((false, _)) => ThreadFor::Other,
    })
}

/// The thread in `scope` (the owner's, or for an admin the tenant's), or `None` if it does not
/// exist, is someone else's or was erased.
pub async fn find(
    executor: impl PgExecutor<'_>,
    id: ThreadId,
    scope: Scope<'_>,
) -> sqlx::Result<Option<Thread>> {
    let mut query = sqlx::QueryBuilder::new(concat!(
        "SELECT ",
        columns!(),
        " FROM threads t WHERE t.erased_at IS NULL AND t.id = "
    ));
    query.push_bind(id);
    scope.push(&mut query, "t");
    query.build_query_as().fetch_optional(executor).await
}

/// Filters of a thread list.
#[derive(Clone, Debug, Default)]
pub struct ThreadFilter {
    /// `Some(true)`: only threads with an active run; `Some(false)`: only those without.
    pub busy: Option<bool>,
    /// Only threads answered by this agent.
    pub agent_id: Option<AgentId>,
    /// Only threads whose metadata has each key with this value (compared as text).
    pub metadata: Vec<(String, String)>,
}

/// A page of the threads in `scope`, newest first.
pub async fn list(
    executor: impl PgExecutor<'_>,
    scope: Scope<'_>,
    filter: &ThreadFilter,
    after: Option<Cursor>,
    limit: i64,
) -> sqlx::Result<Page<Thread>> {
    let mut query = sqlx::QueryBuilder::new("");
    push_list(&mut query, scope, filter, after, limit);
    let rows: Vec<Thread> = query.build_query_as().fetch_all(executor).await?;
    Ok(page::page(rows, limit, |t| (t.created_at, t.id.0)))
}

/// Appends [`list`]'s statement to `query` (public so a test can `EXPLAIN` exactly what the
/// list runs: `tests/tests/e2e/growth.rs`).
pub fn push_list(
    query: &mut sqlx::QueryBuilder<sqlx::Postgres>,
    scope: Scope<'_>,
    filter: &ThreadFilter,
    after: Option<Cursor>,
    limit: i64,
) {
    query.push(concat!(
        "SELECT * FROM (SELECT ",
        columns!(),
        " FROM threads t WHERE t.erased_at IS NULL"
    ));
    scope.push(query, "t");
    if let Some(agent_id) = filter.agent_id {
        query.push(" AND t.agent_id = ");
        query.push_bind(agent_id);
    }
    for (key, value) in &filter.metadata {
        // Containment first, which the GIN index `threads_metadata_idx` answers, then the
        // exact test ("compared as text", so `5` also matches a stored number 5).
        query.push(" AND t.metadata @> ANY(");
        query.push_bind(containing(key, value));
        query.push("::text[]::jsonb[]) AND t.metadata ->> ");
        query.push_bind(key.clone());
        query.push(" = ");
        query.push_bind(value.clone());
    }
    page::push_after(query, "t", after);
    match filter.busy {
        // The status filter reads each row's active run, so it wraps the scan instead of
        // limiting it: the limit applies after it.
        Some(busy) => {
            query.push(") t WHERE (t.active_workflow_id IS NOT NULL) = ");
            query.push_bind(busy);
            page::push_order(query, "t", limit);
        }
        None => {
            page::push_order(query, "t", limit);
            query.push(") t");
        }
    }
}

/// The objects whose containment in a thread's metadata is necessary for `metadata ->> key =
/// value`, as JSON text (Postgres parses them, numbers exactly): `{key: "value"}`, and when
/// `value` is itself JSON other than a string (`5`, `true`, `{"a": 1}`), `{key: value}`. The
/// text of a stored value equals `value` only if the value is one of those two (a JSON text
/// parses back to the value it is the text of), so the list misses nothing.
fn containing(key: &str, value: &str) -> Vec<String> {
    let key = Value::from(key);
    let mut objects = vec![format!("{{{key}: {}}}", Value::from(value))];
    // Postgres refuses a NUL in jsonb, which serde_json accepts; no stored value holds one.
    match serde_json::from_str::<Value>(value) {
        Ok(parsed) if !parsed.is_string() && !holds_nul(&parsed) => {
            objects.push(format!("{{{key}: {value}}}"));
        }
        _ => {}
    }
    objects
}

fn holds_nul(value: &Value) -> bool {
    match value {
        Value::String(text) => text.contains('\0'),
        Value::Array(items) => items.iter().any(holds_nul),
        Value::Object(fields) => fields.iter().any(|(k, v)| k.contains('\0') || holds_nul(v)),
        _ => false,
    }
}

/// What a PATCH changes.
#[derive(Clone, Debug, Default)]
pub struct ThreadPatch {
    /// `Some(None)` clears the title.
    pub title: Option<Option<String>>,
    /// Merged into the metadata: a `null` value removes its key.
    pub metadata: Option<serde_json::Map<String, Value>>,
}

/// Applies `patch` to the thread in `scope`; `None` if there is no such thread.
pub async fn update(
    executor: impl PgExecutor<'_>,
    id: ThreadId,
    scope: Scope<'_>,
    patch: &ThreadPatch,
) -> sqlx::Result<Option<Thread>> {
    let (set, remove): (serde_json::Map<_, _>, Vec<_>) = match &patch.metadata {
        Some(metadata) => {
            let set = metadata
                .iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let remove = metadata
                .iter()
                .filter(|(_, v)| v.is_null())
                .map(|(k, _)| k.clone())
                .collect();
            (set, remove)
        }
        None => Default::default(),
    };
    let mut query = sqlx::QueryBuilder::new("WITH t AS (UPDATE threads t SET updated_at = now()");
    if let Some(title) = &patch.title {
        query.push(", title = ");
        query.push_bind(title.clone());
    }
    if patch.metadata.is_some() {
        query.push(", metadata = (t.metadata - ");
        query.push_bind(remove);
        query.push("::text[]) || ");
        query.push_bind(Json(Value::Object(set)));
    }
    query.push(" WHERE t.id = ");
    query.push_bind(id);
    query.push(" AND t.erased_at IS NULL");
    scope.push(&mut query, "t");
    query.push(concat!(" RETURNING t.*) SELECT ", columns!(), " FROM t"));
    query.build_query_as().fetch_optional(executor).await
}

/// What erasing a thread found: the runs it deletes, and those whose worker may still publish
/// (its stream's fence must refuse them).
#[derive(Clone, Debug)]
pub struct Erasing {
    /// Every run of the thread.
    pub runs: Vec<WorkflowId>,
    /// The active run and the runs that ended in the last minute: a worker publishes a run's
    /// last events (for up to its flush window) after writing its end to Postgres.
    pub publishing: Vec<WorkflowId>,
    /// The active runs admitted under quotas, with their tenant and counters: erasing them
    /// gives their room back ([`crate::quota::admission::Admission::release`]).
    pub admitted: Vec<(WorkflowId, String, crate::quota::RunQuota)>,
}

/// The longest an erasure's statement waits for one lock (`SET LOCAL lock_timeout`): a worker's
/// write to the thread's active run, or the heartbeat that renews it, holds the run's row for
/// a moment; longer than this, the erasure gives up (nothing erased) and the client retries.
pub const ERASURE_LOCK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// The longest one of an erasure's statements runs (`SET LOCAL statement_timeout`): it deletes
/// one thread's rows, by index, so this is far more than a thread of thousands of messages
/// needs; past it the erasure gives up rather than hold the thread's locks longer.
pub const ERASURE_STATEMENT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// Locks the thread in `scope` for erasure (in the caller's transaction, which it bounds by
/// [`ERASURE_LOCK_TIMEOUT`] and [`ERASURE_STATEMENT_TIMEOUT`]): a message racing the erasure
/// waits for it and is then refused. `None` if there is no such thread. A timeout is an error
/// that [`crate::db::is_timeout`] recognises: the transaction must be rolled back and the
/// erasure tried again.
///
/// The erasure holds the row of the thread's active run locked until it commits. The lease
/// renewal of the worker that holds the run skips a locked row rather than wait for it
/// ([`crate::db::runs::heartbeat`]), so the erasure never holds up the renewal of the other
/// runs that worker holds, other tenants' included.
pub async fn lock_for_erasure(
    conn: &mut PgConnection,
    id: ThreadId,
    scope: Scope<'_>,
) -> sqlx::Result<Option<Erasing>> {
    sqlx::query(
        "SELECT set_config('lock_timeout', $1, true), set_config('statement_timeout', $2, true)",
    )
    .bind(format!("{}ms", ERASURE_LOCK_TIMEOUT.as_millis()))
    .bind(format!("{}ms", ERASURE_STATEMENT_TIMEOUT.as_millis()))
    .execute(&mut *conn)
    .await?;
    let mut query = sqlx::QueryBuilder::new("SELECT t.id FROM threads t WHERE t.id = ");
    query.push_bind(id);
    query.push(" AND t.erased_at IS NULL");
    scope.push(&mut query, "t");
    query.push(" FOR UPDATE");
    let found: Option<(ThreadId,)> = query.build_query_as().fetch_optional(&mut *conn).await?;
    if found.is_none() {
        return Ok(None);
    }
    // The runs are locked too: a status change in flight (whose trigger writes a webhook
    // delivery) commits before the erasure reads and deletes, so nothing it wrote survives.
    // Children before parents, as the end of a child locks them (its row, then its parent's,
    // to re-queue it): the two never wait for each other in a circle.
    type Admitted = Option<sqlx::types::Json<crate::quota::RunQuota>>;
    let runs: Vec<(WorkflowId, bool, String, Admitted)> = sqlx::query_as(
        "SELECT id, finished_at IS NULL OR finished_at > now() - interval '1 minute',
                tenant_id, CASE WHEN finished_at IS NULL THEN quota END
           FROM runs WHERE thread_id = $1 ORDER BY depth DESC, id FOR UPDATE",
    )
    .bind(id)
    .fetch_all(conn)
    .await?;
    Ok(Some(Erasing {
        publishing: runs.iter().filter(|r| r.1).map(|r| r.0).collect(),
        admitted: runs
            .iter()
            .filter_map(|(id, _, tenant, quota)| Some((*id, tenant.clone(), quota.clone()?.0)))
            .collect(),
        runs: runs.into_iter().map(|r| r.0).collect(),
    }))
}

/// Erases a thread locked by [`lock_for_erasure`]: its idempotency keys, webhook deliveries,
/// runs (with their steps), messages, summaries and Chat Completions conversation hashes are
/// deleted; the row keeps only its id and
/// `erased_at`, so the id can never be used again.
pub async fn erase(conn: &mut PgConnection, id: ThreadId) -> sqlx::Result<()> {
    sqlx::query(
        "WITH r AS (SELECT id FROM runs WHERE thread_id = $1),
              k AS (DELETE FROM idempotency_keys WHERE workflow_id IN (SELECT id FROM r))
         DELETE FROM runs WHERE thread_id = $1",
    )
    .bind(id)
    .execute(&mut *conn)
    .await?;
    sqlx::query("DELETE FROM webhook_deliveries WHERE thread_id = $1")
        .bind(id)
        .execute(&mut *conn)
        .await?;
    sqlx::query("DELETE FROM messages WHERE thread_id = $1")
        .bind(id)
        .execute(&mut *conn)
        .await?;
    sqlx::query("DELETE FROM thread_summaries WHERE thread_id = $1")
        .bind(id)
        .execute(&mut *conn)
        .await?;
    // The hashes of its Chat Completions conversations (derived from the erased words).
    sqlx::query("DELETE FROM chat_histories WHERE thread_id = $1")
        .bind(id)
        .execute(&mut *conn)
        .await?;
    sqlx::query(
        "UPDATE threads
            SET tenant_id = '', owner_id = '', agent_id = NULL, metadata = '{}', title = NULL,
                last_message_at = NULL, erased_at = now(), updated_at = now()
          WHERE id = $1",
    )
    .bind(id)
    .execute(conn)
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metadata_filter_contains_the_value_as_text_and_as_the_json_it_spells() {
        assert_eq!(containing("topic", "even"), [r#"{"topic": "even"}"#]);
        assert_eq!(containing("n", "3"), [r#"{"n": "3"}"#, r#"{"n": 3}"#]);
        assert_eq!(
            containing("k\"", r#"{"a": [1, true]}"#),
            [
                r#"{"k\"": "{\"a\": [1, true]}"}"#,
                r#"{"k\"": {"a": [1, true]}}"#
            ]
        );
        // A NUL no stored value can hold: only the text form, which Postgres parses.
        assert_eq!(containing("k", r#""\u0000""#).len(), 1);
        assert_eq!(containing("k", r#"["\u0000"]"#).len(), 1);
    }
}
