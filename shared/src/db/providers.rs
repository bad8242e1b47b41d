//! A tenant's model providers (`/v1/providers`, DESIGN section 12): "bring your own key". An
//! agent's `provider` names one of these first, then one of the operator's (`SPOOL_PROVIDERS`,
//! [`crate::provider`]).
//!
//! What must stay true:
//! - The API key is stored only sealed ([`crate::secrets_key`]), bound to the tenant and the
//!   provider's id; nothing here returns it in clear but [`StoredProvider::api_key`], which
//!   the worker calls right before it builds the provider's client.
//! - Every query is scoped to the tenant: another tenant's id or name reads as no provider.
//! - A run snapshots the provider's id ([`resolve`]), never its key: the worker reads the row
//!   (and so the current key and URL) when it calls the model.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgExecutor;
use sqlx::types::Json;

use crate::agent::{AgentSpec, FieldError};
use crate::db::page::{self, Cursor, Page};
use crate::egress::NetworkPolicy;
use crate::ids::ProviderId;
use crate::pricing::Prices;
use crate::provider::ProviderKind;
use crate::secrets_key::{OpenError, Sealed, SecretsKeys};

/// The name of the unique index that refuses a second provider of a name in a tenant.
pub const NAME_INDEX: &str = "providers_tenant_name_idx";

/// The longest API key accepted, in bytes.
pub const MAX_KEY_BYTES: usize = 4096;

/// A tenant provider's settings: everything but its key (what the `spec` column holds).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProviderSettings {
    /// The name agents use in `provider` (1 to 64 characters of a-z, A-Z, 0-9, `_`, `-`),
    /// unique in the tenant. It hides an operator provider of the same name from the tenant.
    #[schema(min_length = 1, max_length = 64, pattern = "^[A-Za-z0-9_-]+$")]
    pub name: String,
    /// Its wire format: `openai` (Chat Completions) or `anthropic` (Messages).
    pub kind: ProviderKind,
    /// What the provider's own SDK takes as its base URL (for `openai`, ending in `/v1`). It
    /// must pass the network policy, at save and at every call.
    #[schema(max_length = 2048)]
    pub base_url: String,
    /// The model of agents that name this provider and no `model`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_model: Option<String>,
    /// The models it serves, if it says: agents naming it may use only these.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<Vec<String>>,
    /// The prices of its models (US dollars per million tokens): its runs' `cost_usd`. A model
    /// without a price is unpriced.
    #[serde(default, skip_serializing_if = "Prices::is_empty")]
    pub prices: Prices,
}

impl ProviderSettings {
    /// Every problem of the settings by field; the second value says whether the network
    /// policy refused `base_url` outright (a scheme or a literal address: 422
    /// `url_not_allowed`).
    pub fn problems(&self, policy: &NetworkPolicy) -> (Vec<FieldError>, bool) {
        let mut problems = Vec::new();
        let mut add = |field: &str, message: String| {
            problems.push(FieldError {
                field: field.to_owned(),
                message,
            });
        };
        let valid_name = (1..=64).contains(&self.name.len())
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !valid_name {
            add(
                "name",
                "must be 1 to 64 characters of a-z, A-Z, 0-9, _ or -".into(),
            );
        }
        let mut refused = false;
        match reqwest::Url::parse(&self.base_url) {
            _ if self.base_url.len() > 2048 => add("base_url", "must be at most 2048 bytes".into()),
            Err(err) => add("base_url", format!("must be an absolute URL ({err})")),
            Ok(url) => {
                if let Err(reason) = policy.check_url(&url) {
                    refused = true;
                    add(
                        "base_url",
                        format!("the network policy refuses it: {reason}"),
                    );
                } else if !url.username().is_empty() || url.password().is_some() {
                    add(
                        "base_url",
                        "must not carry credentials: put the key in `api_key`".into(),
                    );
                } else if url.query().is_some() || url.fragment().is_some() {
                    add("base_url", "must have no query or fragment".into());
                }
            }
        }
        let model_name = |m: &str| !m.trim().is_empty() && m.len() <= 200;
        if let Some(model) = &self.default_model
            && !model_name(model)
        {
            add(
                "default_model",
                "must be a model name of 1 to 200 characters".into(),
            );
        }
        if let Some(models) = &self.models {
            if models.is_empty() || models.len() > 200 {
                add("models", "must list 1 to 200 models when given".into());
            }
            for (i, model) in models.iter().enumerate() {
                if !model_name(model) {
                    add(
                        &format!("models[{i}]"),
                        "must be a model name of 1 to 200 characters".into(),
                    );
                }
            }
            if let Some(model) = &self.default_model
                && !models.contains(model)
            {
                add("default_model", format!("`{model}` is not among `models`"));
            }
        }
        for (field, message) in self.prices.problems() {
            add(&format!("prices.{field}"), message);
        }
        (problems, refused)
    }

