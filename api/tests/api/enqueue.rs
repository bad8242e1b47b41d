//! `POST user_message`: the 202 contract, the busy rule, idempotency, the persisted reply.

use reqwest::StatusCode;
use serde_json::json;
use uuid::Uuid;

use spool_tests::token;

use crate::common::{TestApp, worker_args};

#[tokio::test]
async fn a_message_is_accepted_with_202_committed_and_answered_by_the_demo_model() {
    let app = TestApp::start(1, worker_args(5, 0)).await;
    let alice = token("alice", "acme");
    let thread = Uuid::new_v4();
    let response = app
        .http
        .post(app.url(&format!("/v1/threads/{thread}/user_message")))
        .bearer_auth(&alice)
        .json(&json!({"input_text": "hello spool"}))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    let location = response.headers()["location"]
        .to_str()
        .expect("ascii")
        .to_owned();
    let body: serde_json::Value = response.json().await.expect("json");
    let workflow = body["workflow_id"]
        .as_str()
        .expect("workflow_id")
        .to_owned();
    assert_eq!(location, format!("/v1/workflows/{workflow}"));
    assert_eq!(body["thread_id"], thread.to_string());
    assert_eq!(body["status"], "queued");
    assert_eq!(body["stream_url"], format!("/v1/threads/{thread}/stream"));
    for field in ["user_message_id", "message_id"] {
        assert!(
            body[field]
                .as_str()
                .is_some_and(|id| id.parse::<Uuid>().is_ok()),
            "{field}"
        );
    }
    // Committed before the 202: both messages and the run are in Postgres.
    let run = spool_tests::run_row(&app.db.pool, workflow.parse().expect("uuid")).await;
    assert!(run.is_some(), "the run is in Postgres");
    assert_eq!(app.db.count("messages").await, 2);

    let done = app.wait_for_status(&alice, &workflow, "completed").await;
    assert_eq!(done["attempt"], 1);
    assert_eq!(done["message_id"], body["message_id"]);
    let (_, page) = app
        .get(&alice, &format!("/v1/threads/{thread}/messages"))
        .await;
    let messages = page["messages"].as_array().expect("messages");
    assert_eq!(messages.len(), 2);
    assert_eq!(messages[0]["role"], "user");
    assert_eq!(messages[0]["content"], "hello spool");
    assert_eq!(messages[1]["id"], body["message_id"]);
    assert_eq!(messages[1]["status"], "completed");
    assert_eq!(
        messages[1]["content"],
        spool_worker::demo::reply("hello spool", 5).concat()
    );
    assert_eq!(messages[1]["usage"]["output_tokens"], 5);
    app.stop().await;
}

#[tokio::test]
async fn a_second_message_while_a_run_is_active_gets_409_then_is_accepted_once_it_completes() {
    let app = TestApp::start(1, worker_args(20, 50)).await;
    let alice = token("alice", "acme");
    let thread = Uuid::new_v4();
    let (status, first) = app.send_message(&alice, thread, "one").await;
    assert_eq!(status, StatusCode::ACCEPTED);

    let (status, busy) = app.send_message(&alice, thread, "two").await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(busy["error"]["code"], "thread_busy");
    assert_eq!(busy["error"]["active_workflow_id"], first["workflow_id"]);
    assert_eq!(
        busy["error"]["stream_url"],
        format!("/v1/threads/{thread}/stream")
    );
    let (_, thread_body) = app.get(&alice, &format!("/v1/threads/{thread}")).await;
    assert_eq!(thread_body["status"], "busy");
    assert_eq!(thread_body["active_workflow_id"], first["workflow_id"]);
    assert_eq!(
        app.db.count("runs").await,
        1,
        "the refused message left nothing behind"
    );
    assert_eq!(app.db.count("messages").await, 2);

    app.wait_for_status(
        &alice,
        first["workflow_id"].as_str().expect("id"),
        "completed",
    )
    .await;
    let (status, second) = app.send_message(&alice, thread, "two").await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_ne!(second["workflow_id"], first["workflow_id"]);
    app.stop().await;
}

