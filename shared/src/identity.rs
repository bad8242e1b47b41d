//! The keys of `X-Spool-Identity`, the token every tool, MCP and hook call carries to prove
//! which user of which tenant a run acts for (DESIGN section 13, review finding B-H2).
//!
//! The token is an EdDSA (Ed25519) JWT so that a tool verifies it with a *public* key, from
//! the API's `GET /.well-known/jwks.json`: holding what verifies a token no longer lets a tool
//! mint one for another user or another tool, as the shared HS256 secret did.
//!
//! What must stay true:
//! - Every process (API, workers) computes the same keys from the same settings: the worker
//!   signs, the API publishes. So the key is `SPOOL_IDENTITY_KEY`, or, unset, derived from
//!   `SPOOL_JWT_SECRET` by HKDF-SHA256, never random per process.
//! - The identity key is never the API's HS256 secret (start refused): a tool that learnt it
//!   could otherwise sign API tokens.
//! - `kid` is the key's RFC 7638 thumbprint, so it is the same on every process and changes
//!   with the key; retired keys (`SPOOL_IDENTITY_KEYS_RETIRED`) stay published so tokens signed
//!   just before a rotation keep verifying.
//! - Error messages name the setting, never the key.

use anyhow::Context as _;
use aws_lc_rs::signature::{Ed25519KeyPair, KeyPair as _};
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use secrecy::{ExposeSecret as _, SecretString};
use serde::Serialize;

/// The JOSE `typ` of identity tokens; the API refuses a bearer token that carries it.
pub const IDENTITY_TYP: &str = "spool-identity+jwt";
/// The `iss` of identity tokens.
pub const IDENTITY_ISSUER: &str = "spool";
/// The HS256 secret used when `SPOOL_JWT_SECRET` is unset: fine on a laptop, refused by the
/// API on a public address.
pub const DEV_JWT_SECRET: &str = "spool-insecure-development-secret";
/// The shortest `SPOOL_JWT_SECRET`: HS256 wants a key of at least 256 bits (RFC 7518, 3.2).
pub const MIN_JWT_SECRET_BYTES: usize = crate::config::MIN_SECRET_BYTES;

/// HKDF salt and info of the derived key: versioned, so a future derivation cannot collide.
const HKDF_SALT: &[u8] = b"spool identity key v1";
const HKDF_INFO: &[u8] = b"ed25519 seed";

/// `SPOOL_JWT_SECRET` checked ([`crate::config::check_signing_secret`]: long enough, not the
/// example's placeholder, not one character repeated), else the development secret (`true`).
pub fn jwt_secret_or_dev(secret: Option<&SecretString>) -> anyhow::Result<(SecretString, bool)> {
    match secret {
        Some(secret) => {
            crate::config::check_signing_secret("SPOOL_JWT_SECRET", secret.expose_secret())?;
            Ok((secret.clone(), false))
        }
        None => Ok((SecretString::from(DEV_JWT_SECRET.to_owned()), true)),
    }
}

/// One Ed25519 public key, as published.
#[derive(Clone, Debug, PartialEq, Eq)]
struct PublicKey {
    kid: String,
    x: Vec<u8>,
}

impl PublicKey {
    fn of(pair: &Ed25519KeyPair) -> Self {
        let x = pair.public_key().as_ref().to_vec();
        Self {
            kid: thumbprint(&x),
            x,
        }
    }

    fn jwk(&self) -> Jwk {
        Jwk {
            kty: "OKP",
            crv: "Ed25519",
            alg: "EdDSA",
            key_use: "sig",
            kid: self.kid.clone(),
            x: URL_SAFE_NO_PAD.encode(&self.x),
        }
    }
}

/// The RFC 7638 thumbprint of an Ed25519 public key: the same on every process, new with a key.
fn thumbprint(x: &[u8]) -> String {
    let canonical = format!(
        r#"{{"crv":"Ed25519","kty":"OKP","x":"{}"}}"#,
        URL_SAFE_NO_PAD.encode(x)
    );
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, canonical.as_bytes());
    URL_SAFE_NO_PAD.encode(digest.as_ref())
}

/// One key of a JSON Web Key Set: an Ed25519 public key (RFC 8037).
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct Jwk {
    /// `OKP`.
    #[schema(example = "OKP")]
    pub kty: &'static str,
    /// `Ed25519`.
    #[schema(example = "Ed25519")]
    pub crv: &'static str,
    /// `EdDSA`.
    #[schema(example = "EdDSA")]
    pub alg: &'static str,
    /// `sig`.
    #[serde(rename = "use")]
    #[schema(example = "sig")]
    pub key_use: &'static str,
    /// The key's id: the `kid` of the tokens it verifies (its RFC 7638 thumbprint).
    pub kid: String,
    /// The public key, base64url.
    pub x: String,
}

