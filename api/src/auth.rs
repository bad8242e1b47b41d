//! Authentication: HS256 JWTs signed with `SPOOL_JWT_SECRET`, claims `sub` (user), `tenant`,
//! `exp` and optionally `admin` and `permissions`; when `SPOOL_AUTH_JWKS_URL` is set, an
//! external identity provider's RS256, ES256 or EdDSA tokens ([`external`]), told apart by the
//! header's `alg`; and the tenants' API keys (`spk_...`, [`api_key`]), told apart by their prefix.
//! The verified caller becomes an [`Owner`] that scopes every query, with the [`Permissions`]
//! every route checks ([`permission`]). `GET .../stream` may pass the token as `?access_token=` (browsers' `EventSource`
//! cannot set headers); that parameter is never logged. A token whose JOSE header says
//! `typ: "spool-identity+jwt"` (what tools receive, `spool_shared::identity`) is refused with
//! `identity_token_refused` whatever signed it, so a tool can never replay one at the API.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use secrecy::{ExposeSecret as _, SecretString};
use serde::{Deserialize, Serialize};

use spool_shared::db::threads::Owner;
use spool_shared::identity::IDENTITY_TYP;

use crate::app::AppState;
use crate::error::ApiError;

pub mod api_key;
pub mod external;
pub mod permission;
pub mod public;
pub mod scoped;
pub mod stream_token;

pub use external::{ExternalAuth, ExternalSettings};
pub use permission::{Permission, Permissions};

/// The claims Spool reads and writes.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Claims {
    /// The user.
    pub sub: String,
    /// The tenant.
    pub tenant: String,
    /// Expiry, seconds since the epoch.
    pub exp: u64,
    /// Every permission (`admin`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub admin: bool,
    /// The permissions (`runs:create`, ...); absent: `agents:read` and `runs:create`
    /// ([`Permissions::of_token`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<Vec<String>>,
}

/// Signing and verification keys for one secret, and the external identity provider if one is
/// configured.
#[derive(Clone)]
pub struct JwtKeys {
    encoding: EncodingKey,
    decoding: DecodingKey,
    validation: Validation,
    external: Option<Arc<ExternalAuth>>,
    /// The key of the API's own narrow tokens (stream tokens, public sessions).
    pub(crate) scoped: scoped::ScopedKeys,
}

impl JwtKeys {
    /// Keys for the HS256 secret.
    pub fn new(secret: &SecretString) -> Self {
        let bytes = secret.expose_secret().as_bytes();
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_required_spec_claims(&["exp", "sub"]);
        validation.leeway = 5;
        Self {
            encoding: EncodingKey::from_secret(bytes),
            decoding: DecodingKey::from_secret(bytes),
            validation,
            external: None,
            scoped: scoped::ScopedKeys::new(bytes),
        }
    }

    /// The same keys, also accepting the tokens of `external` (any algorithm but HS256).
    pub fn with_external(mut self, external: ExternalAuth) -> Self {
        self.external = Some(Arc::new(external));
        self
    }

    /// Authenticates a bearer token: HS256 with the secret, else (RS256, ES256, EdDSA) the
    /// external provider's. A refusal is logged with its reason, never with the token.
    pub async fn authenticate(&self, token: &str) -> Result<Caller, ApiError> {
        let header = match jsonwebtoken::decode_header(token) {
            Ok(header) => header,
            // Checked again (and logged) by `verify`, which gives the same answer.
            Err(_) => return self.verify(token).map(Caller::from_claims),
        };
        let Some(external) = self
            .external
            .as_ref()
            .filter(|_| header.alg != Algorithm::HS256)
        else {
            return self.verify(token).map(Caller::from_claims);
        };
        let result = match identity_typed(&header) {
            Err(refused) => Err(refused),
            Ok(()) => external.verify(token, &header).await,
        };
        if let Err(ApiError::Unauthorized { code, message }) = &result {
            tracing::info!(auth.code = code, reason = %message, "external token refused");
        }
        result.map(Caller::from_principal)
    }

