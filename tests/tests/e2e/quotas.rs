//! Quotas at enqueue (docs/operations.md), configured as an operator does (`SPOOL_QUOTA_*`), across
//! two API processes on one database: racing requests never both pass a limit, a refused request
//! creates nothing, and each refusal is a 429 with its code and `Retry-After`.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use spool_tests::process::{Backing, vars};
use spool_tests::{Process, token};

use crate::stack::{Stack, TIMEOUT, workflow_id};

/// A stack whose API runs with `settings`, and a second API process with the same settings on
/// its database.
async fn two_apis(settings: &[(&str, &str)]) -> (Stack, Process, String) {
    let stack = Stack::start_with(&spool_tests::redis_url(), settings).await;
    let vars = [&[("SPOOL_DB_MAX_CONNECTIONS", "8")], settings].concat();
    let (api, base) = Backing {
        database_url: &stack.db.url,
        redis_url: &stack.redis_url,
        redis_prefix: &stack.prefix,
    }
    .start_api(&vars, TIMEOUT)
    .await
    .expect("a second spool-api");
    (stack, api, base)
}

/// `POST user_message` to a new thread through `base`: status, `Retry-After`, body.
async fn send(http: &reqwest::Client, base: &str, token: &str) -> (StatusCode, Option<u64>, Value) {
    let thread = uuid::Uuid::new_v4();
    let response = http
        .post(format!("{base}/v1/threads/{thread}/user_message"))
        .bearer_auth(token)
        .json(&json!({"input_text": "hello"}))
        .send()
        .await
        .expect("request");
    let status = response.status();
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok()?.parse().ok());
    (
        status,
        retry_after,
        response.json().await.unwrap_or_default(),
    )
}

/// `n` requests of `token` at once, alternating between the two APIs.
async fn burst(stack: &Stack, other: &str, token: &str, n: usize) -> Vec<(StatusCode, Value)> {
    let requests = (0..n).map(|i| {
        let base = if i % 2 == 0 { &stack.base } else { other };
        let (http, token) = (stack.http.clone(), token.to_owned());
        async move {
            let (status, _, body) = send(&http, base, &token).await;
            (status, body)
        }
    });
    futures::future::join_all(requests).await
}

/// How many threads, messages and runs the database holds.
async fn rows(stack: &Stack) -> (i64, i64, i64) {
    sqlx::query_as(
        "SELECT (SELECT count(*) FROM threads), (SELECT count(*) FROM messages),
                (SELECT count(*) FROM runs)",
    )
    .fetch_one(&stack.db.pool)
    .await
    .expect("counts")
}

fn accepted(results: &[(StatusCode, Value)]) -> Vec<&Value> {
    results
        .iter()
        .filter(|(status, _)| *status == StatusCode::ACCEPTED)
        .map(|(_, body)| body)
        .collect()
}

fn refused<'a>(results: &'a [(StatusCode, Value)], code: &str) -> Vec<&'a Value> {
    results
        .iter()
        .filter(|(status, body)| {
            *status == StatusCode::TOO_MANY_REQUESTS && body["error"]["code"] == code
        })
        .map(|(_, body)| body)
        .collect()
}

