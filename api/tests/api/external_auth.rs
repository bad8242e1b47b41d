//! Tokens of an external identity provider: a JWKS served by a loopback server with keys
//! generated here (RSA, P-256, Ed25519), tokens signed with them as a provider would. Valid
//! ones act as their user; every bad one is a 401 with a code and changes nothing.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{self, KeyPair as _};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use spool_api::auth::{ExternalAuth, ExternalSettings, JwtKeys};
use spool_tests::{JWT_SECRET, poll_until};

use crate::common::{TestApp, worker_args};

const ISSUER: &str = "https://idp.example.com/";
const AUDIENCE: &str = "https://spool.example.com";

/// A provider's key: what it signs with, and its public JWK.
enum Key {
    Rsa(signature::RsaKeyPair),
    Ec(signature::EcdsaKeyPair),
    Ed(signature::Ed25519KeyPair),
}

impl Key {
    fn rsa() -> Self {
        Self::Rsa(
            signature::RsaKeyPair::generate(aws_lc_rs::rsa::KeySize::Rsa2048).expect("rsa key"),
        )
    }

    fn ec() -> Self {
        let alg = &signature::ECDSA_P256_SHA256_FIXED_SIGNING;
        Self::Ec(signature::EcdsaKeyPair::generate(alg).expect("p-256 key"))
    }

    fn ed() -> Self {
        Self::Ed(signature::Ed25519KeyPair::generate().expect("ed25519 key"))
    }

    fn alg(&self) -> &'static str {
        match self {
            Self::Rsa(_) => "RS256",
            Self::Ec(_) => "ES256",
            Self::Ed(_) => "EdDSA",
        }
    }

    fn jwk(&self, kid: &str) -> Value {
        match self {
            Self::Rsa(pair) => {
                let public = pair.public_key();
                json!({"kty": "RSA", "kid": kid, "use": "sig",
                    "n": B64.encode(public.modulus().big_endian_without_leading_zero()),
                    "e": B64.encode(public.exponent().big_endian_without_leading_zero())})
            }
            Self::Ec(pair) => {
                // Uncompressed point: 0x04 || x || y.
                let point = pair.public_key().as_ref();
                json!({"kty": "EC", "crv": "P-256", "kid": kid,
                    "x": B64.encode(&point[1..33]), "y": B64.encode(&point[33..65])})
            }
            Self::Ed(pair) => json!({"kty": "OKP", "crv": "Ed25519", "kid": kid,
                "x": B64.encode(pair.public_key().as_ref())}),
        }
    }

    fn public_der(&self) -> Vec<u8> {
        match self {
            Self::Rsa(pair) => pair.public_key().as_ref().to_vec(),
            Self::Ec(pair) => pair.public_key().as_ref().to_vec(),
            Self::Ed(pair) => pair.public_key().as_ref().to_vec(),
        }
    }

    fn sign(&self, message: &[u8]) -> Vec<u8> {
        match self {
            Self::Rsa(pair) => {
                let mut out = vec![0; pair.public_modulus_len()];
                pair.sign(
                    &signature::RSA_PKCS1_SHA256,
                    &SystemRandom::new(),
                    message,
                    &mut out,
                )
                .expect("rsa sign");
                out
            }
            Self::Ec(pair) => pair
                .sign(&SystemRandom::new(), message)
                .expect("ec sign")
                .as_ref()
                .to_vec(),
            Self::Ed(pair) => pair.sign(message).as_ref().to_vec(),
        }
    }
}

/// A compact JWT of `header` and `claims`, signed by `key` (unsigned when `None`).
fn jwt(header: &Value, claims: &Value, key: Option<&Key>) -> String {
    let input = format!(
        "{}.{}",
        B64.encode(header.to_string()),
        B64.encode(claims.to_string())
    );
    let signature = key.map(|k| k.sign(input.as_bytes())).unwrap_or_default();
    format!("{input}.{}", B64.encode(signature))
}

fn claims(sub: &str, exp_in: i64) -> Value {
    let now = chrono::Utc::now().timestamp();
    json!({"iss": ISSUER, "aud": AUDIENCE, "sub": sub, "tenant": "acme",
        "iat": now, "exp": now + exp_in})
}

