//! API keys as bearer tokens (DESIGN section 13): `Authorization: Bearer spk_...`. The key is
//! looked up by its hash on every request (`spool_shared::db::api_keys`), never cached, so a
//! revocation through any API process holds on every other at once. A key acts as the user
//! `apikey:<id>` of its tenant, with exactly the permissions it was given. A refusal is logged
//! with its reason, never with the key.

use sqlx::PgPool;

use spool_shared::db::api_keys::{self, ApiKey, Presented};
use spool_shared::db::threads::Owner;
use spool_shared::ids::ApiKeyId;

use super::{Caller, Permissions, unauthorized};
use crate::error::ApiError;

/// The user a key acts as: `apikey:<id>`.
pub fn user_id(id: ApiKeyId) -> String {
    format!("apikey:{id}")
}

/// The caller a presented key is: 401 `invalid_token` for no such key, `api_key_revoked` for
/// a revoked one.
pub async fn authenticate(db: &PgPool, key: &str) -> Result<Caller, ApiError> {
    let refused = match api_keys::authenticate(db, &api_keys::hash(key)).await? {
        Presented::Valid(key) => return Ok(caller(key)),
        Presented::Revoked => unauthorized("api_key_revoked", "this API key has been revoked"),
        Presented::Unknown => unauthorized("invalid_token", "no such API key"),
    };
    if let ApiError::Unauthorized { code, message } = &refused {
        tracing::info!(auth.code = code, reason = %message, "API key refused");
    }
    Err(refused)
}

fn caller(key: ApiKey) -> Caller {
    Caller {
        permissions: Permissions::known(&key.permissions),
        owner: Owner {
            user_id: user_id(key.id),
            tenant_id: key.tenant_id,
        },
    }
}
