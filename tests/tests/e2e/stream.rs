//! The stream across process failures: a worker killed mid-stream, a stale worker fenced by
//! Redis, hundreds of clients resuming at random, and a Redis outage.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use spool_shared::event::{EventType, Origin};
use spool_shared::stream::{self, PublishError, StreamKeys};
use spool_shared::{MessageId, ThreadId, WorkflowId};
use spool_tests::fake_llm::{self, FakeLlm, tool_results_in};
use spool_tests::sse::{Frame, SseReader};
use spool_tests::{poll_until, token};

use crate::stack::{Stack, TIMEOUT, connections_to_port, demo_reply, workflow_id};

const READ: Duration = Duration::from_secs(15);

/// The text a client shows: deltas since the last `message_start` or `attempt_restarted`.
fn shown_text(frames: &[Frame]) -> String {
    let mut text = String::new();
    for frame in frames {
        match frame.event.as_str() {
            "message_start" | "attempt_restarted" => text.clear(),
            "text_delta" => text.push_str(frame.json()["data"]["delta"].as_str().unwrap_or("")),
            _ => {}
        }
    }
    text
}

#[tokio::test]
async fn a_client_sees_attempt_restarted_then_the_whole_message_when_its_worker_is_killed() {
    let stack = Stack::start().await;
    let slow = [("SPOOL_DEMO_TOKENS", "40"), ("SPOOL_DEMO_DELAY_MS", "100")];
    let mut a = stack.worker(&slow).await;
    let alice = token("alice", "acme");
    let accepted = stack.enqueue(&alice, "crash mid-stream").await;
    let mut reader = SseReader::new(stack.stream(&alice, &accepted["thread_id"], None).await);
    let mut frames = Vec::new();
    while frames
        .iter()
        .filter(|f: &&Frame| f.event == "text_delta")
        .count()
        < 5
    {
        frames.push(reader.next(READ).await.expect("an event before the crash"));
    }
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
    // Step 1 asks the client for a file; step 2 answers slowly (40 deltas, 100 ms apart).
    let fake = FakeLlm::start(|request, _| match tool_results_in(request) {
        0 => fake_llm::tool_calls(&[("c1", "read_file", r#"{"path": "/notes"}"#)]),
        _ => fake_llm::paced_text(&"word ".repeat(40), 40, Duration::from_millis(100)),
    })
    .await;
    let stack = Stack::start().await;
    let llm = [("SPOOL_LLM_BASE_URL", fake.base_url.as_str())];
    let mut a = stack.worker(&llm).await;
    let agent = stack
        .create_agent(&json!({"name": "reader", "model": "gpt-4o-mini",
            "tools": [{"type": "client", "name": "read_file"}]}))
        .await;
    let alice = token("alice", "acme");
    let thread = uuid::Uuid::new_v4();
    let (_, accepted) = stack
        .post(
            &alice,
            &format!("/v1/threads/{thread}/user_message"),
            &json!({"input_text": "read my notes", "agent_id": agent}),
        )
        .await;
    stack.wait_run(&accepted, "requires_action").await;
    let workflow = workflow_id(&accepted);
    let (status, _) = stack
        .post(
            &alice,
            &format!("/v1/workflows/{workflow}/tool_outputs"),
            &json!({"tool_outputs": [{"tool_call_id": "c1", "output": "the notes"}]}),
        )
        .await;
    assert_eq!(status, reqwest::StatusCode::ACCEPTED);

    // The client follows the answer after the pause; the resumed attempt dies mid-answer.
    let mut reader = SseReader::new(stack.stream(&alice, &accepted["thread_id"], None).await);
    let mut frames = Vec::new();
    while frames
        .iter()
        .filter(|f: &&Frame| f.event == "text_delta")
        .count()
        < 5
    {
        frames.push(reader.next(READ).await.expect("an event before the crash"));
    }
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
    let mut conn = stream::connect(&spool_tests::redis_url()).expect("redis");
    let origin = |attempt| Origin {
        thread_id: ThreadId(uuid::Uuid::nil()),
        workflow_id: WorkflowId(uuid::Uuid::max()),
        message_id: MessageId(uuid::Uuid::max()),
        attempt,
    };
    let publish = |attempt: i32| {
        let event = origin(attempt).event(
            EventType::TextDelta,
            json!({"block_id": "b0", "delta": "x"}),
        );
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
                events: &events,
            };
            stream::publish(&mut conn, &keys, &batch, Duration::from_secs(60)).await
        }
    };
    publish(1).await.expect("attempt 1 publishes");
    publish(2).await.expect("attempt 2 takes over");
    match publish(1).await {
        Err(PublishError::Fenced { current }) => assert_eq!(current, 2),
        other => panic!("a stale attempt must be refused, got {other:?}"),
    }
    publish(2).await.expect("the current attempt goes on");
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
    assert_eq!(attempts, [1, 2, 2]);
}

#[tokio::test]
async fn a_batch_sent_again_after_a_lost_reply_is_stored_once() {
    let keys = StreamKeys::new(spool_tests::redis_prefix());
    let mut conn = stream::connect(&spool_tests::redis_url()).expect("redis");
    let origin = Origin {
        thread_id: ThreadId::new(),
        workflow_id: WorkflowId::new(),
        message_id: MessageId::new(),
        attempt: 1,
    };
    let delta = |text: &str| {
        origin.event(
            EventType::TextDelta,
            json!({"block_id": "b0", "delta": text}),
        )
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
                events: &events,
            };
            stream::publish(&mut conn, &keys, &batch, Duration::from_secs(60))
                .await
                .expect("publish")
        }
    };
    let first = vec![delta("Hel"), delta("lo")];
    assert_eq!(publish("b1".into(), first.clone()).await.len(), 2);
    // The reply was lost (a timeout, a reset, a failover): the publisher sends the batch again.
    assert!(publish("b1".into(), first.clone()).await.is_empty());
    assert_eq!(publish("b2".into(), vec![delta(", world")]).await.len(), 1);
    // Even after many later batches, a late repeat of a recent one is recognised.
    for n in 3..12 {
        publish(format!("b{n}"), vec![delta("!")]).await;
    }
    assert!(
        publish("b2".into(), vec![delta(", world")])
            .await
            .is_empty()
    );
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