#[tokio::test]
async fn two_api_processes_share_one_concurrency_limit_and_a_refusal_creates_nothing() {
    let (stack, _api, other) = two_apis(&[
        ("SPOOL_QUOTA_USER_CONCURRENT_RUNS", "1"),
        ("SPOOL_QUOTA_TENANT_CONCURRENT_RUNS", "2"),
    ])
    .await;
    let alice = token("alice", "acme");
    // No worker: admitted runs stay queued, so they stay active.
    let results = burst(&stack, &other, &alice, 12).await;
    let passed = accepted(&results);
    let limited = refused(&results, "concurrency_limited");
    assert_eq!(
        passed.len(),
        1,
        "exactly one passes a limit of one: {results:?}"
    );
    assert_eq!(limited.len(), 11, "{results:?}");
    assert_eq!(limited[0]["error"]["scope"], "user");
    assert_eq!(limited[0]["error"]["limit"], 1);
    assert_eq!(
        rows(&stack).await,
        (1, 2, 1),
        "refused requests created nothing"
    );
    let (status, retry_after, _) = send(&stack.http, &other, &alice).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry_after, Some(5));

    // The tenant's limit of two: bob takes the second slot, carol is refused for the tenant.
    let bob = token("bob", "acme");
    let (status, _, bob_run) = send(&stack.http, &other, &bob).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let (status, _, body) = send(&stack.http, &stack.base, &token("carol", "acme")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["error"]["scope"], "tenant");
    assert_eq!(body["error"]["limit"], 2);
    // Another tenant is not counted with acme.
    let (status, _, _) = send(&stack.http, &stack.base, &token("dave", "globex")).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    // Erasing bob's thread cancels his run and gives its room back: carol gets in.
    let response = stack
        .http
        .delete(format!(
            "{}/v1/threads/{}",
            stack.base,
            bob_run["thread_id"].as_str().expect("thread")
        ))
        .bearer_auth(&bob)
        .send()
        .await
        .expect("delete");
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    let (status, _, body) = send(&stack.http, &other, &token("carol", "acme")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");

    // A run that ends frees its slot: cancel alice's queued run, and she may start another.
    let run = passed[0];
    let (status, body) = stack
        .post(
            &alice,
            &format!("/v1/workflows/{}/cancel", workflow_id(run)),
            &json!({}),
        )
        .await;
    assert!(status.is_success(), "{body}");
    stack.wait_run(run, "cancelled").await;
    // Given back by the cancel itself, not left for a full counter to prune.
    let held = held_in_redis(&stack).await;
    let cancelled = run["workflow_id"].as_str().expect("workflow id");
    let erased = bob_run["workflow_id"].as_str().expect("workflow id");
    assert!(
        !held.iter().any(|id| id == cancelled || id == erased),
        "{held:?}"
    );
    let (status, _, body) = send(&stack.http, &other, &alice).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
}

/// A connection to the stack's Redis, and its quota keys that match `pattern` (after the
/// `{prefix}:quota:`).
async fn quota_keys(
    stack: &Stack,
    pattern: &str,
) -> (redis::aio::MultiplexedConnection, Vec<String>) {
    let client = redis::Client::open(stack.redis_url.as_str()).expect("redis url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}:quota:{pattern}", stack.prefix))
        .query_async(&mut conn)
        .await
        .expect("keys");
    (conn, keys)
}

/// Every run the stack's concurrency counters hold in Redis.
async fn held_in_redis(stack: &Stack) -> Vec<String> {
    let (mut conn, sets) = quota_keys(stack, "*:active").await;
    let mut held = Vec::new();
    for set in sets {
        let members: Vec<String> = redis::cmd("ZRANGE")
            .arg(&set)
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await
            .expect("zrange");
        held.extend(members);
    }
    held
}

#[tokio::test]
async fn runs_per_hour_are_counted_across_two_apis_per_user_and_per_tenant() {
    let (stack, _api, other) = two_apis(&[
        ("SPOOL_QUOTA_USER_RUNS_PER_HOUR", "3"),
        ("SPOOL_QUOTA_TENANT_RUNS_PER_HOUR", "4"),
    ])
    .await;
    let alice = token("alice", "acme");
    let results = burst(&stack, &other, &alice, 10).await;
    assert_eq!(accepted(&results).len(), 3, "{results:?}");
    let limited = refused(&results, "rate_limited");
    assert_eq!(limited.len(), 7, "{results:?}");
    assert_eq!(limited[0]["error"]["scope"], "user");
    let (status, retry_after, body) = send(&stack.http, &stack.base, &alice).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    let retry_after = retry_after.expect("Retry-After");
    assert!(
        (3590..=3600).contains(&retry_after),
        "the window's end: {retry_after}"
    );
    assert_eq!(body["error"]["retry_after"], retry_after);
    assert_eq!(rows(&stack).await, (3, 6, 3));
    // Bob's first run is the tenant's fourth; his second is over the tenant's limit.
    let bob = token("bob", "acme");
    assert_eq!(
        send(&stack.http, &other, &bob).await.0,
        StatusCode::ACCEPTED
    );
    let (status, _, body) = send(&stack.http, &stack.base, &bob).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(body["error"]["code"], "rate_limited");
    assert_eq!(body["error"]["scope"], "tenant");
    assert_eq!(body["error"]["limit"], 4);
}

