//! Workers die, hang and are told to stop mid-run; the run still completes exactly once.

use std::time::Instant;

use spool_tests::{poll_until, run_row, token};

use crate::stack::{Stack, TIMEOUT, demo_reply, workflow_id};

/// A run of 40 deltas, 100 ms apart: long enough to interrupt.
const SLOW: [(&str, &str); 2] = [("SPOOL_DEMO_TOKENS", "40"), ("SPOOL_DEMO_DELAY_MS", "100")];

#[tokio::test]
async fn a_killed_worker_s_run_is_reclaimed_after_the_lease_and_completes_once() {
    let stack = Stack::start().await;
    let mut a = stack.worker(&SLOW).await;
    let accepted = stack
        .enqueue(&token("alice", "acme"), "survive a crash")
        .await;
    stack.wait_streaming(&accepted).await;
    a.kill9().await;
    let killed_at = Instant::now();
    let _b = stack.worker(&SLOW).await;
    let id = workflow_id(&accepted);
    poll_until("the run to be reclaimed", TIMEOUT, || async {
        run_row(&stack.db.pool, id).await.filter(|r| r.attempt == 2)
    })
    .await;
    let reclaim = killed_at.elapsed();
    println!(
        "reclaim after kill -9 took {:.2} s with a 3 s lease",
        reclaim.as_secs_f64()
    );
    let run = stack.wait_run(&accepted, "completed").await;
    assert_eq!((run.attempt, run.reclaims), (2, 1));
    let messages = stack.messages(&accepted).await;
    assert_eq!(messages.len(), 2, "exactly one assistant message");
    assert_eq!(messages[1].1, "completed");
    assert_eq!(messages[1].2, demo_reply("survive a crash", 40));
}

#[tokio::test]
async fn a_stopped_worker_that_wakes_after_the_takeover_changes_nothing() {
    let stack = Stack::start().await;
    let a = stack.worker(&SLOW).await;
    let accepted = stack.enqueue(&token("alice", "acme"), "stale writer").await;
    stack.wait_streaming(&accepted).await;
    a.signal("STOP");
    let b = stack
        .worker(&[("SPOOL_DEMO_TOKENS", "3"), ("SPOOL_DEMO_DELAY_MS", "0")])
        .await;
    let done = stack.wait_run(&accepted, "completed").await;
    assert_eq!(done.attempt, 2);
    let message_before = stack.messages(&accepted).await;
    assert_eq!(message_before[1].2, demo_reply("stale writer", 3));

    a.signal("CONT");
    poll_until(
        "the stale worker to notice it lost the lease",
        TIMEOUT,
        || async { a.output().contains("LeaseLost").then_some(()) },
    )
    .await;
    let after = run_row(&stack.db.pool, workflow_id(&accepted))
        .await
        .expect("run");
    assert_eq!(
        after.updated_at, done.updated_at,
        "the stale worker wrote to the run"
    );
    assert_eq!((after.status.as_str(), after.attempt), ("completed", 2));
    assert_eq!(after.lease_owner, done.lease_owner);
    assert_eq!(stack.messages(&accepted).await, message_before);
    // Nor did it publish: after the new attempt's first event, every event is the new attempt's.
    let stored = stack.stored(&accepted["thread_id"]).await;
    let takeover = stored
        .iter()
        .position(|(_, e)| e["attempt"] == 2)
        .expect("attempt 2 events");
    assert!(stored[takeover..].iter().all(|(_, e)| e["attempt"] == 2));
    assert_eq!(
        stored.last().map(|(_, e)| e["type"].clone()),
        Some("done".into())
    );
    drop(b);
}

#[tokio::test]
async fn sigterm_lets_a_short_run_finish_and_exits_0() {
    let stack = Stack::start().await;
    let mut a = stack
        .worker(&[
            ("SPOOL_DEMO_TOKENS", "10"),
            ("SPOOL_DEMO_DELAY_MS", "100"),
            ("SPOOL_SHUTDOWN_GRACE_SECS", "15"),
        ])
        .await;
    let accepted = stack.enqueue(&token("alice", "acme"), "finish me").await;
    stack.wait_streaming(&accepted).await;
    a.signal("TERM");
    assert_eq!(a.wait(TIMEOUT).await, Some(0));
    let run = run_row(&stack.db.pool, workflow_id(&accepted))
        .await
        .expect("run");
    assert_eq!((run.status.as_str(), run.attempt), ("completed", 1));
}

