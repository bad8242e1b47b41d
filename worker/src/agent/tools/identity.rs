//! The identity a run acts with, as every outbound call (HTTP tool, MCP server, hook) carries
//! it, so that a tool can act with the user's permissions and never more:
//!
//! - `X-Spool-Tenant` and `X-Spool-User`: the run's tenant and user, for logs and routing. They
//!   are plain text: anyone who can reach the tool could send them, so they prove nothing.
//! - `X-Spool-Identity`: an EdDSA JWT that proves them (JOSE header `typ` =
//!   `spool-identity+jwt`, `kid`). Claims: `iss` = `spool`, `sub` = the user, `tenant`, `aud` =
//!   the origin of the URL called (`https://tools.example.com`, `http://127.0.0.1:8080`),
//!   `workflow_id`, `iat`, and `exp` = `iat` + 5 minutes. A token is minted per request (per
//!   HTTP request of an MCP session too), so a long session never carries an expired one, and
//!   one captured by a tool is worth nothing at another origin.
//!
//! Tools verify the token with the public keys the API publishes at
//! `GET /.well-known/jwks.json` ([`spool_shared::identity`]): a tool can verify but never sign,
//! so no tool can pass for a user at another tool (review B-H2). A call never follows a
//! redirect to another origin, as with configured headers: the token is a credential.
//!
//! Values that are not visible ASCII (a user id with spaces or non-Latin letters) are
//! percent-encoded in the plain headers; the token's claims hold them as they are.

use std::sync::Arc;

use jsonwebtoken::{EncodingKey, Header};
use reqwest::Url;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde::Serialize;
use spool_shared::identity::{IDENTITY_ISSUER, IdentityKeys};

/// `X-Spool-Tenant`.
pub const TENANT_HEADER: &str = "x-spool-tenant";
/// `X-Spool-User`.
pub const USER_HEADER: &str = "x-spool-user";
/// `X-Spool-Identity`.
pub const IDENTITY_HEADER: &str = "x-spool-identity";
/// How long a token is valid.
pub const TOKEN_TTL_SECS: i64 = 300;

/// Signs identity tokens with the process's identity key; one per worker.
pub struct IdentitySigner {
    key: EncodingKey,
    header: Header,
}

impl IdentitySigner {
    /// A signer with the current key of `keys`.
    pub fn new(keys: IdentityKeys) -> Self {
        Self {
            key: keys.encoding_key(),
            header: keys.header(),
        }
    }
}

#[derive(Serialize)]
struct Claims<'a> {
    iss: &'static str,
    sub: &'a str,
    tenant: &'a str,
    aud: &'a str,
    workflow_id: &'a str,
    iat: i64,
    exp: i64,
}

/// Who a run acts for.
#[derive(Clone)]
pub struct Identity {
    tenant: String,
    user: String,
    workflow: String,
    signer: Option<Arc<IdentitySigner>>,
}

impl Identity {
    /// The identity of `user` of `tenant` in run `workflow`; signed if there is a signer.
    pub fn new(
        tenant: &str,
        user: &str,
        workflow: &str,
        signer: Option<Arc<IdentitySigner>>,
    ) -> Self {
        Self {
            tenant: tenant.to_owned(),
            user: user.to_owned(),
            workflow: workflow.to_owned(),
            signer,
        }
    }

    /// Whether calls carry a signed token (a credential: redirects must stay on the origin).
    pub fn signs(&self) -> bool {
        self.signer.is_some()
    }

    /// The headers of a request to `url`.
    pub fn headers(&self, url: &Url) -> HeaderMap {
        let mut headers = HeaderMap::with_capacity(3);
        headers.insert(TENANT_HEADER, plain(&self.tenant));
        headers.insert(USER_HEADER, plain(&self.user));
        if let Some(token) = self.token(&url.origin().ascii_serialization())
            && let Ok(value) = HeaderValue::from_str(&token)
        {
            headers.insert(IDENTITY_HEADER, value);
        }
        headers
    }

    /// The same headers, as the MCP transport takes them.
    pub fn header_pairs(&self, url: &str) -> Vec<(HeaderName, HeaderValue)> {
        let Ok(url) = Url::parse(url) else {
            return Vec::new();
        };
        self.headers(&url)
            .into_iter()
            .filter_map(|(name, value)| Some((name?, value)))
            .collect()
    }

    /// A token for `audience`, valid for [`TOKEN_TTL_SECS`].
    fn token(&self, audience: &str) -> Option<String> {
        let signer = self.signer.as_ref()?;
        let now = chrono::Utc::now().timestamp();
        let claims = Claims {
            iss: IDENTITY_ISSUER,
            sub: &self.user,
            tenant: &self.tenant,
            aud: audience,
            workflow_id: &self.workflow,
            iat: now,
            exp: now + TOKEN_TTL_SECS,
        };
        match jsonwebtoken::encode(&signer.header, &claims, &signer.key) {
            Ok(token) => Some(token),
            Err(err) => {
                tracing::warn!(error = %err, "signing an identity token failed");
                None
            }
        }
    }
}

