//! The control plane (docs/api.md): thread lists, renames and erasure; run lists; `?wait=`; the
//! durable timeline. Every route is scoped like the rest: another user's or tenant's ids are
//! 404, an admin sees the tenant's.

use std::time::{Duration, Instant};

use redis::AsyncCommands as _;
use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use spool_shared::ThreadId;
use spool_tests::fake_llm::{FakeLlm, weather_then_echo};
use spool_tests::tools::{Tools, http_tool};
use spool_tests::{poll_until, token};

use crate::agents::admin;
use crate::common::{TestApp, app_with, ask, finished, worker_args};

impl TestApp {
    /// Every page of a list, following `next_cursor`, `limit` at a time.
    async fn all_pages(&self, token: &str, path: &str, limit: usize) -> Vec<Value> {
        let mut rows = Vec::new();
        let mut cursor: Option<String> = None;
        let sep = if path.contains('?') { '&' } else { '?' };
        loop {
            let mut url = format!("{path}{sep}limit={limit}");
            if let Some(cursor) = &cursor {
                url.push_str(&format!("&cursor={cursor}"));
            }
            let (status, page) = self.get(token, &url).await;
            assert_eq!(status, StatusCode::OK, "{page}");
            let data = page["data"].as_array().expect("data").clone();
            assert!(data.len() <= limit);
            rows.extend(data);
            match page["next_cursor"].as_str() {
                Some(next) => cursor = Some(next.to_owned()),
                None => return rows,
            }
        }
    }
}

fn ids(rows: &[Value]) -> Vec<String> {
    rows.iter()
        .map(|r| {
            r["id"]
                .as_str()
                .or(r["workflow_id"].as_str())
                .expect("an id")
                .to_owned()
        })
        .collect()
}

