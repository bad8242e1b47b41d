//! Idempotency keys for `POST user_message`.
//!
//! The key row is inserted first in the enqueue transaction, so concurrent duplicates serialize
//! on its primary key: the first inserts and goes on; the others wait for it, find a live key,
//! roll back and replay its stored response. A key whose transaction rolled back (a 409, say)
//! leaves no trace, and a retry with it is free to succeed. Keys expire after a window
//! (`SPOOL_RETENTION_IDEMPOTENCY_HOURS`, 24 by default): every function takes it, so the API that
//! reads keys and the housekeeping that purges them agree.

use chrono::Duration;
use serde_json::Value;
use sha2::{Digest as _, Sha256};
use sqlx::PgExecutor;
use sqlx::types::Json;

use crate::ids::WorkflowId;

/// A key already in use.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct Stored {
    /// Hash of the request that used the key.
    pub request_hash: String,
    /// The HTTP status it answered.
    pub status_code: i32,
    /// The body it answered.
    pub response: Json<Value>,
}

/// The SHA-256 (hex) of the parts that make a request the same request.
pub fn request_hash(parts: &[&[u8]]) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part);
    }
    hex::encode(hasher.finalize())
}

/// Takes the key for this request, or returns `false` if a live row (younger than `window`)
/// holds it.
pub async fn reserve(
    executor: impl PgExecutor<'_>,
    tenant_id: &str,
    key: &str,
    request_hash: &str,
    window: Duration,
) -> sqlx::Result<bool> {
    let row: Option<(i32,)> = sqlx::query_as(
        "INSERT INTO idempotency_keys (tenant_id, key, request_hash, status_code, response)
         VALUES ($1, $2, $3, 0, 'null')
         ON CONFLICT (tenant_id, key) DO UPDATE
            SET request_hash = EXCLUDED.request_hash, status_code = 0, response = 'null',
                workflow_id = NULL, created_at = now()
          WHERE idempotency_keys.created_at < now() - $4::interval
      RETURNING 1",
    )
    .bind(tenant_id)
    .bind(key)
    .bind(request_hash)
    .bind(window)
    .fetch_optional(executor)
    .await?;
    Ok(row.is_some())
}

/// Records the response of the request that reserved the key.
pub async fn record(
    executor: impl PgExecutor<'_>,
    tenant_id: &str,
    key: &str,
    status_code: u16,
    response: &Value,
    workflow_id: WorkflowId,
) -> sqlx::Result<()> {
    sqlx::query(
        "UPDATE idempotency_keys SET status_code = $3, response = $4, workflow_id = $5
          WHERE tenant_id = $1 AND key = $2",
    )
    .bind(tenant_id)
    .bind(key)
    .bind(i32::from(status_code))
    .bind(Json(response))
    .bind(workflow_id)
    .execute(executor)
    .await?;
    Ok(())
}

/// The live row (younger than `window`) holding the key, if any.
pub async fn find(
    executor: impl PgExecutor<'_>,
    tenant_id: &str,
    key: &str,
    window: Duration,
) -> sqlx::Result<Option<Stored>> {
    sqlx::query_as(
        "SELECT request_hash, status_code, response FROM idempotency_keys
          WHERE tenant_id = $1 AND key = $2 AND created_at >= now() - $3::interval",
    )
    .bind(tenant_id)
    .bind(key)
    .bind(window)
    .fetch_optional(executor)
    .await
}

/// Deletes up to `limit` keys older than `window` (a batch keeps each statement short);
/// returns how many.
pub async fn purge_expired(
    executor: impl PgExecutor<'_>,
    window: Duration,
    limit: i64,
) -> sqlx::Result<u64> {
    let result = sqlx::query(
        "DELETE FROM idempotency_keys WHERE (tenant_id, key) IN (
             SELECT tenant_id, key FROM idempotency_keys
              WHERE created_at < now() - $2::interval
              ORDER BY created_at LIMIT $1 FOR UPDATE SKIP LOCKED)",
    )
    .bind(limit)
    .bind(window)
    .execute(executor)
    .await?;
    Ok(result.rows_affected())
}