/// `value` as a header value: visible ASCII as is, every other byte (and `%`) percent-encoded.
fn plain(value: &str) -> HeaderValue {
    let mut encoded = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_graphic() && byte != b'%' {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    HeaderValue::from_str(&encoded).unwrap_or_else(|_| HeaderValue::from_static(""))
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::jwk::JwkSet;
    use jsonwebtoken::{Algorithm, DecodingKey, Validation};
    use secrecy::SecretString;

    const JWT_SECRET: &str = "a-jwt-secret-that-is-32-bytes-long!";
    /// 32 bytes of 0x01, base64url.
    const OLD_KEY: &str = "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE";
    /// 32 bytes of 0x02, base64url.
    const NEW_KEY: &str = "AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI";

    fn keys(key: Option<&str>, retired: Option<&str>) -> IdentityKeys {
        let secret = |text: &str| SecretString::from(text.to_owned());
        IdentityKeys::new(
            &secret(JWT_SECRET),
            key.map(secret).as_ref(),
            retired.map(secret).as_ref(),
        )
        .expect("keys")
    }

    fn signed(keys: IdentityKeys) -> Identity {
        let signer = IdentitySigner::new(keys);
        Identity::new("acme", "alice smith", "wf-1", Some(Arc::new(signer)))
    }

    /// Verifies as a tool would: the key of the JWKS whose `kid` the header names.
    fn verify(token: &str, jwks: &IdentityKeys, origin: &str) -> anyhow::Result<serde_json::Value> {
        let set: JwkSet = serde_json::from_value(serde_json::to_value(jwks.jwks())?)?;
        let header = jsonwebtoken::decode_header(token)?;
        anyhow::ensure!(header.typ.as_deref() == Some("spool-identity+jwt"), "typ");
        let kid = header.kid.unwrap_or_default();
        let jwk = set
            .find(&kid)
            .ok_or_else(|| anyhow::anyhow!("unknown kid"))?;
        let mut validation = Validation::new(Algorithm::EdDSA);
        validation.set_audience(&[origin]);
        validation.set_issuer(&["spool"]);
        let key = DecodingKey::from_jwk(jwk)?;
        Ok(jsonwebtoken::decode::<serde_json::Value>(token, &key, &validation)?.claims)
    }

    fn token(identity: &Identity, url: &str) -> String {
        let headers = identity.headers(&Url::parse(url).expect("url"));
        headers[IDENTITY_HEADER].to_str().expect("ascii").to_owned()
    }

    #[test]
    fn a_token_verifies_with_the_jwks_for_its_origin_only_and_never_with_the_jwt_secret() {
        let url = Url::parse("https://tools.example.com:8443/weather?q=1").expect("url");
        let headers = signed(keys(None, None)).headers(&url);
        assert_eq!(headers[TENANT_HEADER], "acme");
        assert_eq!(headers[USER_HEADER], "alice%20smith");
        let token = headers[IDENTITY_HEADER].to_str().expect("ascii");
        let claims = verify(token, &keys(None, None), "https://tools.example.com:8443")
            .expect("valid for its origin");
        assert_eq!(claims["sub"], "alice smith");
        assert_eq!(claims["tenant"], "acme");
        assert_eq!(claims["workflow_id"], "wf-1");
        let ttl = claims["exp"].as_i64().unwrap_or(0) - claims["iat"].as_i64().unwrap_or(0);
        assert_eq!(ttl, TOKEN_TTL_SECS);
        assert!(verify(token, &keys(None, None), "https://other.example.com").is_err());
        let mut hs256 = Validation::new(Algorithm::HS256);
        hs256.set_audience(&["https://tools.example.com:8443"]);
        let secret = DecodingKey::from_secret(JWT_SECRET.as_bytes());
        assert!(
            jsonwebtoken::decode::<serde_json::Value>(token, &secret, &hs256).is_err(),
            "the JWT secret does not verify it"
        );
    }

    #[test]
    fn after_a_rotation_the_new_key_signs_and_the_retired_one_still_verifies() {
        let url = "http://127.0.0.1:9/x";
        let before = token(&signed(keys(Some(OLD_KEY), None)), url);
        let rotated = keys(Some(NEW_KEY), Some(OLD_KEY));
        let after = token(&signed(keys(Some(NEW_KEY), None)), url);
        let kid = |t: &str| jsonwebtoken::decode_header(t).expect("header").kid;
        assert_eq!(kid(&after).as_deref(), Some(rotated.kid()));
        assert_ne!(kid(&before), kid(&after));
        for token in [&before, &after] {
            verify(token, &rotated, "http://127.0.0.1:9").expect("both verify after rotation");
        }
        assert!(
            verify(&before, &keys(Some(NEW_KEY), None), "http://127.0.0.1:9").is_err(),
            "once no longer published, the old key's tokens are refused"
        );
    }
}
