//! The SSE gateway: order, replay, resume, retention, control events, isolation.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;
use uuid::Uuid;

use spool_shared::ThreadId;
use spool_shared::stream::{self as events, EntryId};
use spool_tests::sse::{Frame, SseReader};
use spool_tests::{poll_until, token};

use crate::common::{TIMEOUT, TestApp, worker_args};

const READ: Duration = Duration::from_secs(10);

impl TestApp {
    pub(crate) async fn open_stream(
        &self,
        token: &str,
        thread: Uuid,
        query: &str,
        last_event_id: Option<&str>,
    ) -> reqwest::Response {
        let mut request = self
            .http
            .get(self.url(&format!("/v1/threads/{thread}/stream{query}")))
            .bearer_auth(token);
        if let Some(id) = last_event_id {
            request = request.header("Last-Event-ID", id);
        }
        request.send().await.expect("stream request")
    }

    pub(crate) async fn stream(
        &self,
        token: &str,
        thread: Uuid,
        query: &str,
        last_event_id: Option<&str>,
    ) -> SseReader {
        let response = self.open_stream(token, thread, query, last_event_id).await;
        assert_eq!(response.status(), StatusCode::OK);
        SseReader::new(response)
    }

    /// Replays every event the thread's stream holds, from its `stream_start` marker, whether
    /// or not a run is still streaming (a run can finish before a test gets to subscribe).
    pub(crate) async fn replay_all(&self, token: &str, thread: Uuid) -> SseReader {
        let key = self.keys.events(ThreadId(thread));
        let entries = events::read_after(&mut self.streams.conn(), &key, EntryId::default(), 1)
            .await
            .expect("xrange");
        let marker = entries.first().expect("the stream exists");
        assert!(marker.is_marker(), "the stream starts with its marker");
        self.stream(token, thread, "", Some(&marker.id.to_string()))
            .await
    }

    /// Publishes `events` as the attempt of `origin` would, through the fenced script.
    pub(crate) async fn publish_as(
        &self,
        origin: &spool_shared::event::Origin,
        events: &[spool_shared::event::Event],
    ) {
        let id = Uuid::new_v4().simple().to_string();
        let batch = events::Batch {
            thread: origin.thread_id,
            workflow: origin.workflow_id,
            attempt: origin.attempt,
            id: &id,
            previous: None,
            events,
        };
        events::publish(
            &mut self.streams.conn(),
            &self.keys,
            &batch,
            Duration::from_secs(60),
        )
        .await
        .expect("publish");
    }

    /// Deletes the thread's last two events (`message_end`, `done`) from Redis, as if the
    /// worker had not published them yet; returns the events as they were before.
    pub(crate) async fn unpublish_the_end(&self, thread: Uuid) -> Vec<(String, String)> {
        let stored = self.stored(thread).await;
        let (end, done) = (&stored[stored.len() - 2], &stored[stored.len() - 1]);
        assert_eq!((end.1.as_str(), done.1.as_str()), ("message_end", "done"));
        let _: i64 = redis::cmd("XDEL")
            .arg(self.keys.events(ThreadId(thread)))
            .arg(&end.0)
            .arg(&done.0)
            .query_async(&mut self.streams.conn())
            .await
            .expect("xdel");
        stored
    }

    /// Every stored event of the thread, straight from Redis (the marker excluded).
    pub(crate) async fn stored(&self, thread: Uuid) -> Vec<(String, String)> {
        let key = self.keys.events(ThreadId(thread));
        let entries =
            events::read_after(&mut self.streams.conn(), &key, EntryId::default(), 100_000)
                .await
                .expect("xrange");
        entries
            .into_iter()
            .filter(|e| !e.is_marker())
            .map(|e| (e.id.to_string(), e.kind))
            .collect()
    }
}

fn kinds(frames: &[Frame]) -> Vec<&str> {
    frames
        .iter()
        .map(|f| f.event.as_str())
        .filter(|k| *k != "heartbeat")
        .collect()
}

fn text(frames: &[Frame]) -> String {
    frames
        .iter()
        .filter(|f| f.event == "text_delta")
        .map(|f| f.json()["data"]["delta"].as_str().unwrap_or("").to_owned())
        .collect()
}

fn ids(frames: &[Frame]) -> Vec<String> {
    frames.iter().filter_map(|f| f.id.clone()).collect()
}

async fn persisted(app: &TestApp, token: &str, thread: Uuid) -> Value {
    let (_, page) = app
        .get(token, &format!("/v1/threads/{thread}/messages"))
        .await;
    page["messages"][1].clone()
}

