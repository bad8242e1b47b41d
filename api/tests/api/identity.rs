//! Identity tokens (`X-Spool-Identity`) from the API's side: it publishes the public keys that
//! verify them at `GET /.well-known/jwks.json`, and it never takes one as a bearer token,
//! whoever signed it (review B-H2).

use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use spool_shared::identity::{IDENTITY_TYP, IdentityKeys};
use spool_tests::{JWT_SECRET, identity_jwks};

use crate::common::{TestApp, worker_args, worker_args_with};

#[tokio::test]
async fn the_jwks_publishes_the_identity_key_every_process_derives_without_auth() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let response = app
        .http
        .get(app.url("/.well-known/jwks.json"))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), StatusCode::OK, "no auth needed");
    let jwks: Value = response.json().await.expect("JSON");
    let key = &jwks["keys"][0];
    assert_eq!(
        (&key["kty"], &key["crv"], &key["alg"]),
        (&json!("OKP"), &json!("Ed25519"), &json!("EdDSA"))
    );
    assert!(key["kid"].as_str().is_some_and(|kid| !kid.is_empty()));
    assert_eq!(key.get("d"), None, "no private part");
    // The key a worker with the same `SPOOL_JWT_SECRET` signs with.
    assert_eq!(jwks, identity_jwks(&["--jwt-secret", JWT_SECRET]));
    app.stop().await;
}

#[tokio::test]
async fn an_identity_token_as_a_bearer_is_401_identity_token_refused_and_changes_nothing() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let exp = chrono::Utc::now().timestamp() + 300;
    let claims = json!({"iss": "spool", "sub": "alice", "tenant": "acme", "aud": app.base,
        "exp": exp, "iat": exp - 300, "admin": true});
    // One signed by the identity key itself, as a tool receives it...
    let keys = IdentityKeys::new(&JWT_SECRET.to_owned().into(), None, None).expect("keys");
    let real = jsonwebtoken::encode(&keys.header(), &claims, &keys.encoding_key()).expect("sign");
    // ... and one typed as an identity token but signed with the API's own secret.
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    header.typ = Some(IDENTITY_TYP.to_owned());
    let secret = jsonwebtoken::EncodingKey::from_secret(JWT_SECRET.as_bytes());
    let typed = jsonwebtoken::encode(&header, &claims, &secret).expect("sign");
    let path = format!("/v1/threads/{}/user_message", Uuid::new_v4());
    for bad in [real, typed] {
        let (status, error) = app.post(&bad, &path, &json!({"input_text": "hi"})).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{error}");
        assert_eq!(error["error"]["code"], "identity_token_refused");
        let (status, _) = app.get(&bad, "/v1/agents").await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
    }
    for table in ["threads", "messages", "runs"] {
        assert_eq!(app.db.count(table).await, 0, "{table} must be empty");
    }
    app.stop().await;
}

#[tokio::test]
async fn after_a_rotation_the_jwks_publishes_the_new_key_first_and_the_retired_one_still() {
    const OLD: &str = "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE";
    const NEW: &str = "AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI";
    let rotated = ["--identity-key", NEW, "--identity-keys-retired", OLD];
    let app = TestApp::start(0, worker_args_with(1, 0, &rotated)).await;
    let response = app
        .http
        .get(app.url("/.well-known/jwks.json"))
        .send()
        .await
        .expect("request");
    let jwks: Value = response.json().await.expect("JSON");
    let kids: Vec<Value> = jwks["keys"]
        .as_array()
        .expect("keys")
        .iter()
        .map(|key| key["kid"].clone())
        .collect();
    let kid_of = |key: &str| identity_jwks(&["--identity-key", key])["keys"][0]["kid"].clone();
    assert_eq!(kids, [kid_of(NEW), kid_of(OLD)]);
    app.stop().await;
}