    /// Signs a token for the claims.
    pub fn sign(&self, claims: &Claims) -> anyhow::Result<String> {
        Ok(jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            claims,
            &self.encoding,
        )?)
    }

    /// Verifies a token and returns its claims. A refusal is logged with its reason, never
    /// with the token.
    pub fn verify(&self, token: &str) -> Result<Claims, ApiError> {
        let result = self.check(token);
        if let Err(ApiError::Unauthorized { code, message }) = &result {
            tracing::info!(auth.code = code, reason = %message, "bearer token refused");
        }
        result
    }

    fn check(&self, token: &str) -> Result<Claims, ApiError> {
        // An identity token is for tools, never for the API, whoever signed it (review B-H2):
        // refused by its header before any key is tried.
        let header = jsonwebtoken::decode_header(token)
            .map_err(|err| unauthorized("invalid_token", &format!("malformed token: {err}")))?;
        identity_typed(&header)?;
        scoped::refuse_scoped(&header)?;
        let claims = jsonwebtoken::decode::<Claims>(token, &self.decoding, &self.validation)
            .map_err(|err| match err.kind() {
                ErrorKind::ExpiredSignature => {
                    unauthorized("token_expired", "the token has expired")
                }
                _ => unauthorized("invalid_token", &format!("the token is not valid: {err}")),
            })?
            .claims;
        if claims.sub.is_empty() || claims.tenant.is_empty() {
            return Err(unauthorized(
                "invalid_token",
                "the token lacks `sub` or `tenant`",
            ));
        }
        Ok(claims)
    }
}

/// Refuses a token typed as an identity token, whatever signed it.
fn identity_typed(header: &Header) -> Result<(), ApiError> {
    if header.typ.as_deref() == Some(IDENTITY_TYP) {
        return Err(unauthorized(
            "identity_token_refused",
            "an X-Spool-Identity token (typ spool-identity+jwt) is not an API token",
        ));
    }
    Ok(())
}

fn unauthorized(code: &'static str, message: &str) -> ApiError {
    ApiError::Unauthorized {
        code,
        message: message.to_owned(),
    }
}

/// The authenticated caller.
#[derive(Clone, Debug)]
pub struct Caller {
    /// Tenant and user: the scope of every query.
    pub owner: Owner,
    /// What the caller may do: the token's `admin` and permissions claim, or an API key's.
    pub permissions: Permissions,
}

impl Caller {
    fn from_claims(claims: Claims) -> Self {
        Self {
            permissions: Permissions::of_token(claims.admin, claims.permissions.as_deref()),
            owner: Owner {
                tenant_id: claims.tenant,
                user_id: claims.sub,
            },
        }
    }

    /// A caller with no right beyond its own threads (`runs:create` alone): what a stream
    /// token or a public session stands for, on the few routes that take them.
    pub(crate) fn restricted(owner: Owner) -> Self {
        Self {
            owner,
            permissions: Permissions::NONE.with(Permission::RunsCreate),
        }
    }

    fn from_principal(principal: external::Principal) -> Self {
        Self {
            permissions: Permissions::of_token(false, principal.permissions.as_deref()),
            owner: Owner {
                tenant_id: principal.tenant,
                user_id: principal.sub,
            },
        }
    }

    /// Passes if the caller holds `permission` (or `admin`); else 403 `forbidden` naming it.
    pub fn require(&self, permission: Permission) -> Result<(), ApiError> {
        self.permissions.require(permission)
    }

    /// Passes if the caller holds one of `any` (or `admin`); else 403 `forbidden` naming the
    /// first.
    pub fn require_any(&self, any: &[Permission]) -> Result<(), ApiError> {
        self.permissions.require_any(any)
    }

    /// Whether the caller holds `permission` (or `admin`).
    pub fn holds(&self, permission: Permission) -> bool {
        self.permissions.grants(permission)
    }