#[tokio::test]
async fn a_whole_run_streams_in_order_and_its_deltas_equal_the_persisted_message() {
    let app = TestApp::start(0, worker_args(12, 10)).await;
    let alice = token("alice", "acme");
    let thread = Uuid::new_v4();
    let (_, accepted) = app.send_message(&alice, thread, "stream me").await;
    let response = app.open_stream(&alice, thread, "", None).await;
    // No worker until the client is connected: it sees the run from its first event.
    let app = app.with_worker(worker_args(12, 10)).await;
    assert_eq!(response.status(), StatusCode::OK);
    let headers = response.headers().clone();
    assert_eq!(headers["content-type"], "text/event-stream");
    assert_eq!(headers["cache-control"], "no-cache");
    assert_eq!(headers["x-accel-buffering"], "no");
    let mut reader = SseReader::new(response);
    let frames = reader.collect(READ).await;
    assert!(reader.closed, "the stream closes after done");
    let k = kinds(&frames);
    assert_eq!(k.first(), Some(&"message_start"));
    assert_eq!(&k[1..3], ["step_start", "text_start"]);
    assert_eq!(
        &k[k.len() - 4..],
        ["text_end", "step_end", "message_end", "done"]
    );
    assert!(k[3..k.len() - 4].iter().all(|k| *k == "text_delta"));
    let ids = ids(&frames);
    assert_eq!(ids.len(), frames.len(), "every stored event has an id");
    let parsed: Vec<EntryId> = ids.iter().map(|id| id.parse().expect("entry id")).collect();
    assert!(
        parsed.windows(2).all(|w| w[0] < w[1]),
        "ids strictly increase"
    );
    for frame in &frames {
        let envelope = frame.json();
        assert_eq!(envelope["v"], 1);
        assert_eq!(envelope["type"], frame.event);
        assert_eq!(envelope["thread_id"], thread.to_string());
        assert_eq!(envelope["workflow_id"], accepted["workflow_id"]);
        assert_eq!(envelope["message_id"], accepted["message_id"]);
        assert_eq!(envelope["attempt"], 1);
    }
    let message = persisted(&app, &alice, thread).await;
    assert_eq!(text(&frames), message["content"].as_str().expect("content"));
    let end = frames
        .iter()
        .find(|f| f.event == "message_end")
        .expect("message_end")
        .json();
    assert_eq!(end["data"]["status"], "completed");
    assert_eq!(end["data"]["usage"], message["usage"]);
    app.stop().await;
}

#[tokio::test]
async fn a_client_that_subscribes_before_any_worker_claims_the_run_sees_every_event() {
    let app = TestApp::start(0, worker_args(6, 0)).await;
    let alice = token("alice", "acme");
    let thread = Uuid::new_v4();
    let (_, _) = app.send_message(&alice, thread, "early bird").await;
    let mut reader = app.stream(&alice, thread, "", None).await;
    assert!(
        reader.next(Duration::from_millis(300)).await.is_none(),
        "nothing before a worker runs"
    );
    let app = app.with_worker(worker_args(6, 0)).await;
    let frames = reader.collect(READ).await;
    assert_eq!(kinds(&frames).first(), Some(&"message_start"));
    assert_eq!(kinds(&frames).last(), Some(&"done"));
    assert_eq!(
        ids(&frames),
        app.stored(thread)
            .await
            .into_iter()
            .map(|(id, _)| id)
            .collect::<Vec<_>>()
    );
    app.stop().await;
}

async fn resume_after_k_events(by_header: bool) {
    let app = TestApp::start(0, worker_args(20, 30)).await;
    let alice = token("alice", "acme");
    let thread = Uuid::new_v4();
    app.send_message(&alice, thread, "resume me").await;
    let mut first = app.stream(&alice, thread, "", None).await;
    let app = app.with_worker(worker_args(20, 30)).await;
    let mut seen = Vec::new();
    for _ in 0..5 {
        seen.push(first.next(READ).await.expect("an event"));
    }
    drop(first);
    let cursor = seen.last().and_then(|f| f.id.clone()).expect("id");
    let mut second = if by_header {
        app.stream(&alice, thread, "", Some(&cursor)).await
    } else {
        app.stream(&alice, thread, &format!("?last_entry_id={cursor}"), None)
            .await
    };
    let rest = second.collect(READ).await;
    assert!(second.closed);
    assert_eq!(rest.last().map(|f| f.event.as_str()), Some("done"));
    let mut all = ids(&seen);
    all.extend(ids(&rest));
    let stored: Vec<String> = app
        .stored(thread)
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(all, stored, "no gap, no duplicate");
    let mut frames = seen;
    frames.extend(rest);
    assert_eq!(
        text(&frames),
        persisted(&app, &alice, thread).await["content"]
            .as_str()
            .expect("content")
    );
    app.stop().await;
}

#[tokio::test]
async fn reconnecting_with_last_event_id_resumes_without_gap_or_duplicate() {
    resume_after_k_events(true).await;
}

#[tokio::test]
async fn reconnecting_with_last_entry_id_resumes_without_gap_or_duplicate() {
    resume_after_k_events(false).await;
}

#[tokio::test]
async fn the_header_cursor_wins_over_the_query_cursor() {
    let app = TestApp::start(1, worker_args(4, 0)).await;
    let alice = token("alice", "acme");
    let thread = Uuid::new_v4();
    let (_, accepted) = app.send_message(&alice, thread, "which").await;
    app.wait_for_status(
        &alice,
        accepted["workflow_id"].as_str().expect("id"),
        "completed",
    )
    .await;
    let stored = app.stored(thread).await;
    let (text_end, _) = stored
        .iter()
        .find(|(_, k)| k == "text_end")
        .expect("text_end");
    let mut reader = app
        .stream(&alice, thread, "?last_entry_id=0-1", Some(text_end))
        .await;
    let frames = reader.collect(READ).await;
    assert_eq!(kinds(&frames), ["step_end", "message_end", "done"]);
    app.stop().await;
}

