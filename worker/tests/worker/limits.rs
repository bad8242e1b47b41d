//! Per-run limits (docs/agents.md): `max_steps`, `max_tool_calls`, `max_parallel_tools`,
//! `timeout_secs` (by the database clock, from enqueue) and `max_output_tokens`. Reaching one
//! fails the run with its code, keeps the partial message, and streams `message_end` and `done`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::routing::post;
use serde_json::{Value, json};

use spool_tests::fake_llm::{self, FakeLlm, tool_results_in};
use spool_tests::tools::{Tools, http_tool};

use crate::harness::Harness;

/// The last two event types of the run's stream.
async fn ending(app: &Harness, thread: uuid::Uuid) -> Vec<String> {
    let kinds: Vec<String> = app
        .events(thread)
        .await
        .into_iter()
        .map(|f| f.event)
        .filter(|k| k != "heartbeat")
        .collect();
    kinds[kinds.len().saturating_sub(2)..].to_vec()
}

#[tokio::test]
async fn a_step_past_max_tool_calls_fails_the_run_before_its_calls_run() {
    // A new call every step (different arguments, so no doom loop), with some text first.
    let fake = FakeLlm::start(|request, _| {
        let n = tool_results_in(request);
        let (id, arguments) = (format!("c{n}"), format!(r#"{{"n": {n}}}"#));
        let reply = fake_llm::tool_calls(&[(&id, "create", &arguments)]);
        fake_llm::with_text(reply, &format!("Step {n}. "))
    })
    .await;
    let (tools, base) = Tools::start().await;
    let app = Harness::start(&fake).await;
    let agent = app
        .create_agent(&json!({"name": "busy", "model": "gpt-4o-mini",
            "limits": {"max_tool_calls": 2},
            "tools": [http_tool("create", format!("{base}/create"))]}))
        .await;
    let (thread, accepted) = app.ask(&agent, "go").await;
    let run = app.finished(&accepted).await;
    assert_eq!(run["status"], "failed");
    assert_eq!(run["error"]["code"], "max_tool_calls_exceeded", "{run}");
    assert_eq!(tools.calls().len(), 2, "the third call was never made");
    let message = &app.messages(thread).await["messages"][1];
    assert_eq!(message["status"], "failed");
    assert!(
        message["content"]
            .as_str()
            .is_some_and(|c| c.contains("Step 2.")),
        "the partial message is kept: {message}"
    );
    assert_eq!(ending(&app, thread).await, ["message_end", "done"]);
}

#[tokio::test]
async fn an_agent_without_max_tool_calls_still_stops_at_the_default() {
    // Forty new calls every step (different arguments: no doom loop), with no limit set.
    let fake = FakeLlm::start(|request, _| {
        let n = tool_results_in(request);
        let calls: Vec<(String, String)> = (n..n + 40)
            .map(|i| (format!("c{i}"), format!(r#"{{"n": {i}}}"#)))
            .collect();
        let calls: Vec<(&str, &str, &str)> = calls
            .iter()
            .map(|(id, arguments)| (id.as_str(), "create", arguments.as_str()))
            .collect();
        fake_llm::tool_calls(&calls)
    })
    .await;
    let (tools, base) = Tools::start().await;
    let app = Harness::start(&fake).await;
    let agent = app
        .create_agent(&json!({"name": "tireless", "model": "gpt-4o-mini",
            "tools": [http_tool("create", format!("{base}/create"))]}))
        .await;
    let (_, accepted) = app.ask(&agent, "go").await;
    let run = app.finished(&accepted).await;
    assert_eq!(run["error"]["code"], "max_tool_calls_exceeded", "{run}");
    let default = spool_shared::agent::DEFAULT_MAX_TOOL_CALLS as usize;
    assert_eq!(
        tools.calls().len(),
        default,
        "five steps of 40, not the sixth"
    );
}

#[tokio::test]
async fn limits_max_steps_and_max_output_tokens_shape_the_requests() {
    let fake = FakeLlm::start(|request, _| match tool_results_in(request) {
        0 => fake_llm::tool_calls(&[("c1", "create", r#"{"n": 1}"#)]),
        _ => fake_llm::text("done", 1),
    })
    .await;
    let (_, base) = Tools::start().await;
    let app = Harness::start(&fake).await;
    let agent = app
        .create_agent(
            &json!({"name": "short", "model": "gpt-4o-mini", "max_steps": 25,
            "limits": {"max_steps": 1, "max_output_tokens": 64},
            "tools": [http_tool("create", format!("{base}/create"))]}),
        )
        .await;
    let (_, accepted) = app.ask(&agent, "go").await;
    assert_eq!(app.finished(&accepted).await["status"], "completed");
    let requests = fake.requests();
    assert_eq!(
        requests.len(),
        1,
        "one step: limits.max_steps wins over max_steps"
    );
    assert_eq!(requests[0]["max_tokens"], 64);
    assert!(
        requests[0].get("tools").is_none_or(Value::is_null),
        "the last step offers no tools: {}",
        requests[0]
    );
}

#[tokio::test]
async fn max_parallel_tools_bounds_the_read_only_calls_running_at_once() {
    #[derive(Clone, Default)]
    struct Peak {
        in_flight: Arc<std::sync::atomic::AtomicUsize>,
        seen: Arc<Mutex<Vec<usize>>>,
    }
    let peak = Peak::default();
    let handler = |State(peak): State<Peak>| async move {
        use std::sync::atomic::Ordering;
        let now = peak.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        // Long enough for every call of a batch to be in flight together.
        tokio::time::sleep(Duration::from_millis(150)).await;
        peak.seen.lock().expect("lock").push(now);
        peak.in_flight.fetch_sub(1, Ordering::SeqCst);
        "ok"
    };
    let base = spool_tests::serve(
        axum::Router::new()
            .route("/look", post(handler))
            .with_state(peak.clone()),
    )
    .await;
    let fake = FakeLlm::start(|request, _| match tool_results_in(request) {
        0 => fake_llm::tool_calls(&[
            ("r1", "look", r#"{"n": 1}"#),
            ("r2", "look", r#"{"n": 2}"#),
            ("r3", "look", r#"{"n": 3}"#),
            ("r4", "look", r#"{"n": 4}"#),
            ("r5", "look", r#"{"n": 5}"#),
        ]),
        _ => fake_llm::text("done", 1),
    })
    .await;
    let app = Harness::start(&fake).await;
    let mut look = http_tool("look", format!("{base}/look"));
    look["read_only"] = json!(true);
    let agent = app
        .create_agent(&json!({"name": "bounded", "model": "gpt-4o-mini",
            "limits": {"max_parallel_tools": 2}, "tools": [look]}))
        .await;
    let (_, accepted) = app.ask(&agent, "go").await;
    assert_eq!(app.finished(&accepted).await["status"], "completed");
    let seen = peak.seen.lock().expect("lock").clone();
    assert_eq!(seen.len(), 5);
    assert_eq!(seen.iter().max(), Some(&2), "at most two at once: {seen:?}");
}

#[tokio::test]
async fn a_run_past_its_timeout_by_the_database_clock_fails_even_if_it_never_ran() {
    let fake = FakeLlm::start(|_, _| fake_llm::text("never", 1)).await;
    let app = Harness::start(&fake).await;
    let agent = app
        .create_agent(&json!({"name": "late", "model": "gpt-4o-mini",
            "limits": {"timeout_secs": 60}}))
        .await;
    let (thread, accepted) = app.ask(&agent, "hello?").await;
    // Enqueued a minute and a half ago by the database's clock (a long queue, a crash loop).
    sqlx::query("UPDATE runs SET created_at = now() - interval '90 seconds' WHERE id = $1")
        .bind(uuid::Uuid::parse_str(accepted["workflow_id"].as_str().expect("id")).expect("uuid"))
        .execute(&app.db.pool)
        .await
        .expect("age the run");
    let run = app.finished(&accepted).await;
    assert_eq!(run["error"]["code"], "timeout", "{run}");
    assert!(
        fake.requests().is_empty(),
        "no model call after the deadline"
    );
    assert_eq!(ending(&app, thread).await, ["message_end", "done"]);
}

#[tokio::test]
async fn a_run_still_working_at_its_timeout_stops_and_keeps_its_partial_message() {
    let fake = FakeLlm::start(|request, _| match tool_results_in(request) {
        0 => fake_llm::with_text(
            fake_llm::tool_calls(&[("h1", "hang", r#"{"n": 1}"#)]),
            "Let me check. ",
        ),
        _ => fake_llm::text("never", 1),
    })
    .await;
    let (_, base) = Tools::start().await;
    let app = Harness::start(&fake).await;
    let agent = app
        .create_agent(&json!({"name": "slow", "model": "gpt-4o-mini",
            "limits": {"timeout_secs": 5},
            "tools": [http_tool("hang", format!("{base}/hang"))]}))
        .await;
    let started = Instant::now();
    let (thread, accepted) = app.ask(&agent, "go").await;
    let run = app.finished(&accepted).await;
    assert_eq!(run["error"]["code"], "timeout", "{run}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    let message = &app.messages(thread).await["messages"][1];
    assert!(
        message["content"]
            .as_str()
            .is_some_and(|c| c.contains("Let me check.")),
        "{message}"
    );
    assert_eq!(ending(&app, thread).await, ["message_end", "done"]);
}

#[tokio::test]
async fn a_pause_ends_by_the_runs_timeout_and_the_run_fails_with_timeout() {
    let fake = FakeLlm::start(|_, _| {
        fake_llm::tool_calls(&[("f1", "read_local_file", r#"{"path": "a"}"#)])
    })
    .await;
    let app = Harness::start(&fake).await;
    let agent = app
        .create_agent(&json!({"name": "waits", "model": "gpt-4o-mini",
            "limits": {"timeout_secs": 5, "human_timeout_secs": 86400},
            "tools": [{"type": "client", "name": "read_local_file"}]}))
        .await;
    let (_, accepted) = app.ask(&agent, "read a").await;
    let paused = app.run_until(&accepted, |s| s == "requires_action").await;
    assert_eq!(paused["status"], "requires_action");
    let id = uuid::Uuid::parse_str(accepted["workflow_id"].as_str().expect("id")).expect("uuid");
    let (slack,): (f64,) = sqlx::query_as(
        "SELECT extract(epoch FROM (created_at + interval '5 seconds') - pause_expires_at)::float8
           FROM runs WHERE id = $1",
    )
    .bind(id)
    .fetch_one(&app.db.pool)
    .await
    .expect("deadline");
    // Within a second of it (the worker counts the remaining time from its claim on its own
    // monotonic clock, a few milliseconds late); the claim then judges by the database's.
    assert!(
        (-1.0..5.0).contains(&slack),
        "the pause ends by the run's deadline, not in a day: {slack} s before it"
    );
    // Nobody answers: the claim takes the expired pause and the run fails with `timeout`.
    let run = app.finished(&accepted).await;
    assert_eq!(run["error"]["code"], "timeout", "{run}");
}
