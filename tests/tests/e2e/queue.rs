//! The queue as worker processes drive it: leases from the database clock, exclusive claims,
//! the worker's own port, and a pool that survives dropped connections. The statements
//! themselves (claims, fencing on the attempt, terminal states) are tested beside their SQL,
//! in `shared/src/db/runs.rs`.

use std::time::Duration;

use spool_tests::{poll_until, token};

use crate::stack::{Stack, TIMEOUT};

#[tokio::test]
async fn every_lease_a_worker_writes_is_the_database_s_now_plus_the_lease() {
    let stack = Stack::start().await;
    let pool = &stack.db.pool;
    // Record, in the same transaction as every write of a lease, the database's own now().
    // A lease the worker computed (its clock plus the lease, bound as a value) could not equal
    // that transaction time plus the lease to the microsecond.
    sqlx::raw_sql(
        "CREATE TABLE lease_audit (attempt int, db_now timestamptz, expires timestamptz);
         CREATE FUNCTION audit_lease() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           INSERT INTO lease_audit VALUES (NEW.attempt, now(), NEW.lease_expires_at);
           RETURN NEW;
         END $$;
         CREATE TRIGGER audit_lease AFTER UPDATE OF lease_expires_at ON runs FOR EACH ROW
           WHEN (NEW.lease_expires_at IS NOT NULL) EXECUTE FUNCTION audit_lease();",
    )
    .execute(pool)
    .await
    .expect("audit trigger");
    // A worker with a lease of 3 s renewed every 0.5 s, on a run of about 2 s.
    let _worker = stack
        .worker(&[("SPOOL_DEMO_TOKENS", "10"), ("SPOOL_DEMO_DELAY_MS", "200")])
        .await;
    let accepted = stack.enqueue(&token("alice", "acme"), "lease me").await;
    stack.wait_run(&accepted, "completed").await;

    let audit: Vec<(i32, i64)> = sqlx::query_as(
        "SELECT attempt, (extract(epoch FROM expires - db_now) * 1e6)::bigint
           FROM lease_audit ORDER BY db_now",
    )
    .fetch_all(pool)
    .await
    .expect("audit");
    assert!(
        audit.len() >= 3,
        "a claim and at least two renewals: {audit:?}"
    );
    for (attempt, lease_us) in &audit {
        assert_eq!(
            (*attempt, *lease_us),
            (1, 3_000_000),
            "every lease is the database's now() plus 3 s: {audit:?}"
        );
    }
}

#[tokio::test]
async fn two_workers_complete_200_runs_each_claimed_once() {
    let stack = Stack::start().await;
    let settings = [
        ("SPOOL_DEMO_TOKENS", "3"),
        ("SPOOL_DEMO_DELAY_MS", "0"),
        ("SPOOL_WORKER_CONCURRENCY", "8"),
        // A long lease: this test is about exclusive claims, and a 2 s lease can truly expire
        // on a loaded 2-core machine (a reclaim would then be correct, and fail the count).
        ("SPOOL_LEASE_SECS", "10"),
        ("SPOOL_HEARTBEAT_SECS", "2"),
    ];
    let _a = stack.worker(&settings).await;
    let _b = stack.worker(&settings).await;
    let alice = token("alice", "acme");
    let mut accepted = Vec::new();
    for batch in 0..10 {
        let requests = (0..20).map(|i| {
            let alice = alice.clone();
            let stack = &stack;
            async move { stack.enqueue(&alice, &format!("run {batch}-{i}")).await }
        });
        accepted.extend(futures::future::join_all(requests).await);
    }
    let pool = &stack.db.pool;
    poll_until("200 runs to complete", Duration::from_secs(90), || async {
        let (done,): (i64,) =
            sqlx::query_as("SELECT count(*) FROM runs WHERE status = 'completed'")
                .fetch_one(pool)
                .await
                .ok()?;
        (done == 200).then_some(())
    })
    .await;
    let (max_attempt, reclaims, owners): (i32, i64, i64) =
        sqlx::query_as("SELECT max(attempt), sum(reclaims), count(DISTINCT lease_owner) FROM runs")
            .fetch_one(pool)
            .await
            .expect("stats");
    assert_eq!(max_attempt, 1, "no run was claimed twice");
    assert_eq!(reclaims, 0);
    assert_eq!(owners, 2, "both workers took part");
    let (assistant,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM messages WHERE role = 'assistant' AND status = 'completed'",
    )
    .fetch_one(pool)
    .await
    .expect("count");
    assert_eq!(assistant, 200);
    let content: (String,) = sqlx::query_as("SELECT content FROM messages WHERE id = $1")
        .bind(
            accepted[0]["message_id"]
                .as_str()
                .and_then(|s| s.parse::<uuid::Uuid>().ok())
                .expect("id"),
        )
        .fetch_one(pool)
        .await
        .expect("content");
    assert_eq!(content.0, crate::stack::demo_reply("run 0-0", 3));
}

