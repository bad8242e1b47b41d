//! The stream across process failures: a worker killed mid-stream, a stale worker fenced by
//! Redis, hundreds of clients resuming at random, and a Redis outage.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use spool_shared::event::{
    BlockId, Data, Done, EventType, MessageStart, Origin, StepCall, StepResult, TextDelta,
};
use spool_shared::status::RunStatus;
use spool_shared::stream::{self, PublishError, StreamKeys};
use spool_shared::{MessageId, ThreadId, WorkflowId};
use spool_tests::servers::{OwnRedis, free_port};
use spool_tests::sse::SseReader;
use spool_tests::{poll_until, token};

use crate::stack::{Stack, TIMEOUT, demo_reply, read_deltas, shown_text, slow_reader};

const READ: Duration = Duration::from_secs(15);

#[tokio::test]
async fn a_client_sees_attempt_restarted_then_the_whole_message_when_its_worker_is_killed() {
    let stack = Stack::start().await;
    let slow = [("SPOOL_DEMO_TOKENS", "40"), ("SPOOL_DEMO_DELAY_MS", "100")];
    let mut a = stack.worker(&slow).await;
    let alice = token("alice", "acme");
    let accepted = stack.enqueue(&alice, "crash mid-stream").await;
    let mut reader = SseReader::new(stack.stream(&alice, &accepted["thread_id"], None).await);
    let mut frames = read_deltas(&mut reader, 5).await;
    a.kill9().await;
    let _b = stack.worker(&slow).await;
    frames.extend(reader.collect(Duration::from_secs(20)).await);
    assert_eq!(frames.last().map(|f| f.event.as_str()), Some("done"));
    let restart = frames
        .iter()
        .position(|f| f.event == "attempt_restarted")
        .expect("attempt_restarted");
    assert_eq!(frames[restart].json()["attempt"], 2);
    assert!(
        frames[restart..].iter().all(|f| f.json()["attempt"] == 2),
        "no event of the dead attempt after the new attempt's first event"
    );
    let persisted = stack.messages(&accepted).await;
    assert_eq!(shown_text(&frames), persisted[1].2);
    assert_eq!(persisted[1].2, demo_reply("crash mid-stream", 40));
}

#[tokio::test]
async fn a_crash_after_an_answered_pause_restarts_the_answer_for_the_client() {
    let fake = slow_reader().await;
    let stack = Stack::start().await;
    let llm = [("SPOOL_LLM_BASE_URL", fake.base_url.as_str())];
    let mut a = stack.worker(&llm).await;
    let accepted = stack.answered_client_tool().await;
    let alice = token("alice", "acme");

    // The client follows the answer after the pause; the resumed attempt dies mid-answer.
    let mut reader = SseReader::new(stack.stream(&alice, &accepted["thread_id"], None).await);
    let mut frames = read_deltas(&mut reader, 5).await;
    a.kill9().await;
    let _b = stack.worker(&llm).await;
    frames.extend(reader.collect(Duration::from_secs(30)).await);
    assert_eq!(frames.last().map(|f| f.event.as_str()), Some("done"));
    let restart = frames
        .iter()
        .position(|f| f.event == "attempt_restarted")
        .expect("attempt_restarted after a crash that followed a resume");
    assert_eq!(frames[restart].json()["attempt"], 3);
    assert!(
        frames[restart..].iter().all(|f| f.json()["attempt"] == 3),
        "no event of the dead attempt after the new attempt's first event"
    );
    let persisted = stack.messages(&accepted).await;
    assert_eq!(persisted[1].2, "word ".repeat(40));
    assert_eq!(
        shown_text(&frames),
        persisted[1].2,
        "the client shows the answer once"
    );
}

