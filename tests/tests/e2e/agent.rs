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
    let llm = model_and_tools(&fake);
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

    in_flight(&calls, "t3", "step 3's tool call to be in flight").await;
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

    // The stream retracts the cut step and replays its call under the new attempt (read once
    // it ends with the done, which the worker publishes after it writes the run's end).
    let stored = stored_to_done(&stack, &accepted).await;
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
    // Each step ends once: steps 1 and 2 by the killed attempt (the new one does not repeat
    // them), step 3 (saved, its call cut short) and step 4 by the new attempt; each after its
    // results, and before the message ends.
    let step_ends: Vec<(Value, Value)> = stored
        .iter()
        .filter(|(_, e)| e["type"] == "step_end")
        .map(|(_, e)| (e["data"]["step"].clone(), e["attempt"].clone()))
        .collect();
    assert_eq!(
        step_ends,
        [
            (json!(1), json!(1)),
            (json!(2), json!(1)),
            (json!(3), json!(2)),
            (json!(4), json!(2))
        ],
        "{stored:?}"
    );
    let at = |kind: &str, step: u64| {
        stored
            .iter()
            .position(|(_, e)| e["type"] == kind && e["data"]["step"] == step)
    };
    let c_result = stored.iter().rposition(|(_, e)| {
        e["type"] == "step"
            && e["data"]["phase"] == "result"
            && e["data"]["tool_call_id"] == "call_c"
    });
    assert!(c_result < at("step_end", 3), "{stored:?}");
    let message_end = stored.iter().position(|(_, e)| e["type"] == "message_end");
    assert!(at("step_end", 4) < message_end, "{stored:?}");
    assert_eq!(
        stored
            .iter()
            .filter(|(_, e)| e["type"] == "step_end")
            .map(|(_, e)| e["data"]["finish_reason"].clone())
            .collect::<Vec<_>>(),
        ["tool_calls", "tool_calls", "tool_calls", "stop"]
    );
    assert!(at("step_start", 4) > Some(restart));
}

/// What a client following the stream contract shows at the end: every event in order, except
/// that `attempt_restarted` drops what was shown since the last `step` result (or the
/// `message_start`) of its message.
fn client_view(stored: &[(String, Value)]) -> Vec<Value> {
    let mut view: Vec<Value> = Vec::new();
    for (_, event) in stored {
        if event["type"] == "attempt_restarted" {
            let keep = view
                .iter()
                .rposition(|e| {
                    e["message_id"] == event["message_id"]
                        && (e["type"] == "message_start"
                            || (e["type"] == "step" && e["data"]["phase"] == "result"))
                })
                .map_or(0, |i| i + 1);
            view.truncate(keep);
        } else {
            view.push(event.clone());
        }
    }
    view
}

/// How often the view shows `phase` of `call`, and `text` in its deltas.
fn shown(view: &[Value], phase: &str, call: &str) -> usize {
    view.iter()
        .filter(|e| {
            e["type"] == "step" && e["data"]["phase"] == phase && e["data"]["tool_call_id"] == call
        })
        .count()
}

fn shown_text(view: &[Value], text: &str) -> usize {
    let deltas: String = view
        .iter()
        .filter(|e| e["type"] == "text_delta")
        .filter_map(|e| e["data"]["delta"].as_str())
        .collect();
    deltas.matches(text).count()
}

/// A tool server that records the tools called; the first call of `held` waits until the
/// returned semaphore gets a permit, or forever if `held_forever`.
async fn held_tool_server(
    held: &'static str,
    held_forever: bool,
) -> (Calls, Arc<tokio::sync::Semaphore>, String) {
    let calls: Calls = Arc::default();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let state = (calls.clone(), gate.clone());
    let app = axum::Router::new()
        .route(
            "/{tool}",
            post(
                move |State((calls, gate)): State<(Calls, Arc<tokio::sync::Semaphore>)>,
                      Path(tool): Path<String>| async move {
                    let first = {
                        let mut calls = calls.lock().expect("lock");
                        calls.push((tool.clone(), String::new()));
                        tool == held && calls.iter().filter(|(t, _)| t == held).count() == 1
                    };
                    if first && held_forever {
                        std::future::pending::<()>().await;
                    }
                    if first {
                        let _permit = gate.acquire().await.expect("gate");
                    }
                    format!("{tool} done")
                },
            ),
        )
        .with_state(state);
    let base = spool_tests::serve(app).await;
    (calls, gate, base)
}