#[tokio::test]
async fn a_spent_daily_token_budget_refuses_new_runs_until_the_utc_day_ends() {
    let stack = Stack::start_with(
        &spool_tests::redis_url(),
        &[("SPOOL_QUOTA_USER_DAILY_TOKENS", "3")],
    )
    .await;
    let _worker = stack.worker(&[]).await;
    let alice = token("alice", "acme");
    // Nothing spent yet: admitted, and its one model call spends more than 3 tokens.
    let (status, _, run) = send(&stack.http, &stack.base, &alice).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{run}");
    assert_eq!(stack.wait_run(&run, "completed").await.status, "completed");
    let (status, retry_after, body) = send(&stack.http, &stack.base, &alice).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["error"]["code"], "budget_exceeded");
    assert_eq!(body["error"]["scope"], "user");
    assert_eq!(body["error"]["limit"], 3);
    let seconds_to_midnight = 86_400 - chrono::Utc::now().timestamp() % 86_400;
    let retry_after = retry_after.expect("Retry-After") as i64;
    assert!(
        (retry_after - seconds_to_midnight).abs() <= 2,
        "{retry_after} vs {seconds_to_midnight}"
    );
    // Bob has a budget of his own.
    let (status, _, _) = send(&stack.http, &stack.base, &token("bob", "acme")).await;
    assert_eq!(status, StatusCode::ACCEPTED);
}

#[tokio::test]
async fn an_agents_governance_holds_its_own_runs_apart_from_the_servers_quotas() {
    let stack = Stack::start().await;
    let strict = stack
        .create_agent(&json!({"name": "strict", "model": "demo",
            "governance": {"user": {"max_concurrent_runs": 1}}}))
        .await;
    let alice = token("alice", "acme");
    let to_agent = |agent: &str| json!({"input_text": "hi", "agent_id": agent});
    let path = || format!("/v1/threads/{}/user_message", uuid::Uuid::new_v4());
    let (status, _) = stack.post(&alice, &path(), &to_agent(&strict)).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let (status, body) = stack.post(&alice, &path(), &to_agent(&strict)).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["error"]["code"], "concurrency_limited");
    assert_eq!(body["error"]["agent_id"], strict.as_str());
    // The default agent, and another user, are not held by it.
    let (status, _) = stack
        .post(&alice, &path(), &json!({"input_text": "hi"}))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let (status, _) = stack
        .post(&token("bob", "acme"), &path(), &to_agent(&strict))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);

    // Out of range: refused by field, nothing stored.
    let admin = spool_tests::token_with("root", "acme", true, 3600, spool_tests::JWT_SECRET);
    let (status, body) = stack
        .post(
            &admin,
            "/v1/agents",
            &json!({"name": "bad", "model": "demo",
                "governance": {"user": {"runs_per_hour": 0},
                               "tenant": {"daily_token_budget": 0}}}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["code"], "invalid_agent");
    let fields: Vec<&str> = body["error"]["errors"]
        .as_array()
        .expect("errors")
        .iter()
        .filter_map(|e| e["field"].as_str())
        .collect();
    assert_eq!(
        fields,
        [
            "governance.user.runs_per_hour",
            "governance.tenant.daily_token_budget"
        ]
    );
}

#[tokio::test]
async fn a_quota_variable_that_does_not_parse_stops_the_api_with_the_variable_named() {
    let db = spool_tests::TestDb::new().await.expect("test database");
    for (name, value) in [
        ("SPOOL_QUOTA_TENANT_DAILY_TOKENS", "lots"),
        ("SPOOL_QUOTA_USER_CONCURRENT_RUNS", "0"),
    ] {
        let env = vars(&[
            ("DATABASE_URL", db.url.as_str()),
            ("SPOOL_API_ADDR", "127.0.0.1:0"),
            (name, value),
        ]);
        let mut api = Process::spawn("spool-api", &["serve"], &env).expect("spawn");
        let code = api.wait(Duration::from_secs(20)).await;
        assert!(
            matches!(code, Some(c) if c != 0),
            "{name}={value}: {code:?}"
        );
        let output = api.output();
        assert!(output.contains(name), "{name}={value}: {output}");
    }
}

/// Deletes every quota counter of the stack from Redis, as a restart of a Redis that keeps
/// nothing on disk (or a failover to a replica that had not caught up) loses them.
async fn lose_the_counters(stack: &Stack) {
    let (mut conn, keys) = quota_keys(stack, "*").await;
    assert!(!keys.is_empty(), "the counters live in Redis");
    redis::cmd("DEL")
        .arg(&keys)
        .query_async::<()>(&mut conn)
        .await
        .expect("del");
}