#[tokio::test]
async fn after_completion_a_cursor_before_done_gets_the_rest_and_no_cursor_gets_message_not_streaming()
 {
    let app = TestApp::start(1, worker_args(4, 0)).await;
    let alice = token("alice", "acme");
    let thread = Uuid::new_v4();
    let (_, accepted) = app.send_message(&alice, thread, "finished").await;
    app.wait_for_status(
        &alice,
        accepted["workflow_id"].as_str().expect("id"),
        "completed",
    )
    .await;
    poll_until("done to be stored", TIMEOUT, || async {
        app.stored(thread)
            .await
            .iter()
            .any(|(_, k)| k == "done")
            .then_some(())
    })
    .await;
    let stored = app.stored(thread).await;
    let (start, _) = &stored[0];
    let mut reader = app.stream(&alice, thread, "", Some(start)).await;
    let frames = reader.collect(READ).await;
    assert_eq!(
        ids(&frames),
        stored[1..]
            .iter()
            .map(|(id, _)| id.clone())
            .collect::<Vec<_>>()
    );
    assert!(reader.closed);

    let (last, _) = stored.last().expect("done");
    let frames = app
        .stream(&alice, thread, "", Some(last))
        .await
        .collect(READ)
        .await;
    assert_eq!(kinds(&frames), ["message_not_streaming"]);
    assert!(frames[0].id.is_none(), "gateway events carry no id");

    let frames = app
        .stream(&alice, thread, "", None)
        .await
        .collect(READ)
        .await;
    assert_eq!(kinds(&frames), ["message_not_streaming"]);

    let message = accepted["message_id"].as_str().expect("id");
    let frames = app
        .stream(&alice, thread, &format!("?last_message_id={message}"), None)
        .await
        .collect(READ)
        .await;
    assert_eq!(kinds(&frames), ["message_not_streaming"]);
    assert_eq!(frames[0].json()["message_id"], message);
    app.stop().await;
}

#[tokio::test]
async fn a_cursor_older_than_the_retained_window_gets_stream_reset() {
    // Two slow runs back to back with a 2 s window: the second's `done` trims the first.
    let app = TestApp::start_with_retention(1, worker_args(50, 50), 2).await;
    let alice = token("alice", "acme");
    let thread = Uuid::new_v4();
    let (_, first) = app.send_message(&alice, thread, "one").await;
    app.wait_for_status(
        &alice,
        first["workflow_id"].as_str().expect("id"),
        "completed",
    )
    .await;
    let (early, _) = app.stored(thread).await[0].clone();
    let (_, second) = app.send_message(&alice, thread, "two").await;
    app.wait_for_status(
        &alice,
        second["workflow_id"].as_str().expect("id"),
        "completed",
    )
    .await;
    let key = app.keys.events(ThreadId(thread));
    let retention = poll_until("the first run to be trimmed", TIMEOUT, || async {
        let cursor = early.parse().expect("id");
        let r = events::inspect(&mut app.streams.conn(), &app.keys, ThreadId(thread), cursor)
            .await
            .ok()?;
        (r.trimmed_through >= early.parse().expect("id")).then_some(r)
    })
    .await;
    assert!(!retention.retains(early.parse().expect("id")));
    // The thread's hashes forget the first run, whose events are trimmed.
    let mut conn = app.streams.conn();
    let fence: Vec<String> = redis::cmd("HKEYS")
        .arg(app.keys.fence(ThreadId(thread)))
        .query_async(&mut conn)
        .await
        .expect("hkeys");
    let (one, two) = (
        first["workflow_id"].as_str().expect("id"),
        second["workflow_id"].as_str().expect("id"),
    );
    assert!(fence.iter().all(|f| !f.starts_with(one)), "{fence:?}");
    assert!(fence.iter().any(|f| f == two), "{fence:?}");
    let starts: Vec<String> = redis::cmd("HKEYS")
        .arg(app.keys.starts(ThreadId(thread)))
        .query_async(&mut conn)
        .await
        .expect("hkeys");
    let mut starts: Vec<&str> = starts.iter().map(String::as_str).collect();
    starts.sort_unstable();
    let mut expected = vec![
        ":oldest_start",
        ":trimmed",
        second["message_id"].as_str().expect("id"),
    ];
    expected.sort_unstable();
    assert_eq!(starts, expected);
    let frames = app
        .stream(&alice, thread, "", Some(&early))
        .await
        .collect(READ)
        .await;
    assert_eq!(kinds(&frames), ["stream_reset"]);

    // A stream Redis lost (or that expired) is a gap too, even once it is re-created.
    redis::cmd("DEL")
        .arg(&key)
        .query_async::<()>(&mut app.streams.conn())
        .await
        .expect("del");
    let (_, third) = app.send_message(&alice, thread, "three").await;
    app.wait_for_status(
        &alice,
        third["workflow_id"].as_str().expect("id"),
        "completed",
    )
    .await;
    let frames = app
        .stream(&alice, thread, "", Some(&early))
        .await
        .collect(READ)
        .await;
    assert_eq!(kinds(&frames), ["stream_reset"]);
    app.stop().await;
}

#[tokio::test]
async fn an_entry_whose_notification_was_lost_still_reaches_its_follower() {
    // No worker: the run stays queued, and the follower waits on its thread's feed.
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let alice = token("alice", "acme");
    let thread = Uuid::new_v4();
    let (_, accepted) = app.send_message(&alice, thread, "anyone there?").await;
    let mut reader = app.stream(&alice, thread, "", None).await;
    // Stored as the publish script stores it, but never announced on the notify channel.
    let origin = spool_shared::event::Origin {
        thread_id: ThreadId(thread),
        workflow_id: accepted["workflow_id"]
            .as_str()
            .and_then(|w| w.parse().ok())
            .expect("workflow"),
        message_id: accepted["message_id"]
            .as_str()
            .and_then(|m| m.parse().ok())
            .expect("message"),
        attempt: 1,
        depth: 0,
    };
    let event = origin.event(spool_shared::event::MessageStart::new(None));
    let id: String = redis::cmd("XADD")
        .arg(app.keys.events(ThreadId(thread)))
        .arg("*")
        .arg("x")
        .arg(events::entry(&event).expect("entry"))
        .query_async(&mut app.streams.conn())
        .await
        .expect("xadd");
    // The feed reads on its own within its longest wait (8 s) and a second.
    let frame = reader
        .next(Duration::from_secs(9))
        .await
        .expect("the entry, read without a notification");
    assert_eq!(
        (frame.event.as_str(), frame.id.as_deref()),
        ("message_start", Some(id.as_str()))
    );
    app.stop().await;
}

