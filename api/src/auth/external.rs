//! Tokens of an external identity provider (Auth0, Clerk, Keycloak, Cognito, ...): verified
//! with the public keys of its JWKS (`SPOOL_AUTH_JWKS_URL`), so a team that signs its users in
//! there needs not mint Spool tokens itself (DESIGN section 13).
//!
//! What must stay true:
//! - Only asymmetric keys are used: RS256 (RSA), ES256 (P-256), EdDSA (Ed25519), and the
//!   token's `alg` must be the one of the key its `kid` names. An `oct` key in the set is
//!   ignored, so no token can be checked as HMAC over a public key; `alg: none` never parses.
//! - The keys are cached; an unknown `kid` refetches the set at most once per
//!   [`REFETCH_INTERVAL`], whatever the traffic, so tokens with made-up `kid`s cannot turn the
//!   API into a load generator against the provider.
//! - A provider that is down or answers garbage leaves the cache as it was: a token whose key is
//!   not known is refused (401), never let in unverified.
//! - `iss` and `aud` must be the configured ones; `exp` has 60 s of leeway for clock skew.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::Value;
use tokio::sync::Mutex;

use crate::error::ApiError;

/// The fewest seconds between two fetches of the set for unknown `kid`s.
pub const REFETCH_INTERVAL: Duration = Duration::from_secs(30);
/// Leeway on `exp` (and `nbf`), for clocks that differ.
const LEEWAY_SECS: u64 = 60;
/// How long one fetch of the set may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

/// The provider's settings (`SPOOL_AUTH_*`).
#[derive(Clone, Debug)]
pub struct ExternalSettings {
    /// `SPOOL_AUTH_JWKS_URL`.
    pub jwks_url: reqwest::Url,
    /// `SPOOL_AUTH_ISSUER`.
    pub issuer: String,
    /// `SPOOL_AUTH_AUDIENCE`.
    pub audience: String,
    /// `SPOOL_AUTH_TENANT_CLAIM`.
    pub tenant_claim: String,
    /// `SPOOL_AUTH_PERMISSIONS_CLAIM`.
    pub permissions_claim: String,
}

/// Who an external token names.
#[derive(Clone, Debug)]
pub struct Principal {
    /// `sub`.
    pub sub: String,
    /// The tenant claim.
    pub tenant: String,
    /// The permissions claim, `None` when the token has none (then it holds the defaults,
    /// [`super::Permissions::of_token`]).
    pub permissions: Option<Vec<String>>,
}

/// The keys fetched so far, and when the set was last asked for.
#[derive(Default)]
struct Cache {
    keys: HashMap<String, (Algorithm, DecodingKey)>,
    fetched_at: Option<Instant>,
}

/// Verifies tokens of one provider.
pub struct ExternalAuth {
    settings: ExternalSettings,
    http: reqwest::Client,
    refetch_interval: Duration,
    cache: Mutex<Cache>,
}

impl ExternalAuth {
    /// A verifier for `settings`, refetching at most every [`REFETCH_INTERVAL`].
    pub fn new(settings: ExternalSettings) -> anyhow::Result<Self> {
        Self::with_refetch_interval(settings, REFETCH_INTERVAL)
    }

    /// The same with another refetch interval (tests).
    pub fn with_refetch_interval(
        settings: ExternalSettings,
        refetch_interval: Duration,
    ) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .timeout(FETCH_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        Ok(Self {
            settings,
            http,
            refetch_interval,
            cache: Mutex::new(Cache::default()),
        })
    }

    /// Verifies `token`, whose header has already been read.
    pub async fn verify(
        &self,
        token: &str,
        header: &jsonwebtoken::Header,
    ) -> Result<Principal, ApiError> {
        if !matches!(
            header.alg,
            Algorithm::RS256 | Algorithm::ES256 | Algorithm::EdDSA
        ) {
            return Err(invalid(&format!(
                "algorithm {:?} is not accepted",
                header.alg
            )));
        }
        let kid = header
            .kid
            .as_deref()
            .ok_or_else(|| invalid("the token has no `kid`"))?;
        let (alg, key) = self.key(kid).await?;
        if alg != header.alg {
            return Err(invalid(&format!(
                "the token says {:?}, its key is {alg:?}",
                header.alg
            )));
        }
        let mut validation = Validation::new(alg);
        validation.leeway = LEEWAY_SECS;
        validation.set_issuer(&[&self.settings.issuer]);
        validation.set_audience(&[&self.settings.audience]);
        validation.set_required_spec_claims(&["exp", "sub", "iss", "aud"]);
        let claims = jsonwebtoken::decode::<Value>(token, &key, &validation)
            .map_err(|err| match err.kind() {
                jsonwebtoken::errors::ErrorKind::ExpiredSignature => {
                    super::unauthorized("token_expired", "the token has expired")
                }
                _ => invalid(&format!("the token is not valid: {err}")),
            })?
            .claims;
        self.principal(&claims)
    }

