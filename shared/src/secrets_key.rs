//! The operator's key for secrets stored at rest (`SPOOL_SECRETS_KEY`, DESIGN section 12): a
//! tenant provider's `api_key` is sealed with it (AES-256-GCM) before it reaches Postgres, and
//! opened only by the worker that calls the provider.
//!
//! What must stay true:
//! - The key is 32 bytes given as 64 hex characters; anything else is refused, naming the
//!   variable and never the value.
//! - A sealed secret records the version of the key that sealed it (a short fingerprint of the
//!   key, not a counter an operator must keep): after a rotation the former key stays in
//!   `SPOOL_SECRETS_KEYS_RETIRED` and what it sealed still opens, while new writes use the
//!   current key.
//! - Each secret is bound to where it belongs (its associated data, e.g. the tenant and the
//!   provider id), so a sealed value copied to another row does not open there.
//! - A fresh random 96-bit nonce per seal (a key seals far fewer than 2^32 secrets).

use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};

/// Bytes of a key.
pub const KEY_LEN: usize = 32;

/// A secret as stored: the ciphertext (tag included), its nonce and the version of the key
/// that sealed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sealed {
    /// AES-256-GCM output: the ciphertext followed by the 16-byte tag.
    pub ciphertext: Vec<u8>,
    /// The 12-byte nonce.
    pub nonce: Vec<u8>,
    /// The version (fingerprint) of the key that sealed it.
    pub key_version: String,
}

/// Why a sealed secret did not open.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// No configured key has the version that sealed it.
    #[error(
        "the secret was sealed with key version {0}, which is neither SPOOL_SECRETS_KEY nor in \
         SPOOL_SECRETS_KEYS_RETIRED"
    )]
    UnknownKey(String),
    /// The ciphertext, nonce or associated data do not match (tampered, or another row's).
    #[error("the secret does not open with its key (altered, or stored for another resource)")]
    Corrupt,
}

/// One key and its version.
struct Key {
    version: String,
    key: LessSafeKey,
}

impl Key {
    fn parse(hex_text: &str, variable: &str) -> Result<Self, String> {
        let hex_text = hex_text.trim();
        let bytes = hex::decode(hex_text)
            .ok()
            .filter(|b| b.len() == KEY_LEN)
            .ok_or_else(|| {
                format!(
                    "{variable} must be {KEY_LEN} bytes as {} hex characters (e.g. the output of \
                     `openssl rand -hex 32`)",
                    KEY_LEN * 2
                )
            })?;
        let mut fingerprint = b"spool-secrets-key\0".to_vec();
        fingerprint.extend_from_slice(&bytes);
        let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, &fingerprint);
        let version = hex::encode(&digest.as_ref()[..6]);
        let key = UnboundKey::new(&AES_256_GCM, &bytes)
            .map_err(|_| format!("{variable}: the key was refused by AES-256-GCM"))?;
        Ok(Self {
            version,
            key: LessSafeKey::new(key),
        })
    }
}

/// The current key and the retired ones that still open what they sealed.
pub struct SecretsKeys {
    current: Key,
    retired: Vec<Key>,
}

impl std::fmt::Debug for SecretsKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The versions only: never the keys.
        f.debug_struct("SecretsKeys")
            .field("current", &self.current.version)
            .field(
                "retired",
                &self.retired.iter().map(|k| &k.version).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl SecretsKeys {
    /// `SPOOL_SECRETS_KEY` and `SPOOL_SECRETS_KEYS_RETIRED` (comma-separated, may be empty);
    /// the error names the variable and what is wrong, never the value.
    pub fn parse(current: &str, retired: &str) -> Result<Self, String> {
        let current = Key::parse(current, "SPOOL_SECRETS_KEY")?;
        let retired = retired
            .split(',')
            .map(str::trim)
            .filter(|k| !k.is_empty())
            .enumerate()
            .map(|(i, k)| Key::parse(k, &format!("SPOOL_SECRETS_KEYS_RETIRED[{i}]")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { current, retired })
    }

    /// The version new secrets are sealed with.
    pub fn current_version(&self) -> &str {
        &self.current.version
    }

    /// Whether a secret sealed with `version` opens with these keys.
    pub fn knows(&self, version: &str) -> bool {
        std::iter::once(&self.current)
            .chain(&self.retired)
            .any(|k| k.version == version)
    }

    /// Seals `secret` with the current key, bound to `bound_to`.
    pub fn seal(&self, secret: &str, bound_to: &str) -> Sealed {
        let mut nonce = [0u8; NONCE_LEN];
        aws_lc_rs::rand::fill(&mut nonce).expect("the system random source");
        let mut buffer = secret.as_bytes().to_vec();
        self.current
            .key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(bound_to.as_bytes()),
                &mut buffer,
            )
            .expect("AES-256-GCM seals any buffer under 64 GiB");
        Sealed {
            ciphertext: buffer,
            nonce: nonce.to_vec(),
            key_version: self.current.version.clone(),
        }
    }

    /// Opens `sealed`, which must have been sealed bound to `bound_to`.
    pub fn open(&self, sealed: &Sealed, bound_to: &str) -> Result<String, OpenError> {
        let key = std::iter::once(&self.current)
            .chain(&self.retired)
            .find(|k| k.version == sealed.key_version)
            .ok_or_else(|| OpenError::UnknownKey(sealed.key_version.clone()))?;
        let nonce =
            <[u8; NONCE_LEN]>::try_from(sealed.nonce.as_slice()).map_err(|_| OpenError::Corrupt)?;
        let mut buffer = sealed.ciphertext.clone();
        let plain = key
            .key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(bound_to.as_bytes()),
                &mut buffer,
            )
            .map_err(|_| OpenError::Corrupt)?;
        String::from_utf8(plain.to_vec()).map_err(|_| OpenError::Corrupt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
    const B: &str = "1f1e1d1c1b1a191817161514131211100f0e0d0c0b0a09080706050403020100";

    #[test]
    fn a_sealed_secret_opens_only_with_its_key_and_binding() {
        let keys = SecretsKeys::parse(A, "").expect("key");
        let sealed = keys.seal("sk-live-123", "acme/p1");
        assert_ne!(sealed.ciphertext, b"sk-live-123");
        assert_eq!(keys.open(&sealed, "acme/p1").expect("opens"), "sk-live-123");
        assert!(matches!(
            keys.open(&sealed, "other/p1"),
            Err(OpenError::Corrupt)
        ));
        // Rotated: the former key is retired, its secrets still open, new ones use the new key.
        let rotated = SecretsKeys::parse(B, A).expect("keys");
        assert_eq!(
            rotated.open(&sealed, "acme/p1").expect("opens"),
            "sk-live-123"
        );
        assert_ne!(rotated.current_version(), sealed.key_version);
        assert!(rotated.knows(&sealed.key_version));
        let without = SecretsKeys::parse(B, "").expect("key");
        assert!(matches!(
            without.open(&sealed, "acme/p1"),
            Err(OpenError::UnknownKey(_))
        ));
    }

    #[test]
    fn a_short_or_non_hex_key_is_refused_without_showing_it() {
        for bad in ["", "abcd", &A[..62], &format!("{}zz", &A[..62])] {
            let err = SecretsKeys::parse(bad, "").expect_err(bad);
            assert!(err.starts_with("SPOOL_SECRETS_KEY must be"), "{err}");
            assert!(bad.is_empty() || !err.contains(bad), "{err}");
        }
        let err = SecretsKeys::parse(A, "nope").expect_err("retired");
        assert!(err.contains("SPOOL_SECRETS_KEYS_RETIRED[0]"), "{err}");
    }
}
