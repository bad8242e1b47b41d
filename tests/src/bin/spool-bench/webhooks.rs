//! P8, webhooks: deliveries per second to a loopback receiver against the rate runs complete in
//! the same round (the outbox must keep pace with the runs that fill it), and the delay of one
//! tenant's delivery while another tenant's endpoints are blackholed (a loopback listener that
//! accepts and never answers) against the same delay with no such tenant, in the same round.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_json::json;
use spool_tests::webhooks::{Receiver, blackhole};

use crate::load::{Until, enqueue};
use crate::report::{Figure, Report};
use crate::scenarios::Sizes;
use crate::stack::{Stack, wait_for};

const S: &str = "P8 webhooks";
/// How long the whole measure may take.
const WAIT: Duration = Duration::from_secs(600);
/// Endpoints of the blackholed tenant, and its runs per round.
const DARK_ENDPOINTS: usize = 10;
const DARK_RUNS: usize = 10;
/// A 10 s lease: a try times out after 5 s.
const LEASE: &str = "10";

/// Creates an endpoint of `tenant` at `url` for `run.completed`.
async fn endpoint(stack: &Stack, tenant: &str, url: &str) -> anyhow::Result<()> {
    let admin = spool_tests::token_with("root", tenant, true, 3600, spool_tests::JWT_SECRET);
    let response = reqwest::Client::new()
        .post(stack.client().url("/v1/webhooks"))
        .bearer_auth(admin)
        .json(&json!({"url": url, "events": ["run.completed"]}))
        .send()
        .await?;
    anyhow::ensure!(
        response.status() == reqwest::StatusCode::CREATED,
        "POST /v1/webhooks: {}",
        response.status()
    );
    Ok(())
}

/// Posts one message of `user` of `tenant` on a new thread; the 202's workflow id.
async fn post_as(stack: &Stack, user: &str, tenant: &str) -> anyhow::Result<String> {
    let response = reqwest::Client::new()
        .post(stack.client().url(&format!(
            "/v1/threads/{}/user_message",
            uuid::Uuid::new_v4()
        )))
        .bearer_auth(spool_tests::token(user, tenant))
        .json(&json!({"input_text": "hello"}))
        .send()
        .await?;
    let body: serde_json::Value = response.json().await?;
    body["workflow_id"]
        .as_str()
        .map(str::to_owned)
        .context("a workflow id")
}

/// Seconds from posting one message of `acme` to its delivery at `receiver`.
async fn one_delivery(stack: &Stack, receiver: &Receiver) -> anyhow::Result<f64> {
    let before = receiver.count();
    let started = Instant::now();
    post_as(stack, "alice", "acme").await?;
    wait_for("acme's delivery", WAIT, async || {
        (receiver.count() > before).then_some(())
    })
    .await?;
    Ok(started.elapsed().as_secs_f64())
}