/// The worker settings of these tests: the fake model, and tools on loopback.
fn model_and_tools(fake: &FakeLlm) -> [(&'static str, &str); 2] {
    [
        ("SPOOL_LLM_BASE_URL", fake.base_url.as_str()),
        ("SPOOL_TOOLS_ALLOW_NETWORKS", "127.0.0.1/32"),
    ]
}

/// Waits until the tool server has been called for `tool` (`what` names the wait).
async fn in_flight(calls: &Calls, tool: &str, what: &str) {
    poll_until(what, TIMEOUT, || async {
        calls
            .lock()
            .expect("lock")
            .iter()
            .any(|(t, _)| t == tool)
            .then_some(())
    })
    .await;
}

/// The thread's stored events once they end with the run's `done` (a worker publishes its
/// last events after it writes the run's end to Postgres).
async fn stored_to_done(stack: &Stack, accepted: &Value) -> Vec<(String, Value)> {
    poll_until("the run's done in the stream", TIMEOUT, || async {
        let stored = stack.stored(&accepted["thread_id"]).await;
        (stored.last().map(|(_, e)| &e["type"]) == Some(&json!("done"))).then_some(stored)
    })
    .await
}

/// Alice asks `agent` on a new thread.
async fn ask(stack: &Stack, agent: &str) -> Value {
    stack.ask(agent, "look it up").await
}

/// Review L5: a step's results reach the stream only once the step is saved. The test holds the
/// step's row locked while the tool answers, so the worker waits in the save; the stream must
/// not hold the result then. The worker is killed there: the next attempt repeats the step,
/// and a client following the contract shows its text, call and result once.
#[tokio::test]
async fn a_step_s_result_is_streamed_only_after_the_step_is_saved_so_a_crash_shows_it_once() {
    let fake = FakeLlm::start(|request, _| match tool_results_in(request) {
        0 => fake_llm::with_text(
            fake_llm::tool_calls(&[("call_a", "t1", "{}")]),
            "Let me look.",
        ),
        _ => fake_llm::text("Found it.", 2),
    })
    .await;
    let (calls, gate, base) = held_tool_server("t1", false).await;
    let stack = Stack::start().await;
    let llm = model_and_tools(&fake);
    let mut a = stack.worker(&llm).await;
    let agent = stack
        .create_agent(&json!({"name": "look", "model": "gpt-4o-mini",
            "tools": [spool_tests::tools::http_tool("t1", format!("{base}/t1"))]}))
        .await;
    let accepted = ask(&stack, &agent).await;
    let wf = workflow_id(&accepted);
    poll_until("the tool call to be in flight", TIMEOUT, || async {
        (!calls.lock().expect("lock").is_empty()).then_some(())
    })
    .await;

    // The step (saved with its call before the call was made) is held locked.
    let mut lock = stack.db.pool.begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM run_steps WHERE workflow_id = $1 AND step = 1 FOR UPDATE")
        .bind(wf)
        .fetch_one(&mut *lock)
        .await
        .expect("the step's row");
    gate.add_permits(1);
    poll_until("the worker to wait in the step's save", TIMEOUT, || async {
        let waiting: (i64,) = sqlx::query_as(
            "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND wait_event_type = 'Lock'
                AND query LIKE '%INSERT INTO run_steps%'",
        )
        .fetch_one(&stack.db.pool)
        .await
        .expect("pg_stat_activity");
        (waiting.0 > 0).then_some(())
    })
    .await;
    let stored = stack.stored(&accepted["thread_id"]).await;
    let view = client_view(&stored);
    assert_eq!(shown(&view, "call", "call_a"), 1, "the call is shown");
    assert_eq!(
        shown(&view, "result", "call_a"),
        0,
        "a result streamed before its step was saved: {view:?}"
    );

    a.kill9().await;
    lock.rollback().await.expect("rollback");
    let _b = stack.worker(&llm).await;
    let run = stack.wait_run(&accepted, "completed").await;
    assert_eq!(run.attempt, 2);
    let view = client_view(&stored_to_done(&stack, &accepted).await);
    assert_eq!(
        (
            shown_text(&view, "Let me look."),
            shown(&view, "call", "call_a"),
            shown(&view, "result", "call_a"),
            shown_text(&view, "Found it."),
        ),
        (1, 1, 1, 1),
        "{view:?}"
    );
}

/// A step paused for an approval after another call's result was shown, approved, and its
/// worker killed while the approved call runs: the next attempt keeps what the client kept
/// (the text, both calls and the first result) and shows only the second result.
#[tokio::test]
async fn a_crash_after_an_approval_shows_the_step_s_earlier_result_once() {
    let fake = FakeLlm::start(|request, _| match tool_results_in(request) {
        0 => fake_llm::with_text(
            fake_llm::tool_calls(&[("call_a", "t1", "{}"), ("call_b", "t2", "{}")]),
            "Let me look.",
        ),
        _ => fake_llm::text("Both ran.", 2),
    })
    .await;
    let (calls, _gate, base) = held_tool_server("t2", true).await;
    let stack = Stack::start().await;
    let llm = model_and_tools(&fake);
    let mut a = stack.worker(&llm).await;
    let mut t2 = spool_tests::tools::http_tool("t2", format!("{base}/t2"));
    t2["requires_approval"] = json!(true);
    let agent = stack
        .create_agent(&json!({"name": "look", "model": "gpt-4o-mini",
            "tools": [spool_tests::tools::http_tool("t1", format!("{base}/t1")), t2]}))
        .await;
    let accepted = ask(&stack, &agent).await;
    let wf = workflow_id(&accepted);
    poll_until("the run to wait for an approval", TIMEOUT, || async {
        spool_tests::run_row(&stack.db.pool, wf)
            .await
            .filter(|r| r.status == "awaiting_approval")
    })
    .await;
    let (status, body) = stack
        .post(
            &token("alice", "acme"),
            &format!("/v1/workflows/{wf}/approvals/call_b"),
            &json!({"approved": true}),
        )
        .await;
    assert!(status.is_success(), "{status} {body}");
    in_flight(&calls, "t2", "the approved call to be in flight").await;
    a.kill9().await;
    let _b = stack.worker(&llm).await;
    stack.wait_run(&accepted, "completed").await;

    let stored = stored_to_done(&stack, &accepted).await;
    assert!(stored.iter().any(|(_, e)| e["type"] == "attempt_restarted"));
    let view = client_view(&stored);
    assert_eq!(
        (
            shown_text(&view, "Let me look."),
            shown(&view, "call", "call_a"),
            shown(&view, "call", "call_b"),
            shown(&view, "result", "call_a"),
            shown(&view, "result", "call_b"),
            shown_text(&view, "Both ran."),
        ),
        (1, 1, 1, 1, 1, 1),
        "{view:?}"
    );
    let count = |tool: &str| {
        calls
            .lock()
            .expect("lock")
            .iter()
            .filter(|(t, _)| t == tool)
            .count()
    };
    assert_eq!((count("t1"), count("t2")), (1, 2), "t1 ran once");
}

/// Review M7: a run that ends without running its loop (here: past `SPOOL_MAX_RECLAIMS` after
/// its worker was killed in step 2) keeps what its earlier attempt produced: step 1's text and
/// tool result are in the failed message.
#[tokio::test]
async fn a_run_failed_by_the_reclaim_cap_keeps_its_saved_steps_in_the_message() {
    let fake = FakeLlm::start(|request, _| match tool_results_in(request) {
        0 => fake_llm::with_text(
            fake_llm::tool_calls(&[("call_a", "t1", "{}")]),
            "Let me look.",
        ),
        _ => fake_llm::tool_calls(&[("call_b", "t2", "{}")]),
    })
    .await;
    let (calls, _gate, base) = held_tool_server("t2", true).await;
    let stack = Stack::start().await;
    let llm = [&model_and_tools(&fake)[..], &[("SPOOL_MAX_RECLAIMS", "0")]].concat();
    let mut a = stack.worker(&llm).await;
    let agent = stack
        .create_agent(&json!({"name": "look", "model": "gpt-4o-mini",
            "tools": [spool_tests::tools::http_tool("t1", format!("{base}/t1")),
                      spool_tests::tools::http_tool("t2", format!("{base}/t2"))]}))
        .await;
    let accepted = ask(&stack, &agent).await;
    in_flight(&calls, "t2", "step 2's call to be in flight").await;
    a.kill9().await;
    let _b = stack.worker(&llm).await;
    let run = stack.wait_run(&accepted, "failed").await;
    assert_eq!(
        run.error.as_ref().map(|e| e["code"].clone()),
        Some(json!("too_many_attempts"))
    );
    let id: uuid::Uuid = accepted["message_id"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("message id");
    let (content, parts): (String, Value) =
        sqlx::query_as("SELECT content, parts FROM messages WHERE id = $1")
            .bind(id)
            .fetch_one(&stack.db.pool)
            .await
            .expect("message");
    assert_eq!(content, "Let me look.");
    let results: Vec<&str> = parts
        .as_array()
        .expect("parts")
        .iter()
        .filter(|p| p["type"] == "tool_result")
        .filter_map(|p| p["output"].as_str())
        .collect();
    assert_eq!(results, ["t1 done"], "{parts}");
}

/// Review L7: URLs may carry credentials (a token in the query), so the worker never logs them:
/// a failing hook is logged by its host, and a dead MCP server's error without its URL.
#[tokio::test]
async fn hook_and_mcp_urls_with_credentials_stay_out_of_the_worker_s_log() {
    let fake = FakeLlm::start(|_, _| fake_llm::text("Answered anyway.", 2)).await;
    let broken = spool_tests::serve(axum::Router::new().route(
        "/hook",
        post(|| async { (axum::http::StatusCode::INTERNAL_SERVER_ERROR, "no") }),
    ))
    .await;
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port");
    let stack = Stack::start().await;
    let worker = stack.worker(&model_and_tools(&fake)).await;
    let agent = stack
        .create_agent(&json!({"name": "quiet", "model": "gpt-4o-mini",
            "tools": [{"type": "mcp", "name": "gh",
                       "url": format!("http://{dead}/mcp?token=mcp-secret-5678")}],
            "hooks": [
                {"event": "on_run_start", "type": "http",
                 "url": format!("{broken}/hook?key=hook-secret-1234")},
                {"event": "pre_response", "type": "http",
                 "url": format!("http://{dead}/hook?key=hook-secret-9999")}]}))
        .await;
    let accepted = ask(&stack, &agent).await;
    stack.wait_run(&accepted, "completed").await;
    let log = poll_until("the worker to log the failures", TIMEOUT, || async {
        let log = worker.output();
        (log.matches("hook failed").count() >= 2 && log.contains("MCP server unavailable"))
            .then_some(log)
    })
    .await;
    for secret in ["hook-secret-1234", "hook-secret-9999", "mcp-secret-5678"] {
        assert!(!log.contains(secret), "{secret} is in the log:\n{log}");
    }
}