#[tokio::test]
async fn a_worker_serves_metrics_and_health_on_its_own_port() {
    let stack = Stack::start().await;
    let worker = stack
        .worker(&[("SPOOL_DEMO_TOKENS", "2"), ("SPOOL_DEMO_DELAY_MS", "0")])
        .await;
    let addr = poll_until("the metrics port to be logged", TIMEOUT, || async {
        worker.logged("metrics and health listening", "addr")
    })
    .await;
    let accepted = stack.enqueue(&token("alice", "acme"), "measure me").await;
    stack.wait_run(&accepted, "completed").await;
    for path in ["/healthz", "/readyz"] {
        let response = stack
            .http
            .get(format!("http://{addr}{path}"))
            .send()
            .await
            .expect("ops");
        assert!(response.status().is_success(), "{path}");
    }
    let text = stack
        .http
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        text.contains(r#"spool_runs_finished_total{status="completed"} 1"#),
        "{text}"
    );
    assert!(text.contains("spool_queue_depth 0"), "{text}");
}

#[tokio::test]
async fn a_connection_postgres_dropped_while_idle_is_replaced_before_it_is_used() {
    // Check every checkout, so the test needs no idle wait; the default checks connections
    // idle for over a second, and skips the round trip for connections in steady use.
    let stack = Stack::start_with(
        &spool_tests::redis_url(),
        &[("SPOOL_DB_CHECK_IDLE_SECS", "0")],
    )
    .await;
    let alice = token("alice", "acme");
    stack.enqueue(&alice, "warm the pool").await;
    // What a Postgres restart or an idle-connection reaper does to the API's pool.
    let (killed,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid()) t",
    )
    .fetch_one(&stack.db.pool)
    .await
    .expect("terminate");
    assert!(killed >= 1, "the API had connections to drop");
    // Every request after it succeeds: no dead connection is handed to a query.
    for i in 0..5 {
        stack.enqueue(&alice, &format!("after the drop {i}")).await;
    }
}

#[tokio::test]
async fn workers_on_one_host_with_the_same_configuration_all_run_and_a_taken_set_port_is_an_error()
{
    let stack = Stack::start().await;
    // The documented configuration only: no metrics address, as an operator starts them.
    let documented: &[(&str, &str)] = &[];
    let a = stack.worker(documented).await;
    let b = stack.worker(documented).await;
    let mut addrs = Vec::new();
    for worker in [&a, &b] {
        let addr = poll_until("the metrics port to be logged", TIMEOUT, || async {
            worker.logged("metrics and health listening", "addr")
        })
        .await;
        let response = stack
            .http
            .get(format!("http://{addr}/healthz"))
            .send()
            .await
            .expect("ops");
        assert!(response.status().is_success(), "{addr}");
        addrs.push(addr);
    }
    assert_ne!(addrs[0], addrs[1], "each worker has a port of its own");
    // Both claim and finish runs.
    let alice = token("alice", "acme");
    for i in 0..6 {
        let accepted = stack.enqueue(&alice, &format!("two workers {i}")).await;
        stack.wait_run(&accepted, "completed").await;
    }

    // An operator who names an address that is taken is told so, and the worker exits.
    let mut c = stack.spawn_worker(&[("SPOOL_WORKER_METRICS_ADDR", addrs[0].as_str())]);
    let code = c.wait(TIMEOUT).await;
    assert!(matches!(code, Some(code) if code != 0), "exit {code:?}");
    let output = c.output();
    assert!(
        output.contains(&format!("binding the metrics port {}", addrs[0]))
            && output.contains("SPOOL_WORKER_METRICS_ADDR"),
        "{output}"
    );
}