#[tokio::test]
async fn redis_itself_refuses_a_stale_attempt_s_events() {
    let keys = StreamKeys::new(spool_tests::redis_prefix());
    let mut conn = spool_shared::redis_conn::connect(&spool_tests::redis_url()).expect("redis");
    let origin = |attempt| Origin {
        thread_id: ThreadId(uuid::Uuid::nil()),
        workflow_id: WorkflowId(uuid::Uuid::max()),
        message_id: MessageId(uuid::Uuid::max()),
        attempt,
        depth: 0,
    };
    let publish_kind = |attempt: i32, kind: EventType| {
        let event = origin(attempt).event(sample(kind));
        let keys = keys.clone();
        let mut conn = conn.clone();
        async move {
            let id = uuid::Uuid::new_v4().simple().to_string();
            let events = [event];
            let batch = stream::Batch {
                thread: events[0].thread_id,
                workflow: events[0].workflow_id,
                attempt,
                id: &id,
                previous: None,
                events: &events,
            };
            stream::publish(&mut conn, &keys, &batch, Duration::from_secs(60)).await
        }
    };
    let publish = |attempt: i32| publish_kind(attempt, EventType::TextDelta);
    publish(1).await.expect("attempt 1 publishes");
    publish(2).await.expect("attempt 2 takes over");
    match publish(1).await {
        Err(PublishError::Fenced { current }) => assert_eq!(current, 2),
        other => panic!("a stale attempt must be refused, got {other:?}"),
    }
    publish(2).await.expect("the current attempt goes on");
    // The run's done prunes the fences of runs done before the window, never its own: the
    // stale attempt is still refused after it.
    publish_kind(2, EventType::Done)
        .await
        .expect("the current attempt ends the run");
    assert!(
        matches!(publish(1).await, Err(PublishError::Fenced { current: 2 })),
        "a stale attempt is refused after the run's done too"
    );
    let stored = stream::read_after(
        &mut conn,
        &keys.events(ThreadId(uuid::Uuid::nil())),
        Default::default(),
        100,
    )
    .await
    .expect("xrange");
    let attempts: Vec<i64> = stored
        .iter()
        .filter(|e| !e.is_marker())
        .map(|e| {
            serde_json::from_str::<Value>(&e.json).expect("json")["attempt"]
                .as_i64()
                .unwrap_or(0)
        })
        .collect();
    assert_eq!(attempts, [1, 2, 2, 2]);
}

#[tokio::test]
async fn a_batch_sent_again_after_a_lost_reply_is_stored_once() {
    let keys = StreamKeys::new(spool_tests::redis_prefix());
    let mut conn = spool_shared::redis_conn::connect(&spool_tests::redis_url()).expect("redis");
    let origin = Origin {
        thread_id: ThreadId::new(),
        workflow_id: WorkflowId::new(),
        message_id: MessageId::new(),
        attempt: 1,
        depth: 0,
    };
    let delta = |text: &str| {
        origin.event(TextDelta {
            block_id: BlockId::of_step(0),
            delta: text.to_owned(),
        })
    };
    let publish = |id: String, events: Vec<spool_shared::event::Event>| {
        let keys = keys.clone();
        let mut conn = conn.clone();
        async move {
            let batch = stream::Batch {
                thread: origin.thread_id,
                workflow: origin.workflow_id,
                attempt: origin.attempt,
                id: &id,
                previous: None,
                events: &events,
            };
            stream::publish(&mut conn, &keys, &batch, Duration::from_secs(60))
                .await
                .expect("publish")
        }
    };
    let first = vec![delta("Hel"), delta("lo")];
    assert_eq!(publish("b1".into(), first.clone()).await, 2);
    // The reply was lost (a timeout, a reset, a failover): the publisher sends the batch again.
    assert_eq!(publish("b1".into(), first.clone()).await, 0);
    assert_eq!(publish("b2".into(), vec![delta(", world")]).await, 1);
    // Even after many later batches, a late repeat of a recent one is recognised.
    for n in 3..12 {
        publish(format!("b{n}"), vec![delta("!")]).await;
    }
    assert_eq!(publish("b2".into(), vec![delta(", world")]).await, 0);
    let stored = stream::read_after(
        &mut conn,
        &keys.events(origin.thread_id),
        Default::default(),
        100,
    )
    .await
    .expect("xrange");
    let text: String = stored
        .iter()
        .filter(|e| !e.is_marker())
        .map(|e| serde_json::from_str::<Value>(&e.json).expect("json")["data"]["delta"].clone())
        .filter_map(|d| d.as_str().map(str::to_owned))
        .collect();
    assert_eq!(text, format!("Hello, world{}", "!".repeat(9)));
}

/// A thread's stream written to as a worker writes it (`stream::publish`), with a short
/// retention window, and its hashes read back: for the tests of what a `done` forgets.
struct Direct {
    keys: StreamKeys,
    conn: spool_shared::redis_conn::RedisConn,
    thread: ThreadId,
    window: Duration,
}

impl Direct {
    fn new(window: Duration) -> Self {
        Self {
            keys: StreamKeys::new(spool_tests::redis_prefix()),
            conn: spool_shared::redis_conn::connect(&spool_tests::redis_url()).expect("redis"),
            thread: ThreadId::new(),
            window,
        }
    }

