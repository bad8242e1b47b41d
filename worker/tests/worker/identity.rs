//! Identity to tools: every HTTP tool and hook call carries the run's tenant and user, and a
//! token a tool verifies with the published public keys (never with the JWT secret), valid for
//! its own origin only. (MCP servers get the same on every request: `mcp.rs`.)

use serde_json::json;

use spool_tests::fake_llm::FakeLlm;
use spool_tests::tools::{Tools, http_tool};
use spool_tests::{JWT_SECRET, identity_jwks, verify_identity};

use crate::harness::Harness;

/// An agent whose weather tool is on `tools` and whose `pre_tool_use` hook is on `hook`.
fn agent(tools: &str, hook: &str) -> serde_json::Value {
    json!({"name": "identified", "model": "gpt-4o-mini",
        "tools": [http_tool("get_weather", format!("{tools}/weather"))],
        "hooks": [{"event": "pre_tool_use", "type": "http", "url": format!("{hook}/list")}]})
}

#[tokio::test]
async fn tool_and_hook_calls_carry_a_token_each_origin_verifies_for_itself_only() {
    let fake = FakeLlm::start(spool_tests::fake_llm::weather_then_echo()).await;
    let (tools, tools_base) = Tools::start().await;
    // The hook answers "ok", which is not a decision: the call is allowed.
    let (hook, hook_base) = Tools::start().await;
    let app = Harness::start_with(&fake.base_url, &["--jwt-secret", JWT_SECRET]).await;
    let jwks = identity_jwks(&["--jwt-secret", JWT_SECRET]);
    let agent = app.create_agent(&agent(&tools_base, &hook_base)).await;
    let (_, accepted) = app.ask(&agent, "weather?").await;
    assert_eq!(app.finished(&accepted).await["status"], "completed");

    for (server, origin, other) in [
        (&tools, &tools_base, &hook_base),
        (&hook, &hook_base, &tools_base),
    ] {
        let seen = server.identities();
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert_eq!(seen[0].tenant.as_deref(), Some("acme"));
        assert_eq!(seen[0].user.as_deref(), Some("alice"));
        let token = seen[0].token.as_deref().expect("a token");
        let claims = verify_identity(token, origin, &jwks).expect("valid at its own origin");
        assert_eq!(claims["sub"], "alice");
        assert_eq!(claims["tenant"], "acme");
        assert_eq!(claims["workflow_id"], accepted["workflow_id"]);
        assert!(
            verify_identity(token, other, &jwks).is_err(),
            "a token for {origin} is refused at {other}"
        );
        let mut hs256 = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::HS256);
        hs256.set_audience(&[origin]);
        let secret = jsonwebtoken::DecodingKey::from_secret(JWT_SECRET.as_bytes());
        assert!(
            jsonwebtoken::decode::<serde_json::Value>(token, &secret, &hs256).is_err(),
            "the JWT secret does not verify it"
        );
    }
}

#[tokio::test]
async fn with_a_rotated_key_calls_are_signed_by_the_new_key_and_the_old_one_stays_published() {
    const OLD: &str = "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE";
    const NEW: &str = "AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI";
    let fake = FakeLlm::start(spool_tests::fake_llm::weather_then_echo()).await;
    let (tools, tools_base) = Tools::start().await;
    let (_hook, hook_base) = Tools::start().await;
    let rotated = ["--identity-key", NEW, "--identity-keys-retired", OLD];
    let app = Harness::start_with(&fake.base_url, &rotated).await;
    let agent = app.create_agent(&agent(&tools_base, &hook_base)).await;
    let (_, accepted) = app.ask(&agent, "weather?").await;
    assert_eq!(app.finished(&accepted).await["status"], "completed");
    let seen = tools.identities();
    let token = seen[0].token.as_deref().expect("a token");
    let jwks = identity_jwks(&rotated);
    verify_identity(token, &tools_base, &jwks).expect("verifies after the rotation");
    let new_only = identity_jwks(&["--identity-key", NEW]);
    verify_identity(token, &tools_base, &new_only).expect("signed by the new key");
    assert!(
        verify_identity(token, &tools_base, &identity_jwks(&["--identity-key", OLD])).is_err(),
        "not by the old one"
    );
    assert_eq!(jwks["keys"].as_array().map(Vec::len), Some(2), "{jwks}");
}