#[tokio::test]
async fn a_worker_purges_idempotency_keys_past_their_24_hours_and_keeps_the_others() {
    let stack = Stack::start().await;
    let pool = &stack.db.pool;
    sqlx::raw_sql(
        "INSERT INTO idempotency_keys (tenant_id, key, request_hash, status_code, response, created_at)
         VALUES ('acme', 'old', 'h', 202, '{}', now() - interval '25 hours'),
                ('acme', 'fresh', 'h', 202, '{}', now() - interval '23 hours')",
    )
    .execute(pool)
    .await
    .expect("insert keys");
    let _worker = stack.worker(&[]).await;
    let left: Vec<String> = poll_until("the expired key to go", TIMEOUT, || async {
        let keys: Vec<String> = sqlx::query_scalar("SELECT key FROM idempotency_keys ORDER BY key")
            .fetch_all(pool)
            .await
            .ok()?;
        (!keys.contains(&"old".to_owned())).then_some(keys)
    })
    .await;
    assert_eq!(left, ["fresh"], "a key within its 24 hours stays");
}

/// Review M10: `--embedded-worker` runs its workers on a pool of their own, as a worker process
/// would, so runs never take the API's connections from its requests; `pg_stat_activity` tells
/// the two apart by `application_name`.
#[tokio::test]
async fn embedded_workers_use_a_pool_of_their_own_named_apart_from_the_api_s() {
    let stack = Stack::start_with(
        &spool_tests::redis_url(),
        &[("SPOOL_EMBEDDED_WORKERS", "1")],
    )
    .await;
    let accepted = stack.enqueue(&token("alice", "acme"), "hello").await;
    stack.wait_run(&accepted, "completed").await;
    let names: Vec<(String,)> = sqlx::query_as(
        "SELECT DISTINCT application_name FROM pg_stat_activity
          WHERE datname = current_database() AND application_name LIKE 'spool-%'
          ORDER BY 1",
    )
    .fetch_all(&stack.db.pool)
    .await
    .expect("pg_stat_activity");
    let names: Vec<&str> = names.iter().map(|(n,)| n.as_str()).collect();
    assert_eq!(names, ["spool-api", "spool-worker"]);
}

/// Issue 37 item 3, as an operator sets it: `SPOOL_RETENTION_IDEMPOTENCY_HOURS` on the API (a
/// key older than the window no longer replays) and on the worker (it purges them), and
/// `SPOOL_RETENTION_STEPS_DAYS` on the worker (a run that ended longer ago loses its steps,
/// and its timeline says so).
#[tokio::test]
async fn retention_windows_set_in_the_environment_expire_keys_and_steps() {
    let hours = [("SPOOL_RETENTION_IDEMPOTENCY_HOURS", "2")];
    let stack = Stack::start_with(&spool_tests::redis_url(), &hours).await;
    let pool = &stack.db.pool;
    let alice = token("alice", "acme");
    let first = stack.worker(&[]).await;
    let accepted = stack.enqueue(&alice, "hello").await;
    stack.wait_run(&accepted, "completed").await;
    drop(first);
    let id = accepted["workflow_id"].as_str().expect("id").to_owned();
    sqlx::query("UPDATE runs SET finished_at = now() - interval '11 days' WHERE id = $1::uuid")
        .bind(&id)
        .execute(pool)
        .await
        .expect("backdate");
    sqlx::raw_sql(
        "INSERT INTO idempotency_keys (tenant_id, key, request_hash, status_code, response, created_at)
         VALUES ('acme', 'old', 'h', 202, '{}', now() - interval '3 hours'),
                ('acme', 'fresh', 'h', 202, '{}', now() - interval '1 hour')",
    )
    .execute(pool)
    .await
    .expect("keys");

    // The API: a key past its 2 hours is free again (with 24 it would be 422, another body).
    let thread = uuid::Uuid::new_v4();
    let response = stack
        .http
        .post(format!("{}/v1/threads/{thread}/user_message", stack.base))
        .bearer_auth(&alice)
        .header("Idempotency-Key", "old")
        .json(&serde_json::json!({"input_text": "again"}))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), reqwest::StatusCode::ACCEPTED);
    sqlx::query("DELETE FROM idempotency_keys WHERE key = 'old'")
        .execute(pool)
        .await
        .expect("forget");
    sqlx::raw_sql(
        "INSERT INTO idempotency_keys (tenant_id, key, request_hash, status_code, response, created_at)
         VALUES ('acme', 'old', 'h', 202, '{}', now() - interval '3 hours')",
    )
    .execute(pool)
    .await
    .expect("old key");

    let _worker = stack
        .worker(&[
            ("SPOOL_RETENTION_IDEMPOTENCY_HOURS", "2"),
            ("SPOOL_RETENTION_STEPS_DAYS", "10"),
        ])
        .await;
    let timeline = poll_until("the run's steps to expire", TIMEOUT, || async {
        let (_, timeline) = stack
            .get_with(&alice, &format!("/v1/workflows/{id}/steps"))
            .await;
        timeline["steps_expired_at"].is_string().then_some(timeline)
    })
    .await;
    assert_eq!(timeline["steps"], serde_json::json!([]));
    let keys: Vec<String> = poll_until("the expired key to go", TIMEOUT, || async {
        let keys: Vec<String> = sqlx::query_scalar("SELECT key FROM idempotency_keys ORDER BY key")
            .fetch_all(pool)
            .await
            .ok()?;
        (!keys.contains(&"old".to_owned())).then_some(keys)
    })
    .await;
    assert_eq!(keys, ["fresh"], "a key within its 2 hours stays");
}