    /// Publishes `kinds` for `message` of `workflow` (attempt 1) as one batch.
    async fn publish(&self, workflow: WorkflowId, message: MessageId, kinds: &[EventType]) {
        let origin = Origin {
            thread_id: self.thread,
            workflow_id: workflow,
            message_id: message,
            attempt: 1,
            depth: 0,
        };
        let events: Vec<_> = kinds.iter().map(|k| origin.event(sample(*k))).collect();
        let id = uuid::Uuid::new_v4().to_string();
        let batch = stream::Batch {
            thread: self.thread,
            workflow,
            attempt: 1,
            id: &id,
            previous: None,
            events: &events,
        };
        stream::publish(&mut self.conn.clone(), &self.keys, &batch, self.window)
            .await
            .expect("publish");
    }

    /// A whole run: its `message_start` and its `done`.
    async fn run(&self, workflow: WorkflowId, message: MessageId) {
        self.publish(
            workflow,
            message,
            &[EventType::MessageStart, EventType::Done],
        )
        .await;
    }

    /// The hash's fields, sorted.
    async fn fields(&self, hash: &str) -> Vec<String> {
        let mut fields: Vec<String> = redis::cmd("HKEYS")
            .arg(hash)
            .query_async(&mut self.conn.clone())
            .await
            .expect("hkeys");
        fields.sort();
        fields
    }

    async fn field(&self, hash: &str, name: &str) -> Option<String> {
        redis::cmd("HGET")
            .arg(hash)
            .arg(name)
            .query_async(&mut self.conn.clone())
            .await
            .expect("hget")
    }

    async fn set_field(&self, hash: &str, name: &str, value: &str) {
        let () = redis::cmd("HSET")
            .arg(hash)
            .arg(name)
            .arg(value)
            .query_async(&mut self.conn.clone())
            .await
            .expect("hset");
    }

    /// Redis's clock, in ms.
    async fn now_ms(&self) -> u64 {
        let (secs, micros): (u64, u64) = redis::cmd("TIME")
            .query_async(&mut self.conn.clone())
            .await
            .expect("time");
        secs * 1000 + micros / 1000
    }

    /// Waits until Redis's clock is past `ms`.
    async fn wait_past(&self, ms: u64, what: &str) {
        poll_until(what, TIMEOUT, || async {
            (self.now_ms().await > ms).then_some(())
        })
        .await;
    }
}

/// The ms of an entry id (`<ms>-<seq>`).
fn entry_ms(id: &str) -> u64 {
    id.split('-')
        .next()
        .and_then(|ms| ms.parse().ok())
        .expect("entry id")
}

#[tokio::test]
async fn a_done_forgets_the_fences_of_runs_done_before_the_window_and_keeps_the_others() {
    const WINDOW: Duration = Duration::from_secs(3);
    let direct = Direct::new(WINDOW);
    let fence = direct.keys.fence(direct.thread);
    let (old, running, recent, latest) = (
        WorkflowId::new(),
        WorkflowId::new(),
        WorkflowId::new(),
        WorkflowId::new(),
    );
    direct.run(old, MessageId::new()).await;
    // A run that starts (which keeps the thread's keys) and is still going.
    direct
        .publish(running, MessageId::new(), &[EventType::MessageStart])
        .await;
    let old_done: u64 = direct
        .field(&fence, &format!("{old}:done"))
        .await
        .expect("the done's time")
        .parse()
        .expect("ms");
    // The hash is looked through once its oldest done is more than an eighth of a window
    // before the window.
    let forgotten = old_done + (WINDOW + WINDOW / 8).as_millis() as u64;
    direct
        .wait_past(forgotten, "the first run's done to leave the window")
        .await;
    direct.run(recent, MessageId::new()).await;
    direct.run(latest, MessageId::new()).await;
    let mut expected: Vec<String> = [running, recent, latest]
        .iter()
        .flat_map(|w| [w.to_string(), format!("{w}:batches")])
        .chain([recent, latest].iter().map(|w| format!("{w}:done")))
        .chain([":oldest_done".to_owned()])
        .collect();
    expected.sort();
    assert_eq!(
        direct.fields(&fence).await,
        expected,
        "the run done before the window is forgotten, the others kept"
    );
    assert_eq!(
        direct.field(&fence, ":oldest_done").await,
        direct.field(&fence, &format!("{recent}:done")).await,
        "the earliest done kept"
    );

    // While that oldest is within the window, a done does not look through the hash: a field
    // planted as if done long ago stays (it goes at the next look, a window from now).
    direct.set_field(&fence, "planted:done", "1").await;
    direct.run(WorkflowId::new(), MessageId::new()).await;
    assert!(
        direct
            .fields(&fence)
            .await
            .contains(&"planted:done".to_owned()),
        "a done within the window reads one field, not the hash"
    );
}