#[tokio::test]
async fn a_cursor_that_is_not_an_entry_id_gets_400() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let alice = token("alice", "acme");
    let thread = Uuid::new_v4();
    app.send_message(&alice, thread, "x").await;
    for bad in ["abc", "1-", "$", "-1-1"] {
        let response = app.open_stream(&alice, thread, "", Some(bad)).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{bad}");
        let body: Value = response.json().await.expect("json");
        assert_eq!(body["error"]["code"], "invalid_cursor");
    }
    let response = app
        .open_stream(&alice, thread, "?last_entry_id=nope", None)
        .await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    app.stop().await;
}

#[tokio::test]
async fn text_with_newlines_and_field_names_cannot_forge_an_sse_event() {
    let app = TestApp::start(0, worker_args(3, 0)).await;
    let alice = token("alice", "acme");
    let thread = Uuid::new_v4();
    let evil = "a\r\nid: 1-1\n\nevent: done\ndata: {}\r\r";
    app.send_message(&alice, thread, evil).await;
    let mut reader = app.stream(&alice, thread, "", None).await;
    let app = app.with_worker(worker_args(3, 0)).await;
    let frames = reader.collect(READ).await;
    assert_eq!(frames.iter().filter(|f| f.event == "done").count(), 1);
    assert_eq!(kinds(&frames).last(), Some(&"done"));
    for frame in &frames {
        assert!(
            frame.json().is_object(),
            "every data line is one JSON object: {:?}",
            frame.data
        );
        assert_ne!(frame.id.as_deref(), Some("1-1"));
    }
    assert!(
        text(&frames).contains(evil),
        "the text arrives intact, JSON-encoded"
    );
    app.stop().await;
}

#[tokio::test]
async fn another_tenant_gets_404_on_the_stream_by_header_or_access_token() {
    let app = TestApp::start(1, worker_args(3, 0)).await;
    let alice = token("alice", "acme");
    let thread = Uuid::new_v4();
    app.send_message(&alice, thread, "mine").await;
    for intruder in [token("alice", "evil"), token("mallory", "acme")] {
        let response = app.open_stream(&intruder, thread, "", None).await;
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        let response = app
            .http
            .get(app.url(&format!(
                "/v1/threads/{thread}/stream?access_token={intruder}"
            )))
            .send()
            .await
            .expect("send");
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
    }
    let response = app
        .http
        .get(app.url(&format!("/v1/threads/{thread}/stream")))
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    // The owner may pass the token in the query, as EventSource must.
    let response = app
        .http
        .get(app.url(&format!("/v1/threads/{thread}/stream?access_token={alice}")))
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), StatusCode::OK);
    let frames = SseReader::new(response).collect(READ).await;
    assert!(!frames.is_empty());
    app.stop().await;
}

#[tokio::test]
async fn browsers_from_a_configured_origin_pass_cors() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let response = app
        .http
        .request(
            reqwest::Method::OPTIONS,
            app.url("/v1/threads/00000000-0000-0000-0000-000000000000/stream"),
        )
        .header("Origin", "https://app.example")
        .header("Access-Control-Request-Method", "GET")
        .header(
            "Access-Control-Request-Headers",
            "authorization,last-event-id",
        )
        .send()
        .await
        .expect("preflight");
    assert_eq!(
        response.headers()["access-control-allow-origin"],
        "https://app.example"
    );
    let other = app
        .http
        .request(reqwest::Method::OPTIONS, app.url("/v1/threads"))
        .header("Origin", "https://evil.example")
        .header("Access-Control-Request-Method", "POST")
        .send()
        .await
        .expect("preflight");
    assert!(other.headers().get("access-control-allow-origin").is_none());
    app.stop().await;
}

#[tokio::test]
async fn a_running_run_publishes_a_heartbeat_every_interval() {
    // Heartbeat 1 s (see `worker_args`); the run lasts about 3 s.
    let app = TestApp::start(0, worker_args(30, 100)).await;
    let alice = token("alice", "acme");
    let thread = Uuid::new_v4();
    app.send_message(&alice, thread, "tick").await;
    let mut reader = app.stream(&alice, thread, "", None).await;
    let app = app.with_worker(worker_args(30, 100)).await;
    let frames = reader.collect(READ).await;
    assert_eq!(
        kinds(&frames).last(),
        Some(&"done"),
        "nothing, not even a heartbeat, after done"
    );
    let beats: Vec<&Frame> = frames.iter().filter(|f| f.event == "heartbeat").collect();
    assert!(
        beats.len() >= 2,
        "expected heartbeats over a 3 s run, got {}",
        beats.len()
    );
    let done = frames.iter().position(|f| f.event == "done").expect("done");
    assert!(
        frames
            .iter()
            .position(|f| f.event == "heartbeat")
            .is_some_and(|h| h < done)
    );
    app.stop().await;
}