#[tokio::test]
async fn threads_list_newest_first_by_page_with_filters_and_only_the_callers_own() {
    // No worker: every run stays queued, so its thread is busy.
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let alice = token("alice", "acme");
    let mut made = Vec::new();
    for i in 0..5 {
        let topic = if i % 2 == 0 { "even" } else { "odd" };
        let (status, thread) = app
            .post(
                &alice,
                "/v1/threads",
                &json!({"metadata": {"topic": topic, "n": i}}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{thread}");
        made.push(thread["id"].as_str().expect("id").to_owned());
    }
    let (status, _) = app
        .send_message(&alice, made[1].parse().expect("uuid"), "hi")
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    app.post(&token("bob", "acme"), "/v1/threads", &json!({}))
        .await;
    app.post(&token("alice", "other"), "/v1/threads", &json!({}))
        .await;

    let newest_first: Vec<String> = made.iter().rev().cloned().collect();
    for limit in [1, 2, 5, 100] {
        let rows = app.all_pages(&alice, "/v1/threads", limit).await;
        assert_eq!(ids(&rows), newest_first, "limit {limit}");
    }
    let (_, page) = app.get(&alice, "/v1/threads").await;
    assert_eq!(page["next_cursor"], Value::Null, "one page holds all five");
    let busy = &page["data"][3];
    assert_eq!(busy["id"], made[1].as_str());
    assert_eq!(busy["status"], "busy");
    assert!(busy["last_message_at"].is_string(), "{busy}");
    assert_eq!(busy["title"], Value::Null);

    let filtered = |query: &'static str| {
        let app = &app;
        let alice = &alice;
        async move {
            ids(&app
                .all_pages(alice, &format!("/v1/threads?{query}"), 2)
                .await)
        }
    };
    assert_eq!(
        filtered("metadata[topic]=even").await,
        [made[4].clone(), made[2].clone(), made[0].clone()]
    );
    assert_eq!(
        filtered("metadata[topic]=odd&metadata[n]=3").await,
        [made[3].clone()]
    );
    assert_eq!(filtered("status=busy").await, [made[1].clone()]);
    assert_eq!(filtered("status=idle").await.len(), 4);
    assert!(
        filtered("agent_id=00000000-0000-0000-0000-000000000000")
            .await
            .is_empty()
    );

    // Another user sees only theirs; an admin sees the tenant's; another tenant nothing of it.
    let (_, bobs) = app.get(&token("bob", "acme"), "/v1/threads").await;
    assert_eq!(bobs["data"].as_array().map(Vec::len), Some(1));
    let tenant = app.all_pages(&admin("acme"), "/v1/threads", 3).await;
    assert_eq!(tenant.len(), 6);
    let (_, other) = app.get(&admin("other"), "/v1/threads").await;
    assert_eq!(other["data"].as_array().map(Vec::len), Some(1));

    for (query, code) in [
        ("limit=101", "invalid_limit"),
        ("limit=0", "invalid_limit"),
        ("limit=ten", "invalid_limit"),
        ("cursor=zz", "invalid_cursor"),
        ("cursor=3132", "invalid_cursor"),
        ("colour=red", "unknown_parameter"),
        ("metadata[]=x", "unknown_parameter"),
        ("status=sleepy", "invalid_filter"),
        ("status=busy&status=idle", "invalid_filter"),
        ("agent_id=nope", "invalid_filter"),
        ("metadata[topic]=a%00b", "invalid_filter"),
    ] {
        let (status, body) = app.get(&alice, &format!("/v1/threads?{query}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
        assert_eq!(body["error"]["code"], code, "{query}");
    }
    app.stop().await;
}

#[tokio::test]
async fn a_patch_renames_and_merges_metadata_and_a_bad_one_changes_nothing() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let alice = token("alice", "acme");
    let (_, thread) = app
        .post(
            &alice,
            "/v1/threads",
            &json!({"metadata": {"keep": 1, "drop": 2}}),
        )
        .await;
    let path = format!("/v1/threads/{}", thread["id"].as_str().expect("id"));
    let patch = |token: &str, body: Value| {
        let (app, path, token) = (&app, path.clone(), token.to_owned());
        async move {
            app.send(reqwest::Method::PATCH, &token, &path, Some(&body))
                .await
        }
    };

    let (status, patched) = patch(
        &alice,
        json!({"title": "Trip to Paris", "metadata": {"drop": null, "add": "x"}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{patched}");
    assert_eq!(patched["title"], "Trip to Paris");
    assert_eq!(patched["metadata"], json!({"keep": 1, "add": "x"}));
    assert!(patched["updated_at"].as_str() > thread["updated_at"].as_str());

    for (body, code) in [
        (json!({"title": 7}), "invalid_body"),
        (json!({"metadata": ["a"]}), "invalid_body"),
        (json!({"colour": "red"}), "invalid_body"),
        (json!({"title": "x".repeat(201)}), "invalid_title"),
        (json!({"title": "ok", "metadata": 3}), "invalid_body"),
    ] {
        let (status, error) = patch(&alice, body.clone()).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {error}");
        assert_eq!(error["error"]["code"], code, "{body}");
    }
    let (_, now) = app.get(&alice, &path).await;
    assert_eq!(now["title"], "Trip to Paris", "nothing changed");
    assert_eq!(now["metadata"], json!({"keep": 1, "add": "x"}));

    let (status, _) = patch(&token("bob", "acme"), json!({"title": "mine"})).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "another user's thread");
    let (status, _) = patch(&admin("other"), json!({"title": "mine"})).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "another tenant's admin");
    // An admin reads the tenant's threads (and their messages); another tenant's admin not.
    for (who, expected) in [
        (admin("acme"), StatusCode::OK),
        (admin("other"), StatusCode::NOT_FOUND),
    ] {
        let (status, _) = app.get(&who, &path).await;
        assert_eq!(status, expected);
        let (status, _) = app.get(&who, &format!("{path}/messages")).await;
        assert_eq!(status, expected);
    }
    let (status, cleared) = patch(&admin("acme"), json!({"title": null})).await;
    assert_eq!(status, StatusCode::OK, "the tenant's admin: {cleared}");
    assert_eq!(cleared["title"], Value::Null);
    app.stop().await;
}

/// Rows of the thread left in each table.
async fn left_in_postgres(app: &TestApp, thread: Uuid, runs: &[String]) -> Vec<(String, i64)> {
    let runs: Vec<Uuid> = runs.iter().map(|r| r.parse().expect("uuid")).collect();
    let mut left = Vec::new();
    for (table, sql) in [
        (
            "messages",
            "SELECT count(*) FROM messages WHERE thread_id = $1",
        ),
        ("runs", "SELECT count(*) FROM runs WHERE thread_id = $1"),
        (
            "run_steps",
            "SELECT count(*) FROM run_steps WHERE workflow_id = ANY($2)",
        ),
        (
            "idempotency_keys",
            "SELECT count(*) FROM idempotency_keys WHERE workflow_id = ANY($2)",
        ),
        (
            "webhook_deliveries",
            "SELECT count(*) FROM webhook_deliveries WHERE thread_id = $1",
        ),
        (
            "thread_summaries",
            "SELECT count(*) FROM thread_summaries WHERE thread_id = $1",
        ),
        (
            "threads (content)",
            "SELECT count(*) FROM threads WHERE id = $1
              AND (tenant_id <> '' OR owner_id <> '' OR metadata <> '{}' OR title IS NOT NULL
                   OR erased_at IS NULL)",
        ),
    ] {
        let (count,): (i64,) = sqlx::query_as(sql)
            .bind(thread)
            .bind(&runs)
            .fetch_one(&app.db.pool)
            .await
            .expect(table);
        left.push((table.to_owned(), count));
    }
    left
}

#[tokio::test]
async fn erasing_a_thread_stops_its_run_and_its_stream_leaves_nothing_and_the_id_stays_dead() {
    // A slow demo answer: the second run is still streaming when the thread is erased.
    let app = TestApp::start(1, worker_args(400, 20)).await;
    let alice = token("alice", "acme");
    let thread = Uuid::new_v4();
    let first = app
        .http
        .post(app.url(&format!("/v1/threads/{thread}/user_message")))
        .bearer_auth(&alice)
        .header("idempotency-key", "erase-me-1")
        .json(&json!({"input_text": "first"}))
        .send()
        .await
        .expect("request");
    assert_eq!(first.status(), StatusCode::ACCEPTED);
    let first: Value = first.json().await.expect("json");
    let run = first["workflow_id"].as_str().expect("id").to_owned();
    // The first run has saved steps by the time its answer streams; cancel it to move on.
    app.wait_run(&first, |s| s == "running").await;
    app.post(&alice, &format!("/v1/workflows/{run}/cancel"), &json!({}))
        .await;
    app.wait_run(&first, |s| s == "cancelled").await;
    let (status, second) = app.send_message(&alice, thread, "second").await;
    assert_eq!(status, StatusCode::ACCEPTED, "{second}");
    let active = second["workflow_id"].as_str().expect("id").to_owned();
    let key = app.keys.events(ThreadId(thread));
    // Held by a worker first: the first run's text_deltas are on the thread's stream too, so
    // the count below alone can pass while the second run is still queued.
    app.wait_run(&second, |s| s == "running").await;
    poll_until(
        "the second run to stream",
        Duration::from_secs(10),
        || async {
            let stored = app.stored(thread).await;
            (stored.iter().filter(|(_, k)| k == "text_delta").count() > 3).then_some(())
        },
    )
    .await;

    // A summary of its older turns, as the active run's worker stores one when a prompt
    // outgrows its window.
    let active_id: spool_shared::WorkflowId = active.parse().expect("id");
    let (attempt,): (i32,) = sqlx::query_as("SELECT attempt FROM runs WHERE id = $1")
        .bind(active_id)
        .fetch_one(&app.db.pool)
        .await
        .expect("attempt");
    let stored = spool_shared::db::messages::save_summary(
        &app.db.pool,
        active_id,
        attempt,
        1,
        "what was said",
        "gpt-4o-mini",
    )
    .await
    .expect("a summary");
    assert!(stored, "the active run's attempt holds it");
    // A client following the stream while the thread is erased.
    let mut follower = app.stream(&alice, thread, "", None).await;
    let path = format!("/v1/threads/{thread}");
    for other in [token("bob", "acme"), admin("other")] {
        let (status, _) = app.send(reqwest::Method::DELETE, &other, &path, None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "not theirs to erase");
    }
    let (status, body) = app.send(reqwest::Method::DELETE, &alice, &path, None).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");

    let runs = [run.clone(), active.clone()];
    for (table, count) in left_in_postgres(&app, thread, &runs).await {
        assert_eq!(count, 0, "{table} still holds the erased thread");
    }
    // The worker of the active run publishes nothing more: the stream is not born again while
    // it would have streamed dozens of deltas.
    let mut conn = app.streams.conn();
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        let exists: bool = conn.exists(&key).await.expect("exists");
        assert!(!exists, "the erased stream came back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let starts: bool = conn
        .exists(app.keys.starts(ThreadId(thread)))
        .await
        .expect("exists");
    assert!(!starts);
    let fence: std::collections::HashMap<String, String> = conn
        .hgetall(app.keys.fence(ThreadId(thread)))
        .await
        .expect("hgetall");
    assert_eq!(
        fence,
        [
            (active.clone(), i32::MAX.to_string()),
            (run.clone(), i32::MAX.to_string()),
        ]
        .into(),
        "only the refusals of the active run and of the one that just ended are left"
    );

    // The follower is told, and its stream ends: the entries it would resume from are gone
    // (`stream_reset`: re-fetch over REST, which now says 404).
    let frames = follower.collect(Duration::from_secs(25)).await;
    let last = frames
        .iter()
        .rev()
        .find(|f| f.event != "heartbeat")
        .expect("frames");
    assert_eq!(last.event, "stream_reset", "{frames:?}");

    // 404 for everyone, forever; a message cannot bring it back.
    for who in [&alice, &admin("acme")] {
        let (status, _) = app.get(who, &path).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        let (status, _) = app.get(who, &format!("/v1/workflows/{active}")).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
    }
    let (status, error) = app.send_message(&alice, thread, "again").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{error}");
    assert_eq!(error["error"]["code"], "thread_not_found");
    let (status, _) = app.send(reqwest::Method::DELETE, &alice, &path, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "erased once");
    let listed = app.all_pages(&admin("acme"), "/v1/threads", 100).await;
    assert!(!ids(&listed).contains(&thread.to_string()));
    app.stop().await;
}

#[tokio::test]
async fn runs_list_newest_first_filtered_by_thread_agent_and_statuses() {
    let mut app = TestApp::start(1, worker_args(1, 0)).await;
    let alice = token("alice", "acme");
    let agent = app
        .create_agent("acme", &json!({"name": "plain", "model": "gpt-4o-mini"}))
        .await;
    let (thread, first) = ask(&app, &agent, "one").await;
    finished(&app, &first).await;
    let (status, second) = app.send_message(&alice, thread, "two").await;
    assert_eq!(status, StatusCode::ACCEPTED);
    finished(&app, &second).await;
    // No worker from here: the third run is cancelled while queued, bob's stays queued.
    app.restart_workers(0, worker_args(1, 0)).await;
    let (_, third) = ask(&app, &agent, "three").await;
    let cancelled = third["workflow_id"].as_str().expect("id");
    app.post(
        &alice,
        &format!("/v1/workflows/{cancelled}/cancel"),
        &json!({"reason": "enough"}),
    )
    .await;
    app.wait_run(&third, |s| s == "cancelled").await;
    let (_, bobs) = app
        .send_message(&token("bob", "acme"), Uuid::new_v4(), "bob's")
        .await;

    let all = ids(&app.all_pages(&alice, "/v1/workflows", 1).await);
    let expected: Vec<String> = [&third, &second, &first]
        .iter()
        .map(|a| a["workflow_id"].as_str().expect("id").to_owned())
        .collect();
    assert_eq!(all, expected);
    let of_thread = ids(&app
        .all_pages(&alice, &format!("/v1/workflows?thread_id={thread}"), 1)
        .await);
    assert_eq!(of_thread, expected[1..]);
    let (_, page) = app
        .get(
            &alice,
            &format!(
                "/v1/workflows?agent_id={agent}&status=cancelled&status=completed&status=failed"
            ),
        )
        .await;
    let rows = page["data"].as_array().expect("data");
    assert_eq!(rows.len(), 3, "{page}");
    let (_, page) = app
        .get(&alice, "/v1/workflows?status=queued&status=running")
        .await;
    assert_eq!(page["data"], json!([]));
    let (_, page) = app.get(&alice, "/v1/workflows?status=cancelled").await;
    assert_eq!(ids(page["data"].as_array().expect("data")), expected[..1]);
    let run = &app
        .get(&alice, &format!("/v1/workflows/{}", expected[0]))
        .await
        .1;
    assert_eq!(run["cancel_reason"], "enough");
    assert_eq!(run["parent_workflow_id"], Value::Null);
    assert!(run.get("usage").is_some() && run.get("error").is_some());

    let tenant = app.all_pages(&admin("acme"), "/v1/workflows", 2).await;
    assert_eq!(tenant.len(), 4, "the admin sees bob's too");
    assert!(ids(&tenant).contains(&bobs["workflow_id"].as_str().expect("id").to_owned()));
    let (_, other) = app.get(&admin("other"), "/v1/workflows").await;
    assert_eq!(other["data"], json!([]));
    let bobs_path = format!(
        "/v1/workflows/{}",
        bobs["workflow_id"].as_str().expect("id")
    );
    assert_eq!(app.get(&admin("acme"), &bobs_path).await.0, StatusCode::OK);
    assert_eq!(app.get(&alice, &bobs_path).await.0, StatusCode::NOT_FOUND);
    assert_eq!(
        app.get(&admin("other"), &bobs_path).await.0,
        StatusCode::NOT_FOUND
    );
    let (_, bob_sees) = app
        .get(
            &token("bob", "acme"),
            &format!("/v1/workflows?thread_id={thread}"),
        )
        .await;
    assert_eq!(bob_sees["data"], json!([]), "not bob's thread");

    for (query, code) in [
        ("status=done", "invalid_filter"),
        ("thread_id=x", "invalid_filter"),
        (
            "thread_id=00000000-0000-0000-0000-000000000000&thread_id=00000000-0000-0000-0000-000000000001",
            "invalid_filter",
        ),
        ("limit=500", "invalid_limit"),
        ("cursor=", "invalid_cursor"),
        ("wait=3", "unknown_parameter"),
    ] {
        let (status, body) = app.get(&alice, &format!("/v1/workflows?{query}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
        assert_eq!(body["error"]["code"], code, "{query}");
    }
    app.stop().await;
}

#[tokio::test]
async fn a_wait_answers_when_the_run_ends_or_at_its_deadline_and_holds_no_connection() {
    let app = TestApp::start(0, worker_args(5, 0)).await;
    let alice = token("alice", "acme");
    let (status, accepted) = app
        .send_message(&alice, Uuid::new_v4(), "wait for me")
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let workflow = accepted["workflow_id"].as_str().expect("id").to_owned();
    let path = format!("/v1/workflows/{workflow}");

    // No worker: after its deadline, the run as it is.
    let started = Instant::now();
    let (status, run) = app.get(&alice, &format!("{path}?wait=1")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(run["status"], "queued");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );

    for (query, status, code) in [
        ("wait=61", StatusCode::BAD_REQUEST, "invalid_wait"),
        ("wait=-1", StatusCode::UNPROCESSABLE_ENTITY, "invalid_query"),
        (
            "wait=soon",
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_query",
        ),
    ] {
        let (got, body) = app.get(&alice, &format!("{path}?{query}")).await;
        assert_eq!(got, status, "{query}: {body}");
        assert_eq!(body["error"]["code"], code, "{query}");
    }
    let (status, _) = app
        .get(&token("bob", "acme"), &format!("{path}?wait=5"))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "another user's run, at once");

    // 1,000 waits at once, then a worker: each answers with the completed run, and while they
    // wait the database sees no more connections than the pool (8) and the LISTEN one.
    let waits: Vec<_> = (0..1000)
        .map(|_| {
            let request = app
                .http
                .get(app.url(&format!("{path}?wait=60")))
                .bearer_auth(&alice)
                .send();
            tokio::spawn(async move {
                let response = request.await.expect("request");
                (
                    response.status(),
                    response.json::<Value>().await.expect("json"),
                )
            })
        })
        .collect();
    let connections = || async {
        let (count,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()",
        )
        .fetch_one(&app.db.pool)
        .await
        .expect("count");
        count
    };
    poll_until("the waits to arrive", Duration::from_secs(20), || async {
        let text = app
            .http
            .get(app.url("/metrics"))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        text.lines()
            .filter(|l| l.starts_with("spool_workflow_waits"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .any(|n| n >= 1000.0)
            .then_some(())
    })
    .await;
    let held = connections().await;
    assert!(held <= 8 + 1, "{held} connections for 1,000 waits");
    let woken = Instant::now();
    let app = app.with_worker(worker_args(5, 0)).await;
    for wait in waits {
        let (status, run) = wait.await.expect("task");
        assert_eq!(status, StatusCode::OK);
        assert_eq!(run["status"], "completed", "{run}");
    }
    // Woken by the run's end, not by their 60 s deadline (at least 40 s away when the worker
    // started, since they all arrived within the 20 s poll above).
    assert!(
        woken.elapsed() < Duration::from_secs(30),
        "the waits answered {:?} after the worker started",
        woken.elapsed()
    );
    app.stop().await;
}

#[tokio::test]
async fn the_timeline_shows_each_model_call_tool_call_and_decision_in_order() {
    let fake = FakeLlm::start(weather_then_echo()).await;
    let (tools, base) = Tools::start().await;
    let app = app_with(&fake).await;
    let mut tool = http_tool("get_weather", format!("{base}/weather"));
    tool["requires_approval"] = json!(true);
    let agent = app
        .create_agent(
            "acme",
            &json!({"name": "careful", "model": "gpt-4o-mini", "tools": [tool]}),
        )
        .await;
    let alice = token("alice", "acme");
    let (_, accepted) = ask(&app, &agent, "weather?").await;
    let workflow = accepted["workflow_id"].as_str().expect("id").to_owned();
    let steps_path = format!("/v1/workflows/{workflow}/steps");

    // Paused: `?wait=` answers at the pause (not at its 30 s deadline), and the timeline shows
    // the call waiting.
    let asked = Instant::now();
    let (_, paused) = app
        .get(&alice, &format!("/v1/workflows/{workflow}?wait=30"))
        .await;
    assert_eq!(paused["status"], "awaiting_approval");
    assert!(
        asked.elapsed() < Duration::from_secs(20),
        "{:?}",
        asked.elapsed()
    );
    let (status, timeline) = app.get(&alice, &steps_path).await;
    assert_eq!(status, StatusCode::OK, "{timeline}");
    assert_eq!(timeline["status"], "awaiting_approval");
    assert_eq!(timeline["pending_action"]["tool_call_id"], "call_w");
    let call = &timeline["steps"][0]["tool_calls"][0];
    assert_eq!(call["state"], "pending_approval");
    assert_eq!(call["result"], Value::Null);
    assert_eq!(timeline["steps"][0]["settled"], false);

    let (status, _) = app
        .post(
            &alice,
            &format!("/v1/workflows/{workflow}/approvals/call_w"),
            &json!({"approved": true, "reason": "fine"}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let (_, done) = app
        .get(&alice, &format!("/v1/workflows/{workflow}?wait=30"))
        .await;
    assert_eq!(done["status"], "completed");
    assert_eq!(tools.calls().len(), 1);

    let (_, timeline) = app.get(&alice, &steps_path).await;
    let steps = timeline["steps"].as_array().expect("steps");
    assert_eq!(steps.len(), 2, "{timeline}");
    let first = &steps[0];
    assert_eq!(first["step"], 1);
    assert_eq!(first["settled"], true);
    assert_eq!(first["model_call"]["model"], "gpt-4o-mini");
    assert_eq!(first["model_call"]["finish_reason"], "tool_calls");
    assert!(first["model_call"]["started_at"].as_str() <= first["model_call"]["ended_at"].as_str());
    let call = &first["tool_calls"][0];
    assert_eq!(call["name"], "get_weather");
    assert_eq!(call["arguments"]["city"], "Paris");
    assert_eq!(call["state"], "done");
    assert_eq!(call["is_error"], false);
    assert!(
        call["result"].as_str().is_some_and(|r| !r.is_empty()),
        "{call}"
    );
    assert_eq!(call["attempt"], 2, "the attempt after the approval ran it");
    assert!(call["started_at"].as_str() <= call["ended_at"].as_str());
    assert_eq!(call["decision"]["by"], "person");
    assert_eq!(call["decision"]["approved"], true);
    assert_eq!(call["decision"]["reason"], "fine");
    let last = &steps[1];
    assert_eq!(last["model_call"]["finish_reason"], "stop");
    assert_eq!(last["tool_calls"], json!([]));
    assert!(last["text"].as_str().is_some_and(|t| !t.is_empty()));
    assert!(last["usage"]["output_tokens"].as_u64().is_some());

    let (status, _) = app.get(&token("bob", "acme"), &steps_path).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = app.get(&admin("other"), &steps_path).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = app.get(&admin("acme"), &steps_path).await;
    assert_eq!(status, StatusCode::OK, "the tenant's admin");
    app.stop().await;
}

#[tokio::test]
async fn the_timeline_shows_a_call_a_hook_denied_as_the_hooks_decision() {
    let fake = FakeLlm::start(weather_then_echo()).await;
    let (tools, base) = Tools::start().await;
    let hook = axum::Router::new().route(
        "/hook",
        axum::routing::post(|| async {
            axum::Json(json!({"decision": "deny", "reason": "weather is classified"}))
        }),
    );
    let hook_url = format!("{}/hook", spool_tests::serve(hook).await);
    let app = app_with(&fake).await;
    let agent = app
        .create_agent(
            "acme",
            &json!({"name": "guarded", "model": "gpt-4o-mini",
                "tools": [http_tool("get_weather", format!("{base}/weather"))],
                "hooks": [{"event": "pre_tool_use", "type": "http", "url": hook_url}]}),
        )
        .await;
    let alice = token("alice", "acme");
    let (_, accepted) = ask(&app, &agent, "weather?").await;
    let workflow = accepted["workflow_id"].as_str().expect("id").to_owned();
    let (_, done) = app
        .get(&alice, &format!("/v1/workflows/{workflow}?wait=30"))
        .await;
    assert_eq!(done["status"], "completed", "{done}");
    assert!(tools.calls().is_empty(), "the denied call was not made");
    let (status, timeline) = app
        .get(&alice, &format!("/v1/workflows/{workflow}/steps"))
        .await;
    assert_eq!(status, StatusCode::OK, "{timeline}");
    let call = &timeline["steps"][0]["tool_calls"][0];
    assert_eq!(call["name"], "get_weather", "{timeline}");
    assert_eq!(call["is_error"], true, "{call}");
    assert_eq!(call["decision"]["by"], "hook", "{call}");
    assert_eq!(call["decision"]["approved"], false, "{call}");
    assert_eq!(
        call["decision"]["reason"], "weather is classified",
        "{call}"
    );
    app.stop().await;
}
