//! Cancel: queued, streaming, during a tool call, paused; twice; racing completion.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use spool_tests::fake_llm::{self, FakeLlm};
use spool_tests::{poll_until, token};

use spool_tests::tools::{Tools, http_tool};

use crate::common::{TestApp, app_with, ask, terminal, worker_args};

async fn cancel(app: &TestApp, accepted: &Value, reason: &str) -> (StatusCode, Value) {
    let workflow = accepted["workflow_id"].as_str().expect("id");
    app.post(
        &token("alice", "acme"),
        &format!("/v1/workflows/{workflow}/cancel"),
        &json!({"reason": reason}),
    )
    .await
}

async fn message(app: &TestApp, accepted: &Value) -> Value {
    let thread = accepted["thread_id"].as_str().expect("id");
    let (_, page) = app
        .get(
            &token("alice", "acme"),
            &format!("/v1/threads/{thread}/messages"),
        )
        .await;
    page["messages"][1].clone()
}

#[tokio::test]
async fn a_queued_run_is_cancelled_at_once_and_the_thread_accepts_new_messages() {
    let app = TestApp::start(0, worker_args(3, 0)).await;
    let alice = token("alice", "acme");
    let thread = Uuid::new_v4();
    let (_, accepted) = app.send_message(&alice, thread, "never mind").await;
    let (status, run) = cancel(&app, &accepted, "changed my mind").await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(run["status"], "cancelled");
    assert_eq!(run["cancelled_by"], "alice", "{run}");
    assert_eq!(message(&app, &accepted).await["status"], "cancelled");
    let kinds: Vec<String> = app
        .stored(thread)
        .await
        .into_iter()
        .map(|(_, k)| k)
        .collect();
    assert_eq!(kinds, ["message_start", "message_end", "done"]);
    let (status, again) = cancel(&app, &accepted, "second thoughts").await;
    assert_eq!(status, StatusCode::ACCEPTED, "idempotent");
    assert_eq!(again["status"], "cancelled");
    let (reason, by): (Option<String>, Option<String>) =
        sqlx::query_as("SELECT cancel_reason, cancelled_by FROM runs")
            .fetch_one(&app.db.pool)
            .await
            .expect("row");
    assert_eq!(
        (reason.as_deref(), by.as_deref()),
        (Some("changed my mind"), Some("alice")),
        "the first request is recorded"
    );
    let (status, queued) = app.send_message(&alice, thread, "new question").await;
    assert_eq!(status, StatusCode::ACCEPTED);
    // Neither another user of the tenant nor anyone of another tenant can cancel, or see, a
    // run, finished or queued.
    for run in [&accepted, &queued] {
        let path = format!(
            "/v1/workflows/{}/cancel",
            run["workflow_id"].as_str().expect("id")
        );
        for intruder in [token("mallory", "acme"), token("alice", "globex")] {
            let (status, body) = app.post(&intruder, &path, &json!({})).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
        }
    }
    assert_eq!(
        finished_status(&app, &queued).await,
        "queued",
        "still waiting for a worker"
    );
    app.stop().await;
}