/// `GET /.well-known/jwks.json`: the keys that verify `X-Spool-Identity`.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct Jwks {
    /// The current key first, then the retired ones still accepted.
    pub keys: Vec<Jwk>,
}

/// The identity keys of a process: the one that signs and the retired ones still published.
pub struct IdentityKeys {
    /// PKCS#8 v2 DER of the signing key, as `jsonwebtoken` takes it.
    pkcs8: Vec<u8>,
    current: PublicKey,
    retired: Vec<PublicKey>,
}

impl std::fmt::Debug for IdentityKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdentityKeys")
            .field("kid", &self.current.kid)
            .finish_non_exhaustive()
    }
}

impl IdentityKeys {
    /// The keys of these settings: `key` (`SPOOL_IDENTITY_KEY`) or, unset or empty, one derived
    /// from `jwt_secret`; `retired` (`SPOOL_IDENTITY_KEYS_RETIRED`, comma-separated). Refused
    /// when `key` is the JWT secret.
    pub fn new(
        jwt_secret: &SecretString,
        key: Option<&SecretString>,
        retired: Option<&SecretString>,
    ) -> anyhow::Result<Self> {
        let key = key
            .map(|k| k.expose_secret().trim())
            .filter(|k| !k.is_empty());
        let pair = match key {
            Some(key) => {
                anyhow::ensure!(
                    key != jwt_secret.expose_secret().trim(),
                    "SPOOL_IDENTITY_KEY equals SPOOL_JWT_SECRET: a tool that verifies identity \
                     tokens could then sign API tokens; give each its own value"
                );
                parse_key(key).context("SPOOL_IDENTITY_KEY")?
            }
            None => derive(jwt_secret.expose_secret().as_bytes())?,
        };
        let current = PublicKey::of(&pair);
        let mut retired_keys: Vec<PublicKey> = Vec::new();
        let retired = retired.map(|r| r.expose_secret().to_owned());
        for (index, text) in retired.iter().flat_map(|r| r.split(',')).enumerate() {
            let text = text.trim();
            if text.is_empty() {
                continue;
            }
            let public =
                PublicKey::of(&parse_key(text).with_context(|| {
                    format!("SPOOL_IDENTITY_KEYS_RETIRED, entry {}", index + 1)
                })?);
            if public != current && !retired_keys.contains(&public) {
                retired_keys.push(public);
            }
        }
        let pkcs8 = pair
            .to_pkcs8()
            .map_err(|_| anyhow::anyhow!("encoding the identity key failed"))?
            .as_ref()
            .to_vec();
        Ok(Self {
            pkcs8,
            current,
            retired: retired_keys,
        })
    }

    /// The `kid` of the signing key.
    pub fn kid(&self) -> &str {
        &self.current.kid
    }

    /// The signing key as `jsonwebtoken` takes it.
    pub fn encoding_key(&self) -> jsonwebtoken::EncodingKey {
        jsonwebtoken::EncodingKey::from_ed_der(&self.pkcs8)
    }

    /// The JOSE header of a token signed now.
    pub fn header(&self) -> jsonwebtoken::Header {
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::EdDSA);
        header.typ = Some(IDENTITY_TYP.to_owned());
        header.kid = Some(self.current.kid.clone());
        header
    }

    /// The published keys: the current one, then the retired ones.
    pub fn jwks(&self) -> Jwks {
        Jwks {
            keys: std::iter::once(&self.current)
                .chain(&self.retired)
                .map(PublicKey::jwk)
                .collect(),
        }
    }
}

/// A key given as PKCS#8 PEM or as a 32-byte seed in base64url (padded or not).
fn parse_key(text: &str) -> anyhow::Result<Ed25519KeyPair> {
    if text.starts_with("-----BEGIN") {
        let body: String = text
            .lines()
            .map(str::trim)
            .filter(|line| !line.starts_with("-----"))
            .collect();
        let der = STANDARD
            .decode(body)
            .map_err(|_| anyhow::anyhow!("the PEM body is not base64"))?;
        return Ed25519KeyPair::from_pkcs8(&der)
            .map_err(|err| anyhow::anyhow!("not an Ed25519 PKCS#8 private key ({err})"));
    }
    let seed = URL_SAFE_NO_PAD
        .decode(text.trim_end_matches('='))
        .map_err(|_| anyhow::anyhow!("neither a PKCS#8 PEM nor a base64url seed"))?;
    anyhow::ensure!(
        seed.len() == 32,
        "an Ed25519 seed is 32 bytes, this one is {} (generate one with \
         `openssl rand 32 | basenc --base64url`)",
        seed.len()
    );
    Ed25519KeyPair::from_seed_unchecked(&seed)
        .map_err(|err| anyhow::anyhow!("not an Ed25519 seed ({err})"))
}

