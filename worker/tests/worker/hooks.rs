//! Hooks: every kind (http, rule) and event, and fail-open. (Approval hooks, answered over the
//! API, are tested with the other pauses in the API's tests.)

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode as AxumStatus;
use axum::routing::post;
use serde_json::{Value, json};

use spool_tests::fake_llm::{self, FakeLlm, weather_then_echo};
use spool_tests::poll_until;
use spool_tests::tools::{Tools, http_tool};

use crate::harness::Harness;

type Decide = Arc<dyn Fn(&Value) -> (u16, Value) + Send + Sync>;

#[derive(Clone)]
struct HookServer {
    seen: Arc<Mutex<Vec<Value>>>,
    decide: Decide,
}

/// A hook endpoint that records every event (with its `Idempotency-Key` header as
/// `idempotency_key`) and answers with `decide(event)`.
async fn hook_server(
    decide: impl Fn(&Value) -> (u16, Value) + Send + Sync + 'static,
) -> (Arc<Mutex<Vec<Value>>>, String) {
    let server = HookServer {
        seen: Arc::default(),
        decide: Arc::new(decide),
    };
    let seen = server.seen.clone();
    let app = axum::Router::new()
        .route(
            "/hook",
            post(
                |State(server): State<HookServer>,
                 headers: axum::http::HeaderMap,
                 Json(event): Json<Value>| async move {
                    let mut seen = event.clone();
                    seen["idempotency_key"] = headers
                        .get("idempotency-key")
                        .and_then(|v| v.to_str().ok())
                        .map_or(Value::Null, |k| json!(k));
                    server.seen.lock().expect("lock").push(seen);
                    let (status, body) = (server.decide)(&event);
                    (
                        AxumStatus::from_u16(status).unwrap_or(AxumStatus::OK),
                        Json(body),
                    )
                },
            ),
        )
        .with_state(server);
    let url = format!("{}/hook", spool_tests::serve(app).await);
    (seen, url)
}

/// The upstream: calls get_weather(Paris) first, then repeats what the tool said.
async fn weather_model() -> FakeLlm {
    FakeLlm::start(weather_then_echo()).await
}

