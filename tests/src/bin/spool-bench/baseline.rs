//! The baselines: `pgbench` running the SQL Spool runs (scripts in `tests/bench/`, kept in
//! sync with the Rust code they mirror) and `redis-benchmark` running `XADD`, on the same
//! Postgres and Redis, in the same run as the Spool figure they are compared with.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use hdrhistogram::Histogram;

use crate::report::histogram;

/// `POST user_message`'s transaction for a new thread (see the file's header).
pub(crate) const ENQUEUE_SQL: &str = include_str!("../../../bench/enqueue.sql");
/// The counters a bench run carries with every `SPOOL_QUOTA_*` set ([`QUOTA_SETTINGS`]), as
/// `runs.quota` stores them.
const QUOTA_JSON: &str = r#"'{"counters": [{"owner_id": "", "agent_id": "", "limits": {"runs_per_hour": 1000000, "max_concurrent_runs": 100000, "daily_token_budget": 1000000000000}}, {"owner_id": "bench-user", "agent_id": "", "limits": {"runs_per_hour": 1000000, "max_concurrent_runs": 100000, "daily_token_budget": 1000000000000}}]}'::jsonb"#;

/// Every quota, each at its highest (so none refuses a bench request).
pub(crate) const QUOTA_SETTINGS: [(&str, &str); 6] = [
    ("SPOOL_QUOTA_USER_RUNS_PER_HOUR", "1000000"),
    ("SPOOL_QUOTA_TENANT_RUNS_PER_HOUR", "1000000"),
    ("SPOOL_QUOTA_USER_CONCURRENT_RUNS", "100000"),
    ("SPOOL_QUOTA_TENANT_CONCURRENT_RUNS", "100000"),
    ("SPOOL_QUOTA_USER_DAILY_TOKENS", "1000000000000"),
    ("SPOOL_QUOTA_TENANT_DAILY_TOKENS", "1000000000000"),
];

/// [`ENQUEUE_SQL`] as the enqueue runs it under [`QUOTA_SETTINGS`]: the run carries its
/// counters (which Redis admitted it against before the statement: shared/src/quota/admission.rs;
/// pgbench has no part of that).
pub(crate) fn enqueue_sql_with_quotas() -> anyhow::Result<String> {
    const QUOTA: &str = "/* quota */ NULL";
    anyhow::ensure!(
        ENQUEUE_SQL.matches(QUOTA).count() == 1,
        "tests/bench/enqueue.sql no longer has one quota column"
    );
    Ok(ENQUEUE_SQL.replace(QUOTA, QUOTA_JSON))
}

/// [`ENQUEUE_SQL`] with the NOTIFY in the statement: the baseline issue 14 names for P1, "the
/// three rows and the NOTIFY" in one transaction (Spool sends its NOTIFY after the commit,
/// folded across enqueues: api/src/wake.rs).
pub(crate) fn enqueue_sql_with_notify() -> anyhow::Result<String> {
    const LAST: &str = "SELECT true FROM thread;";
    anyhow::ensure!(
        ENQUEUE_SQL.matches(LAST).count() == 1,
        "tests/bench/enqueue.sql no longer ends with {LAST}"
    );
    Ok(ENQUEUE_SQL.replace(LAST, "SELECT pg_notify('spool_runs', '') FROM thread;"))
}

/// One no-op run's whole SQL lifecycle (see the file's header).
pub(crate) const LIFECYCLE_SQL: &str = include_str!("../../../bench/lifecycle.sql");

pub(crate) struct Pgbench {
    /// Transactions per second, as pgbench reports it (without connection time).
    pub(crate) tps: f64,
    /// Transactions run.
    pub(crate) transactions: u64,
    /// Each transaction's latency, µs.
    pub(crate) latency: Histogram<u64>,
}