/// The key derived from the JWT secret: HKDF-SHA256, so every process with the secret agrees
/// and the secret cannot be recovered from the key.
fn derive(secret: &[u8]) -> anyhow::Result<Ed25519KeyPair> {
    struct Len;
    impl aws_lc_rs::hkdf::KeyType for Len {
        fn len(&self) -> usize {
            32
        }
    }
    let salt = aws_lc_rs::hkdf::Salt::new(aws_lc_rs::hkdf::HKDF_SHA256, HKDF_SALT);
    let mut seed = [0_u8; 32];
    salt.extract(secret)
        .expand(&[HKDF_INFO], Len)
        .and_then(|okm| okm.fill(&mut seed))
        .map_err(|_| anyhow::anyhow!("deriving the identity key failed"))?;
    Ed25519KeyPair::from_seed_unchecked(&seed)
        .map_err(|err| anyhow::anyhow!("deriving the identity key failed ({err})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(text: &str) -> SecretString {
        SecretString::from(text.to_owned())
    }

    const JWT: &str = "a-jwt-secret-of-at-least-32-bytes-long";
    /// A fixed seed, base64url: 32 bytes of 0x01.
    const SEED: &str = "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE";

    #[test]
    fn the_derived_key_is_the_same_everywhere_and_differs_per_secret() -> anyhow::Result<()> {
        let a = IdentityKeys::new(&secret(JWT), None, None)?;
        let b = IdentityKeys::new(&secret(JWT), Some(&secret("  ")), None)?;
        let other = IdentityKeys::new(&secret(&format!("{JWT}!")), None, None)?;
        assert_eq!(a.kid(), b.kid());
        assert_ne!(a.kid(), other.kid());
        assert_eq!(a.jwks().keys.len(), 1);
        Ok(())
    }

    #[test]
    fn a_seed_and_its_pkcs8_pem_are_the_same_key_and_retired_keys_stay_published()
    -> anyhow::Result<()> {
        let seeded = IdentityKeys::new(&secret(JWT), Some(&secret(SEED)), None)?;
        let pair = Ed25519KeyPair::from_seed_unchecked(&[1_u8; 32])?;
        let pem = format!(
            "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
            STANDARD.encode(pair.to_pkcs8v1()?.as_ref())
        );
        let from_pem = IdentityKeys::new(&secret(JWT), Some(&secret(&pem)), None)?;
        assert_eq!(seeded.kid(), from_pem.kid());
        let derived = IdentityKeys::new(&secret(JWT), None, None)?;
        let retired = format!("{SEED}, ,{pem}");
        let rotated = IdentityKeys::new(&secret(JWT), None, Some(&secret(&retired)))?;
        let kids: Vec<_> = rotated.jwks().keys.into_iter().map(|k| k.kid).collect();
        assert_eq!(
            kids,
            [derived.kid(), seeded.kid()],
            "current first, no duplicates"
        );
        Ok(())
    }

    #[test]
    fn bad_keys_and_a_key_equal_to_the_jwt_secret_are_refused_naming_the_setting() {
        let equal = secret(SEED);
        let err = IdentityKeys::new(&equal, Some(&equal), None).expect_err("refused");
        assert!(err.to_string().contains("SPOOL_JWT_SECRET"), "{err}");
        for bad in [
            "not base64!",
            "AQID",
            "-----BEGIN PRIVATE KEY-----\nAQID\n-----END",
        ] {
            let err = IdentityKeys::new(&secret(JWT), Some(&secret(bad)), None)
                .expect_err(bad)
                .to_string();
            assert!(
                err.contains("SPOOL_IDENTITY_KEY") && !err.contains(bad),
                "{err}"
            );
            let err = IdentityKeys::new(&secret(JWT), None, Some(&secret(bad)))
                .expect_err(bad)
                .to_string();
            assert!(err.contains("SPOOL_IDENTITY_KEYS_RETIRED"), "{err}");
        }
    }
}