#[tokio::test]
async fn a_trimming_done_looks_through_the_message_starts_only_when_the_oldest_left_the_window() {
    const WINDOW: Duration = Duration::from_secs(3);
    let window_ms = WINDOW.as_millis() as u64;
    let direct = Direct::new(WINDOW);
    let starts = direct.keys.starts(direct.thread);
    let messages: [MessageId; 4] = std::array::from_fn(|_| MessageId::new());
    let workflows: [WorkflowId; 4] = std::array::from_fn(|_| WorkflowId::new());
    // Run `i` starts (which keeps the thread's keys from expiring) in a millisecond of its
    // own, after everything before it, and its start's ms.
    let start = async |i: usize| -> u64 {
        direct
            .wait_past(direct.now_ms().await, "the next millisecond")
            .await;
        direct
            .publish(workflows[i], messages[i], &[EventType::MessageStart])
            .await;
        entry_ms(
            &direct
                .field(&starts, &messages[i].to_string())
                .await
                .expect("a start"),
        )
    };
    // Run `i` ends a window after its start: its done trims everything before that start.
    let end = async |i: usize, started: u64| {
        direct
            .wait_past(started + window_ms, "the run to last a window")
            .await;
        direct
            .publish(workflows[i], messages[i], &[EventType::Done])
            .await;
    };
    let sorted = |fields: &[&str]| -> Vec<String> {
        let mut fields: Vec<String> = fields.iter().map(|f| (*f).to_owned()).collect();
        fields.sort();
        fields
    };

    // The first trim looks through the starts (none were looked through yet): the trimmed
    // run's start goes, and the earliest start kept is recorded.
    direct.run(workflows[0], messages[0]).await;
    let first = start(1).await;
    end(1, first).await;
    assert_eq!(
        direct.fields(&starts).await,
        sorted(&[":oldest_start", ":trimmed", &messages[1].to_string()]),
        "the trimmed run's start forgotten"
    );
    assert_eq!(
        direct.field(&starts, ":oldest_start").await,
        Some(first.to_string()),
        "the earliest start kept"
    );

    // The next done trims that run too, but with the oldest start (as last read) recent, it
    // does not read the hash whole: the trimmed run's start stays for now, and so does one
    // planted as ancient.
    let second = start(2).await;
    let looked = direct.now_ms().await;
    direct
        .set_field(&starts, ":oldest_start", &looked.to_string())
        .await;
    direct.set_field(&starts, "planted", "1-0").await;
    end(2, second).await;
    let trimmed = direct.field(&starts, ":trimmed").await.expect("trimmed");
    assert!(
        (first..second).contains(&entry_ms(&trimmed)),
        "the run before trimmed, this run's start kept: {trimmed}"
    );
    assert_eq!(
        direct.fields(&starts).await,
        sorted(&[
            ":oldest_start",
            ":trimmed",
            "planted",
            &messages[1].to_string(),
            &messages[2].to_string()
        ]),
        "a trimming done with a recent oldest start reads one field, not the hash"
    );
    // A start the hash still holds but whose entry was trimmed is gone to its readers: the
    // gateway does not replay from it, and a message that publishes its start again (a run that
    // outlived the window, on a new attempt) gets a new entry.
    let read = async |m: MessageId| {
        stream::message_start(&mut direct.conn.clone(), &direct.keys, direct.thread, m)
            .await
            .expect("read")
            .map(|id| id.to_string())
    };
    assert_eq!(read(messages[1]).await, None, "a trimmed start");
    assert_eq!(
        read(messages[2]).await,
        direct.field(&starts, &messages[2].to_string()).await,
        "a start in the stream"
    );
    direct
        .publish(workflows[1], messages[1], &[EventType::MessageStart])
        .await;
    let again = direct
        .field(&starts, &messages[1].to_string())
        .await
        .expect("a start");
    assert!(entry_ms(&again) > second, "a new entry for it: {again}");

    // Once that oldest start is more than an eighth of a window before what a done keeps, the
    // done forgets every start before it and records the earliest kept.
    direct
        .wait_past(looked + window_ms / 8, "an eighth of a window")
        .await;
    let third = start(3).await;
    end(3, third).await;
    assert_eq!(
        direct.fields(&starts).await,
        sorted(&[":oldest_start", ":trimmed", &messages[3].to_string()]),
        "every start before the window forgotten"
    );
    assert_eq!(
        direct.field(&starts, ":oldest_start").await,
        Some(third.to_string())
    );
}