/// A provider's token of `key` named `kid`.
fn token(key: &Key, kid: &str, claims: &Value) -> String {
    jwt(
        &json!({"alg": key.alg(), "kid": kid, "typ": "JWT"}),
        claims,
        Some(key),
    )
}

/// The provider's JWKS endpoint: its key set (changeable) and how often it was fetched.
struct Provider {
    keys: Arc<Mutex<Value>>,
    fetches: Arc<AtomicUsize>,
    url: String,
}

impl Provider {
    async fn start(keys: Value) -> Self {
        let keys = Arc::new(Mutex::new(keys));
        let fetches = Arc::new(AtomicUsize::new(0));
        let (served, counted) = (keys.clone(), fetches.clone());
        let app = axum::Router::new().route(
            "/jwks",
            axum::routing::get(move || {
                counted.fetch_add(1, Ordering::SeqCst);
                let set = served
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone();
                async move { axum::Json(set) }
            }),
        );
        let base = spool_tests::serve(app).await;
        Self {
            keys,
            fetches,
            url: format!("{base}/jwks"),
        }
    }

    fn publish(&self, keys: Value) {
        *self.keys.lock().unwrap_or_else(PoisonError::into_inner) = keys;
    }

    fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }
}

/// The API accepting tokens of the provider at `url`, refetching at most every `refetch`.
async fn app(url: &str, refetch: Duration) -> TestApp {
    let settings = ExternalSettings {
        jwks_url: url.parse().expect("url"),
        issuer: ISSUER.to_owned(),
        audience: AUDIENCE.to_owned(),
        tenant_claim: "tenant".to_owned(),
        permissions_claim: "permissions".to_owned(),
    };
    let external = ExternalAuth::with_refetch_interval(settings, refetch).expect("external");
    let jwt = JwtKeys::new(&JWT_SECRET.to_owned().into()).with_external(external);
    TestApp::start_with_jwt(0, worker_args(1, 0), 3600, jwt).await
}

/// The status and error code of `GET /v1/threads` with `token`.
async fn list(app: &TestApp, token: &str) -> (StatusCode, Value) {
    let (status, body) = app.get(token, "/v1/threads").await;
    (status, body["error"]["code"].clone())
}

