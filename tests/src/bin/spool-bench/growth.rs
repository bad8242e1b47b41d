//! P7: growth. The same measures on two Spool deployments in the same run: one on an empty
//! database, one on a database filled like months of use (`spool_tests::growth`: a million
//! threads, 2.5 million runs, 5 million messages, 200 tenants, made by SQL through the real
//! schema with the migrations' indexes in place). Each figure is the filled one against the
//! empty one (DESIGN section 15: every cost scales with the work, not with the history; the
//! issue's goal is every ratio within 1.5×).
//!
//! Each round, on each deployment in turn: run throughput (P5's measure: no-op runs posted by
//! the clients and run by two workers, until all are completed), then with the workers gone the
//! enqueue (P1's), the first and a deep page (by cursor) of `GET /v1/threads` and `GET
//! /v1/workflows`, a run's `/steps` timeline, and erasing a 200-message thread whose run is
//! held, beside 15 other runs, by a lease keeper renewing them back to back with the worker's
//! own statement (`runs::heartbeat`): the erasure's time and the slowest renewal during it.

use std::cell::Cell;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use chrono::{DateTime, Utc};
use hdrhistogram::Histogram;
use spool_shared::db::page::Cursor;
use spool_shared::db::runs;
use spool_tests::growth::{self, Size};
use sqlx::postgres::PgPoolOptions;

use crate::load::{Until, enqueue};
use crate::report::{Figure, Report, histogram, ms};
use crate::scenarios::Sizes;
use crate::stack::{Stack, wait_for};

const S: &str = "P7 growth";
const WAIT: Duration = Duration::from_secs(300);
/// Runs a worker holds while the thread is erased, the erased thread's own included.
const HELD: usize = 16;

/// Each measure's rounds on one deployment.
#[derive(Default)]
struct Measures {
    enqueue: Vec<f64>,
    runs: Vec<f64>,
    threads_first: Vec<f64>,
    threads_deep: Vec<f64>,
    workflows_first: Vec<f64>,
    workflows_deep: Vec<f64>,
    steps: Vec<f64>,
    erase: Vec<f64>,
    heartbeat: Vec<f64>,
}

/// How big P7 is.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GrowthSizes {
    /// What the filled database holds.
    pub(crate) fill: Size,
    /// Rows above a deep page.
    pub(crate) depth: i64,
    /// Turns of the erased thread (two messages each).
    pub(crate) turns: i64,
    /// Requests per list and timeline figure (their median latency is the figure).
    pub(crate) requests: usize,
}

/// P7: see the module doc.
pub(crate) async fn p7(sizes: &Sizes, report: &mut Report) -> anyhow::Result<()> {
    let growth = sizes.growth;
    let mut empty = Stack::start(&[]).await?;
    let mut filled = Stack::start(&[]).await?;
    let started = Instant::now();
    let mut steps = Vec::new();
    let mut conn = filled.db.pool.acquire().await?;
    growth::fill(&mut conn, growth.fill, |what, took| {
        eprintln!("  [{S}] filled {what} in {:.1} s", took.as_secs_f64());
        steps.push(format!("{what} {:.0} s", took.as_secs_f64()));
    })
    .await?;
    let (bytes,): (i64,) = sqlx::query_as("SELECT pg_database_size(current_database())")
        .fetch_one(&mut *conn)
        .await?;
    drop(conn);
    report.note(
        S,
        format!(
            "filled database: {} threads, {} runs, {} messages, {} tenants ({} users each), \
             {:.1} GB, made in {:.0} s ({}); deep pages start {} rows down; the erased thread \
             has {} messages; {} requests per list figure (median latency)",
            growth.fill.threads,
            growth.fill.runs(),
            growth.fill.runs() * 2,
            growth.fill.tenants,
            growth.fill.users,
            bytes as f64 / 1e9,
            started.elapsed().as_secs_f64(),
            steps.join(", "),
            growth.depth,
            growth.turns * 2,
            growth.requests,
        ),
    );
    let (mut e, mut f) = (Measures::default(), Measures::default());
    for round in 0..sizes.rounds {
        measure(&mut empty, sizes, &format!("empty-{round}"), &mut e).await?;
        measure(&mut filled, sizes, &format!("filled-{round}"), &mut f).await?;
    }
    add_figures(report, e, f);
    Ok(())
}