#[tokio::test]
async fn during_a_redis_outage_runs_complete_the_gateway_answers_503_and_recovers() {
    let mut redis = OwnRedis::start(free_port());
    let url = redis.url();
    redis.ready(TIMEOUT).await;
    let stack = Stack::start_with_redis(&url).await;
    // Runs of about a second: long enough for a client to connect while one streams.
    let _worker = stack
        .worker(&[("SPOOL_DEMO_TOKENS", "40"), ("SPOOL_DEMO_DELAY_MS", "25")])
        .await;
    let alice = token("alice", "acme");

    redis.kill();
    let started = Instant::now();
    let accepted = stack.enqueue(&alice, "while redis is down").await;
    stack.wait_run(&accepted, "completed").await;
    let messages = stack.messages(&accepted).await;
    assert_eq!(
        messages[1].2,
        demo_reply("while redis is down", 40),
        "the message is persisted"
    );
    let response = stack.stream(&alice, &accepted["thread_id"], None).await;
    assert_eq!(response.status(), reqwest::StatusCode::SERVICE_UNAVAILABLE);
    assert!(response.headers().contains_key("retry-after"));
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["error"]["code"], "stream_unavailable");
    let ready = stack.get_json("/readyz").await;
    assert_eq!(
        ready,
        (
            reqwest::StatusCode::OK,
            json!({"status": "degraded", "postgres": "ok", "redis": "unreachable"})
        ),
        "the API stays in service without Redis"
    );
    println!(
        "run completed without Redis in {:.2} s",
        started.elapsed().as_secs_f64()
    );

    redis.restart();
    poll_until("the gateway to recover", TIMEOUT, || async {
        let response = stack.stream(&alice, &accepted["thread_id"], None).await;
        (response.status() == reqwest::StatusCode::OK).then_some(())
    })
    .await;
    assert_eq!(stack.get_json("/readyz").await.1["status"], "ready");
    let next = stack.enqueue(&alice, "after the outage").await;
    let frames = SseReader::new(stack.stream(&alice, &next["thread_id"], None).await)
        .collect(READ)
        .await;
    assert_eq!(
        frames.first().map(|f| f.event.as_str()),
        Some("message_start")
    );
    assert_eq!(frames.last().map(|f| f.event.as_str()), Some("done"));
    assert_eq!(shown_text(&frames), demo_reply("after the outage", 40));
    let held = spool_tests::process::connections_to_port(stack.api_pid, redis.port);
    assert!(
        (1..=4).contains(&held),
        "the API reconnected without piling up connections: {held}"
    );
}

/// Review M10: one user holds at most `SPOOL_SSE_MAX_STREAMS_PER_USER` streams open on a
/// process. One more is refused with 429 `too_many_streams` (and an OpenAI-compatible
/// `stream: true` request is refused before it enqueues anything); other users stream on; a
/// closed stream frees its slot.
#[tokio::test]
async fn a_user_past_the_stream_limit_gets_429_too_many_streams_and_creates_nothing() {
    let stack = Stack::start_with(
        &spool_tests::redis_url(),
        &[("SPOOL_SSE_MAX_STREAMS_PER_USER", "2")],
    )
    .await;
    let alice = token("alice", "acme");
    // No worker: the run stays queued, and a stream follows it until it ends.
    let accepted = stack.enqueue(&alice, "hold the streams").await;
    let thread = &accepted["thread_id"];
    let first = stack.stream(&alice, thread, None).await;
    let second = stack.stream(&alice, thread, None).await;
    assert_eq!(
        (first.status().as_u16(), second.status().as_u16()),
        (200, 200)
    );

    let third = stack.stream(&alice, thread, None).await;
    assert_eq!(third.status(), 429);
    assert_eq!(
        third
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("2")
    );
    let body: Value = third.json().await.expect("json");
    assert_eq!(
        (
            body["error"]["code"].clone(),
            body["error"]["limit"].clone()
        ),
        (json!("too_many_streams"), json!(2)),
        "{body}"
    );

    let runs = || async {
        let count: (i64,) = sqlx::query_as("SELECT count(*) FROM runs")
            .fetch_one(&stack.db.pool)
            .await
            .expect("runs");
        count.0
    };
    let before = runs().await;
    let refused = stack
        .http
        .post(format!("{}/v1/chat/completions", stack.base))
        .bearer_auth(&alice)
        .json(&json!({"model": "spool-default", "stream": true,
            "messages": [{"role": "user", "content": "one stream too many"}]}))
        .send()
        .await
        .expect("chat");
    assert_eq!(refused.status(), 429);
    let body: Value = refused.json().await.expect("json");
    assert_eq!(body["error"]["code"], "too_many_streams", "{body}");
    assert_eq!(runs().await, before, "a refused stream enqueues nothing");

    let bob = token("bob", "acme");
    let bobs = stack.enqueue(&bob, "my own stream").await;
    let bob_stream = stack.stream(&bob, &bobs["thread_id"], None).await;
    assert_eq!(bob_stream.status(), 200, "another user streams on");

    drop(first);
    let again = poll_until("a closed stream to free its slot", TIMEOUT, || async {
        let response = stack.stream(&alice, thread, None).await;
        (response.status() == 200).then_some(response)
    })
    .await;
    drop((second, again, bob_stream));
}