#[tokio::test]
async fn five_hundred_clients_resuming_at_random_each_get_every_event_once_in_order() {
    let stack = Stack::start().await;
    let alice = token("alice", "acme");
    let mut runs = Vec::new();
    for i in 0..20 {
        runs.push(stack.enqueue(&alice, &format!("thread {i}")).await);
    }
    // The worker starts once every client is connected, so each sees its run from the start.
    let connected = std::sync::atomic::AtomicUsize::new(0);
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let sampler = {
        let peak = peak.clone();
        let pid = stack.api_pid;
        tokio::spawn(async move {
            loop {
                let now = connections_to_port(pid, 6379);
                peak.fetch_max(now, std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let clients = (0..500).map(|i| {
        let thread = runs[i % 20]["thread_id"].clone();
        let stack = &stack;
        let alice = alice.clone();
        let connected = &connected;
        async move {
            // A small LCG: each client disconnects after its own pseudo-random counts.
            let mut seed = (i as u64)
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let mut next = move || {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                (seed >> 33) % 12 + 1
            };
            let mut got: Vec<Frame> = Vec::new();
            let mut reconnects = 0;
            loop {
                let cursor = got.last().and_then(|f| f.id.clone());
                let response = stack.stream(&alice, &thread, cursor.as_deref()).await;
                assert_eq!(response.status(), reqwest::StatusCode::OK);
                if reconnects == 0 {
                    connected.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                let mut reader = SseReader::new(response);
                let budget = next();
                let mut read = 0;
                while let Some(frame) = reader.next(READ).await {
                    got.push(frame);
                    read += 1;
                    if got.last().is_some_and(|f| f.event == "done")
                        || (reconnects < 6 && read == budget)
                    {
                        break;
                    }
                }
                if got.last().is_some_and(|f| f.event == "done") {
                    return (thread, got, reconnects);
                }
                reconnects += 1;
                assert!(reconnects < 200, "client {i} never finished");
            }
        }
    });
    let (results, _worker) = tokio::join!(futures::future::join_all(clients), async {
        poll_until("500 clients to connect", TIMEOUT, || async {
            (connected.load(std::sync::atomic::Ordering::Relaxed) == 500).then_some(())
        })
        .await;
        stack
            .worker(&[
                ("SPOOL_DEMO_TOKENS", "60"),
                ("SPOOL_DEMO_DELAY_MS", "25"),
                ("SPOOL_WORKER_CONCURRENCY", "20"),
            ])
            .await
    });
    sampler.abort();
    let mut total_reconnects = 0;
    for (thread, frames, reconnects) in &results {
        total_reconnects += reconnects;
        let stored = stack.stored(thread).await;
        let start = stored
            .iter()
            .position(|(_, e)| e["type"] == "message_start")
            .expect("start");
        let expected: Vec<&String> = stored[start..].iter().map(|(id, _)| id).collect();
        let received: Vec<&String> = frames.iter().filter_map(|f| f.id.as_ref()).collect();
        assert_eq!(received, expected, "every event exactly once, in order");
    }
    let peak = peak.load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "500 clients, {total_reconnects} reconnects; the API held at most {peak} Redis connections"
    );
    assert!(total_reconnects > 500, "the clients did resume");
    assert!(
        peak <= 4,
        "Redis connections must not grow with clients: {peak}"
    );
}

/// A Redis server of its own, which the test may kill and restart on the same port.
struct OwnRedis {
    port: u16,
    child: Option<std::process::Child>,
}

impl OwnRedis {
    fn start(port: u16) -> Self {
        let child = std::process::Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server");
        Self {
            port,
            child: Some(child),
        }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.kill();
    }
}

#[tokio::test]
async fn during_a_redis_outage_runs_complete_the_gateway_answers_503_and_recovers() {
    // Below the kernel's ephemeral range (32768 and up), so no client socket of a test running
    // alongside can take the port between this check and redis-server binding it.
    let start = 20_000 + u16::try_from(std::process::id() % 5_000).unwrap_or(0);
    let port = (start..start + 2_000)
        .find(|port| std::net::TcpListener::bind(("127.0.0.1", *port)).is_ok())
        .expect("a free port below the ephemeral range");
    let mut redis = OwnRedis::start(port);
    let url = format!("redis://127.0.0.1:{port}");
    poll_until("the private Redis to answer", TIMEOUT, || async {
        let client = redis::Client::open(url.as_str()).ok()?;
        let mut conn = client.get_multiplexed_async_connection().await.ok()?;
        redis::cmd("PING")
            .query_async::<String>(&mut conn)
            .await
            .ok()
    })
    .await;
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

    let _redis = OwnRedis::start(redis.port);
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
}
