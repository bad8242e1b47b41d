//! The conversations Chat Completions requests were sent, by hash, and the thread each one
//! ran on: a request that resends one of them (plus the answer and a new message) continues
//! that thread (`api/src/openai/history.rs`).

use sqlx::PgExecutor;

use crate::db::threads::Owner;
use crate::ids::ThreadId;

/// The thread the caller's conversation of hash `hash` ran on, if one did: one probe of the
/// primary key.
pub async fn find(
    executor: impl PgExecutor<'_>,
    owner: &Owner,
    hash: &str,
) -> sqlx::Result<Option<ThreadId>> {
    sqlx::query_scalar(
        "SELECT thread_id FROM chat_histories
          WHERE tenant_id = $1 AND owner_id = $2 AND history_hash = $3",
    )
    .bind(&owner.tenant_id)
    .bind(&owner.user_id)
    .bind(hash)
    .fetch_optional(executor)
    .await
}

/// Records that the caller's conversation of hash `hash` runs on `thread_id` (the newest
/// wins: the same words sent again start over from there).
pub async fn record(
    executor: impl PgExecutor<'_>,
    owner: &Owner,
    hash: &str,
    thread_id: ThreadId,
) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO chat_histories (tenant_id, owner_id, history_hash, thread_id)
         VALUES ($1, $2, $3, $4)
         ON CONFLICT (tenant_id, owner_id, history_hash)
         DO UPDATE SET thread_id = EXCLUDED.thread_id, created_at = now()",
    )
    .bind(&owner.tenant_id)
    .bind(&owner.user_id)
    .bind(hash)
    .bind(thread_id)
    .execute(executor)
    .await?;
    Ok(())
}

/// The text of the thread's last answer (its last top-level assistant message), if it has one.
pub async fn last_answer(
    executor: impl PgExecutor<'_>,
    thread_id: ThreadId,
) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar(
        "SELECT content FROM messages
          WHERE thread_id = $1 AND role = 'assistant' AND depth = 0
          ORDER BY seq DESC LIMIT 1",
    )
    .bind(thread_id)
    .fetch_optional(executor)
    .await
}