/// Issue 37: the API process holds at most `SPOOL_SSE_MAX_STREAMS` streams in all, whoever
/// opens them: users each within their own limit cannot together open more. One more is 503
/// `server_stream_capacity` with `Retry-After` (an OpenAI-compatible `stream: true` request is
/// refused before it enqueues anything); a closed stream makes room.
#[tokio::test]
async fn past_the_process_stream_limit_every_user_gets_503_server_stream_capacity_and_nothing_is_created()
 {
    let stack = Stack::start_with(
        &spool_tests::redis_url(),
        &[
            ("SPOOL_SSE_MAX_STREAMS", "2"),
            ("SPOOL_SSE_MAX_STREAMS_PER_USER", "5"),
        ],
    )
    .await;
    let (alice, bob, carol) = (
        token("alice", "acme"),
        token("bob", "acme"),
        token("carol", "globex"),
    );
    // No worker: the runs stay queued, and a stream follows its run until it ends.
    let alices = stack.enqueue(&alice, "hold a stream").await;
    let bobs = stack.enqueue(&bob, "hold another").await;
    let carols = stack.enqueue(&carol, "one too many").await;
    let first = stack.stream(&alice, &alices["thread_id"], None).await;
    let second = stack.stream(&bob, &bobs["thread_id"], None).await;
    assert_eq!(
        (first.status().as_u16(), second.status().as_u16()),
        (200, 200)
    );

    let refused = stack.stream(&carol, &carols["thread_id"], None).await;
    assert_eq!(refused.status(), 503);
    assert_eq!(
        refused
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("2")
    );
    let body: Value = refused.json().await.expect("json");
    assert_eq!(body["error"]["code"], "server_stream_capacity", "{body}");

    let runs = || async {
        let count: (i64,) = sqlx::query_as("SELECT count(*) FROM runs")
            .fetch_one(&stack.db.pool)
            .await
            .expect("runs");
        count.0
    };
    let before = runs().await;
    let refused = stack
        .http
        .post(format!("{}/v1/chat/completions", stack.base))
        .bearer_auth(&alice)
        .json(&json!({"model": "spool-default", "stream": true,
            "messages": [{"role": "user", "content": "within my own limit"}]}))
        .send()
        .await
        .expect("chat");
    assert_eq!(refused.status(), 503);
    let body: Value = refused.json().await.expect("json");
    assert_eq!(body["error"]["code"], "server_stream_capacity", "{body}");
    assert_eq!(runs().await, before, "a refused stream enqueues nothing");

    drop(first);
    let again = poll_until("a closed stream to make room", TIMEOUT, || async {
        let response = stack.stream(&carol, &carols["thread_id"], None).await;
        (response.status() == 200).then_some(response)
    })
    .await;
    drop((second, again));
}

/// `spool_sse_streams_open` on the API's `/metrics`.
async fn open_streams(stack: &Stack) -> Option<f64> {
    let url = format!("{}/metrics", stack.base);
    spool_tests::gauge(&stack.http, &url, "spool_sse_streams_open").await
}

