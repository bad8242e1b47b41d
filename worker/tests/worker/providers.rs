//! Named providers (`SPOOL_PROVIDERS`) in the loop: an agent on an Anthropic provider runs a
//! tool round trip over the Messages API, and `fallback_models` answer when the agent's model
//! keeps failing (the step records which model answered).

use serde_json::{Value, json};

use spool_tests::fake_llm::{self, FakeLlm};
use spool_tests::tools::{Tools, http_tool};

use crate::harness::Harness;

/// The model that answered the run's final step, from its timeline record.
async fn answered_by(app: &Harness, accepted: &Value) -> String {
    let id: uuid::Uuid = accepted["workflow_id"]
        .as_str()
        .and_then(|id| id.parse().ok())
        .expect("a workflow id");
    let (model,): (Option<String>,) =
        sqlx::query_as("SELECT final_step->'model_call'->>'model' FROM runs WHERE id = $1")
            .bind(id)
            .fetch_one(&app.db.pool)
            .await
            .expect("the run");
    model.unwrap_or_default()
}

fn providers(base_url: &str) -> String {
    json!([{"name": "claude", "kind": "anthropic", "base_url": base_url},
           {"name": "backup", "kind": "openai", "base_url": base_url,
            "models": ["big-model", "small-model"]}])
    .to_string()
}

#[tokio::test]
async fn an_agent_on_an_anthropic_provider_calls_a_tool_and_answers() {
    let fake = FakeLlm::start(|request, _| {
        let answered = request["messages"]
            .as_array()
            .and_then(|m| m.last())
            .and_then(|m| m["content"].as_array())
            .is_some_and(|blocks| blocks.iter().any(|b| b["type"] == "tool_result"));
        if answered {
            fake_llm::anthropic_text("It is sunny in Oslo.", 3)
        } else {
            fake_llm::anthropic_events(&[
                json!({"type": "message_start", "message": {"usage": {"input_tokens": 20, "output_tokens": 1}}}),
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}}),
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": "{\"city\": "}}),
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": "\"Oslo\"}"}}),
                json!({"type": "content_block_stop", "index": 0}),
                json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 12}}),
                json!({"type": "message_stop"}),
            ])
        }
    })
    .await;
    let (_tools, base) = Tools::start().await;
    let app =
        Harness::start_with(&fake.base_url, &["--providers", &providers(&fake.base_url)]).await;
    let agent = app
        .create_agent(
            &json!({"name": "claude", "model": "claude-sonnet-4-5", "provider": "claude",
            "instructions": "Answer with the weather.",
            "tools": [http_tool("get_weather", format!("{base}/weather"))]}),
        )
        .await;
    let (thread, accepted) = app.ask(&agent, "Weather in Oslo?").await;
    let run = app.finished(&accepted).await;
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(
        app.messages(thread).await["messages"][1]["content"],
        "It is sunny in Oslo."
    );
    let requests = fake.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0]["system"], "Answer with the weather.");
    assert_eq!(requests[0]["tools"][0]["name"], "get_weather");
    let result_turn = requests[1]["messages"]
        .as_array()
        .and_then(|m| m.last())
        .expect("a turn");
    assert_eq!(result_turn["role"], "user");
    assert_eq!(result_turn["content"][0]["tool_use_id"], "toolu_1");
    let called = &requests[1]["messages"][1]["content"][0];
    assert_eq!(
        (called["type"].as_str(), called["input"]["city"].as_str()),
        (Some("tool_use"), Some("Oslo"))
    );
    assert_eq!(run["usage"]["input_tokens"], 29, "{run}");
    assert_eq!(answered_by(&app, &accepted).await, "claude-sonnet-4-5");
}

#[tokio::test]
async fn a_fallback_model_answers_when_the_agent_s_model_keeps_failing() {
    let fake = FakeLlm::start(|request, _| match request["model"].as_str() {
        Some("big-model") => fake_llm::Reply::Status(503, "overloaded".into(), Some("0".into())),
        _ => fake_llm::text("from the small model", 2),
    })
    .await;
    let app =
        Harness::start_with(&fake.base_url, &["--providers", &providers(&fake.base_url)]).await;
    let agent = app
        .create_agent(
            &json!({"name": "fallback", "model": "big-model", "provider": "backup",
            "fallback_models": ["small-model"]}),
        )
        .await;
    let (thread, accepted) = app.ask(&agent, "hi").await;
    let run = app.finished(&accepted).await;
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(
        app.messages(thread).await["messages"][1]["content"],
        "from the small model"
    );
    let models: Vec<String> = fake
        .requests()
        .iter()
        .filter_map(|r| r["model"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(
        models,
        [
            "big-model",
            "big-model",
            "big-model",
            "big-model",
            "small-model"
        ],
        "four tries, then the fallback"
    );
    assert_eq!(answered_by(&app, &accepted).await, "small-model");

    // Without fallbacks the run fails as before, naming the provider's answer.
    let alone = app
        .create_agent(&json!({"name": "alone", "model": "big-model", "provider": "backup"}))
        .await;
    let (_, accepted) = app.ask(&alone, "hi").await;
    let run = app.finished(&accepted).await;
    assert_eq!(run["error"]["code"], "model_unavailable", "{run}");
}

#[tokio::test]
async fn an_anthropic_agent_runs_a_tool_round_trip_against_aimock() {
    // aimock, a third-party mock upstream, speaks the Messages API on `/v1/messages`.
    let aimock = spool_tests::peers::Aimock::start(&json!({"fixtures": [
        {"match": {"hasToolResult": true}, "response": {"content": "It is sunny in Oslo."}},
        {"match": {"userMessage": "Weather in Oslo?"},
         "response": {"toolCalls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]}}
    ]}))
    .await
    .expect("aimock");
    let (tools, base) = Tools::start().await;
    let settings = json!([{"name": "claude", "kind": "anthropic", "base_url": aimock.base_url}]);
    let app = Harness::start_with(&aimock.base_url, &["--providers", &settings.to_string()]).await;
    let agent = app
        .create_agent(
            &json!({"name": "claude", "model": "claude-sonnet-4-5", "provider": "claude",
            "tools": [http_tool("get_weather", format!("{base}/weather"))]}),
        )
        .await;
    let (thread, accepted) = app.ask(&agent, "Weather in Oslo?").await;
    let run = app.finished(&accepted).await;
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(
        app.messages(thread).await["messages"][1]["content"],
        "It is sunny in Oslo."
    );
    let calls = tools.calls();
    assert_eq!(calls.len(), 1, "the tool ran once: {calls:?}");
    assert_eq!(calls[0].2["city"], "Oslo");
}