pub(crate) async fn p8(sizes: &Sizes, report: &mut Report) -> anyhow::Result<()> {
    let settings = [
        ("SPOOL_TOOLS_ALLOW_NETWORKS", "127.0.0.0/8"),
        ("SPOOL_LEASE_SECS", LEASE),
        ("SPOOL_HEARTBEAT_SECS", "2"),
    ];
    let mut stack = Stack::start(&settings).await?;
    for _ in 0..2 {
        stack
            .worker(&[&settings[..], &[("SPOOL_DEMO_TOKENS", "3")]].concat())
            .await?;
    }
    let runs = (sizes.p5_runs / 6).max(20);
    let c = sizes.concurrency;
    let (receiver, url) = Receiver::start(&[]).await;
    let (acme_receiver, acme_url) = Receiver::start(&[]).await;
    endpoint(&stack, "acme", &acme_url).await?;
    let hole = blackhole().await;
    let (mut run_rate, mut delivery_rate) = (vec![], vec![]);
    let (mut alone, mut beside_dark) = (vec![], vec![]);
    let mut completed = 0;
    let mut with_hook = false;
    for round in 0..sizes.rounds {
        // Runs alone (the bench tenant has no endpoint yet in the first round; then it has one
        // and the round measures both).
        let started = Instant::now();
        let delivered_before = receiver.count();
        enqueue(&stack, c, Until::Posted(runs)).await?;
        completed += i64::try_from(runs)?;
        wait_for("every run to complete", WAIT, async || {
            let done = stack.runs_with_status("completed").await.ok()?;
            (done >= completed).then_some(())
        })
        .await?;
        let ran = started.elapsed().as_secs_f64();
        if with_hook {
            let want = delivered_before + usize::try_from(runs)?;
            wait_for("every delivery", WAIT, async || {
                (receiver.count() >= want).then_some(())
            })
            .await?;
            run_rate.push(runs as f64 / ran);
            delivery_rate.push(runs as f64 / started.elapsed().as_secs_f64());
        } else {
            endpoint(&stack, "bench", &url).await?;
            with_hook = true;
        }
        // Another tenant's delivery, with and without a tenant whose endpoints never answer.
        alone.push(one_delivery(&stack, &acme_receiver).await? * 1000.0);
        // A new blackholed tenant each round: the last round's endpoints have open circuits
        // by now (they hold no slot, which is the point of the breaker, but then nothing
        // would be in flight beside acme's delivery).
        let dark = format!("dark-{round}");
        for _ in 0..DARK_ENDPOINTS {
            endpoint(&stack, &dark, &hole).await?;
        }
        for _ in 0..DARK_RUNS {
            post_as(&stack, "eve", &dark).await?;
        }
        wait_for("dark's tries in flight", WAIT, async || {
            let (held,): (i64,) = sqlx::query_as(
                "SELECT count(*) FROM webhook_deliveries
                  WHERE tenant_id = $1 AND lease_expires_at > now()",
            )
            .bind(&dark)
            .fetch_one(&stack.db.pool)
            .await
            .ok()?;
            (held >= 8).then_some(())
        })
        .await?;
        beside_dark.push(one_delivery(&stack, &acme_receiver).await? * 1000.0);
        completed += i64::try_from(DARK_RUNS)? + 2;
    }
    if run_rate.is_empty() {
        // One round (smoke): measure the rate once more, now with the endpoint.
        let started = Instant::now();
        let before = receiver.count();
        enqueue(&stack, c, Until::Posted(runs)).await?;
        wait_for("every delivery", WAIT, async || {
            (receiver.count() >= before + usize::try_from(runs).ok()?).then_some(())
        })
        .await?;
        let took = started.elapsed().as_secs_f64();
        run_rate.push(runs as f64 / took);
        delivery_rate.push(runs as f64 / took);
    }
    report.note(
        S,
        format!(
            "{runs} runs per round posted by {c} clients while 2 workers (SPOOL_WEBHOOKS_CONCURRENCY \
             32 each, lease {LEASE} s: a try times out after 5 s) run them and deliver each \
             run.completed to one loopback receiver answering 204 at once; the delivery rate \
             counts to the last delivery. The delay: one message of another tenant, POST to its \
             delivery, alone and then while a tenant (a new one each round, its circuits closed) has \
             {DARK_ENDPOINTS} endpoints on a listener that never answers and {} deliveries due",
            DARK_ENDPOINTS * DARK_RUNS
        ),
    );
    report.add(
        Figure::new(
            S,
            "deliveries/s (1 endpoint)",
            "deliveries/s",
            delivery_rate,
        )
        .against("runs completed/s, same round", run_rate, Some(0.9)),
    );
    report.add(
        Figure::new(
            S,
            "another tenant's POST → delivery, beside blackholed endpoints",
            "ms",
            beside_dark,
        )
        .against("the same, no blackholed tenant", alone, None)
        .at_most(5000.0 + 2000.0),
    );
    Ok(())
}
