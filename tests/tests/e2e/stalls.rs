//! No tenant's action stalls another's runs (DESIGN section 15, review B-H1): a worker holding
//! several tenants' runs keeps every lease while one tenant's big thread is erased under it, and
//! an erasure that cannot take its locks in time gives up whole with a 503 to retry.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use spool_tests::{poll_until, token};

use crate::stack::{Stack, TIMEOUT, workflow_id};

/// Posts `text` to thread `thread` as `user` of `tenant`; returns the 202 body.
async fn post(stack: &Stack, tenant: &str, thread: uuid::Uuid, text: &str) -> Value {
    let path = format!("/v1/threads/{thread}/user_message");
    let body = json!({"input_text": text});
    let (status, accepted) = stack.post(&token("u", tenant), &path, &body).await;
    assert_eq!(status, reqwest::StatusCode::ACCEPTED, "{accepted}");
    accepted
}

/// Adds `count` earlier turns (a user and an assistant message each) to a thread, in one
/// statement through the real schema: a thread with months of history.
async fn history(stack: &Stack, thread: uuid::Uuid, count: i32) {
    sqlx::query(
        "INSERT INTO messages (id, thread_id, role, status, content)
         SELECT gen_random_uuid(), $1, CASE WHEN n % 2 = 0 THEN 'user' ELSE 'assistant' END,
                'completed', repeat('earlier turn ', 20)
           FROM generate_series(1, 2 * $2) n",
    )
    .bind(thread)
    .bind(count)
    .execute(&stack.db.pool)
    .await
    .expect("history");
}

/// Waits until every run is running, held by one worker; returns that worker's name.
async fn all_running(stack: &Stack, runs: &[uuid::Uuid]) -> String {
    poll_until("every run to be running", TIMEOUT, || async {
        let rows: Vec<(String, Option<String>)> =
            sqlx::query_as("SELECT status, lease_owner FROM runs WHERE id = ANY($1)")
                .bind(runs)
                .fetch_all(&stack.db.pool)
                .await
                .ok()?;
        let owner = rows.first()?.1.clone()?;
        (rows.len() == runs.len()
            && rows
                .iter()
                .all(|(status, o)| status == "running" && o.as_ref() == Some(&owner)))
        .then_some(owner)
    })
    .await
}

#[tokio::test]
async fn erasing_a_big_thread_under_a_worker_takes_no_other_tenant_s_run_off_it() {
    let stack = Stack::start().await;
    // Each deleted message of the erased thread costs 10 ms, as the foreign-key checks of a
    // large `runs` table did (review B-H1): 800 messages hold the erasure's locks for about
    // 8 s, well past the worker's 3 s lease.
    sqlx::raw_sql(
        "CREATE FUNCTION slow_delete() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN PERFORM pg_sleep(0.01); RETURN OLD; END $$;
         CREATE TRIGGER slow_delete BEFORE DELETE ON messages FOR EACH ROW
           EXECUTE FUNCTION slow_delete();",
    )
    .execute(&stack.db.pool)
    .await
    .expect("trigger");
    // Runs of about 20 s (200 deltas, 100 ms apart): all still running after the erasure.
    let worker = stack
        .worker(&[("SPOOL_DEMO_TOKENS", "200"), ("SPOOL_DEMO_DELAY_MS", "100")])
        .await;
    let big = uuid::Uuid::new_v4();
    let erased = post(&stack, "big", big, "the thread to erase").await;
    let mut others = Vec::new();
    for tenant in ["t1", "t2", "t3", "t4", "t5"] {
        others.push(post(&stack, tenant, uuid::Uuid::new_v4(), tenant).await);
    }
    let mut ids: Vec<uuid::Uuid> = others.iter().map(workflow_id).collect();
    ids.push(workflow_id(&erased));
    all_running(&stack, &ids).await;
    history(&stack, big, 400).await;

    let started = Instant::now();
    let response = stack
        .http
        .delete(format!("{}/v1/threads/{big}", stack.base))
        .bearer_auth(token("u", "big"))
        .send()
        .await
        .expect("delete");
    let took = started.elapsed();
    assert_eq!(response.status(), reqwest::StatusCode::NO_CONTENT);
    assert!(
        took > Duration::from_secs(4),
        "the erasure held its locks past the lease: {took:?}"
    );
    let (left,): (i64,) = sqlx::query_as("SELECT count(*) FROM messages WHERE thread_id = $1")
        .bind(big)
        .fetch_one(&stack.db.pool)
        .await
        .expect("count");
    assert_eq!(left, 0, "the thread is erased");

    for accepted in &others {
        let run = stack.wait_run(accepted, "completed").await;
        assert_eq!(
            (run.attempt, run.reclaims),
            (1, 0),
            "never taken off its worker: {run:?}"
        );
    }
    let log = worker.output();
    for lost in ["lease lost", "lease may have expired"] {
        // The erased run's own lease is lost once its row is gone; no other run's is.
        let runs_lost = log.lines().filter(|l| l.contains(lost)).count();
        assert!(
            runs_lost <= 1
                && log
                    .lines()
                    .filter(|l| l.contains(lost))
                    .all(|l| l.contains(&workflow_id(&erased).to_string())),
            "only the erased run may lose its lease:\n{log}"
        );
    }
}