/// Review M10: a client that stops reading is let go once a write has waited
/// `SPOOL_WRITE_TIMEOUT_SECS` for it, instead of holding its stream forever; a client that
/// reads gets the same 8 MiB answer to its `done`.
#[tokio::test]
async fn a_client_that_stops_reading_is_disconnected_after_the_write_timeout() {
    use spool_tests::fake_llm::{self, FakeLlm};
    use tokio::io::AsyncWriteExt as _;

    let answer = "0123456789abcdef".repeat(1 << 19);
    let fake = {
        let answer = answer.clone();
        FakeLlm::start(move |_, _| fake_llm::text(&answer, 512)).await
    };
    let stack = Stack::start_with(
        &spool_tests::redis_url(),
        &[("SPOOL_WRITE_TIMEOUT_SECS", "1")],
    )
    .await;
    let alice = token("alice", "acme");
    // Queued (no worker yet): both clients follow the run from its start.
    let accepted = stack.enqueue(&alice, "a long answer").await;
    let thread = accepted["thread_id"].as_str().expect("thread");

    // A client that sends its request and never reads (a small receive window, so the
    // server's writes soon wait).
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("SO_RCVBUF");
    let addr = stack
        .base
        .trim_start_matches("http://")
        .parse()
        .expect("address");
    let mut stalled = socket.connect(addr).await.expect("connect");
    let request = format!(
        "GET /v1/threads/{thread}/stream HTTP/1.1\r\nHost: spool\r\n\
         Authorization: Bearer {alice}\r\n\r\n"
    );
    stalled
        .write_all(request.as_bytes())
        .await
        .expect("request");
    poll_until("the stalled client's stream to open", TIMEOUT, || async {
        (open_streams(&stack).await == Some(1.0)).then_some(())
    })
    .await;

    let mut reader = SseReader::new(stack.stream(&alice, &accepted["thread_id"], None).await);
    let _worker = stack
        .worker(&[("SPOOL_LLM_BASE_URL", fake.base_url.as_str())])
        .await;
    let mut text = String::new();
    loop {
        let frame = reader.next(TIMEOUT).await.expect("the reader's next event");
        if frame.event == "text_delta" {
            let data: Value = serde_json::from_str(&frame.data).expect("json");
            text.push_str(data["data"]["delta"].as_str().expect("delta"));
        }
        if frame.event == "done" {
            break;
        }
    }
    assert!(
        text == answer,
        "the reader got {} of {} bytes",
        text.len(),
        answer.len()
    );
    // The reader's stream has ended; the stalled one is closed by the server.
    poll_until("the stalled client to be let go", TIMEOUT, || async {
        (open_streams(&stack).await == Some(0.0)).then_some(())
    })
    .await;
    drop(stalled);
}

/// The takeover of a run: the step results in the stream (the latest step's, by call, across
/// batches; a retried batch counted once) come back to the new attempt, which raises the fence
/// in the same round trip (an older attempt is refused afterwards, and a stale takeover too);
/// the run's `done` forgets them.
#[tokio::test]
async fn a_takeover_reads_the_step_results_shown_and_fences_older_attempts() {
    let keys = StreamKeys::new(spool_tests::redis_prefix());
    let conn = spool_shared::redis_conn::connect(&spool_tests::redis_url()).expect("redis");
    let origin = Origin {
        thread_id: ThreadId::new(),
        workflow_id: WorkflowId::new(),
        message_id: MessageId::new(),
        attempt: 1,
        depth: 0,
    };
    let result = |step: u32, call: &str| {
        origin.event(StepResult {
            step,
            tool_call_id: call.to_owned(),
            tool_name: "t".to_owned(),
            output: "ok".to_owned(),
            is_error: false,
        })
    };
    let call = |step: u32, call: &str| {
        origin.event(StepCall {
            step,
            tool_call_id: call.to_owned(),
            tool_name: "t".to_owned(),
            arguments: json!({}),
        })
    };
    let publish = |id: &'static str, attempt: i32, events: Vec<spool_shared::event::Event>| {
        let keys = keys.clone();
        let mut conn = conn.clone();
        async move {
            let batch = stream::Batch {
                thread: origin.thread_id,
                workflow: origin.workflow_id,
                attempt,
                id,
                previous: None,
                events: &events,
            };
            stream::publish(&mut conn, &keys, &batch, Duration::from_secs(60)).await
        }
    };
    let takeover = |attempt: i32| {
        let keys = keys.clone();
        let mut conn = conn.clone();
        async move {
            stream::takeover(
                &mut conn,
                &keys,
                origin.thread_id,
                origin.workflow_id,
                attempt,
            )
            .await
        }
    };
    let shown = |step: u64, calls: &[&str]| stream::Shown {
        step,
        calls: calls.iter().map(|c| (*c).to_owned()).collect(),
    };

    assert_eq!(takeover(1).await.expect("nothing yet"), shown(0, &[]));
    publish("b1", 1, vec![call(1, "a"), result(1, "a")])
        .await
        .expect("b1");
    publish("b2", 1, vec![call(2, "b"), call(2, "c"), result(2, "c")])
        .await
        .expect("b2");
    // A retry of a stored batch changes nothing; calls are not results.
    publish("b2", 1, vec![call(2, "b"), call(2, "c"), result(2, "c")])
        .await
        .expect("b2 again");
    publish("b3", 1, vec![result(2, "b")]).await.expect("b3");
    assert_eq!(takeover(2).await.expect("attempt 2"), shown(2, &["c", "b"]));
    assert!(matches!(
        publish("b4", 1, vec![result(3, "d")]).await,
        Err(PublishError::Fenced { current: 2 })
    ));
    assert!(matches!(
        takeover(1).await,
        Err(PublishError::Fenced { current: 2 })
    ));
    assert_eq!(
        takeover(2).await.expect("the same attempt again"),
        shown(2, &["c", "b"])
    );
    let done = origin.event(sample(EventType::Done));
    let done = spool_shared::event::Event { attempt: 2, ..done };
    publish("b5", 2, vec![done]).await.expect("done");
    assert_eq!(takeover(3).await.expect("after done"), shown(0, &[]));
}