#[tokio::test]
async fn with_a_metrics_token_metrics_answer_only_the_bearer_of_it() {
    let secret = "a-metrics-token-for-the-scraper";
    let stack = Stack::start_with(
        &spool_tests::redis_url(),
        &[("SPOOL_METRICS_TOKEN", secret)],
    )
    .await;
    let scrape = async |bearer: Option<&str>| {
        let mut request = stack.http.get(format!("{}/metrics", stack.base));
        if let Some(bearer) = bearer {
            request = request.bearer_auth(bearer);
        }
        let response = request.send().await.expect("scrape");
        (response.status(), response.text().await.expect("body"))
    };
    for bearer in [None, Some("wrong".to_owned()), Some(token("alice", "acme"))] {
        let (status, body) = scrape(bearer.as_deref()).await;
        assert_eq!(
            status,
            reqwest::StatusCode::UNAUTHORIZED,
            "{bearer:?}: {body}"
        );
        let body: serde_json::Value = serde_json::from_str(&body).expect("json");
        assert_eq!(body["error"]["code"], "invalid_token");
    }
    let (status, body) = scrape(Some(secret)).await;
    assert_eq!(status, reqwest::StatusCode::OK, "{body}");
    assert!(body.contains("spool_queue_depth"), "{body}");
}

#[tokio::test]
async fn with_a_metrics_token_a_worker_s_metrics_answer_only_the_bearer_of_it() {
    let secret = "a-metrics-token-for-the-scraper";
    let stack = Stack::start().await;
    let worker = stack.worker(&[("SPOOL_METRICS_TOKEN", secret)]).await;
    let addr = poll_until("the metrics port to be logged", TIMEOUT, || async {
        worker.logged("metrics and health listening", "addr")
    })
    .await;
    let get = async |path: &str, bearer: Option<&str>| {
        let mut request = stack.http.get(format!("http://{addr}{path}"));
        if let Some(bearer) = bearer {
            request = request.bearer_auth(bearer);
        }
        let response = request.send().await.expect("ops");
        (response.status(), response.text().await.expect("body"))
    };
    for bearer in [None, Some("wrong")] {
        let (status, body) = get("/metrics", bearer).await;
        assert_eq!(
            status,
            reqwest::StatusCode::UNAUTHORIZED,
            "{bearer:?}: {body}"
        );
        assert!(body.contains("invalid_token"), "{body}");
    }
    let (status, body) = get("/metrics", Some(secret)).await;
    assert_eq!(status, reqwest::StatusCode::OK, "{body}");
    assert!(body.contains("spool_queue_depth"), "{body}");
    // The probes stay open.
    assert_eq!(get("/healthz", None).await.0, reqwest::StatusCode::OK);
}