#[tokio::test]
async fn rs256_es256_and_eddsa_tokens_of_the_provider_act_as_their_user_beside_hs256_ones() {
    let (rsa, ec, ed) = (Key::rsa(), Key::ec(), Key::ed());
    let set = json!({"keys": [rsa.jwk("r1"), ec.jwk("e1"), ed.jwk("o1")]});
    let provider = Provider::start(set).await;
    let app = app(&provider.url, Duration::from_secs(30)).await;
    for (key, kid) in [(&rsa, "r1"), (&ec, "e1"), (&ed, "o1")] {
        let token = token(key, kid, &claims("alice", 300));
        let thread = Uuid::new_v4();
        let (status, _) = app.send_message(&token, thread, "hi").await;
        assert_eq!(status, StatusCode::ACCEPTED, "{}", key.alg());
        // The thread is alice's of acme, whoever signed her token.
        let (status, _) = app
            .get(
                &spool_tests::token("alice", "acme"),
                &format!("/v1/threads/{thread}"),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{}", key.alg());
    }
    // 30 s of clock skew on `exp` is tolerated.
    assert_eq!(
        list(&app, &token(&ed, "o1", &claims("alice", -30))).await.0,
        StatusCode::OK
    );
    assert_eq!(
        list(&app, &spool_tests::token("bob", "acme")).await.0,
        StatusCode::OK
    );
    assert_eq!(provider.fetches(), 1, "the keys are cached");

    // `admin` among the permissions (a list, or a space-separated `scope`) is an admin.
    let mut admin = claims("carol", 300);
    admin["permissions"] = json!("openid admin");
    let (status, _) = app.get(&token(&rsa, "r1", &admin), "/v1/usage").await;
    assert_eq!(status, StatusCode::OK);
    admin["permissions"] = json!(["runs:create"]);
    let (status, body) = app.get(&token(&rsa, "r1", &admin), "/v1/usage").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    app.stop().await;
}

#[tokio::test]
async fn bad_provider_tokens_are_401_with_a_code_and_change_nothing() {
    let (rsa, ed) = (Key::rsa(), Key::ed());
    let provider = Provider::start(json!({"keys": [rsa.jwk("r1"), ed.jwk("o1")]})).await;
    let app = app(&provider.url, Duration::from_secs(30)).await;
    let good = claims("alice", 300);
    let with = |field: &str, value: Value| {
        let mut claims = good.clone();
        claims[field] = value;
        claims
    };
    // The RSA public key (DER), which anyone can fetch from the JWKS.
    let rsa_public_der = rsa.public_der();
    let hs256_over_public = jsonwebtoken::encode(
        &{
            let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
            header.kid = Some("r1".to_owned());
            header
        },
        &good,
        &jsonwebtoken::EncodingKey::from_secret(&rsa_public_der),
    )
    .expect("sign");
    let cases = [
        (
            "expired",
            token(&rsa, "r1", &claims("alice", -120)),
            "token_expired",
        ),
        (
            "wrong issuer",
            token(&rsa, "r1", &with("iss", json!("https://evil/"))),
            "invalid_token",
        ),
        (
            "wrong audience",
            token(&rsa, "r1", &with("aud", json!("other"))),
            "invalid_token",
        ),
        (
            "no tenant",
            token(&rsa, "r1", &with("tenant", Value::Null)),
            "invalid_token",
        ),
        (
            "alg none",
            jwt(&json!({"alg": "none", "kid": "r1"}), &good, None),
            "invalid_token",
        ),
        (
            "HS256 over the public key",
            hs256_over_public,
            "invalid_token",
        ),
        // The Ed25519 key's kid, signed by it, but the header claims ES256.
        (
            "alg of another key",
            jwt(&json!({"alg": "ES256", "kid": "o1"}), &good, Some(&ed)),
            "invalid_token",
        ),
        (
            "signed by another key",
            token(&Key::rsa(), "r1", &good),
            "invalid_token",
        ),
        ("unknown kid", token(&rsa, "r9", &good), "invalid_token"),
    ];
    for (what, bad, code) in cases {
        let (status, body) = app
            .post(
                &bad,
                &format!("/v1/threads/{}/user_message", Uuid::new_v4()),
                &json!({"input_text": "hi"}),
            )
            .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{what}: {body}");
        assert_eq!(body["error"]["code"], code, "{what}");
    }
    for table in ["threads", "messages", "runs"] {
        assert_eq!(app.db.count(table).await, 0, "{table} must be empty");
    }
    // Unknown kids fetched the set once (the first token), not once each: at most every 30 s.
    assert_eq!(provider.fetches(), 1);
    app.stop().await;
}

#[tokio::test]
async fn a_new_kid_is_fetched_and_a_provider_that_is_down_lets_nothing_in() {
    let (old, new) = (Key::rsa(), Key::ec());
    let provider = Provider::start(json!({"keys": [old.jwk("k1")]})).await;
    let app = app(&provider.url, Duration::from_millis(200)).await;
    assert_eq!(
        list(&app, &token(&old, "k1", &claims("alice", 300)))
            .await
            .0,
        StatusCode::OK
    );
    // Rotation: the provider publishes a new key; its tokens are accepted once fetched.
    provider.publish(json!({"keys": [old.jwk("k1"), new.jwk("k2")]}));
    let rotated = token(&new, "k2", &claims("alice", 300));
    poll_until(
        "the new key to be fetched",
        Duration::from_secs(10),
        || async { (list(&app, &rotated).await.0 == StatusCode::OK).then_some(()) },
    )
    .await;

    // A provider that is down: nothing unverified gets in.
    let down = app_with_down_provider().await;
    let (status, code) = list(&down, &token(&old, "k1", &claims("alice", 300))).await;
    assert_eq!(
        (status, code),
        (StatusCode::UNAUTHORIZED, json!("invalid_token"))
    );
    app.stop().await;
    down.stop().await;
}

/// The API with a provider whose JWKS URL answers 500.
async fn app_with_down_provider() -> TestApp {
    let broken = axum::Router::new().route(
        "/jwks",
        axum::routing::get(|| async { StatusCode::INTERNAL_SERVER_ERROR }),
    );
    let base = spool_tests::serve(broken).await;
    app(&format!("{base}/jwks"), Duration::ZERO).await
}