#[tokio::test]
async fn a_subscriber_that_falls_behind_the_buffer_is_dropped_and_can_resume() {
    // The test app's live buffer holds 64 events per thread.
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let thread = Uuid::new_v4();
    let origin = spool_shared::event::Origin {
        thread_id: ThreadId(thread),
        workflow_id: spool_shared::WorkflowId::new(),
        message_id: spool_shared::MessageId::new(),
        attempt: 1,
        depth: 0,
    };
    let publish = |n: usize| {
        let events: Vec<_> = (0..n)
            .map(|i| {
                origin.event(spool_shared::event::TextDelta {
                    block_id: spool_shared::event::BlockId::of_step(0),
                    delta: format!("{i} "),
                })
            })
            .collect();
        let app = &app;
        async move { app.publish_as(&origin, &events).await }
    };
    publish(1).await;
    let mut slow = app
        .streams
        .subscribe(ThreadId(thread))
        .await
        .expect("subscribe");
    let mut fast = app
        .streams
        .subscribe(ThreadId(thread))
        .await
        .expect("subscribe");
    assert_eq!(
        app.streams.active_feeds(),
        1,
        "one reader for both subscribers"
    );
    let received = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = received.clone();
    let reader = tokio::spawn(async move {
        let mut got = 0;
        while got < 200 {
            match fast.recv().await {
                Ok(_) => got += 1,
                Err(err) => panic!("the fast subscriber lagged: {err:?}"),
            }
            counted.store(got, std::sync::atomic::Ordering::SeqCst);
        }
        got
    });
    // The fast subscriber keeps pace: each batch is taken before the next is published (a
    // burst larger than the ring would outrun any reader).
    for batch in 1..=20 {
        publish(10).await;
        poll_until("the fast subscriber to take the batch", TIMEOUT, || async {
            (received.load(std::sync::atomic::Ordering::SeqCst) >= batch * 10).then_some(())
        })
        .await;
    }
    assert_eq!(
        reader.await.expect("reader"),
        200,
        "a subscriber that keeps up gets everything"
    );
    match slow.recv().await {
        Err(spool_api::gateway::hub::Missed::Behind) => {}
        other => panic!("the slow subscriber must be told it fell behind, got {other:?}"),
    }
    drop(slow);
    // Everything it missed is still in the stream: a reconnect with its cursor replays it.
    let stored = app.stored(thread).await;
    assert_eq!(stored.len(), 201);
    app.stop().await;
}

