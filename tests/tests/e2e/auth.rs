//! An external identity provider configured as an operator would (`SPOOL_AUTH_*` on the
//! `spool-api` process), with claim names other than the defaults: its EdDSA token, verified
//! with the JWKS of a loopback server, acts as the user and tenant its claims name; `admin` in
//! its `scope` makes an admin.

use serde_json::json;

use spool_shared::identity::IdentityKeys;

use crate::stack::Stack;

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
    let (status, body) = stack
        .post(
            &sign("openid"),
            &format!("/v1/threads/{thread}/user_message"),
            &json!({"input_text": "hi"}),
        )
        .await;
    assert_eq!(status, reqwest::StatusCode::ACCEPTED, "{body}");
    let owner: (String, String) =
        sqlx::query_as("SELECT tenant_id, owner_id FROM threads WHERE id = $1")
            .bind(thread)
            .fetch_one(&stack.db.pool)
            .await
            .expect("the thread");
    assert_eq!(owner, ("acme".to_owned(), "dana".to_owned()));
    let (status, _) = stack.get_with(&sign("openid"), "/v1/usage").await;
    assert_eq!(status, reqwest::StatusCode::FORBIDDEN);
    let (status, _) = stack.get_with(&sign("openid admin"), "/v1/usage").await;
    assert_eq!(status, reqwest::StatusCode::OK);
}