fn last_tool_message(fake: &FakeLlm) -> String {
    let requests = fake.requests();
    requests
        .last()
        .and_then(fake_llm::last_tool_result)
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn a_deny_rule_blocks_the_call_and_the_model_sees_why() {
    let fake = weather_model().await;
    let (tools, base) = Tools::start().await;
    let app = Harness::start(&fake).await;
    let agent = app.create_agent(&json!({"name": "ruled", "model": "gpt-4o-mini",
        "tools": [http_tool("get_weather", format!("{base}/weather"))],
        "hooks": [
            {"event": "pre_tool_use", "type": "rule", "matcher": "get_.*", "message": "Paris is off limits",
             "conditions": [{"argument": "city", "operator": "starts_with", "value": "Par"}]},
            {"event": "pre_tool_use", "type": "rule", "message": "never reached",
             "conditions": [{"argument": "city", "operator": "in", "value": ["Paris"]}]}]})).await;
    let (_, accepted) = app.ask(&agent, "weather?").await;
    assert_eq!(app.finished(&accepted).await["status"], "completed");
    assert!(tools.calls().is_empty(), "the denied call was not made");
    let seen = last_tool_message(&fake);
    assert!(
        seen.contains("Paris is off limits") && !seen.contains("never reached"),
        "{seen}"
    );
}

#[tokio::test]
async fn http_hooks_rewrite_arguments_and_results() {
    let fake = weather_model().await;
    let (tools, base) = Tools::start().await;
    let (seen, hook) = hook_server(|event| match event["event"].as_str() {
        Some("pre_tool_use") => (
            200,
            json!({"decision": "modify", "arguments": {"city": "Lyon"}}),
        ),
        Some("post_tool_use") => (
            200,
            json!({"decision": "modify", "output": "rewritten result"}),
        ),
        _ => (200, json!({"decision": "allow"})),
    })
    .await;
    let app = Harness::start(&fake).await;
    let agent = app.create_agent(&json!({"name": "rewrite", "model": "gpt-4o-mini",
        "tools": [http_tool("get_weather", format!("{base}/weather"))],
        "hooks": [{"event": "pre_tool_use", "type": "http", "url": hook},
                  {"event": "post_tool_use", "type": "http", "url": hook, "matcher": "get_weather"}]})).await;
    let (_, accepted) = app.ask(&agent, "weather?").await;
    assert_eq!(app.finished(&accepted).await["status"], "completed");
    assert_eq!(
        tools.calls()[0].2,
        json!({"city": "Lyon"}),
        "the tool got the rewritten arguments"
    );
    assert_eq!(last_tool_message(&fake), "rewritten result");
    let events: Vec<Value> = seen.lock().expect("lock").clone();
    assert_eq!(events[0]["event"], "pre_tool_use");
    assert_eq!(events[0]["tool_name"], "get_weather");
    assert_eq!(events[0]["arguments"]["city"], "Paris");
    assert_eq!(events[0]["workflow_id"], accepted["workflow_id"]);
    assert_eq!(events[1]["event"], "post_tool_use");
    assert!(
        events[1]["output"]
            .as_str()
            .is_some_and(|o| o.contains("sunny in Lyon"))
    );
}

#[tokio::test]
async fn an_http_hook_can_deny_a_call_and_one_that_hangs_is_passed_over_at_its_timeout() {
    let fake = weather_model().await;
    let (tools, base) = Tools::start().await;
    let (seen, deny) = hook_server(|_| {
        (
            200,
            json!({"decision": "deny", "reason": "weather is classified"}),
        )
    })
    .await;
    // A hook endpoint that never answers in time.
    let slow = axum::Router::new().route(
        "/hook",
        post(|| async {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Json(json!({"decision": "deny", "reason": "too late to count"}))
        }),
    );
    let hanging_url = format!("{}/hook", spool_tests::serve(slow).await);
    let app = Harness::start(&fake).await;

    // The hanging hook comes first: after its 1 s it is passed over, and the deny still holds.
    let agent = app.create_agent(&json!({"name": "guarded", "model": "gpt-4o-mini",
        "tools": [http_tool("get_weather", format!("{base}/weather"))],
        "hooks": [{"event": "pre_tool_use", "type": "http", "url": hanging_url, "timeout_secs": 1},
                  {"event": "pre_tool_use", "type": "http", "url": deny, "matcher": "get_weather"}]})).await;
    let started = std::time::Instant::now();
    let (_, accepted) = app.ask(&agent, "weather?").await;
    assert_eq!(app.finished(&accepted).await["status"], "completed");
    assert!(
        // Ignoring its timeout would hold the run for the tool client's 30 s or the hook's 60.
        started.elapsed() < Duration::from_secs(15),
        "the hanging hook held the run for {:?}",
        started.elapsed()
    );
    assert!(tools.calls().is_empty(), "the denied call was not made");
    let told = last_tool_message(&fake);
    assert!(
        told.contains("weather is classified") && !told.contains("too late"),
        "{told}"
    );
    assert_eq!(seen.lock().expect("lock")[0]["tool_name"], "get_weather");

    // Alone, the hanging hook fails open: the call is made.
    let agent = app.create_agent(&json!({"name": "slow", "model": "gpt-4o-mini",
        "tools": [http_tool("get_weather", format!("{base}/weather"))],
        "hooks": [{"event": "pre_tool_use", "type": "http", "url": hanging_url, "timeout_secs": 1}]})).await;
    let (_, accepted) = app.ask(&agent, "weather?").await;
    assert_eq!(app.finished(&accepted).await["status"], "completed");
    assert_eq!(
        tools.calls().len(),
        1,
        "a hook past its timeout allows the call"
    );
}

#[tokio::test]
async fn failing_or_dead_http_hooks_fail_open() {
    let fake = weather_model().await;
    let (tools, base) = Tools::start().await;
    let (_, broken) = hook_server(|_| (500, json!({"decision": "deny"}))).await;
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port");
    let app = Harness::start(&fake).await;
    let agent = app.create_agent(&json!({"name": "open", "model": "gpt-4o-mini",
        "tools": [http_tool("get_weather", format!("{base}/weather"))],
        "hooks": [{"event": "pre_tool_use", "type": "http", "url": broken},
                  {"event": "pre_tool_use", "type": "http", "url": format!("http://{dead}/hook"), "timeout_secs": 1},
                  {"event": "on_run_start", "type": "http", "url": broken}]})).await;
    let (_, accepted) = app.ask(&agent, "weather?").await;
    assert_eq!(app.finished(&accepted).await["status"], "completed");
    assert_eq!(tools.calls().len(), 1, "a failing hook allows the call");
}

#[tokio::test]
async fn guard_hooks_that_fail_closed_deny_the_call_the_run_and_the_answer() {
    let fake = weather_model().await;
    let (tools, base) = Tools::start().await;
    let (_, broken) = hook_server(|_| (500, json!({"decision": "allow"}))).await;
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port");
    let app = Harness::start(&fake).await;
    // A failing pre_tool_use guard: the call is not made, the model is told, the run goes on;
    // and the answer's failing pre_response guard replaces it.
    let agent = app
        .create_agent(&json!({"name": "closed", "model": "gpt-4o-mini",
        "tools": [http_tool("get_weather", format!("{base}/weather"))],
        "hooks": [{"event": "pre_tool_use", "type": "http", "url": broken, "fail": "closed"},
                  {"event": "pre_response", "type": "http", "url": format!("http://{dead}/hook"),
                   "timeout_secs": 1, "fail": "closed"}]}))
        .await;
    let (thread, accepted) = app.ask(&agent, "weather?").await;
    assert_eq!(app.finished(&accepted).await["status"], "completed");
    assert!(
        tools.calls().is_empty(),
        "a guard that failed closed denies the call"
    );
    let seen = last_tool_message(&fake);
    assert!(seen.contains("fails closed"), "{seen}");
    let page = app.messages(thread).await;
    assert_eq!(
        page["messages"][1]["content"],
        "Sorry, I can't help with that."
    );
    assert_eq!(page["messages"][1]["blocked"], true);
    // A failing on_run_start guard blocks the run before any model call.
    let asked = fake.requests().len();
    let gate = app
        .create_agent(&json!({"name": "gate", "model": "gpt-4o-mini",
        "hooks": [{"event": "on_run_start", "type": "http", "url": broken, "fail": "closed"}]}))
        .await;
    let (_, accepted) = app.ask(&gate, "hello").await;
    let run = app.finished(&accepted).await;
    assert_eq!(run["status"], "failed");
    assert_eq!(run["error"]["code"], "blocked_by_hook");
    assert_eq!(fake.requests().len(), asked, "no model call");
}

#[tokio::test]
async fn on_run_start_can_block_the_run_before_any_model_call() {
    let fake = weather_model().await;
    let (_, hook) = hook_server(|event| {
        if event["input_text"] == "forbidden topic" {
            (
                200,
                json!({"decision": "deny", "reason": "topic not allowed"}),
            )
        } else {
            (200, json!({"decision": "allow"}))
        }
    })
    .await;
    let app = Harness::start(&fake).await;
    let agent = app
        .create_agent(&json!({"name": "gate", "model": "gpt-4o-mini",
        "hooks": [{"event": "on_run_start", "type": "http", "url": hook}]}))
        .await;
    let (_, accepted) = app.ask(&agent, "forbidden topic").await;
    let run = app.finished(&accepted).await;
    assert_eq!(run["status"], "failed");
    assert_eq!(run["error"]["code"], "blocked_by_hook");
    assert_eq!(run["error"]["message"], "topic not allowed");
    assert!(fake.requests().is_empty());
    let (_, allowed) = app.ask(&agent, "fine topic").await;
    assert_eq!(app.finished(&allowed).await["status"], "completed");
}

#[tokio::test]
async fn pre_response_rewrites_or_replaces_the_final_text_before_anyone_sees_it() {
    let fake = FakeLlm::start(|request, _| {
        let text = request["messages"]
            .as_array()
            .and_then(|m| m.last())
            .and_then(|m| m["content"].as_str())
            .unwrap_or("")
            .to_owned();
        fake_llm::text(&format!("secret answer to {text}"), 3)
    })
    .await;
    let (_, hook) = hook_server(|event| {
        let text = event["text"].as_str().unwrap_or("");
        if text.contains("block") {
            let said = json!({"decision": "deny", "reason": "leaks a secret",
                              "text": "I can't share that."});
            (200, said)
        } else if text.contains("quiet") {
            (200, json!({"decision": "deny"}))
        } else {
            (
                200,
                json!({"decision": "modify", "text": text.replace("secret", "[redacted]")}),
            )
        }
    })
    .await;
    let app = Harness::start(&fake).await;
    let agent = app
        .create_agent(&json!({"name": "filter", "model": "gpt-4o-mini",
        "hooks": [{"event": "pre_response", "type": "http", "url": hook}]}))
        .await;
    let (thread, accepted) = app.ask(&agent, "q1").await;
    assert_eq!(app.finished(&accepted).await["status"], "completed");
    let streamed: String = app
        .events(thread)
        .await
        .iter()
        .filter(|e| e.event == "text_delta")
        .filter_map(|e| e.json()["data"]["delta"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(
        streamed, "[redacted] answer to q1",
        "the original text never went out"
    );
    let page = app.messages(thread).await;
    assert_eq!(page["messages"][1]["content"], "[redacted] answer to q1");

    // A denial answers with the hook's text (else a default), and the run completes.
    for (input, answer) in [
        ("block me", "I can't share that."),
        ("quiet please", "Sorry, I can't help with that."),
    ] {
        let (thread, blocked) = app.ask(&agent, input).await;
        let run = app.finished(&blocked).await;
        assert_eq!(run["status"], "completed", "{run}");
        assert!(run["error"].is_null(), "{run}");
        let page = app.messages(thread).await;
        let message = &page["messages"][1];
        assert_eq!(message["content"], answer);
        assert_eq!(message["blocked"], true);
        let events = app.events(thread).await;
        let streamed: String = events
            .iter()
            .filter(|e| e.event == "text_delta")
            .filter_map(|e| e.json()["data"]["delta"].as_str().map(str::to_owned))
            .collect();
        assert_eq!(streamed, answer, "the model's text never went out");
        let end = events
            .iter()
            .find(|e| e.event == "message_end")
            .expect("message_end");
        assert_eq!(end.json()["data"]["blocked"], true);
    }
    assert_eq!(page["messages"][1]["blocked"], false);
}

#[tokio::test]
async fn on_run_complete_is_told_how_the_run_ended() {
    let fake = FakeLlm::start(|_, _| fake_llm::text("all done", 1)).await;
    let (seen, hook) = hook_server(|_| (200, json!({}))).await;
    let app = Harness::start(&fake).await;
    let agent = app
        .create_agent(&json!({"name": "notify", "model": "gpt-4o-mini",
        "hooks": [{"event": "on_run_complete", "type": "http", "url": hook}]}))
        .await;
    let (_, accepted) = app.ask(&agent, "hi").await;
    assert_eq!(app.finished(&accepted).await["status"], "completed");
    let event = poll_until("the completion hook", Duration::from_secs(10), || async {
        seen.lock().expect("lock").first().cloned()
    })
    .await;
    assert_eq!(event["event"], "on_run_complete");
    assert_eq!(event["status"], "completed");
    assert_eq!(event["content"], "all done");
    assert_eq!(event["workflow_id"], accepted["workflow_id"]);
}

#[tokio::test]
async fn a_failed_run_calls_on_run_failed_and_only_a_completed_one_calls_on_run_complete() {
    // The first model call is refused (the run fails `model_error`); later ones answer.
    let fake = FakeLlm::start(|_, n| match n {
        0 => fake_llm::Reply::Status(400, r#"{"error": {"message": "bad request"}}"#.into(), None),
        _ => fake_llm::text("all done", 1),
    })
    .await;
    let (seen, hook) = hook_server(|_| (200, json!({}))).await;
    let app = Harness::start(&fake).await;
    let agent = app
        .create_agent(&json!({"name": "notify", "model": "gpt-4o-mini",
        "hooks": [{"event": "on_run_complete", "type": "http", "url": hook},
                  {"event": "on_run_failed", "type": "http", "url": hook},
                  {"event": "on_run_cancelled", "type": "http", "url": hook}]}))
        .await;
    let (_, failed) = app.ask(&agent, "first").await;
    assert_eq!(app.finished(&failed).await["status"], "failed");
    let (_, completed) = app.ask(&agent, "second").await;
    assert_eq!(app.finished(&completed).await["status"], "completed");
    // The completed run's hook is called after the failed run's end was told: once it is
    // seen, everything the first run's end fired has been spawned long before.
    poll_until("both runs' hooks", Duration::from_secs(10), || async {
        let seen = seen.lock().expect("lock");
        (seen.len() >= 2
            && seen
                .iter()
                .any(|e| e["workflow_id"] == completed["workflow_id"]))
        .then_some(())
    })
    .await;
    let mut told: Vec<(String, String, String)> = seen
        .lock()
        .expect("lock")
        .iter()
        .map(|e| {
            let run = if e["workflow_id"] == failed["workflow_id"] {
                "failed run"
            } else {
                "completed run"
            };
            let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
            (run.to_owned(), text(&e["event"]), text(&e["status"]))
        })
        .collect();
    told.sort();
    assert_eq!(
        told,
        [
            (
                "completed run".into(),
                "on_run_complete".into(),
                "completed".into()
            ),
            ("failed run".into(), "on_run_failed".into(), "failed".into()),
        ]
    );
}

#[tokio::test]
async fn every_hook_call_has_its_own_idempotency_key() {
    // Two calls in one step, two pre_tool_use hooks, one post_tool_use hook, and the run's end.
    let fake = FakeLlm::start(|request, _| {
        if fake_llm::tool_results_in(request) == 0 {
            fake_llm::tool_calls(&[
                ("call_a", "get_weather", r#"{"city":"Paris"}"#),
                ("call_b", "get_weather", r#"{"city":"Lyon"}"#),
            ])
        } else {
            fake_llm::text("done", 1)
        }
    })
    .await;
    let (_, base) = Tools::start().await;
    let (seen, hook) = hook_server(|_| (200, json!({"decision": "allow"}))).await;
    let app = Harness::start(&fake).await;
    let agent = app
        .create_agent(&json!({"name": "keyed", "model": "gpt-4o-mini",
        "tools": [http_tool("get_weather", format!("{base}/weather"))],
        "hooks": [{"event": "pre_tool_use", "type": "http", "url": hook},
                  {"event": "pre_tool_use", "type": "http", "url": hook},
                  {"event": "post_tool_use", "type": "http", "url": hook},
                  {"event": "on_run_complete", "type": "http", "url": hook}]}))
        .await;
    let (_, accepted) = app.ask(&agent, "weather?").await;
    assert_eq!(app.finished(&accepted).await["status"], "completed");
    let wf = accepted["workflow_id"]
        .as_str()
        .expect("workflow id")
        .to_owned();
    let events = poll_until("all seven hook calls", Duration::from_secs(10), || async {
        let events = seen.lock().expect("lock").clone();
        (events.len() == 7).then_some(events)
    })
    .await;
    let mut keys: Vec<String> = events
        .iter()
        .map(|e| e["idempotency_key"].as_str().expect("a key").to_owned())
        .collect();
    keys.sort();
    let mut expected = vec![
        format!("{wf}:1:call_a:pre_tool_use:0"),
        format!("{wf}:1:call_a:pre_tool_use:1"),
        format!("{wf}:1:call_b:pre_tool_use:0"),
        format!("{wf}:1:call_b:pre_tool_use:1"),
        format!("{wf}:1:call_a:post_tool_use:2"),
        format!("{wf}:1:call_b:post_tool_use:2"),
        format!("{wf}:on_run_complete:3"),
    ];
    expected.sort();
    assert_eq!(keys, expected, "one key per call, event and hook");
}

#[tokio::test]
async fn a_hook_s_rewrite_over_the_result_limit_is_cut_like_any_tool_result() {
    let fake = weather_model().await;
    let (_, base) = Tools::start().await;
    let (_, hook) = hook_server(|_| {
        (
            200,
            json!({"decision": "modify", "output": "h".repeat(50_007)}),
        )
    })
    .await;
    let app = Harness::start(&fake).await;
    let agent = app
        .create_agent(&json!({"name": "verbose", "model": "gpt-4o-mini",
        "tools": [http_tool("get_weather", format!("{base}/weather"))],
        "hooks": [{"event": "post_tool_use", "type": "http", "url": hook}]}))
        .await;
    let (_, accepted) = app.ask(&agent, "weather?").await;
    assert_eq!(app.finished(&accepted).await["status"], "completed");
    let requests = fake.requests();
    let seen = fake_llm::last_tool_result(&requests[1]).unwrap_or_default();
    assert!(
        seen.ends_with("\n[truncated: 47 more characters]"),
        "{}",
        seen.len()
    );
}