/// An event of type `kind` as these tests publish it (a start, a delta, a completed done).
fn sample(kind: EventType) -> Data {
    match kind {
        EventType::MessageStart => MessageStart::new(None).into(),
        EventType::Done => Done {
            status: RunStatus::Completed,
        }
        .into(),
        EventType::TextDelta => TextDelta {
            block_id: BlockId::of_step(0),
            delta: "x".to_owned(),
        }
        .into(),
        other => panic!("no sample of {other:?}"),
    }
}

/// Review B-M3: a client that takes what the API writes, but too slowly for the write timeout
/// to notice (a few hundred bytes at a time), is disconnected once a window shows it under
/// `SPOOL_MIN_DRAIN_BYTES_PER_SEC`; a client that reads at once gets everything.
#[tokio::test]
async fn a_client_that_drains_under_the_minimum_rate_is_disconnected() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    let stack = Stack::start_with(
        &spool_tests::redis_url(),
        &[("SPOOL_MIN_DRAIN_BYTES_PER_SEC", "50000")],
    )
    .await;
    let addr: std::net::SocketAddr = stack
        .base
        .trim_start_matches("http://")
        .parse()
        .expect("addr");
    // An answer larger than the kernel's socket buffers hold (up to 4 MB on Linux), so that
    // the API itself holds what the client has not taken: 80 agents of 60 KB each.
    for i in 0..80 {
        let instructions = "x".repeat(60_000);
        stack
            .create_agent(&json!({"name": format!("big{i}"), "model": "demo",
                "instructions": instructions}))
            .await;
    }
    let request = format!(
        "GET /v1/agents HTTP/1.1\r\nHost: spool\r\nAuthorization: Bearer {}\r\n\
         Connection: close\r\n\r\n",
        token("alice", "acme")
    );
    // A small receive buffer, so the API's writes wait on this client soon.
    let connect = || async {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.set_recv_buffer_size(4096).expect("rcvbuf");
        let mut conn = socket.connect(addr).await.expect("connect");
        conn.write_all(request.as_bytes()).await.expect("request");
        conn
    };
    // Read at once: the whole list (some 4.8 MB), then the close.
    let mut fast = connect().await;
    let mut whole = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), fast.read_to_end(&mut whole))
        .await
        .expect("the document in time")
        .expect("read");
    assert!(whole.len() > 4_500_000, "{} bytes", whole.len());
    let drops = || async {
        let text = reqwest::get(format!("{}/metrics", stack.base))
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        let line = text
            .lines()
            .find(|l| l.starts_with("spool_http_slow_client_drops_total"))?;
        line.split_whitespace().last()?.parse::<f64>().ok()
    };
    assert_eq!(
        drops().await.unwrap_or(0.0),
        0.0,
        "the fast client was not dropped"
    );
    // About 2.5 KB a second, a twentieth of the minimum. The API closes its side once a window
    // shows it (the kernel still delivers what it had buffered, so the client cannot tell yet).
    let mut slow = connect().await;
    let reader = tokio::spawn(async move {
        let mut chunk = [0; 256];
        while let Ok(1..) = slow.read(&mut chunk).await {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    poll_until(
        "the slow client to be dropped",
        Duration::from_secs(40),
        || async { drops().await.filter(|n| *n >= 1.0) },
    )
    .await;
    reader.abort();
}
