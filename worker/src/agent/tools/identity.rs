//! The identity a run acts with, as every outbound call (HTTP tool, MCP server, hook) carries
//! it, so that a tool can act with the user's permissions and never more:
//!
//! - `X-Spool-Tenant` and `X-Spool-User`: the run's tenant and user, for logs and routing. They
//!   are plain text: anyone who can reach the tool could send them, so they prove nothing.
//! - `X-Spool-Identity`: a JWT (HS256, signed with `SPOOL_TOOL_IDENTITY_SECRET`) that proves
//!   them. Claims: `iss` = `spool`, `sub` = the user, `tenant`, `aud` = the origin of the URL
//!   called (`https://tools.example.com`, `http://127.0.0.1:8080`), `workflow_id`, `iat`, and
//!   `exp` = `iat` + 5 minutes. A token is minted per request (per HTTP request of an MCP
//!   session too), so a long session never carries an expired one, and one captured by a tool
//!   is worth nothing at another origin.
//!
//! Without the secret, calls carry the two plain headers and no token (the worker logs this at
//! start). With it, a call never follows a redirect to another origin, as with configured
//! headers: the token is a credential.
//!
//! Values that are not visible ASCII (a user id with spaces or non-Latin letters) are
//! percent-encoded in the plain headers; the token's claims hold them as they are.

use std::sync::Arc;

use jsonwebtoken::{EncodingKey, Header};
use reqwest::Url;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use secrecy::{ExposeSecret as _, SecretString};
use serde::Serialize;

/// `X-Spool-Tenant`.
pub const TENANT_HEADER: &str = "x-spool-tenant";
/// `X-Spool-User`.
pub const USER_HEADER: &str = "x-spool-user";
/// `X-Spool-Identity`.
pub const IDENTITY_HEADER: &str = "x-spool-identity";
/// How long a token is valid.
pub const TOKEN_TTL_SECS: i64 = 300;
/// The shortest secret accepted: HS256 wants a key of at least 256 bits.
pub const MIN_SECRET_BYTES: usize = spool_shared::config::MIN_SECRET_BYTES;

/// Signs identity tokens with `SPOOL_TOOL_IDENTITY_SECRET`; one per worker.
pub struct IdentitySigner {
    key: EncodingKey,
}

impl IdentitySigner {
    /// A signer with `secret`, which must be at least [`MIN_SECRET_BYTES`] long.
    pub fn new(secret: &SecretString) -> anyhow::Result<Self> {
        spool_shared::config::check_signing_secret(
            "SPOOL_TOOL_IDENTITY_SECRET",
            secret.expose_secret(),
        )?;
        Ok(Self {
            key: EncodingKey::from_secret(secret.expose_secret().as_bytes()),
        })
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
            iss: "spool",
            sub: &self.user,
            tenant: &self.tenant,
            aud: audience,
            workflow_id: &self.workflow,
            iat: now,
            exp: now + TOKEN_TTL_SECS,
        };
        match jsonwebtoken::encode(&Header::default(), &claims, &signer.key) {
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
    use jsonwebtoken::{DecodingKey, Validation};

    const SECRET: &str = "a-tool-identity-secret-of-32-bytes!";

    fn signed() -> Identity {
        let signer = IdentitySigner::new(&SecretString::from(SECRET.to_owned())).expect("signer");
        Identity::new("acme", "alice smith", "wf-1", Some(Arc::new(signer)))
    }

    #[test]
    fn a_token_verifies_for_its_origin_only_and_expires_in_five_minutes() {
        let url = Url::parse("https://tools.example.com:8443/weather?q=1").expect("url");
        let headers = signed().headers(&url);
        assert_eq!(headers[TENANT_HEADER], "acme");
        assert_eq!(headers[USER_HEADER], "alice%20smith");
        let token = headers[IDENTITY_HEADER].to_str().expect("ascii");
        let key = DecodingKey::from_secret(SECRET.as_bytes());
        let mut validation = Validation::new(jsonwebtoken::Algorithm::HS256);
        validation.set_audience(&["https://tools.example.com:8443"]);
        validation.set_issuer(&["spool"]);
        let claims = jsonwebtoken::decode::<serde_json::Value>(token, &key, &validation)
            .expect("valid for its origin")
            .claims;
        assert_eq!(claims["sub"], "alice smith");
        assert_eq!(claims["tenant"], "acme");
        assert_eq!(claims["workflow_id"], "wf-1");
        let ttl = claims["exp"].as_i64().unwrap_or(0) - claims["iat"].as_i64().unwrap_or(0);
        assert_eq!(ttl, TOKEN_TTL_SECS);
        validation.set_audience(&["https://other.example.com"]);
        assert!(
            jsonwebtoken::decode::<serde_json::Value>(token, &key, &validation).is_err(),
            "another origin refuses it"
        );
    }

    #[test]
    fn without_a_secret_only_the_plain_headers_go_and_a_short_secret_is_refused() {
        let url = Url::parse("http://127.0.0.1:9/x").expect("url");
        let identity = Identity::new("acme", "bob", "wf", None);
        let headers = identity.headers(&url);
        assert!(!identity.signs());
        assert_eq!(headers.len(), 2);
        assert!(!headers.contains_key(IDENTITY_HEADER));
        let err = IdentitySigner::new(&SecretString::from("short".to_owned()))
            .err()
            .expect("refused")
            .to_string();
        assert!(err.contains("SPOOL_TOOL_IDENTITY_SECRET"), "{err}");
    }
}
