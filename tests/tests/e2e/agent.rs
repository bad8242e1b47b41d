//! The agent across a crash: a worker killed while a step's tool call is in flight.

use std::sync::{Arc, Mutex};

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::routing::post;
use serde_json::{Value, json};

use spool_tests::fake_llm::{self, FakeLlm, tool_results_in};
use spool_tests::{JWT_SECRET, poll_until, token, token_with};

use crate::stack::{Stack, TIMEOUT, workflow_id};

type Calls = Arc<Mutex<Vec<(String, String)>>>;

/// A tool server that records `(tool, Idempotency-Key)` and hangs the first `t3` call forever.
async fn tool_server() -> (Calls, String) {
    let calls: Calls = Arc::default();
    let app = axum::Router::new()
        .route(
            "/{tool}",
            post(|State(calls): State<Calls>, Path(tool): Path<String>, headers: HeaderMap| async move {
                let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
                let first_t3 = {
                    let mut calls = calls.lock().expect("lock");
                    calls.push((tool.clone(), key));
                    tool == "t3" && calls.iter().filter(|(t, _)| t == "t3").count() == 1
                };
                if first_t3 {
                    std::future::pending::<()>().await;
                }
                format!("{tool} done")
            }),
        )
        .with_state(calls.clone());
    let base = spool_tests::serve(app).await;
    (calls, base)
}

#[tokio::test]
async fn a_crash_during_step_3_of_4_repeats_no_completed_model_or_tool_call() {
    let fake = FakeLlm::start(|request, _| match tool_results_in(request) {
        0 => fake_llm::tool_calls(&[("call_a", "t1", r#"{"n": 1}"#)]),
        1 => fake_llm::tool_calls(&[("call_b", "t2", r#"{"n": 2}"#)]),
        2 => fake_llm::tool_calls(&[("call_c", "t3", r#"{"n": 3}"#)]),
        _ => fake_llm::text("All three tools ran.", 3),
    })
    .await;
    let (calls, base) = tool_server().await;
    let stack = Stack::start().await;
    let llm = [
        ("SPOOL_LLM_BASE_URL", fake.base_url.as_str()),
        ("SPOOL_TOOLS_ALLOW_NETWORKS", "127.0.0.1/32"),
    ];
    let mut a = stack.worker(&llm).await;

    let tools: Vec<Value> = ["t1", "t2", "t3"]
        .iter()
        .map(|name| json!({"type": "http", "name": name, "url": format!("{base}/{name}")}))
        .collect();
    let response = stack
        .http
        .post(format!("{}/v1/agents", stack.base))
        .bearer_auth(token_with("root", "acme", true, 3600, JWT_SECRET))
        .json(&json!({"name": "three", "model": "gpt-4o-mini", "tools": tools}))
        .send()
        .await
        .expect("agent");
    let agent: Value = response.json().await.expect("json");
    let thread = uuid::Uuid::new_v4();
    let accepted: Value = stack
        .http
        .post(format!("{}/v1/threads/{thread}/user_message", stack.base))
        .bearer_auth(token("alice", "acme"))
        .json(&json!({"input_text": "run the tools", "agent_id": agent["id"]}))
        .send()
        .await
        .expect("post")
        .json()
        .await
        .expect("json");

    poll_until("step 3's tool call to be in flight", TIMEOUT, || async {
        calls
            .lock()
            .expect("lock")
            .iter()
            .any(|(tool, _)| tool == "t3")
            .then_some(())
    })
    .await;
    a.kill9().await;
    let _b = stack.worker(&llm).await;
    let run = stack.wait_run(&accepted, "completed").await;
    assert_eq!(run.attempt, 2);

    let wf = workflow_id(&accepted);
    let calls = calls.lock().expect("lock").clone();
    let count = |tool: &str| calls.iter().filter(|(t, _)| t == tool).count();
    assert_eq!(
        (count("t1"), count("t2"), count("t3")),
        (1, 1, 2),
        "{calls:?}"
    );
    let t3_keys: Vec<&String> = calls
        .iter()
        .filter(|(t, _)| t == "t3")
        .map(|(_, k)| k)
        .collect();
    assert_eq!(
        t3_keys,
        [&format!("{wf}:3:call_c"), &format!("{wf}:3:call_c")],
        "same key, so the tool can de-duplicate"
    );
    assert_eq!(
        fake.requests().len(),
        4,
        "each model call ran once: steps 1-3 before the crash, 4 after"
    );

    let messages = stack.messages(&accepted).await;
    assert_eq!(messages[1].2, "All three tools ran.");
    let parts: (Value,) = sqlx::query_as("SELECT parts FROM messages WHERE id = $1")
        .bind(
            accepted["message_id"]
                .as_str()
                .and_then(|s| s.parse::<uuid::Uuid>().ok())
                .expect("id"),
        )
        .fetch_one(&stack.db.pool)
        .await
        .expect("parts");
    let results: Vec<&str> = parts
        .0
        .as_array()
        .expect("parts")
        .iter()
        .filter(|p| p["type"] == "tool_result")
        .filter_map(|p| p["output"].as_str())
        .collect();
    assert_eq!(results, ["t1 done", "t2 done", "t3 done"]);

    // The stream retracts the cut step and replays its call under the new attempt.
    let stored = stack.stored(&json!(thread.to_string())).await;
    let restart = stored
        .iter()
        .position(|(_, e)| e["type"] == "attempt_restarted")
        .expect("restart");
    assert!(stored[restart..].iter().any(|(_, e)| e["type"] == "step"
        && e["data"]["tool_call_id"] == "call_c"
        && e["data"]["phase"] == "call"));
    assert_eq!(
        stored.last().map(|(_, e)| e["type"].clone()),
        Some(json!("done"))
    );
}