#[tokio::test]
async fn the_database_itself_refuses_a_second_active_run_on_a_thread() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let alice = token("alice", "acme");
    let thread = Uuid::new_v4();
    let (status, _) = app.send_message(&alice, thread, "one").await;
    assert_eq!(status, StatusCode::ACCEPTED);
    // Bypass the API: copy the active run under a new id.
    let copied = sqlx::query(
        "INSERT INTO runs (id, thread_id, tenant_id, owner_id, user_message_id, assistant_message_id)
         SELECT gen_random_uuid(), thread_id, tenant_id, owner_id, user_message_id,
                assistant_message_id FROM runs",
    )
    .execute(&app.db.pool)
    .await;
    let err = copied.expect_err("the partial unique index refuses it");
    assert!(
        spool_shared::db::is_unique_violation(&err, "runs_one_active_per_thread"),
        "{err}"
    );
    app.stop().await;
}

#[tokio::test]
async fn the_same_idempotency_key_replays_the_same_202_and_creates_one_run() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let alice = token("alice", "acme");
    let thread = Uuid::new_v4();
    let send = |key: &'static str, text: &'static str| {
        app.http
            .post(app.url(&format!("/v1/threads/{thread}/user_message")))
            .bearer_auth(&alice)
            .header("Idempotency-Key", key)
            .json(&json!({"input_text": text}))
            .send()
    };
    let first = send("key-1", "hello").await.expect("request");
    assert_eq!(first.status(), StatusCode::ACCEPTED);
    let first: serde_json::Value = first.json().await.expect("json");
    let again = send("key-1", "hello").await.expect("request");
    assert_eq!(again.status(), StatusCode::ACCEPTED);
    assert_eq!(
        again.headers()["location"],
        format!(
            "/v1/workflows/{}",
            first["workflow_id"].as_str().expect("id")
        )
    );
    let again: serde_json::Value = again.json().await.expect("json");
    assert_eq!(again, first);
    assert_eq!(app.db.count("runs").await, 1);

    let other = send("key-1", "a different body").await.expect("request");
    assert_eq!(other.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let other: serde_json::Value = other.json().await.expect("json");
    assert_eq!(other["error"]["code"], "idempotency_key_reused");
    assert_eq!(app.db.count("runs").await, 1);
    assert_eq!(app.db.count("messages").await, 2);
    app.stop().await;
}

#[tokio::test]
async fn twenty_concurrent_duplicates_create_exactly_one_run() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let alice = token("alice", "acme");
    let thread = Uuid::new_v4();
    let requests = (0..20).map(|_| {
        app.http
            .post(app.url(&format!("/v1/threads/{thread}/user_message")))
            .bearer_auth(&alice)
            .header("Idempotency-Key", "burst")
            .json(&json!({"input_text": "once"}))
            .send()
    });
    let responses = futures::future::join_all(requests).await;
    let mut bodies = Vec::new();
    for response in responses {
        let response = response.expect("request");
        assert_eq!(response.status(), StatusCode::ACCEPTED);
        bodies.push(response.json::<serde_json::Value>().await.expect("json"));
    }
    assert!(
        bodies.iter().all(|b| b == &bodies[0]),
        "every duplicate got the same body"
    );
    assert_eq!(app.db.count("runs").await, 1);
    assert_eq!(app.db.count("messages").await, 2);
    assert_eq!(app.db.count("idempotency_keys").await, 1);
    app.stop().await;
}