    /// `sub`, the tenant and the permissions of verified claims.
    fn principal(&self, claims: &Value) -> Result<Principal, ApiError> {
        let text = |name: &str| {
            claims[name]
                .as_str()
                .filter(|value| !value.is_empty())
                .map(str::to_owned)
        };
        let sub = text("sub").ok_or_else(|| invalid("the token lacks `sub`"))?;
        let tenant_claim = &self.settings.tenant_claim;
        let tenant = text(tenant_claim).ok_or_else(|| {
            invalid(&format!(
                "the token lacks the tenant claim `{tenant_claim}`"
            ))
        })?;
        let claim = &claims[&self.settings.permissions_claim];
        let permissions =
            if claim.is_null() {
                None
            } else {
                Some(permissions(claim).ok_or_else(|| {
                    invalid("the permissions claim is neither a list nor a string")
                })?)
            };
        Ok(Principal {
            sub,
            tenant,
            permissions,
        })
    }

    /// The key named `kid`: cached, or fetched when the last fetch is old enough.
    async fn key(&self, kid: &str) -> Result<(Algorithm, DecodingKey), ApiError> {
        // One lock across the fetch: concurrent misses wait for one fetch, not one each.
        let mut cache = self.cache.lock().await;
        if let Some(found) = cache.keys.get(kid) {
            return Ok(found.clone());
        }
        let due = cache
            .fetched_at
            .is_none_or(|at| at.elapsed() >= self.refetch_interval);
        if due {
            cache.fetched_at = Some(Instant::now());
            match self.fetch().await {
                Ok(keys) => cache.keys = keys,
                // The old keys stay; the provider's outage lets nothing in.
                Err(err) => tracing::warn!(error = %err, "fetching SPOOL_AUTH_JWKS_URL failed"),
            }
        }
        cache
            .keys
            .get(kid)
            .cloned()
            .ok_or_else(|| invalid("no key of the identity provider has the token's `kid`"))
    }

    /// The usable keys of the provider's set, by `kid`.
    async fn fetch(&self) -> anyhow::Result<HashMap<String, (Algorithm, DecodingKey)>> {
        let response = self
            .http
            .get(self.settings.jwks_url.clone())
            .send()
            .await
            .map_err(reqwest::Error::without_url)?
            .error_for_status()
            .map_err(reqwest::Error::without_url)?;
        let set: JwkSet = response.json().await.map_err(reqwest::Error::without_url)?;
        let keys: HashMap<_, _> = set.keys.iter().filter_map(usable).collect();
        tracing::info!(keys = keys.len(), "fetched the identity provider's keys");
        Ok(keys)
    }
}

/// A key of the set as (`kid`, (its algorithm, the key)), if it is one Spool accepts.
fn usable(jwk: &Jwk) -> Option<(String, (Algorithm, DecodingKey))> {
    let kid = jwk.common.key_id.clone()?;
    let alg = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => Algorithm::RS256,
        AlgorithmParameters::EllipticCurve(ec) if ec.curve == EllipticCurve::P256 => {
            Algorithm::ES256
        }
        AlgorithmParameters::OctetKeyPair(okp) if okp.curve == EllipticCurve::Ed25519 => {
            Algorithm::EdDSA
        }
        // `oct` (HMAC) and other curves: never.
        _ => return None,
    };
    // A key that names another algorithm is for that one only.
    if let Some(named) = jwk.common.key_algorithm
        && format!("{named:?}") != format!("{alg:?}")
    {
        return None;
    }
    let key = DecodingKey::from_jwk(jwk).ok()?;
    Some((kid, (alg, key)))
}

/// A permissions claim: a JSON array of strings, or a space-separated string (OAuth's
/// `scope`). `None` for any other shape.
fn permissions(claim: &Value) -> Option<Vec<String>> {
    match claim {
        Value::String(text) => Some(text.split_whitespace().map(str::to_owned).collect()),
        Value::Array(items) => items
            .iter()
            .map(|item| item.as_str().map(str::to_owned))
            .collect(),
        _ => None,
    }
}

fn invalid(message: &str) -> ApiError {
    super::unauthorized("invalid_token", message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn permissions_are_a_list_or_a_space_separated_string_and_nothing_else() {
        assert_eq!(
            permissions(&json!(["admin", "runs:create"])),
            Some(vec!["admin".to_owned(), "runs:create".to_owned()])
        );
        assert_eq!(
            permissions(&json!("openid  agents:read")),
            Some(vec!["openid".to_owned(), "agents:read".to_owned()])
        );
        assert_eq!(permissions(&Value::Null), None);
        assert_eq!(permissions(&json!([1])), None);
        assert_eq!(permissions(&json!({"admin": true})), None);
    }
}