#[tokio::test]
async fn a_cursor_on_a_thread_with_nothing_running_replays_and_ends_even_without_a_done() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let alice = token("alice", "acme");
    let (_, thread) = app
        .post(&alice, "/v1/threads", &serde_json::json!({}))
        .await;
    let thread: Uuid = thread["id"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("thread");
    // Events whose `done` never made it (lost with Redis, say), and no run active.
    let origin = spool_shared::event::Origin {
        thread_id: ThreadId(thread),
        workflow_id: spool_shared::WorkflowId::new(),
        message_id: spool_shared::MessageId::new(),
        attempt: 1,
        depth: 0,
    };
    let events: Vec<_> = ["a", "b", "c"]
        .iter()
        .map(|d| {
            origin.event(spool_shared::event::TextDelta {
                block_id: spool_shared::event::BlockId::of_step(0),
                delta: (*d).to_owned(),
            })
        })
        .collect();
    app.publish_as(&origin, &events).await;
    let stored = app.stored(thread).await;
    let mut reader = app.stream(&alice, thread, "", Some(&stored[0].0)).await;
    let frames = reader.collect(Duration::from_secs(5)).await;
    assert_eq!(ids(&frames), [stored[1].0.clone(), stored[2].0.clone()]);
    assert!(
        reader.closed,
        "the stream ends instead of waiting for a done that will not come"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_client_resuming_after_the_run_ended_but_before_its_done_was_published_gets_the_done() {
    let app = TestApp::start(1, worker_args(3, 0)).await;
    let alice = token("alice", "acme");
    let thread = Uuid::new_v4();
    let (_, accepted) = app.send_message(&alice, thread, "almost done").await;
    let workflow = accepted["workflow_id"].as_str().expect("workflow");
    app.wait_for_status(&alice, workflow, "completed").await;
    // Rewind Redis to the moment after the worker's fenced write to Postgres and before it
    // published the end of the message: the last two events are not there yet.
    let stored = app.unpublish_the_end(thread).await;

    let mut reader = app.stream(&alice, thread, "", Some(&stored[0].0)).await;
    let mut frames = Vec::new();
    while frames.len() < stored.len() - 3 {
        frames.push(reader.next(READ).await.expect("a replayed event"));
    }
    assert!(
        reader.next(Duration::from_millis(300)).await.is_none() && !reader.closed,
        "the stream waits for the done of a run that has only just finished"
    );
    let origin = spool_shared::event::Origin {
        thread_id: ThreadId(thread),
        workflow_id: workflow.parse().expect("workflow id"),
        message_id: accepted["message_id"]
            .as_str()
            .and_then(|m| m.parse().ok())
            .expect("message id"),
        attempt: 1,
        depth: 0,
    };
    let end: Vec<_> = completed()
        .into_iter()
        .map(|data| origin.event(data))
        .collect();
    app.publish_as(&origin, &end).await;
    frames.extend(reader.collect(READ).await);
    assert_eq!(kinds(&frames).last(), Some(&"done"));
    assert!(reader.closed, "and closes after it");
    app.stop().await;
}

/// The thread's stored events once the last one is a `done` of the thread's own run `turn`
/// (the worker publishes it after writing the run's end to Postgres).
async fn stored_through_done(app: &TestApp, thread: Uuid, turn: usize) -> Vec<(String, String)> {
    poll_until("the turn's done to be stored", TIMEOUT, || async {
        let stored = app.stored(thread).await;
        let dones = stored.iter().filter(|(_, k)| k == "done").count();
        (dones == turn && stored.last().is_some_and(|(_, k)| k == "done")).then_some(stored)
    })
    .await
}

/// Two turns on a new thread, then Redis rewound to the moment after the second run's end was
/// written to Postgres and before its worker stored its first batch (a run this fast ends
/// before it publishes). Returns the thread, the first turn's `done` (a client's cursor) and
/// the second run's origin.
async fn a_run_ended_but_not_yet_published(
    app: &TestApp,
    token: &str,
) -> (Uuid, String, spool_shared::event::Origin) {
    let thread = Uuid::new_v4();
    let (_, first) = app.send_message(token, thread, "one").await;
    app.wait_for_status(
        token,
        first["workflow_id"].as_str().expect("id"),
        "completed",
    )
    .await;
    let cursor = stored_through_done(app, thread, 1)
        .await
        .pop()
        .expect("done")
        .0;
    let (_, second) = app.send_message(token, thread, "two").await;
    let workflow = second["workflow_id"].as_str().expect("id");
    app.wait_for_status(token, workflow, "completed").await;
    let stored = stored_through_done(app, thread, 2).await;
    let unpublished: Vec<&str> = stored
        .iter()
        .filter(|(id, _)| id.parse::<EntryId>().expect("id") > cursor.parse().expect("id"))
        .map(|(id, _)| id.as_str())
        .collect();
    assert!(
        unpublished.len() >= 3,
        "the second run's events: {stored:?}"
    );
    let message = second["message_id"].as_str().expect("message id");
    let () = redis::pipe()
        .cmd("XDEL")
        .arg(app.keys.events(ThreadId(thread)))
        .arg(&unpublished)
        .ignore()
        .cmd("HDEL")
        .arg(app.keys.starts(ThreadId(thread)))
        .arg(message)
        .ignore()
        .query_async(&mut app.streams.conn())
        .await
        .expect("xdel");
    let origin = spool_shared::event::Origin {
        thread_id: ThreadId(thread),
        workflow_id: workflow.parse().expect("workflow id"),
        message_id: message.parse().expect("message id"),
        attempt: 1,
        depth: 0,
    };
    (thread, cursor, origin)
}

#[tokio::test]
async fn a_client_resuming_from_the_last_done_before_a_finished_run_published_anything_gets_its_events()
 {
    let app = TestApp::start(1, worker_args(3, 0)).await;
    let alice = token("alice", "acme");
    // The client, resuming from the first run's `done`, must wait for the second run's
    // events, not be told that nothing streams.
    let (thread, cursor, origin) = a_run_ended_but_not_yet_published(&app, &alice).await;
    let mut reader = app.stream(&alice, thread, "", Some(&cursor)).await;
    assert!(
        reader.next(Duration::from_millis(300)).await.is_none() && !reader.closed,
        "the stream waits for the events of a run that has only just finished"
    );
    let run: Vec<_> = std::iter::once(spool_shared::event::MessageStart::new(None).into())
        .chain(completed())
        .map(|data| origin.event(data))
        .collect();
    app.publish_as(&origin, &run).await;
    let frames = reader.collect(READ).await;
    assert_eq!(kinds(&frames), ["message_start", "message_end", "done"]);
    assert!(reader.closed, "and closes after the done");

    // Resuming from that `done`: the thread's last run is shown to its end, nothing follows.
    let done = frames.last().and_then(|f| f.id.clone()).expect("done's id");
    let mut reader = app.stream(&alice, thread, "", Some(&done)).await;
    let frames = reader.collect(READ).await;
    assert_eq!(kinds(&frames), ["message_not_streaming"]);
    app.stop().await;
}

#[tokio::test]
async fn a_client_waiting_for_a_finished_run_s_events_that_never_come_gets_message_not_streaming() {
    let app = TestApp::start(1, worker_args(3, 0)).await;
    let alice = token("alice", "acme");
    // The worker died before it published anything (or Redis lost it all): once the flush
    // window has passed without an event, the client is told to read the message over REST.
    let (thread, cursor, origin) = a_run_ended_but_not_yet_published(&app, &alice).await;
    let mut reader = app.stream(&alice, thread, "", Some(&cursor)).await;
    let frames = reader
        .collect(spool_shared::stream::FLUSH_WINDOW + READ)
        .await;
    assert_eq!(kinds(&frames), ["message_not_streaming"]);
    assert_eq!(
        frames[0].json()["workflow_id"],
        origin.workflow_id.to_string(),
        "naming the run"
    );
    assert!(reader.closed);
    app.stop().await;
}

#[tokio::test]
async fn streams_are_served_over_http2_without_tls_too() {
    let app = TestApp::start(0, worker_args(3, 0)).await;
    let alice = token("alice", "acme");
    let thread = Uuid::new_v4();
    app.send_message(&alice, thread, "over h2c").await;
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .expect("client");
    let response = h2
        .get(app.url(&format!("/v1/threads/{thread}/stream")))
        .bearer_auth(&alice)
        .send()
        .await
        .expect("stream over h2c");
    assert_eq!(response.version(), reqwest::Version::HTTP_2);
    assert_eq!(response.status(), StatusCode::OK);
    let mut reader = SseReader::new(response);
    let app = app.with_worker(worker_args(3, 0)).await;
    let frames = reader.collect(READ).await;
    assert_eq!(kinds(&frames).first(), Some(&"message_start"));
    assert_eq!(kinds(&frames).last(), Some(&"done"));
    app.stop().await;
}

/// Removes entries of the thread's stream behind Spool's back: `XTRIM MINID` (everything
/// before `min_id`) or `XDEL` (one entry), as an operator, a restart or a failover would.
async fn lose(app: &TestApp, thread: Uuid, command: &str, id: &str) {
    let key = app.keys.events(ThreadId(thread));
    let mut cmd = redis::cmd(command);
    cmd.arg(&key);
    if command == "XTRIM" {
        cmd.arg("MINID");
    }
    let removed: i64 = cmd
        .arg(id)
        .query_async(&mut app.streams.conn())
        .await
        .expect("redis");
    assert!(removed > 0, "{command} removed nothing");
}

#[tokio::test]
async fn a_cursor_whose_entry_redis_no_longer_holds_gets_stream_reset_never_a_silent_gap() {
    // Deltas 10 ms apart, so each is an entry of its own.
    let app = TestApp::start(1, worker_args(8, 10)).await;
    let alice = token("alice", "acme");
    let (thread, other) = (Uuid::new_v4(), Uuid::new_v4());
    for (t, text) in [(thread, "one"), (other, "elsewhere")] {
        let (_, accepted) = app.send_message(&alice, t, text).await;
        let workflow = accepted["workflow_id"].as_str().expect("id");
        app.wait_for_status(&alice, workflow, "completed").await;
    }
    let stored = app.stored(thread).await;
    assert!(stored.len() > 6, "{stored:?}");
    let resume = |cursor: String| {
        let app = &app;
        let alice = alice.clone();
        async move {
            let frames = app
                .stream(&alice, thread, "", Some(&cursor))
                .await
                .collect(READ)
                .await;
            kinds(&frames)
                .into_iter()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        }
    };
    // A cursor in the stream resumes; one from another thread's stream or from the future
    // names no entry of this stream.
    assert_eq!(
        resume(stored[3].0.clone()).await.last().map(String::as_str),
        Some("done")
    );
    let elsewhere = app.stored(other).await[2].0.clone();
    assert_eq!(resume(elsewhere).await, ["stream_reset"]);
    assert_eq!(resume("99999999999999-0".into()).await, ["stream_reset"]);

    // Trimmed by someone else (no trace in Spool's own trim record), then one entry deleted
    // in the middle, as a failover to a replica that never had it would: both are gaps.
    lose(&app, thread, "XTRIM", &stored[3].0).await;
    assert_eq!(resume(stored[1].0.clone()).await, ["stream_reset"]);
    lose(&app, thread, "XDEL", &stored[5].0).await;
    assert_eq!(resume(stored[5].0.clone()).await, ["stream_reset"]);
    assert_eq!(
        resume(stored[3].0.clone()).await.last().map(String::as_str),
        Some("done"),
        "a cursor still in the stream resumes"
    );
    app.stop().await;
}

#[tokio::test]
async fn an_entry_lost_under_a_live_stream_ends_it_with_stream_reset() {
    // A run of 200 deltas 30 ms apart: about 6 s to follow live.
    let app = TestApp::start(1, worker_args(200, 30)).await;
    let alice = token("alice", "acme");
    let thread = Uuid::new_v4();
    let (_, accepted) = app.send_message(&alice, thread, "stream on").await;
    let workflow = accepted["workflow_id"].as_str().expect("id");
    app.wait_for_status(&alice, workflow, "running").await;
    let mut reader = app.stream(&alice, thread, "", None).await;
    let (mut deltas, mut last) = (0, None);
    while deltas < 5 {
        let frame = reader.next(READ).await.expect("a live event");
        if frame.event == "text_delta" {
            deltas += 1;
            last = Some(frame);
        }
    }
    let last = last.expect("a delta");
    // The entry this client continues from vanishes, with every later one so far, in one
    // script: the live feed has read at least to `last` (it delivered it) and maybe further
    // (the worker keeps publishing), so its position is among them wherever it is. Deleting
    // `last` alone raced the feed: once it had read past it, nothing was lost to anyone.
    let removed: i64 = redis::cmd("EVAL")
        .arg(
            "local n = 0
             for _, e in ipairs(redis.call('XRANGE', KEYS[1], ARGV[1], '+')) do
                 n = n + redis.call('XDEL', KEYS[1], e[1])
             end
             return n",
        )
        .arg(1)
        .arg(app.keys.events(ThreadId(thread)))
        .arg(last.id.as_deref().expect("an id"))
        .query_async(&mut app.streams.conn())
        .await
        .expect("redis");
    assert!(removed > 0, "nothing removed");
    let rest = reader.collect(READ).await;
    assert_eq!(
        kinds(&rest).last(),
        Some(&"stream_reset"),
        "{:?}",
        kinds(&rest)
    );
    assert!(
        !kinds(&rest).contains(&"done"),
        "nothing after the gap is sent"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_client_following_a_message_sees_none_of_the_previous_run_s_late_events() {
    let app = TestApp::start(1, worker_args(40, 50)).await;
    let alice = token("alice", "acme");
    let thread = Uuid::new_v4();
    let (_, first) = app.send_message(&alice, thread, "first").await;
    let first_workflow = first["workflow_id"].as_str().expect("workflow");
    app.wait_for_status(&alice, first_workflow, "completed")
        .await;
    // The first run is over in Postgres, its last two events not yet in Redis.
    app.unpublish_the_end(thread).await;

    let (_, second) = app.send_message(&alice, thread, "second").await;
    let mut reader = app.stream(&alice, thread, "", None).await;
    // Now the first run's worker publishes its end, after the tail the session started from.
    let origin = spool_shared::event::Origin {
        thread_id: ThreadId(thread),
        workflow_id: first_workflow.parse().expect("workflow id"),
        message_id: first["message_id"]
            .as_str()
            .and_then(|m| m.parse().ok())
            .expect("message id"),
        attempt: 1,
        depth: 0,
    };
    let late: Vec<_> = completed()
        .into_iter()
        .map(|data| origin.event(data))
        .collect();
    app.publish_as(&origin, &late).await;
    let frames = reader.collect(READ).await;
    assert!(reader.closed, "the stream ends with the second run's done");
    assert_eq!(kinds(&frames).first(), Some(&"message_start"));
    assert_eq!(kinds(&frames).last(), Some(&"done"));
    let foreign: Vec<&Frame> = frames
        .iter()
        .filter(|f| f.json()["message_id"] != second["message_id"])
        .collect();
    assert!(foreign.is_empty(), "{foreign:?}");
    app.stop().await;
}

/// A completed run's `message_end` and `done`.
fn completed() -> Vec<spool_shared::event::Data> {
    let end = spool_shared::event::MessageEnd {
        status: spool_shared::status::RunStatus::Completed,
        usage: spool_shared::run::Usage::default(),
        blocked: false,
        output: None,
    };
    spool_shared::event::end_of_message(end, None)
}

/// Publishes one batch of `texts` (as text deltas, then `tail`) for `origin` under batch id
/// `id`, naming `previous` as the attempt's last acknowledged batch.
async fn publish_batch(
    app: &TestApp,
    origin: &spool_shared::event::Origin,
    (id, previous): (&str, Option<&str>),
    texts: &[&str],
    tail: Vec<spool_shared::event::Data>,
) {
    use spool_shared::event::{BlockId, TextDelta};
    let mut list: Vec<_> = texts
        .iter()
        .map(|text| {
            origin.event(TextDelta {
                block_id: BlockId::of_step(1),
                delta: (*text).to_owned(),
            })
        })
        .collect();
    list.extend(tail.into_iter().map(|data| origin.event(data)));
    let batch = events::Batch {
        thread: origin.thread_id,
        workflow: origin.workflow_id,
        attempt: origin.attempt,
        id,
        previous,
        events: &list,
    };
    events::publish(
        &mut app.streams.conn(),
        &app.keys,
        &batch,
        Duration::from_secs(60),
    )
    .await
    .expect("publish");
}

#[tokio::test]
async fn a_batch_acknowledged_then_lost_in_a_failover_ends_a_reader_with_stream_reset_never_a_hole()
{
    let app = TestApp::start(1, worker_args(2, 0)).await;
    let alice = token("alice", "acme");
    for lost in [false, true] {
        let thread = Uuid::new_v4();
        let (_, accepted) = app.send_message(&alice, thread, "first").await;
        let workflow = accepted["workflow_id"].as_str().expect("id");
        app.wait_for_status(&alice, workflow, "completed").await;
        // The run's done is published after its status commits: wait for it on the stream.
        let cursor = poll_until("the done to be stored", TIMEOUT, || async {
            let stored = app.stored(thread).await;
            let last = stored.last().filter(|(_, k)| k == "done");
            last.map(|(id, _)| id.clone())
        })
        .await;
        // A later run's attempt publishes three batches; the second is acknowledged, then lost
        // with the master that stored it (its entries and its record in the fence hash gone,
        // as on the replica that takes over).
        let origin = spool_shared::event::Origin {
            thread_id: ThreadId(thread),
            workflow_id: spool_shared::WorkflowId::new(),
            message_id: spool_shared::MessageId::new(),
            attempt: 1,
            depth: 0,
        };
        publish_batch(&app, &origin, ("b1", None), &["a"], Vec::new()).await;
        publish_batch(&app, &origin, ("b2", Some("b1")), &["b"], Vec::new()).await;
        if lost {
            let b = app.stored(thread).await.last().expect("b").0.clone();
            lose(&app, thread, "XDEL", &b).await;
            let fence = app.keys.fence(ThreadId(thread));
            let _: i64 = redis::cmd("HSET")
                .arg(&fence)
                .arg(format!("{}:batches", origin.workflow_id))
                .arg("b1")
                .query_async(&mut app.streams.conn())
                .await
                .expect("hset");
        }
        publish_batch(&app, &origin, ("b3", Some("b2")), &["c"], completed()).await;

        let frames = app
            .stream(&alice, thread, "", Some(&cursor))
            .await
            .collect(READ)
            .await;
        if lost {
            assert_eq!(kinds(&frames), ["text_delta", "stream_reset"], "{frames:?}");
            assert_eq!(text(&frames), "a", "nothing after the hole is shown");
        } else {
            assert_eq!(kinds(&frames).last(), Some(&"done"), "{frames:?}");
            assert_eq!(text(&frames), "abc");
        }
    }
    app.stop().await;
}