#[tokio::test]
async fn concurrent_first_messages_to_a_new_thread_get_one_202_and_409s_never_404() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let alice = token("alice", "acme");
    // Several rounds: the race needs one request's insert of the thread to wait on another's.
    for _ in 0..5 {
        let thread = Uuid::new_v4();
        let requests = (0..10).map(|i| {
            app.http
                .post(app.url(&format!("/v1/threads/{thread}/user_message")))
                .bearer_auth(&alice)
                .json(&json!({"input_text": format!("first {i}")}))
                .send()
        });
        let mut statuses = Vec::new();
        for response in futures::future::join_all(requests).await {
            let response = response.expect("request");
            let status = response.status();
            let body: serde_json::Value = response.json().await.expect("json");
            statuses.push((status, body["error"]["code"].as_str().map(str::to_owned)));
        }
        let accepted = statuses
            .iter()
            .filter(|(s, _)| *s == StatusCode::ACCEPTED)
            .count();
        assert_eq!(accepted, 1, "{statuses:?}");
        assert!(
            statuses.iter().all(|(s, code)| *s == StatusCode::ACCEPTED
                || (*s == StatusCode::CONFLICT && code.as_deref() == Some("thread_busy"))),
            "the owner's own new thread was refused: {statuses:?}"
        );
    }
    assert_eq!(app.db.count("threads").await, 5);
    assert_eq!(app.db.count("runs").await, 5);
    app.stop().await;
}

#[tokio::test]
async fn a_thread_can_be_created_read_and_listed() {
    let app = TestApp::start(1, worker_args(3, 0)).await;
    let alice = token("alice", "acme");
    let (status, thread) = app
        .post(
            &alice,
            "/v1/threads",
            &json!({"metadata": {"topic": "billing"}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(thread["status"], "idle");
    assert_eq!(thread["metadata"]["topic"], "billing");
    let id: Uuid = thread["id"].as_str().expect("id").parse().expect("uuid");
    let (status, read) = app.get(&alice, &format!("/v1/threads/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(read["id"], thread["id"]);

    for text in ["first", "second", "third"] {
        let (status, accepted) = app.send_message(&alice, id, text).await;
        assert_eq!(status, StatusCode::ACCEPTED);
        app.wait_for_status(
            &alice,
            accepted["workflow_id"].as_str().expect("id"),
            "completed",
        )
        .await;
    }
    let (_, page) = app
        .get(&alice, &format!("/v1/threads/{id}/messages?limit=2"))
        .await;
    let newest = page["messages"].as_array().expect("messages").clone();
    assert_eq!(newest.len(), 2);
    assert_eq!(
        newest[0]["content"], "third",
        "oldest first within the newest page"
    );
    assert_eq!(newest[1]["role"], "assistant");
    let before = newest[0]["id"].as_str().expect("id");
    let (_, older) = app
        .get(
            &alice,
            &format!("/v1/threads/{id}/messages?before={before}"),
        )
        .await;
    let older = older["messages"].as_array().expect("messages").clone();
    assert_eq!(older.len(), 4);
    assert_eq!(older[0]["content"], "first");
    app.stop().await;
}

/// The enqueue commits without a NOTIFY (one in the statement would make Postgres commit
/// enqueues one at a time); the API sends one after it. An idle worker waits for exactly that:
/// without it, runs would start only at the next poll.
#[tokio::test]
async fn every_enqueue_is_followed_by_a_notify_that_wakes_the_workers() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let mut listener = sqlx::postgres::PgListener::connect_with(&app.db.pool)
        .await
        .expect("listener");
    listener
        .listen(spool_shared::db::RUNS_CHANNEL)
        .await
        .expect("LISTEN");
    let alice = token("alice", "acme");
    for key in [None, Some("with-a-key")] {
        let mut request = app
            .http
            .post(app.url(&format!("/v1/threads/{}/user_message", Uuid::new_v4())))
            .bearer_auth(&alice)
            .json(&json!({"input_text": "wake up"}));
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        let response = request.send().await.expect("request");
        assert_eq!(response.status(), StatusCode::ACCEPTED, "key {key:?}");
        let woken = tokio::time::timeout(std::time::Duration::from_secs(10), listener.recv())
            .await
            .unwrap_or_else(|_| panic!("no NOTIFY after the enqueue (key {key:?})"))
            .expect("notification");
        assert_eq!(woken.channel(), spool_shared::db::RUNS_CHANNEL);
        // Nothing else is pending: the next enqueue must bring its own.
        while listener.next_buffered().is_some() {}
    }
}
