//! Access as an operator configures it and a server uses it, on the real binaries: an external
//! identity provider configured with `SPOOL_AUTH_*` on the `spool-api` process, with claim names
//! other than the defaults (its EdDSA token, verified with the JWKS of a loopback server, acts as
//! the user and tenant its claims name, with the permissions its `scope` lists); an API key
//! revoked through one API process refused by another at once; and `spool-api token
//! --permission`.
use serde_json::json;

use spool_shared::identity::IdentityKeys;

use spool_tests::process::{Backing, binary};
use spool_tests::{JWT_SECRET, token_with};

use crate::stack::{Stack, TIMEOUT};

#[tokio::test]
async fn the_api_process_accepts_an_external_provider_s_tokens_with_the_configured_claims() {
    // An Ed25519 key of the "provider": a fixed seed, its public key as a JWKS.
    let seed = "AwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwM";
    let keys = IdentityKeys::new(
        &"unused-jwt-secret".to_owned().into(),
        Some(&seed.to_owned().into()),
        None,
    )
    .expect("a key");
    let jwks = serde_json::to_value(keys.jwks()).expect("jwks");
    let app = axum::Router::new().route(
        "/jwks",
        axum::routing::get(move || {
            let jwks = jwks.clone();
            async move { axum::Json(jwks) }
        }),
    );
    let provider = spool_tests::serve(app).await;
    let jwks_url = format!("{provider}/jwks");
    let stack = Stack::start_with(
        &spool_tests::redis_url(),
        &[
            ("SPOOL_AUTH_JWKS_URL", jwks_url.as_str()),
            ("SPOOL_AUTH_ISSUER", "https://idp.example.com/"),
            ("SPOOL_AUTH_AUDIENCE", "spool"),
            ("SPOOL_AUTH_TENANT_CLAIM", "org_id"),
            ("SPOOL_AUTH_PERMISSIONS_CLAIM", "scope"),
        ],
    )
    .await;
    let now = chrono::Utc::now().timestamp();
    let sign = |scope: &str| {
        let claims = json!({"iss": "https://idp.example.com/", "aud": "spool", "sub": "dana",
            "org_id": "acme", "scope": scope, "iat": now, "exp": now + 300});
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::EdDSA);
        header.kid = Some(keys.kid().to_owned());
        jsonwebtoken::encode(&header, &claims, &keys.encoding_key()).expect("sign")
    };
    let thread = uuid::Uuid::new_v4();
    let path = format!("/v1/threads/{thread}/user_message");
    let message = json!({"input_text": "hi"});
    // The `scope` claim is the permissions claim here: the token holds what it lists, and
    // `openid` alone is no Spool permission.
    let (status, body) = stack.post(&sign("openid"), &path, &message).await;
    assert_eq!(status, reqwest::StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["permission"], "runs:create");
    let (status, body) = stack
        .post(&sign("openid runs:create"), &path, &message)
        .await;
    assert_eq!(status, reqwest::StatusCode::ACCEPTED, "{body}");
    let owner: (String, String) =
        sqlx::query_as("SELECT tenant_id, owner_id FROM threads WHERE id = $1")
            .bind(thread)
            .fetch_one(&stack.db.pool)
            .await
            .expect("the thread");
    assert_eq!(owner, ("acme".to_owned(), "dana".to_owned()));
    let (status, _) = stack
        .get_with(&sign("openid runs:create"), "/v1/usage")
        .await;
    assert_eq!(status, reqwest::StatusCode::FORBIDDEN);
    let (status, _) = stack.get_with(&sign("openid admin"), "/v1/usage").await;
    assert_eq!(status, reqwest::StatusCode::OK);
}

/// `DELETE` `path` through `base` with `token`.
async fn delete(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    path: &str,
) -> reqwest::StatusCode {
    http.delete(format!("{base}{path}"))
        .bearer_auth(token)
        .send()
        .await
        .expect("request")
        .status()
}

/// `GET /v1/threads` through `base` with `token`: the status and the error code.
async fn list_threads(
    http: &reqwest::Client,
    base: &str,
    token: &str,
) -> (reqwest::StatusCode, serde_json::Value) {
    let response = http
        .get(format!("{base}/v1/threads"))
        .bearer_auth(token)
        .send()
        .await
        .expect("request");
    let status = response.status();
    let body: serde_json::Value = response.json().await.unwrap_or_default();
    (status, body["error"]["code"].clone())
}

#[tokio::test]
async fn an_api_key_revoked_through_one_api_process_is_refused_by_another_at_once() {
    let stack = Stack::start().await;
    let (_second, other) = Backing {
        database_url: &stack.db.url,
        redis_url: &stack.redis_url,
        redis_prefix: &stack.prefix,
    }
    .start_api(&[("SPOOL_DB_MAX_CONNECTIONS", "8")], TIMEOUT)
    .await
    .expect("a second spool-api");
    let admin = token_with("root", "acme", true, 3600, JWT_SECRET);
    let (status, created) = stack
        .post(
            &admin,
            "/v1/api_keys",
            &json!({"name": "ingest", "permissions": ["runs:create"]}),
        )
        .await;
    assert_eq!(status, reqwest::StatusCode::CREATED, "{created}");
    let key = created["key"].as_str().expect("the key");
    let id = created["id"].as_str().expect("id");
    // Both processes accept it...
    for base in [&stack.base, &other] {
        let (status, code) = list_threads(&stack.http, base, key).await;
        assert_eq!(status, reqwest::StatusCode::OK, "{base}: {code}");
    }
    // ...until it is revoked through the second: the first refuses it with the very next
    // request, no waiting.
    let status = delete(&stack.http, &other, &admin, &format!("/v1/api_keys/{id}")).await;
    assert_eq!(status, reqwest::StatusCode::NO_CONTENT);
    for base in [&stack.base, &other] {
        let (status, code) = list_threads(&stack.http, base, key).await;
        assert_eq!(status, reqwest::StatusCode::UNAUTHORIZED, "{base}");
        assert_eq!(code, "api_key_revoked", "{base}");
    }
    // The refusal is logged with its reason, never with the key.
    assert!(!stack.api_log().contains(key));
}

#[tokio::test]
async fn spool_api_token_mints_tokens_with_the_permissions_it_is_given() {
    let stack = Stack::start().await;
    let mint = |extra: &[&str]| {
        std::process::Command::new(binary("spool-api"))
            .args([&["token", "--sub", "ops", "--tenant", "acme"][..], extra].concat())
            .env("SPOOL_JWT_SECRET", JWT_SECRET)
            .output()
            .expect("spool-api token")
    };
    let output = mint(&["--permission", "usage:read", "--permission", "agents:read"]);
    assert!(output.status.success(), "{output:?}");
    let token = String::from_utf8(output.stdout).expect("utf-8");
    let token = token.trim();
    let (status, body) = stack.get_with(token, "/v1/usage").await;
    assert_eq!(status, reqwest::StatusCode::OK, "{body}");
    let (status, _) = stack.get_with(token, "/v1/agents").await;
    assert_eq!(status, reqwest::StatusCode::OK);
    // Only those: no `runs:create`, which a token without permissions would have.
    let (status, body) = stack.get_with(token, "/v1/threads").await;
    assert_eq!(status, reqwest::StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["permission"], "runs:create");

    // A name that is no permission is refused before anything is signed.
    let output = mint(&["--permission", "runs:everything"]);
    assert!(!output.status.success());
    assert!(output.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("not a permission"), "{stderr}");
}