    /// What an agent's `model`, `fallback_models` and `summary_model` get wrong against this
    /// provider (named `provider` in the agent).
    pub fn agent_problems(&self, agent: &AgentSpec) -> Vec<FieldError> {
        let mut problems = Vec::new();
        if agent.model.trim().is_empty() && self.default_model.is_none() {
            problems.push(FieldError {
                field: "model".into(),
                message: format!(
                    "must be given: provider `{}` has no `default_model`",
                    self.name
                ),
            });
        }
        let Some(models) = &self.models else {
            return problems;
        };
        let named = std::iter::once(("model".to_owned(), &agent.model))
            .filter(|(_, m)| !m.trim().is_empty())
            .chain(
                agent
                    .fallback_models
                    .iter()
                    .enumerate()
                    .map(|(i, m)| (format!("fallback_models[{i}]"), m)),
            );
        problems.extend(named.filter(|(_, model)| !models.contains(model)).map(
            |(field, model)| FieldError {
                field,
                message: format!(
                    "provider `{}` does not serve `{model}` (it lists {models:?})",
                    self.name
                ),
            },
        ));
        problems
    }

    /// Whether a key stored for `stored` may be kept for these settings: the same destination
    /// (scheme, host and port of `base_url`).
    pub fn same_destination(&self, stored: &Self) -> bool {
        match (
            reqwest::Url::parse(&self.base_url),
            reqwest::Url::parse(&stored.base_url),
        ) {
            (Ok(new), Ok(old)) => new.origin() == old.origin(),
            _ => false,
        }
    }
}

/// A stored provider, its key sealed.
#[derive(Clone, Debug)]
pub struct StoredProvider {
    /// Its id.
    pub id: ProviderId,
    /// Its tenant.
    pub tenant_id: String,
    /// Its settings.
    pub settings: ProviderSettings,
    /// Its API key, sealed.
    pub sealed_key: Sealed,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
}

impl StoredProvider {
    /// The API key in clear.
    pub fn api_key(&self, keys: &SecretsKeys) -> Result<String, OpenError> {
        keys.open(&self.sealed_key, &bound_to(&self.tenant_id, self.id))
    }
}

/// What a provider's sealed key is bound to: its tenant and id.
pub fn bound_to(tenant_id: &str, id: ProviderId) -> String {
    format!("provider:{tenant_id}:{id}")
}

#[derive(sqlx::FromRow)]
struct Row {
    id: ProviderId,
    tenant_id: String,
    spec: Json<ProviderSettings>,
    api_key_ciphertext: Vec<u8>,
    api_key_nonce: Vec<u8>,
    api_key_version: String,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

impl From<Row> for StoredProvider {
    fn from(row: Row) -> Self {
        Self {
            id: row.id,
            tenant_id: row.tenant_id,
            settings: row.spec.0,
            sealed_key: Sealed {
                ciphertext: row.api_key_ciphertext,
                nonce: row.api_key_nonce,
                key_version: row.api_key_version,
            },
            created_at: row.created_at,
            updated_at: row.updated_at,
        }
    }
}

/// The columns of [`Row`].
const COLUMNS: &str = "id, tenant_id, spec, api_key_ciphertext, api_key_nonce, api_key_version, \
                       created_at, updated_at";

/// Stores a new provider (a taken name is a unique violation of [`NAME_INDEX`]); `key` is
/// sealed bound to `(tenant_id, id)` ([`bound_to`]).
pub async fn insert(
    executor: impl PgExecutor<'_>,
    id: ProviderId,
    tenant_id: &str,
    settings: &ProviderSettings,
    key: &Sealed,
) -> sqlx::Result<StoredProvider> {
    let row: Row = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "INSERT INTO providers (id, tenant_id, name, spec, api_key_ciphertext, api_key_nonce,
                                api_key_version)
         VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING {COLUMNS}"
    )))
    .bind(id)
    .bind(tenant_id)
    .bind(&settings.name)
    .bind(Json(settings))
    .bind(&key.ciphertext)
    .bind(&key.nonce)
    .bind(&key.key_version)
    .fetch_one(executor)
    .await?;
    Ok(row.into())
}

/// Replaces a provider's settings and key; `None` if the tenant has no such provider.
pub async fn update(
    executor: impl PgExecutor<'_>,
    id: ProviderId,
    tenant_id: &str,
    settings: &ProviderSettings,
    key: &Sealed,
) -> sqlx::Result<Option<StoredProvider>> {
    // `clock_timestamp()`: the worker's cache compares `updated_at`, so two changes in one
    // transaction's `now()` would look alike; strictly later than the last change.
    let row: Option<Row> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "UPDATE providers SET name = $3, spec = $4, api_key_ciphertext = $5, api_key_nonce = $6,
                api_key_version = $7,
                updated_at = greatest(clock_timestamp(), updated_at + interval '1 microsecond')
          WHERE id = $1 AND tenant_id = $2 RETURNING {COLUMNS}"
    )))
    .bind(id)
    .bind(tenant_id)
    .bind(&settings.name)
    .bind(Json(settings))
    .bind(&key.ciphertext)
    .bind(&key.nonce)
    .bind(&key.key_version)
    .fetch_optional(executor)
    .await?;
    Ok(row.map(Into::into))
}