#[tokio::test]
async fn counters_redis_lost_are_rebuilt_from_postgres_and_both_apis_still_hold_the_limits() {
    let (stack, _api, other) = two_apis(&[
        ("SPOOL_QUOTA_USER_CONCURRENT_RUNS", "1"),
        ("SPOOL_QUOTA_TENANT_RUNS_PER_HOUR", "3"),
    ])
    .await;
    let alice = token("alice", "acme");
    let (status, _, run) = send(&stack.http, &stack.base, &alice).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{run}");
    lose_the_counters(&stack).await;
    // Alice's queued run still holds her one slot, through either API.
    let results = burst(&stack, &other, &alice, 6).await;
    assert_eq!(
        refused(&results, "concurrency_limited").len(),
        6,
        "{results:?}"
    );
    // Bob's run is the tenant's second of the hour; lost again, the rebuilt window still
    // counts both, so one more run passes and the next is over the tenant's three.
    let (status, _, _) = send(&stack.http, &other, &token("bob", "acme")).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    lose_the_counters(&stack).await;
    let (status, _, _) = send(&stack.http, &stack.base, &token("carol", "acme")).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let (status, retry_after, body) = send(&stack.http, &other, &token("dave", "acme")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["error"]["code"], "rate_limited");
    assert_eq!(body["error"]["scope"], "tenant");
    assert!(retry_after.is_some_and(|s| s > 3500), "{retry_after:?}");
    assert_eq!(rows(&stack).await.2, 3, "refused requests created nothing");
}

#[tokio::test]
async fn with_redis_unreachable_postgres_admits_and_the_limits_still_hold_across_processes() {
    let db = spool_tests::TestDb::new().await.expect("test database");
    // A loopback port with nobody listening.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let redis_url = format!("redis://{}", closed.local_addr().expect("addr"));
    drop(closed);
    let backing = Backing {
        database_url: &db.url,
        redis_url: &redis_url,
        redis_prefix: "spool",
    };
    let quotas = [
        ("SPOOL_QUOTA_USER_CONCURRENT_RUNS", "2"),
        ("SPOOL_QUOTA_TENANT_RUNS_PER_HOUR", "5"),
    ];
    let (_one, one) = backing
        .start_api(&quotas, TIMEOUT)
        .await
        .expect("spool-api with quotas");
    let (_two, two) = backing
        .start_api(&quotas, TIMEOUT)
        .await
        .expect("a second spool-api");
    let http = reqwest::Client::new();
    let runs = || async {
        let (runs,): (i64,) = sqlx::query_as("SELECT count(*) FROM runs")
            .fetch_one(&db.pool)
            .await
            .expect("runs");
        runs
    };
    // Alice's burst through both processes at once (no worker: her runs stay active): exactly
    // her two concurrent runs pass.
    let alice = token("alice", "acme");
    let requests = (0..10).map(|i| {
        let (http, base, alice) = (http.clone(), if i % 2 == 0 { &one } else { &two }, &alice);
        async move { send(&http, base, alice).await }
    });
    let results = futures::future::join_all(requests).await;
    let statuses: Vec<StatusCode> = results.iter().map(|(s, _, _)| *s).collect();
    let passed = statuses
        .iter()
        .filter(|s| **s == StatusCode::ACCEPTED)
        .count();
    assert_eq!(passed, 2, "{results:?}");
    for (status, retry_after, body) in &results {
        if *status != StatusCode::ACCEPTED {
            assert_eq!(*status, StatusCode::TOO_MANY_REQUESTS, "{body}");
            assert_eq!(body["error"]["code"], "concurrency_limited", "{body}");
            assert!(retry_after.is_some(), "{body}");
        }
    }
    assert_eq!(runs().await, 2, "refused requests created nothing");
    // The tenant's five runs an hour: bob's and carol's three more pass, the next is refused.
    for user in ["bob", "bob", "carol"] {
        let (status, _, body) = send(&http, &two, &token(user, "acme")).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    }
    let (status, _, body) = send(&http, &one, &token("carol", "acme")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["error"]["code"], "rate_limited", "{body}");
    assert_eq!(body["error"]["scope"], "tenant", "{body}");
    assert_eq!(runs().await, 5);
}
