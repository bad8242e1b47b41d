//! A reconnect storm: a thousand clients follow forty runs on one API process, each
//! dropping its connection after a pseudo-random number of events and resuming with
//! `Last-Event-ID`, six times, then to the end. Every client must get every event of its run
//! exactly once and in order (0 gaps, 0 duplicates), and the API's Redis connections must not
//! grow with clients.

use std::time::{Duration, Instant};

use spool_tests::process::connections_to_port;
use spool_tests::sse::{Frame, SseReader};
use spool_tests::{poll_until, token};

use crate::SERIAL;
use crate::stack::{Stack, TIMEOUT};

const CLIENTS: usize = 1_000;
const THREADS: usize = 40;
const READ: Duration = Duration::from_secs(15);

#[tokio::test]
async fn a_thousand_clients_resuming_at_random_each_get_every_event_once_in_order() {
    let _turn = SERIAL.lock().await;
    // A user per thread, 25 clients each: more than SPOOL_SSE_MAX_STREAMS_PER_USER's default
    // (20), which a thousand clients of one process is the case for raising. Twice that: a
    // client that drops its connection and resumes at once may hold its new slot before the
    // server has noticed the old connection is gone.
    let stack = Stack::start_with(
        &spool_tests::redis_url(),
        &[("SPOOL_SSE_MAX_STREAMS_PER_USER", "50")],
    )
    .await;
    let started = Instant::now();
    let users: Vec<String> = (0..THREADS)
        .map(|i| token(&format!("user{i}"), "acme"))
        .collect();
    let mut runs = Vec::new();
    for (i, user) in users.iter().enumerate() {
        runs.push(stack.enqueue(user, &format!("thread {i}")).await);
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
    let clients = (0..CLIENTS).map(|i| {
        let thread = runs[i % THREADS]["thread_id"].clone();
        let stack = &stack;
        let user = users[i % THREADS].clone();
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
                let response = stack.stream(&user, &thread, cursor.as_deref()).await;
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
        poll_until("every client to connect", TIMEOUT, || async {
            (connected.load(std::sync::atomic::Ordering::Relaxed) == CLIENTS).then_some(())
        })
        .await;
        stack
            .worker(&[
                ("SPOOL_DEMO_TOKENS", "60"),
                ("SPOOL_DEMO_DELAY_MS", "25"),
                ("SPOOL_WORKER_CONCURRENCY", "40"),
            ])
            .await
    });
    sampler.abort();
    let mut total_reconnects = 0;
    let mut events = 0;
    for (thread, frames, reconnects) in &results {
        total_reconnects += reconnects;
        events += frames.len();
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
        "reconnect storm: {CLIENTS} clients on {THREADS} threads, {total_reconnects} reconnects, {events} events received, 0 gaps, 0 duplicates; the API held at most {peak} Redis connections; {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(total_reconnects > CLIENTS, "the clients did resume");
    assert!(
        peak <= 4,
        "Redis connections must not grow with clients: {peak}"
    );
}
