//! Postgres crashed and restarted while webhooks are due: clients post messages throughout,
//! two workers run them and deliver their `run.completed` events to two slow loopback
//! receivers, so deliveries are in flight and due when the server goes down. Afterwards every
//! outbox row is delivered, each receiver got every completed run's event, and a run's event
//! reached a receiver under one `webhook-id` only (repeats, which at-least-once allows, carry
//! the same id, so a receiver de-duplicating on it sees the event once).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::json;
use sqlx::PgPool;

use spool_tests::webhooks::Receiver;
use spool_tests::{JWT_SECRET, poll_until, token_with};

use crate::SERIAL;
use crate::restarts::{DOWN_AT, OnOwnPostgres, UP_AT, WORKER};

/// The restart tests' workers (`restarts::WORKER`), with short demo runs, a short lease, and
/// deliveries to loopback receivers.
const SETTINGS: [(&str, &str); 5] = [
    ("SPOOL_DEMO_TOKENS", "5"),
    ("SPOOL_TOOLS_ALLOW_NETWORKS", "127.0.0.0/8"),
    ("SPOOL_WEBHOOKS_CONCURRENCY", "8"),
    ("SPOOL_LEASE_SECS", "3"),
    ("SPOOL_HEARTBEAT_SECS", "0.5"),
];

/// Each workflow's event as one receiver got it: the `webhook-id`s it arrived under, and how
/// many times it arrived.
fn by_workflow(receiver: &Receiver) -> BTreeMap<String, (BTreeSet<String>, usize)> {
    let mut seen: BTreeMap<String, (BTreeSet<String>, usize)> = BTreeMap::new();
    for delivery in receiver.received() {
        let workflow = delivery.json()["data"]["workflow_id"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let entry = seen.entry(workflow).or_default();
        entry.0.insert(delivery.id.clone());
        entry.1 += 1;
    }
    seen
}

#[tokio::test]
async fn postgres_restarted_while_webhooks_are_due_loses_none_and_repeats_only_under_one_id() {
    let _turn = SERIAL.lock().await;
    // Later settings win: the demo runs of `SETTINGS` over the restart tests' ones. The API
    // gets them too: it checks a webhook's URL against the same allowed networks.
    let settings = [&WORKER[..], &SETTINGS[..]].concat();
    let deployment = OnOwnPostgres::start("spool_faults_webhooks", &settings, &settings).await;
    let base = &deployment.base;
    // 30 ms an answer, 16 tries in flight in all: slower than the runs end, so deliveries
    // queue up and are due (and in flight) when Postgres goes down.
    let receivers = [
        Receiver::slow(Duration::from_millis(30)).await,
        Receiver::slow(Duration::from_millis(30)).await,
    ];
    let http = reqwest::Client::new();
    let admin = token_with("root", "acme", true, 3600, JWT_SECRET);
    for (_, url) in &receivers {
        let created = http
            .post(format!("{base}/v1/webhooks"))
            .bearer_auth(&admin)
            .json(&json!({"url": url, "events": ["run.completed"]}))
            .send()
            .await
            .expect("create");
        assert_eq!(created.status(), reqwest::StatusCode::CREATED);
    }

    let acknowledged = deployment.crash_under_load().await.acknowledged.len();

    let pool = PgPool::connect(&deployment.database_url)
        .await
        .expect("pool");
    let started = Instant::now();
    let (completed, outbox): (Vec<uuid::Uuid>, i64) = poll_until(
        "every run ended and every delivery delivered",
        Duration::from_secs(120),
        || async {
            let (ended, active): (Vec<uuid::Uuid>, i64) = sqlx::query_as(
                "SELECT coalesce(array_agg(id) FILTER (WHERE status = 'completed'), '{}'),
                        count(*) FILTER (WHERE status NOT IN ('completed', 'failed', 'cancelled'))
                   FROM runs",
            )
            .fetch_one(&pool)
            .await
            .ok()?;
            let (rows, waiting): (i64, i64) = sqlx::query_as(
                "SELECT count(*), count(*) FILTER (WHERE delivered_at IS NULL)
                   FROM webhook_deliveries",
            )
            .fetch_one(&pool)
            .await
            .ok()?;
            (active == 0 && waiting == 0).then_some((ended, rows))
        },
    )
    .await;
    let drained = started.elapsed().as_secs_f64();
    assert!(
        completed.len() >= acknowledged && acknowledged > 50,
        "{acknowledged} acknowledged, {} completed",
        completed.len()
    );
    assert_eq!(
        usize::try_from(outbox).expect("count"),
        completed.len() * receivers.len(),
        "one outbox row per completed run and endpoint"
    );
    let mut repeats = 0;
    for (receiver, _) in &receivers {
        let seen = by_workflow(receiver);
        for workflow in &completed {
            let (ids, times) = seen
                .get(&workflow.to_string())
                .unwrap_or_else(|| panic!("run {workflow}'s event never reached a receiver"));
            assert_eq!(
                ids.len(),
                1,
                "{workflow}: delivered under several ids: {ids:?}"
            );
            repeats += times - 1;
        }
        assert_eq!(
            seen.len(),
            completed.len(),
            "no event of a run that did not complete"
        );
    }
    println!(
        "postgres crash with webhooks due: {} runs completed, {outbox} deliveries, none lost, \
         each under one webhook-id ({repeats} repeats with the same id); Postgres down {:?} \
         from {:?}; outbox drained {drained:.1} s after the load",
        completed.len(),
        UP_AT - DOWN_AT,
        DOWN_AT
    );
}