#[tokio::test]
async fn cancelling_while_the_model_streams_stops_it_and_keeps_the_partial_message() {
    let app = TestApp::start(1, worker_args(400, 20)).await;
    let alice = token("alice", "acme");
    let thread = Uuid::new_v4();
    let (_, accepted) = app.send_message(&alice, thread, "talk a lot").await;
    poll_until("some text to stream", Duration::from_secs(10), || async {
        (app.stored(thread)
            .await
            .iter()
            .filter(|(_, k)| k == "text_delta")
            .count()
            >= 3)
            .then_some(())
    })
    .await;
    let (status, _) = cancel(&app, &accepted, "too long").await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let run = app.wait_run(&accepted, |s| s == "cancelled").await;
    assert_eq!(run["status"], "cancelled");
    let message = message(&app, &accepted).await;
    assert_eq!(message["status"], "cancelled");
    let content = message["content"].as_str().expect("content");
    let full = spool_worker::demo::reply("talk a lot", 400).concat();
    assert!(
        !content.is_empty() && full.starts_with(content) && content.len() < full.len(),
        "partial: {content:?}"
    );
    let stored = app.stored(thread).await;
    let kinds: Vec<&str> = stored.iter().map(|(_, k)| k.as_str()).collect();
    assert_eq!(&kinds[kinds.len() - 2..], ["message_end", "done"]);
    // What a client sees: the segment ends as cancelled, with the partial text before it.
    let frames = app
        .replay_all(&alice, thread)
        .await
        .collect(Duration::from_secs(10))
        .await;
    let end = frames
        .iter()
        .find(|f| f.event == "message_end")
        .expect("message_end")
        .json();
    assert_eq!(end["data"]["status"], "cancelled", "{end}");
    let streamed: String = frames
        .iter()
        .filter(|f| f.event == "text_delta")
        .filter_map(|f| f.json()["data"]["delta"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(streamed, content, "the stream and the saved partial agree");
    app.stop().await;
}

#[tokio::test]
async fn cancelling_during_a_tool_call_stops_the_run_at_once() {
    let fake = FakeLlm::start(|_, _| fake_llm::tool_calls(&[("call_h", "hang", "{}")])).await;
    let (tools, base) = Tools::start().await;
    let app = app_with(&fake).await;
    let agent = app
        .create_agent(
            "acme",
            &json!({"name": "hang", "model": "gpt-4o-mini",
        "tools": [http_tool("hang", format!("{base}/hang"))]}),
        )
        .await;
    let (_, accepted) = ask(&app, &agent, "hang").await;
    poll_until(
        "the tool call to be in flight",
        Duration::from_secs(10),
        || async { (!tools.calls().is_empty()).then_some(()) },
    )
    .await;
    let (status, _) = cancel(&app, &accepted, "stuck").await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let run = app.wait_run(&accepted, |s| s == "cancelled").await;
    assert_eq!(
        run["status"], "cancelled",
        "well before the 30 s tool timeout"
    );
    app.stop().await;
}

#[tokio::test]
async fn cancelling_a_paused_run_ends_it_and_its_pause_can_no_longer_be_answered() {
    let fake = FakeLlm::start(|_, _| fake_llm::tool_calls(&[("call_c", "ask_user", "{}")])).await;
    let app = app_with(&fake).await;
    let agent = app
        .create_agent(
            "acme",
            &json!({"name": "asker", "model": "gpt-4o-mini",
        "tools": [{"type": "client", "name": "ask_user"}]}),
        )
        .await;
    let (_, accepted) = ask(&app, &agent, "ask me").await;
    let alice = token("alice", "acme");
    let workflow = accepted["workflow_id"].as_str().expect("id").to_owned();
    poll_until("the pause", Duration::from_secs(10), || async {
        let (_, run) = app.get(&alice, &format!("/v1/workflows/{workflow}")).await;
        (run["status"] == "requires_action").then_some(())
    })
    .await;
    let (status, run) = cancel(&app, &accepted, "gave up").await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(run["status"], "cancelled");
    let (status, body) = app
        .post(
            &alice,
            &format!("/v1/workflows/{workflow}/tool_outputs"),
            &json!({"tool_outputs": [{"tool_call_id": "call_c", "output": "late"}]}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["error"]["code"], "run_not_waiting");
    assert_eq!(finished_status(&app, &accepted).await, "cancelled");
    app.stop().await;
}

async fn finished_status(app: &TestApp, accepted: &Value) -> String {
    let (_, run) = app
        .get(
            &token("alice", "acme"),
            &format!(
                "/v1/workflows/{}",
                accepted["workflow_id"].as_str().expect("id")
            ),
        )
        .await;
    run["status"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn a_cancel_racing_completion_ends_in_exactly_one_terminal_state_that_never_changes() {
    let app = TestApp::start(2, worker_args(2, 0)).await;
    let alice = token("alice", "acme");
    let mut outcomes = Vec::new();
    for i in 0..12 {
        let (_, accepted) = app
            .send_message(&alice, Uuid::new_v4(), &format!("race {i}"))
            .await;
        let (status, _) = cancel(&app, &accepted, "race").await;
        assert_eq!(status, StatusCode::ACCEPTED);
        let run = app.wait_run(&accepted, terminal).await;
        let status = run["status"].as_str().expect("status").to_owned();
        let message = message(&app, &accepted).await;
        assert_eq!(message["status"], status.as_str(), "message and run agree");
        outcomes.push((accepted, status));
    }
    // Terminal states never change afterwards, whatever the workers still do.
    for (accepted, status) in &outcomes {
        let (_, again) = cancel(&app, accepted, "again").await;
        assert_eq!(again["status"], status.as_str());
        assert_eq!(&finished_status(&app, accepted).await, status);
    }
    println!(
        "race outcomes: {:?}",
        outcomes.iter().map(|(_, s)| s.as_str()).collect::<Vec<_>>()
    );
    app.stop().await;
}
