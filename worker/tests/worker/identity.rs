//! Identity to tools: every HTTP tool and hook call carries the run's tenant and user, and (with
//! `SPOOL_TOOL_IDENTITY_SECRET`) a token a tool verifies, valid for its own origin only. (MCP
//! servers get the same on every request: `mcp.rs`.)

use serde_json::json;

use spool_tests::fake_llm::FakeLlm;
use spool_tests::tools::{Tools, http_tool};
use spool_tests::{TOOL_IDENTITY_SECRET, verify_identity};

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
    let app = Harness::start_with(
        &fake.base_url,
        &["--tool-identity-secret", TOOL_IDENTITY_SECRET],
    )
    .await;
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
        let claims = verify_identity(token, origin).expect("valid at its own origin");
        assert_eq!(claims["sub"], "alice");
        assert_eq!(claims["tenant"], "acme");
        assert_eq!(claims["workflow_id"], accepted["workflow_id"]);
        assert!(
            verify_identity(token, other).is_err(),
            "a token for {origin} is refused at {other}"
        );
    }
}

#[tokio::test]
async fn without_the_secret_calls_carry_tenant_and_user_but_no_token() {
    let fake = FakeLlm::start(spool_tests::fake_llm::weather_then_echo()).await;
    let (tools, tools_base) = Tools::start().await;
    let (hook, hook_base) = Tools::start().await;
    let app = Harness::start(&fake).await;
    let agent = app.create_agent(&agent(&tools_base, &hook_base)).await;
    let (_, accepted) = app.ask(&agent, "weather?").await;
    assert_eq!(app.finished(&accepted).await["status"], "completed");
    for server in [&tools, &hook] {
        let seen = server.identities();
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert_eq!(seen[0].tenant.as_deref(), Some("acme"));
        assert_eq!(seen[0].user.as_deref(), Some("alice"));
        assert_eq!(seen[0].token, None);
    }
}
