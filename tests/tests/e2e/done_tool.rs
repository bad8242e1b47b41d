//! SOAT's recommended flow through the real processes: `tool_choice: required`, an HTTP
//! `search` tool, and a client `done` tool named in a `has_tool_call` stop condition, whose
//! validated arguments end the run as the message's `output` (no `requires_action` pause), with
//! `step_start` / `step_end` around each step; arguments that do not validate get one repair
//! round, then fail the run with `invalid_output`.

use axum::Json;
use axum::routing::post;
use serde_json::{Value, json};

use spool_tests::fake_llm::{self, FakeLlm, tool_results_in};
use spool_tests::{poll_until, token};

use crate::stack::{Stack, TIMEOUT, workflow_id};

/// The user's question of a request.
fn question(request: &Value) -> String {
    request["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["role"] == "user")
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned()
}

/// The model: searches first, then calls `done`: with valid arguments, or (for the questions
/// that say so) with invalid ones once, or always.
fn soat_model(request: &Value, _: usize) -> fake_llm::Reply {
    let asked = question(request);
    let valid = r#"{"answer": "Paris", "confidence": 0.9}"#;
    let invalid = r#"{"confidence": "high"}"#;
    match tool_results_in(request) {
        0 => fake_llm::tool_calls(&[("call_s", "search", r#"{"query": "capital of France"}"#)]),
        1 if asked.contains("repair") || asked.contains("never") => {
            fake_llm::tool_calls(&[("call_d1", "done", invalid)])
        }
        1 => fake_llm::tool_calls(&[("call_d", "done", valid)]),
        _ if asked.contains("never") => fake_llm::tool_calls(&[("call_d2", "done", invalid)]),
        _ => fake_llm::tool_calls(&[("call_d2", "done", valid)]),
    }
}

/// A search service on loopback: results for any query.
async fn search_server() -> String {
    let app = axum::Router::new().route(
        "/search",
        post(|Json(body): Json<Value>| async move {
            Json(json!({"query": body["query"], "results": ["Paris is the capital of France."]}))
        }),
    );
    spool_tests::serve(app).await
}

/// The stored events of the run's thread, once its `done` is stored.
async fn events_to_done(stack: &Stack, accepted: &Value) -> Vec<Value> {
    poll_until("the run's done event", TIMEOUT, || async {
        let events: Vec<Value> = stack
            .stored(&accepted["thread_id"])
            .await
            .into_iter()
            .map(|(_, e)| e)
            .collect();
        events.iter().any(|e| e["type"] == "done").then_some(events)
    })
    .await
}

/// The run as the API shows it once it ends or pauses.
async fn settled(stack: &Stack, accepted: &Value) -> Value {
    let path = format!("/v1/workflows/{}", workflow_id(accepted));
    poll_until("the run to end or pause", TIMEOUT, || async {
        let (_, run) = stack
            .get_with(&token("alice", "acme"), &format!("{path}?wait=5"))
            .await;
        let status = run["status"].as_str().unwrap_or_default().to_owned();
        (!["queued", "running"].contains(&status.as_str())).then_some(run)
    })
    .await
}

#[tokio::test]
async fn a_done_tool_ends_the_run_with_its_validated_arguments_as_the_output() {
    let fake = FakeLlm::start(soat_model).await;
    let base = search_server().await;
    let stack = Stack::start().await;
    let _worker = stack
        .worker(&[
            ("SPOOL_LLM_BASE_URL", fake.base_url.as_str()),
            ("SPOOL_TOOLS_ALLOW_NETWORKS", "127.0.0.1/32"),
        ])
        .await;
    let agent = stack
        .create_agent(&json!({"name": "soat", "model": "gpt-4o-mini",
            "tool_choice": "required",
            "tools": [
                {"type": "http", "name": "search", "description": "Searches the web.",
                 "url": format!("{base}/search"),
                 "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                                "required": ["query"]}},
                {"type": "client", "name": "done", "description": "Give the final answer.",
                 "parameters": {"type": "object",
                                "properties": {"answer": {"type": "string"},
                                               "confidence": {"type": "number"}},
                                "required": ["answer"]}}],
            "stop_conditions": [{"type": "has_tool_call", "tool_name": "done"}]}))
        .await;

    let accepted = stack.ask(&agent, "What is the capital of France?").await;
    let run = settled(&stack, &accepted).await;
    assert_eq!(
        run["status"], "completed",
        "not paused for the client: {run}"
    );
    assert!(run["pending_action"].is_null(), "{run}");
    let expected = json!({"answer": "Paris", "confidence": 0.9});
    let thread = accepted["thread_id"].as_str().expect("thread");
    let (_, page) = stack
        .get_with(
            &token("alice", "acme"),
            &format!("/v1/threads/{thread}/messages"),
        )
        .await;
    assert_eq!(page["messages"][1]["output"], expected, "{page}");
    for request in fake.requests() {
        assert_eq!(request["tool_choice"], "required", "{request}");
    }

    let events = events_to_done(&stack, &accepted).await;
    let kinds: Vec<&str> = events
        .iter()
        .filter_map(|e| e["type"].as_str())
        .filter(|k| *k != "heartbeat")
        .collect();
    assert!(!kinds.contains(&"requires_action"), "{kinds:?}");
    let end = events
        .iter()
        .find(|e| e["type"] == "message_end")
        .expect("message_end");
    assert_eq!(end["data"]["output"], expected);
    assert_eq!(end["data"]["status"], "completed");
    // Each step starts before its model call and ends once its results are out.
    assert_eq!(
        kinds,
        [
            "message_start",
            "step_start",
            "step",
            "step",
            "step_end",
            "step_start",
            "step",
            "step",
            "step_end",
            "message_end",
            "done"
        ],
        "{events:?}"
    );
    let step_ends: Vec<(Value, Value)> = events
        .iter()
        .filter(|e| e["type"] == "step_end")
        .map(|e| {
            (
                e["data"]["step"].clone(),
                e["data"]["finish_reason"].clone(),
            )
        })
        .collect();
    assert_eq!(
        step_ends,
        [
            (json!(1), json!("tool_calls")),
            (json!(2), json!("tool_calls"))
        ]
    );
    assert!(
        events
            .iter()
            .filter(|e| e["type"] == "step_end")
            .all(|e| e["data"]["usage"]["input_tokens"].is_u64()),
        "{events:?}"
    );
    let start = events
        .iter()
        .find(|e| e["type"] == "step_start")
        .expect("step_start");
    assert_eq!(start["data"]["model"], "gpt-4o-mini");

    // Invalid arguments: the model is told what is wrong and calls `done` again.
    let repaired = stack.ask(&agent, "capital of France, with a repair").await;
    let run = settled(&stack, &repaired).await;
    assert_eq!(run["status"], "completed", "{run}");
    let events = events_to_done(&stack, &repaired).await;
    let told = events
        .iter()
        .find(|e| e["data"]["tool_call_id"] == "call_d1" && e["data"]["phase"] == "result")
        .expect("the invalid call's result");
    assert_eq!(told["data"]["is_error"], true);
    assert!(
        told["data"]["output"]
            .as_str()
            .is_some_and(|o| o.contains("answer")),
        "names the missing property: {told}"
    );
    let end = events
        .iter()
        .find(|e| e["type"] == "message_end")
        .expect("message_end");
    assert_eq!(end["data"]["output"], expected);

    // Still invalid after the repair round: `invalid_output`.
    let never = stack.ask(&agent, "capital of France, never valid").await;
    let run = settled(&stack, &never).await;
    assert_eq!(run["status"], "failed", "{run}");
    assert_eq!(run["error"]["code"], "invalid_output", "{run}");
    let events = events_to_done(&stack, &never).await;
    let error = events.iter().find(|e| e["type"] == "error").expect("error");
    assert_eq!(error["data"]["retryable"], false);
}