fn scratch_dir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!(
        "spool-bench-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    ));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// The redesigned worker's cycle (issue 44): a batch of finishes and the next claim, with each
/// claimed run's history, in one statement (see the file's header). Run beside [`ENQUEUE_SQL`]
/// by [`pgbench_batched_lifecycle`].
pub(crate) const LIFECYCLE_BATCHED_SQL: &str = include_str!("../../../bench/lifecycle_batched.sql");

/// The runs per batch of [`LIFECYCLE_BATCHED_SQL`] (its k): the review's conservative end (its
/// estimates use 4 and 8; today's claims already take 2-3 runs under P5's load).
pub(crate) const BATCH: u32 = 4;

/// Runs `script` with `clients` connections for `duration` (whole seconds, at least 1).
pub(crate) async fn pgbench(
    db_url: &str,
    script: &str,
    clients: usize,
    duration: Duration,
) -> anyhow::Result<Pgbench> {
    pgbench_scripts(db_url, &[(script, 1)], &[], clients, duration).await
}

/// [`LIFECYCLE_BATCHED_SQL`] beside [`ENQUEUE_SQL`], weighted [`BATCH`] to 1 (each client
/// enqueues a batch's worth of runs per cycle, on average), on a database of its own. Its
/// transactions are enqueues and cycles alike: the runs it completed come from the database.
pub(crate) async fn pgbench_batched_lifecycle(
    db_url: &str,
    clients: usize,
    duration: Duration,
) -> anyhow::Result<Pgbench> {
    // The claim's room: the slots the batch frees and those a short claim left free.
    let room = (2 * BATCH).to_string();
    pgbench_scripts(
        db_url,
        &[(ENQUEUE_SQL, BATCH), (LIFECYCLE_BATCHED_SQL, 1)],
        &[("room", &room), ("held_ids", "{}"), ("held_attempts", "{}")],
        clients,
        duration,
    )
    .await
}

/// Runs `scripts` (each with its weight: pgbench picks one per transaction) with `defines` set
/// (`-D`), `clients` connections, for `duration` (whole seconds, at least 1).
async fn pgbench_scripts(
    db_url: &str,
    scripts: &[(&str, u32)],
    defines: &[(&str, &str)],
    clients: usize,
    duration: Duration,
) -> anyhow::Result<Pgbench> {
    let dir = scratch_dir()?;
    let mut files = Vec::new();
    for (i, (script, weight)) in scripts.iter().enumerate() {
        let file = dir.join(format!("script{i}.sql"));
        std::fs::write(&file, script)?;
        files.push(format!("{}@{weight}", file.display()));
    }
    let prefix = dir.join("txn");
    let seconds = duration.as_secs().max(1).to_string();
    let clients = clients.to_string();
    let threads = clients.parse::<usize>().unwrap_or(1).min(2).to_string();
    let output = tokio::process::Command::new("pgbench")
        .args([
            "-n", "-M", "prepared", "-c", &clients, "-j", &threads, "-T", &seconds, "-l",
        ])
        .arg(format!("--log-prefix={}", prefix.display()))
        .args(
            defines
                .iter()
                .map(|(name, value)| format!("--define={name}={value}")),
        )
        .args(files.iter().flat_map(|file| ["-f", file]))
        .arg(db_url)
        .current_dir(&dir)
        .output()
        .await
        .context("running pgbench (is it installed?)")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!(
            "pgbench failed: {}\n{stdout}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let tps = stdout
        .lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse::<f64>().ok())
        .with_context(|| format!("no tps in pgbench's output:\n{stdout}"))?;
    let failed = stdout
        .lines()
        .find_map(|l| l.strip_prefix("number of failed transactions: "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(0);
    if failed > 0 {
        bail!("pgbench: {failed} transactions failed:\n{stdout}");
    }
    // Per-transaction log: `client_id transaction_no time_us script_no epoch epoch_us`.
    let mut latency = histogram();
    let mut transactions = 0;
    for entry in std::fs::read_dir(&dir)?.flatten() {
        if !entry.file_name().to_string_lossy().starts_with("txn") {
            continue;
        }
        for line in std::fs::read_to_string(entry.path())?.lines() {
            if let Some(us) = line.split(' ').nth(2).and_then(|v| v.parse::<u64>().ok()) {
                latency.saturating_record(us.max(1));
                transactions += 1;
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Pgbench {
        tps,
        transactions,
        latency,
    })
}

/// `redis-benchmark` `XADD` of a `payload`-sized field from one connection, `pipeline` commands
/// in flight; returns operations per second.
pub(crate) async fn xadd_per_second(
    redis_url: &str,
    key: &str,
    payload: usize,
    pipeline: usize,
    requests: usize,
) -> anyhow::Result<f64> {
    let node = spool_shared::redis_conn::nodes(redis_url)
        .into_iter()
        .next()
        .unwrap_or_else(|| redis_url.to_owned());
    let hostport = node
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .to_owned();
    let (host, port) = hostport.rsplit_once(':').unwrap_or((&hostport, "6379"));
    let value = "x".repeat(payload);
    let output = tokio::process::Command::new("redis-benchmark")
        .args(["-h", host, "-p", port, "-c", "1", "--csv"])
        .args(["-P", &pipeline.to_string(), "-n", &requests.to_string()])
        .args(["XADD", key, "*", "e", &value])
        .output()
        .await
        .context("running redis-benchmark (is it installed?)")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let _ = tokio::process::Command::new("redis-cli")
        .args(["-h", host, "-p", port, "DEL", key])
        .output()
        .await;
    // `"test","rps",...` then `"XADD ...","123456.78",...`
    stdout
        .lines()
        .nth(1)
        .and_then(|l| l.split("\",\"").nth(1))
        .and_then(|v| v.trim_matches('"').parse::<f64>().ok())
        .with_context(|| format!("no rate in redis-benchmark's output:\n{stdout}"))
}

/// P2's floor: the hops a run's first event takes, with nothing of Spool in between. A
/// committed `pg_notify` reaches a `LISTEN`ing connection, which then `XADD`s and `PUBLISH`es
/// in one pipeline, and a pub/sub subscriber receives it. The latency of each of `n` rounds, µs.
pub(crate) async fn hop_chain(
    db_url: &str,
    redis_url: &str,
    n: usize,
) -> anyhow::Result<Histogram<u64>> {
    use futures::StreamExt as _;

    let pool = sqlx::PgPool::connect(db_url).await?;
    let mut listener = sqlx::postgres::PgListener::connect(db_url).await?;
    listener.listen("spool_bench_hops").await?;
    let node = spool_shared::redis_conn::nodes(redis_url)
        .into_iter()
        .next()
        .unwrap_or_else(|| redis_url.to_owned());
    let client = redis::Client::open(node)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let (mut sink, mut messages) = client.get_async_pubsub().await?.split();
    let channel = format!("spool_bench_hops_{}", uuid::Uuid::new_v4().simple());
    sink.subscribe(&channel).await?;
    let key = format!("{channel}:events");
    let mut latency = histogram();
    for _ in 0..n {
        let sent = std::time::Instant::now();
        sqlx::query("SELECT pg_notify('spool_bench_hops', '')")
            .execute(&pool)
            .await?;
        listener.recv().await?;
        let _: (String, i64) = redis::pipe()
            .xadd(&key, "*", &[("e", "{}")])
            .publish(&channel, "x")
            .query_async(&mut conn)
            .await?;
        messages.next().await.context("pub/sub closed")?;
        latency.saturating_record(sent.elapsed().as_micros().max(1) as u64);
    }
    let _: i64 = redis::cmd("DEL").arg(&key).query_async(&mut conn).await?;
    Ok(latency)
}