    /// Which threads and runs the caller reads: their own, or (`runs:read:tenant`) the
    /// tenant's.
    pub fn scope(&self) -> spool_shared::db::page::Scope<'_> {
        use spool_shared::db::page::Scope;
        if self.holds(Permission::RunsReadTenant) {
            Scope::Tenant(&self.owner.tenant_id)
        } else {
            Scope::Owner(&self.owner)
        }
    }

    /// Which threads the caller may rename and erase: their own, or (`admin`) the tenant's.
    /// Reading another user's thread (`runs:read:tenant`) is not changing it.
    pub fn write_scope(&self) -> spool_shared::db::page::Scope<'_> {
        use spool_shared::db::page::Scope;
        if self.holds(Permission::Admin) {
            Scope::Tenant(&self.owner.tenant_id)
        } else {
            Scope::Owner(&self.owner)
        }
    }

    /// Authenticates from the `Authorization` header, or from `access_token` in the query
    /// (for `EventSource`, which cannot set headers).
    pub async fn from_header_or_query(
        headers: &HeaderMap,
        state: &AppState,
        access_token: Option<&str>,
    ) -> Result<Self, ApiError> {
        match bearer(headers)?.or(access_token) {
            Some(token) => authenticate(state, token).await,
            None => Err(missing()),
        }
    }
}

/// Authenticates a bearer token: an API key (`spk_...`) by its row, anything else as a JWT.
pub async fn authenticate(state: &AppState, token: &str) -> Result<Caller, ApiError> {
    if token.starts_with(spool_shared::db::api_keys::PREFIX) {
        api_key::authenticate(&state.db, token).await
    } else {
        state.jwt.authenticate(token).await
    }
}

fn missing() -> ApiError {
    unauthorized("missing_token", "send `Authorization: Bearer <token>`")
}

fn bearer(headers: &HeaderMap) -> Result<Option<&str>, ApiError> {
    let Some(value) = headers.get(AUTHORIZATION) else {
        return Ok(None);
    };
    let value = value
        .to_str()
        .map_err(|_| unauthorized("invalid_token", "malformed header"))?;
    match value.split_once(' ') {
        Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") && !token.is_empty() => {
            Ok(Some(token.trim()))
        }
        _ => Err(unauthorized(
            "invalid_token",
            "expected `Authorization: Bearer <token>`",
        )),
    }
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let token = bearer(&parts.headers)?.ok_or_else(missing)?;
        authenticate(state, token).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(secret: &str) -> JwtKeys {
        JwtKeys::new(&SecretString::from(secret.to_owned()))
    }

    fn claims(exp: u64) -> Claims {
        Claims {
            sub: "u".into(),
            tenant: "t".into(),
            exp,
            admin: false,
            permissions: None,
        }
    }

    fn now() -> u64 {
        chrono::Utc::now()
            .timestamp()
            .try_into()
            .unwrap_or_default()
    }

    #[test]
    fn a_signed_token_verifies_and_a_forged_one_does_not() -> anyhow::Result<()> {
        let token = keys("right").sign(&claims(now() + 60))?;
        assert_eq!(keys("right").verify(&token)?.tenant, "t");
        let forged = keys("wrong").verify(&token);
        assert!(matches!(
            forged,
            Err(ApiError::Unauthorized {
                code: "invalid_token",
                ..
            })
        ));
        Ok(())
    }

    #[test]
    fn an_identity_typed_token_is_refused_even_when_the_secret_signed_it() -> anyhow::Result<()> {
        let mut header = Header::new(Algorithm::HS256);
        header.typ = Some(IDENTITY_TYP.to_owned());
        let secret = EncodingKey::from_secret(b"k");
        let token = jsonwebtoken::encode(&header, &claims(now() + 60), &secret)?;
        assert!(matches!(
            keys("k").verify(&token),
            Err(ApiError::Unauthorized {
                code: "identity_token_refused",
                ..
            })
        ));
        Ok(())
    }

    #[test]
    fn an_expired_token_is_refused_with_its_own_code() -> anyhow::Result<()> {
        let token = keys("k").sign(&claims(now() - 3600))?;
        let result = keys("k").verify(&token);
        assert!(matches!(
            result,
            Err(ApiError::Unauthorized {
                code: "token_expired",
                ..
            })
        ));
        Ok(())
    }
}