fn add_figures(report: &mut Report, e: Measures, f: Measures) {
    const BASE: &str = "the same on an empty database";
    // Rates: the filled one at least 1/1.5 of the empty one's.
    for (metric, unit, filled, empty) in [
        ("enqueue (P1's measure)", "requests/s", f.enqueue, e.enqueue),
        ("runs completed (P5's measure)", "runs/s", f.runs, e.runs),
    ] {
        report.add(Figure::new(S, metric, unit, filled).against(BASE, empty, Some(0.67)));
    }
    for (metric, filled, empty) in [
        (
            "GET /v1/threads, first page (p50)",
            f.threads_first,
            e.threads_first,
        ),
        (
            "GET /v1/threads, deep page (p50)",
            f.threads_deep,
            e.threads_deep,
        ),
        (
            "GET /v1/workflows, first page (p50)",
            f.workflows_first,
            e.workflows_first,
        ),
        (
            "GET /v1/workflows, deep page (p50)",
            f.workflows_deep,
            e.workflows_deep,
        ),
        ("GET /v1/workflows/{id}/steps (p50)", f.steps, e.steps),
        ("DELETE /v1/threads/{id}, 200 messages", f.erase, e.erase),
        (
            "slowest heartbeat during the erasure",
            f.heartbeat,
            e.heartbeat,
        ),
    ] {
        report.add(Figure::new(S, metric, "ms", filled).at_most_times(BASE, empty, 1.5));
    }
}

/// One round of every measure on `stack` (see the module doc).
async fn measure(
    stack: &mut Stack,
    sizes: &Sizes,
    seed: &str,
    into: &mut Measures,
) -> anyhow::Result<()> {
    let c = sizes.concurrency;
    let since = database_now(stack).await?;
    for _ in 0..2 {
        stack.worker(&[("SPOOL_DEMO_TOKENS", "3")]).await?;
    }
    let started = Instant::now();
    enqueue(stack, c, Until::Posted(sizes.p5_runs)).await?;
    let wanted = i64::try_from(sizes.p5_runs)?;
    let timeline_run = wait_for("every run to complete", WAIT, async || {
        completed_since(stack, since, wanted).await.ok().flatten()
    })
    .await?;
    into.runs
        .push(sizes.p5_runs as f64 / started.elapsed().as_secs_f64());
    stack.stop_workers();

    enqueue(stack, c, Until::Elapsed(Duration::from_millis(300))).await?;
    let load = enqueue(stack, c, Until::Elapsed(Duration::from_secs(sizes.seconds))).await?;
    into.enqueue.push(load.rate);
    // The enqueued runs would be claimed by the next round's workers and by the lease keeper.
    sqlx::query(
        "UPDATE runs SET status = 'cancelled', finished_at = now() WHERE status = 'queued'",
    )
    .execute(&stack.db.pool)
    .await?;

    let g = sizes.growth;
    let threads = deep_cursor(stack, "threads", g.depth).await?;
    let workflows = deep_cursor(stack, "runs", g.depth).await?;
    let n = g.requests;
    into.threads_first
        .push(latency(stack, "/v1/threads", n).await?);
    let deep = format!("/v1/threads?cursor={}", threads.encode());
    into.threads_deep.push(latency(stack, &deep, n).await?);
    into.workflows_first
        .push(latency(stack, "/v1/workflows", n).await?);
    let deep = format!("/v1/workflows?cursor={}", workflows.encode());
    into.workflows_deep.push(latency(stack, &deep, n).await?);
    let timeline = format!("/v1/workflows/{timeline_run}/steps");
    into.steps.push(latency(stack, &timeline, n).await?);

    let (erase, heartbeat) = erase_while_held(stack, seed, g.turns).await?;
    into.erase.push(erase);
    into.heartbeat.push(heartbeat);
    Ok(())
}

async fn database_now(stack: &Stack) -> anyhow::Result<DateTime<Utc>> {
    let (now,): (DateTime<Utc>,) = sqlx::query_as("SELECT now()")
        .fetch_one(&stack.db.pool)
        .await?;
    Ok(now)
}

/// A run completed since `since`, once `wanted` of them are (the bench's tenant only: the
/// filled database's own runs are older).
async fn completed_since(
    stack: &Stack,
    since: DateTime<Utc>,
    wanted: i64,
) -> anyhow::Result<Option<uuid::Uuid>> {
    let (done, any): (i64, Option<uuid::Uuid>) = sqlx::query_as(
        "SELECT count(*), min(id::text)::uuid FROM runs
          WHERE tenant_id = $1 AND status = 'completed' AND created_at >= $2",
    )
    .bind(growth::TENANT)
    .bind(since)
    .fetch_one(&stack.db.pool)
    .await?;
    Ok(any.filter(|_| done >= wanted))
}

