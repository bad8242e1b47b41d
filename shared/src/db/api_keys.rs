//! API keys (DESIGN section 13): a tenant's long-lived bearer credentials for servers, stored
//! as the SHA-256 of the key (migration `20261128200100_create_api_keys.sql`).
//!
//! What must stay true:
//! - The key is generated here ([`generate`]), 32 random bytes from the system's generator, and
//!   is never stored: only [`hash`] of it is. A key has 256 bits of entropy, so a plain SHA-256
//!   is what to store (a slow password hash protects guessable secrets, not these).
//! - [`authenticate`] reads the row on every use, by the unique index on the hash: a key revoked
//!   by one API process is refused by every other from the moment the revocation commits.
//!   It also records `last_used_at`, at most once a minute per key, in the same statement.
//! - Every statement names the tenant or the hash, and reads an index.

use chrono::{DateTime, Utc};
use sha2::{Digest as _, Sha256};
use sqlx::PgExecutor;

use crate::db::page::{self, Cursor, Page};
use crate::ids::ApiKeyId;

/// What every key starts with, so it is told from a JWT at a glance (and by secret scanners).
pub const PREFIX: &str = "spk_";

/// A new key: [`PREFIX`] and 32 random bytes in unpadded base64url.
pub fn generate() -> anyhow::Result<String> {
    use base64::Engine as _;
    let mut bytes = [0_u8; 32];
    aws_lc_rs::rand::fill(&mut bytes)
        .map_err(|_| anyhow::anyhow!("the system's random generator failed"))?;
    Ok(format!(
        "{PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    ))
}

/// What is stored of a key: its SHA-256.
pub fn hash(key: &str) -> Vec<u8> {
    Sha256::digest(key.as_bytes()).to_vec()
}

/// A key as stored, without its hash.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct ApiKey {
    /// Its id.
    pub id: ApiKeyId,
    /// Its tenant.
    pub tenant_id: String,
    /// Its name, for people.
    pub name: String,
    /// The permission names it holds.
    pub permissions: Vec<String>,
    /// The user whose token created it.
    pub created_by: String,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it was last used (to the minute), if ever.
    pub last_used_at: Option<DateTime<Utc>>,
}

/// The columns of [`ApiKey`].
const COLUMNS: &str = "id, tenant_id, name, permissions, created_by, created_at, last_used_at";

/// Stores a key of `tenant_id` whose hash is `key_hash`.
pub async fn create(
    executor: impl PgExecutor<'_>,
    tenant_id: &str,
    name: &str,
    permissions: &[String],
    key_hash: &[u8],
    created_by: &str,
) -> sqlx::Result<ApiKey> {
    let sql = format!(
        "INSERT INTO api_keys (id, tenant_id, name, permissions, key_hash, created_by)
         VALUES ($1, $2, $3, $4, $5, $6)
         RETURNING {COLUMNS}"
    );
    sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(ApiKeyId::new())
        .bind(tenant_id)
        .bind(name)
        .bind(permissions)
        .bind(key_hash)
        .bind(created_by)
        .fetch_one(executor)
        .await
}

/// A page of the tenant's keys that are not revoked, newest first.
pub async fn list(
    executor: impl PgExecutor<'_>,
    tenant_id: &str,
    after: Option<Cursor>,
    limit: i64,
) -> sqlx::Result<Page<ApiKey>> {
    let mut query = sqlx::QueryBuilder::new(
        "SELECT k.id, k.tenant_id, k.name, k.permissions, k.created_by, k.created_at,
                k.last_used_at
           FROM api_keys k WHERE k.revoked_at IS NULL AND k.tenant_id = ",
    );
    query.push_bind(tenant_id.to_owned());
    page::push_after(&mut query, "k", after);
    page::push_order(&mut query, "k", limit);
    let rows: Vec<ApiKey> = query.build_query_as().fetch_all(executor).await?;
    Ok(page::page(rows, limit, |k| (k.created_at, k.id.0)))
}

/// Revokes the tenant's key; `false` if it has no such key, or it was revoked already.
pub async fn revoke(
    executor: impl PgExecutor<'_>,
    id: ApiKeyId,
    tenant_id: &str,
) -> sqlx::Result<bool> {
    let revoked = sqlx::query(
        "UPDATE api_keys SET revoked_at = now()
          WHERE id = $1 AND tenant_id = $2 AND revoked_at IS NULL",
    )
    .bind(id)
    .bind(tenant_id)
    .execute(executor)
    .await?;
    Ok(revoked.rows_affected() == 1)
}

/// What a presented key is.
#[derive(Clone, Debug)]
pub enum Presented {
    /// A live key.
    Valid(ApiKey),
    /// A key that was revoked.
    Revoked,
    /// No key has that hash.
    Unknown,
}

/// The key whose hash is `key_hash`, recording its use (at most once a minute).
pub async fn authenticate(
    executor: impl PgExecutor<'_>,
    key_hash: &[u8],
) -> sqlx::Result<Presented> {
    // The update is a data-modifying CTE: it runs whether or not the SELECT reads it, and it
    // touches the row only when a minute has passed, so a busy key is not a write per request.
    let sql = format!(
        "WITH found AS (
             SELECT {COLUMNS}, revoked_at FROM api_keys WHERE key_hash = $1
         ), touched AS (
             UPDATE api_keys k SET last_used_at = now()
               FROM found
              WHERE k.id = found.id AND found.revoked_at IS NULL
                AND (found.last_used_at IS NULL
                     OR found.last_used_at < now() - interval '1 minute')
         )
         SELECT {COLUMNS}, revoked_at IS NOT NULL AS revoked FROM found"
    );
    #[derive(sqlx::FromRow)]
    struct Row {
        #[sqlx(flatten)]
        key: ApiKey,
        revoked: bool,
    }
    let row: Option<Row> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(key_hash)
        .fetch_optional(executor)
        .await?;
    Ok(match row {
        None => Presented::Unknown,
        Some(row) if row.revoked => Presented::Revoked,
        Some(row) => Presented::Valid(row.key),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_prefixed_distinct_and_hashed_to_32_bytes() -> anyhow::Result<()> {
        let (a, b) = (generate()?, generate()?);
        assert!(a.starts_with(PREFIX), "{a}");
        assert_eq!(a.len(), PREFIX.len() + 43);
        assert_ne!(a, b);
        assert_eq!(hash(&a).len(), 32);
        assert_ne!(hash(&a), hash(&b));
        Ok(())
    }
}