/// The tenant's provider, if it exists.
pub async fn find(
    executor: impl PgExecutor<'_>,
    id: ProviderId,
    tenant_id: &str,
) -> sqlx::Result<Option<StoredProvider>> {
    select(executor, id, tenant_id, "").await
}

/// The tenant's provider, its row locked until the transaction ends (`FOR UPDATE`).
pub async fn lock(
    executor: impl PgExecutor<'_>,
    id: ProviderId,
    tenant_id: &str,
) -> sqlx::Result<Option<StoredProvider>> {
    select(executor, id, tenant_id, " FOR UPDATE").await
}

/// The tenant's provider by its primary key, read with `locking` (`""` or a locking clause).
async fn select(
    executor: impl PgExecutor<'_>,
    id: ProviderId,
    tenant_id: &str,
    locking: &'static str,
) -> sqlx::Result<Option<StoredProvider>> {
    let row: Option<Row> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM providers WHERE id = $1 AND tenant_id = $2{locking}"
    )))
    .bind(id)
    .bind(tenant_id)
    .fetch_optional(executor)
    .await?;
    Ok(row.map(Into::into))
}

/// The tenant's provider named `name`, if it has one.
pub async fn find_by_name(
    executor: impl PgExecutor<'_>,
    tenant_id: &str,
    name: &str,
) -> sqlx::Result<Option<StoredProvider>> {
    let row: Option<Row> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {COLUMNS} FROM providers WHERE tenant_id = $1 AND name = $2"
    )))
    .bind(tenant_id)
    .bind(name)
    .fetch_optional(executor)
    .await?;
    Ok(row.map(Into::into))
}

/// A page of the tenant's providers, newest first.
pub async fn list(
    executor: impl PgExecutor<'_>,
    tenant_id: &str,
    after: Option<Cursor>,
    limit: i64,
) -> sqlx::Result<Page<StoredProvider>> {
    let mut query = sqlx::QueryBuilder::new(
        "SELECT p.id, p.tenant_id, p.spec, p.api_key_ciphertext, p.api_key_nonce, \
         p.api_key_version, p.created_at, p.updated_at FROM providers p WHERE p.tenant_id = ",
    );
    query.push_bind(tenant_id.to_owned());
    page::push_after(&mut query, "p", after);
    page::push_order(&mut query, "p", limit);
    let rows: Vec<Row> = query.build_query_as().fetch_all(executor).await?;
    let rows: Vec<StoredProvider> = rows.into_iter().map(Into::into).collect();
    Ok(page::page(rows, limit, |p| (p.created_at, p.id.0)))
}

/// Deletes the tenant's provider; `false` if there was none.
pub async fn delete(
    executor: impl PgExecutor<'_>,
    id: ProviderId,
    tenant_id: &str,
) -> sqlx::Result<bool> {
    let result = sqlx::query("DELETE FROM providers WHERE id = $1 AND tenant_id = $2")
        .bind(id)
        .bind(tenant_id)
        .execute(executor)
        .await?;
    Ok(result.rows_affected() == 1)
}

/// The versions of the keys that sealed the stored keys (of every tenant): what a process
/// checks at start against its `SPOOL_SECRETS_KEY` and retired keys.
pub async fn key_versions(executor: impl PgExecutor<'_>) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar("SELECT DISTINCT api_key_version FROM providers ORDER BY 1")
        .fetch_all(executor)
        .await
}

/// `spec` as a run of it executes: when its `provider` names one of the tenant's providers,
/// that provider's id ([`AgentSpec::provider_id`]) and, for an agent without `model`, its
/// `default_model`. What every enqueue snapshots; an operator provider is left to the worker.
pub async fn resolve(
    executor: impl PgExecutor<'_>,
    tenant_id: &str,
    mut spec: AgentSpec,
) -> sqlx::Result<AgentSpec> {
    spec.provider_id = None;
    let Some(name) = spec.provider.as_deref() else {
        return Ok(spec);
    };
    if let Some(provider) = find_by_name(executor, tenant_id, name).await? {
        spec.provider_id = Some(provider.id);
        if spec.model.trim().is_empty()
            && let Some(model) = provider.settings.default_model
        {
            spec.model = model;
        }
    }
    Ok(spec)
}