/// The cursor of the row `depth` rows down the bench user's list of `table`.
async fn deep_cursor(stack: &Stack, table: &str, depth: i64) -> anyhow::Result<Cursor> {
    let erased = if table == "threads" {
        " AND erased_at IS NULL"
    } else {
        ""
    };
    let sql = format!(
        "SELECT created_at, id FROM {table} WHERE tenant_id = $1 AND owner_id = $2{erased}
          ORDER BY created_at DESC, id DESC OFFSET $3 LIMIT 1"
    );
    let (created_at, id): (DateTime<Utc>, uuid::Uuid) = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(growth::TENANT)
        .bind(growth::USER)
        .bind(depth)
        .fetch_one(&stack.db.pool)
        .await
        .with_context(|| format!("a row {depth} rows down the {table}"))?;
    Ok(Cursor { created_at, id })
}

/// The median latency of `n` sequential GETs of `path`, in ms.
async fn latency(stack: &Stack, path: &str, n: usize) -> anyhow::Result<f64> {
    let mut latencies: Histogram<u64> = histogram();
    for _ in 0..n {
        let sent = Instant::now();
        let response = stack
            .http
            .get(stack.url(path))
            .bearer_auth(&stack.token)
            .send()
            .await?;
        let status = response.status();
        let _ = response.bytes().await?;
        ensure!(status.is_success(), "GET {path}: {status}");
        latencies.saturating_record(sent.elapsed().as_micros().max(1) as u64);
    }
    Ok(ms(&latencies, 0.5))
}

/// Erases a thread of `turns` turns whose last run is held, with [`HELD`]` - 1` other runs, by
/// a lease keeper that renews them back to back meanwhile. Returns the erasure's time and the
/// slowest renewal that overlapped it, in ms.
async fn erase_while_held(stack: &Stack, seed: &str, turns: i64) -> anyhow::Result<(f64, f64)> {
    let mut conn = stack.db.pool.acquire().await?;
    let thread = growth::long_thread(&mut conn, seed, turns - 1).await?;
    drop(conn);
    stack.post(thread, "one more").await?;
    for _ in 1..HELD {
        stack.post(uuid::Uuid::new_v4(), "hello").await?;
    }
    // A pool of its own, as the worker's lease keeper has.
    let keeper = PgPoolOptions::new()
        .max_connections(1)
        .connect(&stack.db.url)
        .await?;
    let lease = Duration::from_secs(30);
    let claimed = runs::claim(&keeper, "p7-keeper", lease, HELD as u32 * 2, None).await?;
    ensure!(claimed.len() == HELD, "claimed {} runs", claimed.len());
    let held: Vec<_> = claimed
        .iter()
        .map(|c| (c.run().id, c.run().attempt))
        .collect();

    let erasing = Cell::new(true);
    let started = Instant::now();
    let erase = async {
        let response = stack
            .http
            .delete(stack.url(&format!("/v1/threads/{thread}")))
            .bearer_auth(&stack.token)
            .send()
            .await;
        let took = started.elapsed();
        erasing.set(false);
        anyhow::Ok((response?.status(), took))
    };
    let renew = async {
        let (mut slowest, mut renewed) = (Duration::ZERO, HELD);
        // Paced, not back to back: a renewal writes every held row (and its index entries),
        // which would slow the erasure it measures.
        let mut pace = tokio::time::interval(Duration::from_millis(5));
        pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while erasing.get() {
            pace.tick().await;
            let sent = Instant::now();
            renewed = runs::heartbeat(&keeper, &held, lease).await?.len();
            slowest = slowest.max(sent.elapsed());
        }
        anyhow::Ok((slowest, renewed))
    };
    let (erased, renewals) = tokio::join!(erase, renew);
    let ((status, took), (slowest, renewed)) = (erased?, renewals?);
    ensure!(
        status == reqwest::StatusCode::NO_CONTENT,
        "DELETE: {status}"
    );
    ensure!(
        renewed >= HELD - 1,
        "a lease lost: {renewed} renewed after the erasure"
    );
    sqlx::query(
        "UPDATE runs SET status = 'cancelled', finished_at = now()
          WHERE lease_owner = 'p7-keeper' AND status = 'running'",
    )
    .execute(&keeper)
    .await?;
    keeper.close().await;
    Ok((took.as_secs_f64() * 1000.0, slowest.as_secs_f64() * 1000.0))
}