#[tokio::test]
async fn an_erasure_that_cannot_take_its_locks_in_time_is_a_503_to_retry_and_erases_nothing() {
    let stack = Stack::start().await;
    // A long lease: the erasure holds the run's row while it waits, and this test is about
    // the answer, not the lease.
    let worker = stack
        .worker(&[
            ("SPOOL_DEMO_TOKENS", "200"),
            ("SPOOL_DEMO_DELAY_MS", "100"),
            ("SPOOL_LEASE_SECS", "10"),
            ("SPOOL_HEARTBEAT_SECS", "1"),
        ])
        .await;
    let thread = uuid::Uuid::new_v4();
    let accepted = post(&stack, "acme", thread, "hello").await;
    all_running(&stack, &[workflow_id(&accepted)]).await;
    let count = async || -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM messages WHERE thread_id = $1")
            .bind(thread)
            .fetch_one(&stack.db.pool)
            .await
            .expect("count")
    };
    let before = count().await;
    // A concurrent writer holds one of the thread's messages locked, and keeps it.
    let mut writer = stack.db.pool.begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM messages WHERE thread_id = $1 AND role = 'user' FOR UPDATE")
        .bind(thread)
        .execute(&mut *writer)
        .await
        .expect("lock");

    let delete = || {
        stack
            .http
            .delete(format!("{}/v1/threads/{thread}", stack.base))
            .bearer_auth(token("u", "acme"))
            .timeout(Duration::from_secs(30))
            .send()
    };
    let started = Instant::now();
    let response = delete().await.expect("delete");
    let took = started.elapsed();
    assert_eq!(response.status(), reqwest::StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["error"]["code"], "erasure_timed_out", "{body}");
    // Its own lock timeout (2 s), not the pool's (10 s).
    assert!(took < Duration::from_secs(6), "answered in {took:?}");
    // Nothing erased: the messages, the run (still running on its worker) and the thread.
    assert_eq!(count().await, before);
    let (status, thread_body) = stack
        .get_with(&token("u", "acme"), &format!("/v1/threads/{thread}"))
        .await;
    assert_eq!(status, reqwest::StatusCode::OK, "{thread_body}");
    let run = spool_tests::run_row(&stack.db.pool, workflow_id(&accepted))
        .await
        .expect("the run is kept");
    assert_eq!(run.status, "running");

    // The writer lets go: the retry erases it all.
    writer.rollback().await.expect("rollback");
    assert_eq!(
        delete().await.expect("delete").status(),
        reqwest::StatusCode::NO_CONTENT
    );
    assert_eq!(count().await, 0);
    assert!(
        !worker.output().contains("lease may have expired"),
        "{}",
        worker.output()
    );
}
