//! Per-message overrides on `user_message` (`tool_choice`, `active_tools`, `max_steps`, and
//! `instructions` with an admin token) and an agent's own `active_tools`: what reaches the
//! model, and a clear 4xx with nothing created for each misuse.

use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use spool_tests::fake_llm::{self, FakeLlm};
use spool_tests::token;

use crate::agents::admin;
use crate::common::{app_with, finished};

fn client(name: &str) -> Value {
    json!({"type": "client", "name": name, "parameters": {"type": "object"}})
}

/// The names of the tools a model request offered.
fn offered(request: &Value) -> Vec<String> {
    request["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["function"]["name"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn a_message_steers_its_run_and_the_agent_s_active_tools_hold_otherwise() {
    let fake = FakeLlm::start(|_, _| fake_llm::text("ok", 1)).await;
    let app = app_with(&fake).await;
    let agent = app
        .create_agent(
            "acme",
            &json!({"name": "steer", "model": "gpt-4o-mini", "instructions": "Agent prompt.",
                "tools": [client("a"), client("b"), client("c")], "active_tools": ["a", "b"]}),
        )
        .await;
    let alice = token("alice", "acme");
    let post = |token: String, body: Value| {
        let app = &app;
        async move {
            let thread = Uuid::new_v4();
            let path = format!("/v1/threads/{thread}/user_message");
            let (status, accepted) = app.post(&token, &path, &body).await;
            (status, accepted, thread)
        }
    };

    // The agent's own active tools.
    let (status, accepted, _) = post(
        alice.clone(),
        json!({"input_text": "hi", "agent_id": agent}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    assert_eq!(finished(&app, &accepted).await["status"], "completed");
    let first = fake.requests().last().cloned().expect("a request");
    assert_eq!(offered(&first), ["a", "b"]);
    assert_eq!(first["messages"][0]["content"], "Agent prompt.");

    // The message's tools and choice, for every step of its run.
    let (status, accepted, _) = post(
        alice.clone(),
        json!({"input_text": "hi", "agent_id": agent, "active_tools": ["c"], "tool_choice": "c"}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    assert_eq!(finished(&app, &accepted).await["status"], "completed");
    let steered = fake.requests().last().cloned().expect("a request");
    assert_eq!(offered(&steered), ["c"]);
    assert_eq!(steered["tool_choice"]["function"]["name"], "c");

    // max_steps 1: the first step is the last, so no tools are offered.
    let (status, accepted, _) = post(
        alice.clone(),
        json!({"input_text": "hi", "agent_id": agent, "max_steps": 1}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    assert_eq!(finished(&app, &accepted).await["status"], "completed");
    let last = fake.requests().last().cloned().expect("a request");
    assert!(last["tools"].is_null(), "{last}");

    // Instructions, with an admin token.
    let (status, accepted, _) = post(
        admin("acme"),
        json!({"input_text": "hi", "agent_id": agent, "instructions": "Admin prompt."}),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{accepted}");
    let workflow = accepted["workflow_id"].as_str().expect("id");
    app.wait_for_status(&admin("acme"), workflow, "completed")
        .await;
    let last = fake.requests().last().cloned().expect("a request");
    assert_eq!(last["messages"][0]["content"], "Admin prompt.");
}

#[tokio::test]
async fn overrides_that_do_not_fit_are_refused_by_field_and_create_nothing() {
    let fake = FakeLlm::start(|_, _| fake_llm::text("ok", 1)).await;
    let app = app_with(&fake).await;
    let agent = app
        .create_agent(
            "acme",
            &json!({"name": "steer", "model": "gpt-4o-mini", "tools": [client("a"), client("b")]}),
        )
        .await;
    let alice = token("alice", "acme");
    let cases = [
        (
            json!({"input_text": "hi", "agent_id": agent, "active_tools": ["ghost"]}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_overrides",
            Some("active_tools[0]"),
        ),
        (
            json!({"input_text": "hi", "agent_id": agent, "active_tools": ["a"], "tool_choice": "b"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_overrides",
            Some("tool_choice"),
        ),
        (
            json!({"input_text": "hi", "agent_id": agent, "max_steps": 0}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_overrides",
            Some("max_steps"),
        ),
        (
            // The server's default agent has no tools.
            json!({"input_text": "hi", "active_tools": ["a"]}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_overrides",
            Some("active_tools[0]"),
        ),
        (
            json!({"input_text": "hi", "agent_id": agent, "instructions": "Obey me."}),
            StatusCode::FORBIDDEN,
            "forbidden",
            None,
        ),
    ];
    for (body, status, code, field) in cases {
        let thread = Uuid::new_v4();
        let path = format!("/v1/threads/{thread}/user_message");
        let (got, error) = app.post(&alice, &path, &body).await;
        assert_eq!(
            (got, error["error"]["code"].as_str()),
            (status, Some(code)),
            "{body}: {error}"
        );
        if let Some(field) = field {
            let fields: Vec<&str> = error["error"]["errors"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|e| e["field"].as_str())
                .collect();
            assert!(fields.contains(&field), "{field} not in {fields:?}");
        }
        let (status, _) = app.get(&alice, &format!("/v1/threads/{thread}")).await;
        assert_eq!(
            status,
            StatusCode::NOT_FOUND,
            "nothing was created for {body}"
        );
    }
    assert!(fake.requests().is_empty(), "no run started");
}
