//! An MCP server's `auth` (DESIGN section 12): a fixed bearer token, or one fetched with OAuth
//! 2.0 client credentials (RFC 6749 section 4.4) and kept until it expires.
//!
//! What must stay true:
//! - the token request goes through the network policy (the guarded client for the token
//!   endpoint, its redirects kept on that origin: it carries the client secret);
//! - a fetched token is cached per process, by token endpoint, client, secret and scope (the
//!   secret hashed), until [`EARLY`] before it expires; then the next request fetches a new one.
//!   Concurrent requests for one credential wait for one fetch;
//! - no error names the secret or the token, nor shows the token endpoint's answer (it may
//!   echo them): only its status and the OAuth `error` code.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use base64::Engine as _;
use reqwest::Url;
use sha2::Digest as _;
use tokio::time::Instant;

use spool_shared::agent::McpAuth;
use spool_shared::egress::GuardedClients;

/// How long before its expiry a cached token is fetched again (a request in flight must not
/// reach the server with a token that expires on the way).
pub(crate) const EARLY: Duration = Duration::from_secs(30);

/// How long a token whose answer gives no `expires_in` is kept.
const DEFAULT_LIFETIME: Duration = Duration::from_secs(300);

/// The most bytes of a token endpoint's answer read.
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// Fetched tokens, by credential ([`cache_key`]): each slot locked while it is fetched, so
/// concurrent requests wait for one fetch.
type Slot = Arc<tokio::sync::Mutex<Option<(String, Instant)>>>;
static TOKENS: LazyLock<Mutex<HashMap<String, Slot>>> = LazyLock::new(Mutex::default);

/// Where an MCP session's `Authorization: Bearer` token comes from.
pub(crate) enum Credentials {
    /// A fixed token.
    Fixed(String),
    /// Fetched with client credentials, through `http` (guarded for `token_url`).
    Client {
        token_url: Url,
        client_id: String,
        client_secret: String,
        scope: Option<String>,
        http: reqwest::Client,
        key: String,
    },
}

impl Credentials {
    /// The credentials of `auth`; the token endpoint must pass the network policy.
    pub(crate) fn new(auth: &McpAuth, clients: &GuardedClients) -> anyhow::Result<Self> {
        Ok(match auth {
            McpAuth::Bearer { token } => Self::Fixed(token.clone()),
            McpAuth::OauthClientCredentials {
                token_url,
                client_id,
                client_secret,
                scope,
            } => {
                let url = Url::parse(token_url).context("invalid OAuth token URL")?;
                let http = clients
                    .for_url(&url, true)
                    .context("the OAuth token endpoint")?
                    .clone();
                Self::Client {
                    key: cache_key(token_url, client_id, client_secret, scope.as_deref()),
                    token_url: url,
                    client_id: client_id.clone(),
                    client_secret: client_secret.clone(),
                    scope: scope.clone(),
                    http,
                }
            }
        })
    }

    /// The token to send now: the fixed one, or a cached one that is not about to expire, or
    /// one fetched now.
    pub(crate) async fn token(&self) -> anyhow::Result<String> {
        let key = match self {
            Self::Fixed(token) => return Ok(token.clone()),
            Self::Client { key, .. } => key,
        };
        let slot = {
            let mut tokens = TOKENS
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            // Forget credentials whose tokens expired and that nobody is fetching.
            tokens.retain(|_, slot| {
                Arc::strong_count(slot) > 1
                    || slot.try_lock().map_or(true, |held| {
                        held.as_ref().is_some_and(|(_, at)| *at > Instant::now())
                    })
            });
            Arc::clone(tokens.entry(key.clone()).or_default())
        };
        let mut held = slot.lock().await;
        if let Some((token, expires)) = held.as_ref()
            && Instant::now() + EARLY < *expires
        {
            return Ok(token.clone());
        }
        let (token, lifetime) = self.fetch().await?;
        *held = Some((token.clone(), Instant::now() + lifetime));
        Ok(token)
    }

    /// A new token from the token endpoint, and how long it lives.
    async fn fetch(&self) -> anyhow::Result<(String, Duration)> {
        let Self::Client {
            token_url,
            client_id,
            client_secret,
            scope,
            http,
            ..
        } = self
        else {
            anyhow::bail!("a fixed token is never fetched");
        };
        let form = {
            let mut form = form_urlencoded::Serializer::new(String::new());
            form.append_pair("grant_type", "client_credentials");
            if let Some(scope) = scope {
                form.append_pair("scope", scope);
            }
            form.finish()
        };
        // RFC 6749 section 2.3.1: the id and secret, form-encoded, as HTTP Basic credentials.
        let basic = base64::engine::general_purpose::STANDARD.encode(format!(
            "{}:{}",
            form_urlencoded::byte_serialize(client_id.as_bytes()).collect::<String>(),
            form_urlencoded::byte_serialize(client_secret.as_bytes()).collect::<String>()
        ));
        let response = http
            .post(token_url.clone())
            .header(reqwest::header::AUTHORIZATION, format!("Basic {basic}"))
            .header(reqwest::header::ACCEPT, "application/json")
            .header(
                reqwest::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .body(form)
            .send()
            .await
            .map_err(|err| {
                anyhow::anyhow!("the OAuth token request failed: {}", err.without_url())
            })?;
        let status = response.status();
        let body = read_limited(response).await?;
        let answer: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        if !status.is_success() {
            let code = answer["error"]
                .as_str()
                .filter(|c| c.len() <= 64 && c.chars().all(|c| c.is_ascii_graphic()))
                .unwrap_or("unknown");
            anyhow::bail!("the OAuth token endpoint answered {status} (error `{code}`)");
        }
        let token = answer["access_token"]
            .as_str()
            .filter(|t| !t.is_empty())
            .context("the OAuth token endpoint's answer has no `access_token`")?;
        let lifetime = answer["expires_in"]
            .as_u64()
            .or_else(|| answer["expires_in"].as_str().and_then(|s| s.parse().ok()))
            .map_or(DEFAULT_LIFETIME, Duration::from_secs);
        Ok((token.to_owned(), lifetime))
    }
}

/// At most [`MAX_ANSWER_BYTES`] of a response's body.
async fn read_limited(mut response: reqwest::Response) -> anyhow::Result<Vec<u8>> {
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|err| anyhow::anyhow!("reading the OAuth token answer: {}", err.without_url()))?
    {
        body.extend_from_slice(&chunk);
        anyhow::ensure!(
            body.len() <= MAX_ANSWER_BYTES,
            "the OAuth token answer is over {MAX_ANSWER_BYTES} bytes"
        );
    }
    Ok(body)
}

/// The cache key of a credential: a hash, so the secret is not kept in clear as a key.
fn cache_key(token_url: &str, client_id: &str, secret: &str, scope: Option<&str>) -> String {
    let mut hash = sha2::Sha256::new();
    for part in [token_url, client_id, secret, scope.unwrap_or("\u{0}")] {
        hash.update(part.len().to_le_bytes());
        hash.update(part.as_bytes());
    }
    hex::encode(hash.finalize())
}
