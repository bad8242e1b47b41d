//! Narrow tokens the API mints for browsers (DESIGN section 13): stream tokens
//! ([`super::stream_token`], one thread's stream for 5 minutes) and public sessions
//! ([`super::public`], one agent's anonymous user for an hour).
//!
//! They are HS256 JWTs, but signed with a key derived from `SPOOL_JWT_SECRET` (SHA-256 over a
//! label and the secret), never with the secret itself, and their JOSE header names their kind
//! (`typ`). So a scoped token can never verify as an ordinary bearer token even if a check were
//! forgotten (the signature would not match), and the ordinary verification refuses it by its
//! `typ` first, with a code saying what it is ([`refuse_scoped`]).

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest as _, Sha256};

use crate::error::ApiError;

use super::unauthorized;

/// The JOSE `typ` of a stream token.
pub const STREAM_TYP: &str = "spool-stream+jwt";
/// The JOSE `typ` of a public session's token.
pub const SESSION_TYP: &str = "spool-session+jwt";

/// The kinds of scoped token, by their `typ`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// One thread's stream.
    Stream,
    /// A public agent's anonymous user.
    Session,
}

impl Kind {
    fn typ(self) -> &'static str {
        match self {
            Self::Stream => STREAM_TYP,
            Self::Session => SESSION_TYP,
        }
    }

    /// The kind a token's header names, if it is a scoped token (`None` for anything else,
    /// malformed tokens included: the ordinary verification answers those).
    pub fn of(token: &str) -> Option<Self> {
        let header = jsonwebtoken::decode_header(token).ok()?;
        match header.typ.as_deref() {
            Some(STREAM_TYP) => Some(Self::Stream),
            Some(SESSION_TYP) => Some(Self::Session),
            _ => None,
        }
    }
}

/// The signing key of scoped tokens.
#[derive(Clone)]
pub struct ScopedKeys {
    encoding: EncodingKey,
    decoding: DecodingKey,
}

impl std::fmt::Debug for ScopedKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ScopedKeys(..)")
    }
}

impl ScopedKeys {
    /// The key derived from the JWT secret's bytes.
    pub fn new(secret: &[u8]) -> Self {
        let mut hash = Sha256::new();
        hash.update(b"spool scoped tokens v1\0");
        hash.update(secret);
        let key = hash.finalize();
        Self {
            encoding: EncodingKey::from_secret(&key),
            decoding: DecodingKey::from_secret(&key),
        }
    }

    /// Signs `claims` as a token of `kind`.
    pub fn sign(&self, kind: Kind, claims: &impl Serialize) -> anyhow::Result<String> {
        let mut header = Header::new(Algorithm::HS256);
        header.typ = Some(kind.typ().to_owned());
        Ok(jsonwebtoken::encode(&header, claims, &self.encoding)?)
    }

    /// Verifies a token of `kind` (its `typ`, signature and `exp`, without leeway). A refusal
    /// is logged with its reason, never with the token.
    pub fn verify<C: DeserializeOwned>(&self, kind: Kind, token: &str) -> Result<C, ApiError> {
        let result = self.check(kind, token);
        if let Err(ApiError::Unauthorized { code, message }) = &result {
            tracing::info!(auth.code = code, reason = %message, "scoped token refused");
        }
        result
    }

    fn check<C: DeserializeOwned>(&self, kind: Kind, token: &str) -> Result<C, ApiError> {
        if Kind::of(token) != Some(kind) {
            return Err(unauthorized("invalid_token", "not a token of this kind"));
        }
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_required_spec_claims(&["exp", "sub"]);
        validation.leeway = 0;
        jsonwebtoken::decode::<C>(token, &self.decoding, &validation)
            .map(|data| data.claims)
            .map_err(|err| match err.kind() {
                ErrorKind::ExpiredSignature => {
                    unauthorized("token_expired", "the token has expired")
                }
                _ => unauthorized("invalid_token", &format!("the token is not valid: {err}")),
            })
    }
}

/// Refuses a scoped token where an ordinary bearer token is expected: 401
/// `stream_token_refused` or `session_token_refused`.
pub(super) fn refuse_scoped(header: &Header) -> Result<(), ApiError> {
    match header.typ.as_deref() {
        Some(STREAM_TYP) => Err(unauthorized(
            "stream_token_refused",
            "a stream token is valid only for its thread's stream",
        )),
        Some(SESSION_TYP) => Err(unauthorized(
            "session_token_refused",
            "a public session's token is valid only for its threads, messages, streams and cancel",
        )),
        _ => Ok(()),
    }
}

/// Seconds since the epoch.
pub(crate) fn now() -> u64 {
    u64::try_from(chrono::Utc::now().timestamp()).unwrap_or_default()
}