#[tokio::test]
async fn sigterm_releases_a_long_run_without_burning_an_attempt() {
    let stack = Stack::start().await;
    let mut a = stack
        .worker(&[
            ("SPOOL_DEMO_TOKENS", "200"),
            ("SPOOL_DEMO_DELAY_MS", "100"),
            ("SPOOL_SHUTDOWN_GRACE_SECS", "0.2"),
        ])
        .await;
    let accepted = stack.enqueue(&token("alice", "acme"), "hand me over").await;
    stack.wait_streaming(&accepted).await;
    a.signal("TERM");
    assert_eq!(a.wait(TIMEOUT).await, Some(0));
    let released = run_row(&stack.db.pool, workflow_id(&accepted))
        .await
        .expect("run");
    assert_eq!(
        (
            released.status.as_str(),
            released.attempt,
            released.reclaims
        ),
        ("queued", 1, 0)
    );

    let _b = stack
        .worker(&[("SPOOL_DEMO_TOKENS", "3"), ("SPOOL_DEMO_DELAY_MS", "0")])
        .await;
    let run = stack.wait_run(&accepted, "completed").await;
    assert_eq!(
        (run.attempt, run.reclaims),
        (2, 0),
        "the release was not counted as a crash"
    );
}

#[tokio::test]
async fn a_run_that_keeps_killing_its_workers_fails_after_the_cap() {
    let stack = Stack::start().await;
    let capped = [SLOW[0], SLOW[1], ("SPOOL_MAX_RECLAIMS", "1")];
    let accepted = stack.enqueue(&token("alice", "acme"), "poison").await;
    for crash in 1..=2 {
        let mut worker = stack.worker(&capped).await;
        let id = workflow_id(&accepted);
        poll_until("the run to be claimed", TIMEOUT, || async {
            run_row(&stack.db.pool, id)
                .await
                .filter(|r| r.attempt == crash)
        })
        .await;
        stack.wait_streaming(&accepted).await;
        worker.kill9().await;
    }
    let _last = stack.worker(&capped).await;
    let run = stack.wait_run(&accepted, "failed").await;
    assert_eq!((run.attempt, run.reclaims), (3, 2));
    let error = run.error.expect("an error");
    assert_eq!(error["code"], "too_many_attempts");
    let messages = stack.messages(&accepted).await;
    assert_eq!(messages[1].1, "failed");
}

#[tokio::test]
async fn a_webhook_delivery_cut_short_by_kill_9_is_made_by_another_worker() {
    use spool_tests::webhooks::{Receiver, Reply};
    // The first try hangs at the receiver, and its worker is killed while it waits.
    let (receiver, url) = Receiver::start(&[Reply::Hang]).await;
    let loopback = ("SPOOL_TOOLS_ALLOW_NETWORKS", "127.0.0.0/8");
    let stack = Stack::start_with(&spool_tests::redis_url(), &[loopback]).await;
    let admin = spool_tests::token_with("root", "acme", true, 3600, spool_tests::JWT_SECRET);
    let (status, hook) = stack
        .post(
            &admin,
            "/v1/webhooks",
            &serde_json::json!({"url": url, "events": ["run.completed"]}),
        )
        .await;
    assert_eq!(status, reqwest::StatusCode::CREATED, "{hook}");
    let secret = hook["secret"].as_str().expect("secret").to_owned();
    let mut a = stack.worker(&[loopback]).await;
    let accepted = stack
        .enqueue(&token("alice", "acme"), "tell my backend")
        .await;
    poll_until("the first try to reach the receiver", TIMEOUT, || async {
        (!receiver.received().is_empty()).then_some(())
    })
    .await;
    a.kill9().await;
    stack.wait_run(&accepted, "completed").await;

    let _b = stack.worker(&[loopback]).await;
    let received = poll_until("the delivery by the other worker", TIMEOUT, || async {
        let received = receiver.received();
        (received.len() >= 2).then_some(received)
    })
    .await;
    assert_eq!(
        received[0].id, received[1].id,
        "the same delivery, tried again"
    );
    assert!(received[1].verify(&secret));
    assert_eq!(
        received[1].json()["data"]["workflow_id"],
        accepted["workflow_id"]
    );
    // The receiver has it; the worker records the outcome once the answer reaches it.
    let attempts = poll_until("the delivery to be recorded", TIMEOUT, || async {
        let row: Option<(i32,)> = sqlx::query_as(
            "SELECT attempts FROM webhook_deliveries WHERE delivered_at IS NOT NULL",
        )
        .fetch_optional(&stack.db.pool)
        .await
        .expect("the delivery");
        row.map(|(attempts,)| attempts)
    })
    .await;
    assert_eq!(attempts, 2, "the killed worker's try counts");
}
