//! A tenant's knowledge bases (`/v1/knowledge_bases`): retrieval endpoints the built-in
//! `knowledge_search` tool asks at each call.
//!
//! What must stay true: every query is scoped to the tenant (another tenant's id reads as no
//! knowledge base), and a tenant holds at most [`MAX_PER_TENANT`], so a search asks a bounded
//! set.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;
use sqlx::types::Json;

use crate::db::page::{self, Cursor, Page};
use crate::ids::KnowledgeBaseId;

/// The most knowledge bases one tenant may have.
pub const MAX_PER_TENANT: i64 = 50;

/// The name of the unique index that refuses a second knowledge base of a name in a tenant.
pub const NAME_INDEX: &str = "knowledge_bases_tenant_name_idx";

/// A stored knowledge base.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct KnowledgeBase {
    /// Its id.
    pub id: KnowledgeBaseId,
    /// Its name, unique in the tenant.
    pub name: String,
    /// Its retrieval endpoint.
    pub url: String,
    /// Headers sent with every search (in clear: redact before showing).
    pub headers: Json<BTreeMap<String, String>>,
    /// When it was created.
    pub created_at: DateTime<Utc>,
}

const COLUMNS: &str = "id, name, url, headers, created_at";

/// Stores a new knowledge base; `None` if the tenant already has [`MAX_PER_TENANT`] (a taken
/// name is a unique violation of [`NAME_INDEX`]). The count and the insert are one statement,
/// so two creates that race cannot both pass the limit by more than the race.
pub async fn insert(
    executor: impl PgExecutor<'_>,
    id: KnowledgeBaseId,
    tenant_id: &str,
    name: &str,
    url: &str,
    headers: &BTreeMap<String, String>,
) -> sqlx::Result<Option<KnowledgeBase>> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "INSERT INTO knowledge_bases (id, tenant_id, name, url, headers)
         SELECT $1, $2, $3, $4, $5
          WHERE (SELECT count(*) FROM (SELECT 1 FROM knowledge_bases WHERE tenant_id = $2
                                        LIMIT $6) n) < $6
         RETURNING {COLUMNS}"
    )))
    .bind(id)
    .bind(tenant_id)
    .bind(name)
    .bind(url)
    .bind(Json(headers))
    .bind(MAX_PER_TENANT)
    .fetch_optional(executor)
    .await
}

/// The tenant's knowledge base, if it exists.
pub async fn find(
    executor: impl PgExecutor<'_>,
    id: KnowledgeBaseId,
    tenant_id: &str,
) -> sqlx::Result<Option<KnowledgeBase>> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM knowledge_bases WHERE id = $1 AND tenant_id = $2"
    )))
    .bind(id)
    .bind(tenant_id)
    .fetch_optional(executor)
    .await
}

/// Every knowledge base of the tenant (at most [`MAX_PER_TENANT`]), newest first; only the one
/// named `name` when given.
pub async fn for_search(
    executor: impl PgExecutor<'_>,
    tenant_id: &str,
    name: Option<&str>,
) -> sqlx::Result<Vec<KnowledgeBase>> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM knowledge_bases
          WHERE tenant_id = $1 AND ($2::text IS NULL OR name = $2)
          ORDER BY created_at DESC, id DESC LIMIT $3"
    )))
    .bind(tenant_id)
    .bind(name)
    .bind(MAX_PER_TENANT)
    .fetch_all(executor)
    .await
}

/// A page of the tenant's knowledge bases, newest first.
pub async fn list(
    executor: impl PgExecutor<'_>,
    tenant_id: &str,
    after: Option<Cursor>,
    limit: i64,
) -> sqlx::Result<Page<KnowledgeBase>> {
    let mut query = sqlx::QueryBuilder::new(
        "SELECT k.id, k.name, k.url, k.headers, k.created_at FROM knowledge_bases k
          WHERE k.tenant_id = ",
    );
    query.push_bind(tenant_id.to_owned());
    page::push_after(&mut query, "k", after);
    page::push_order(&mut query, "k", limit);
    let rows: Vec<KnowledgeBase> = query.build_query_as().fetch_all(executor).await?;
    Ok(page::page(rows, limit, |k| (k.created_at, k.id.0)))
}

/// Deletes the tenant's knowledge base; `false` if there was none.
pub async fn delete(
    executor: impl PgExecutor<'_>,
    id: KnowledgeBaseId,
    tenant_id: &str,
) -> sqlx::Result<bool> {
    let result = sqlx::query("DELETE FROM knowledge_bases WHERE id = $1 AND tenant_id = $2")
        .bind(id)
        .bind(tenant_id)
        .execute(executor)
        .await?;
    Ok(result.rows_affected() == 1)
}
