//! `spool-bench`: Spool's load generator and benchmark suite.
//!
//! Each scenario starts real `spool-api` and `spool-worker` processes (the binaries built next
//! to this one: run a release build for real numbers) on a fresh database and Redis prefix,
//! measures Spool and a baseline on the same Postgres or Redis alternately in every round, and
//! reports the median of the rounds and the ratio of the medians. Latencies go into HDR
//! histograms. Output: a Markdown table on stdout, and `results.json` + `results.md` in `--out`.
//!
//! ```text
//! tests/bench.sh                 # release build, then the full suite (BENCHMARKS.md)
//! spool-bench --smoke            # every scenario for about a second (CI)
//! spool-bench p1 p3 --rounds 5   # some scenarios
//! spool-bench p7 --rounds 1      # a million threads: each measure against an empty database
//! ```
//!
//! The load generator shares the machine's cores with what it measures; each scenario's note
//! says how much CPU went to it.

mod baseline;
mod count;
mod cpu;
mod growth;
mod load;
mod meter;
mod report;
mod scenarios;
mod stack;
mod webhooks;

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Parser, ValueEnum};
use spool_tests::growth::Size;

use crate::report::Report;
use crate::scenarios::Sizes;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Scenario {
    /// Enqueue requests/s and latency vs pgbench of the same transaction.
    P1,
    /// POST → first SSE event latency.
    P2,
    /// Events/s of one run at one SSE client vs redis-benchmark XADD.
    P3,
    /// Thousands of SSE subscribers on one API process.
    P4,
    /// No-op runs/s with 2 workers vs pgbench of the run's SQL lifecycle.
    P5,
    /// kill -9 of a worker mid-run: time to the next event vs the lease.
    P6,
    /// Months of data (a million threads): each measure against an empty database.
    P7,
    /// Webhook deliveries/s vs runs completed/s; another tenant's delay beside blackholed
    /// endpoints.
    P8,
}

/// Spool's benchmark suite.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// Scenarios to run (all if none).
    #[arg(value_enum)]
    scenarios: Vec<Scenario>,

    /// Every scenario for about a second, to prove it still works (CI); no figure means anything.
    #[arg(long)]
    smoke: bool,

    /// Rounds per scenario (default 3; 1 with --smoke).
    #[arg(long)]
    rounds: Option<usize>,

    /// Concurrent clients of P1 and P5, and pgbench's clients.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,

    /// Subscriber counts of P4 (default 1000,5000,10000; 100 with --smoke).
    #[arg(long, value_delimiter = ',')]
    subscribers: Option<Vec<usize>>,

    /// Profile the first round of each scenario with `perf record` (our processes, Postgres and
    /// Redis) and write the hottest symbols to `<out>/perf/<scenario>.txt`.
    #[arg(long)]
    perf: bool,

    /// Threads of P7's filled database (default 1,000,000; 2,000 with --smoke).
    #[arg(long)]
    growth_threads: Option<i64>,

    /// Where results.json and results.md go.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpu
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned())
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib / 1024 / 1024);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    format!(
        "{model}, {cores} cores, {mem} GiB, Linux {}, {profile} build",
        kernel.trim()
    )
}

// One thread: the load generator shares 2 cores with what it measures, and a multi-threaded
// runtime spent most of its time waking its own threads (futex ping-pong per event, perf).
#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // 10k subscribers need 10k sockets here and in the API (which inherits the limit).
    let files = rlimit::increase_nofile_limit(u64::MAX).context("raising the open-file limit")?;
    let smoke = cli.smoke;
    let sizes = Sizes {
        rounds: cli.rounds.unwrap_or(if smoke { 1 } else { 3 }),
        concurrency: cli.concurrency,
        seconds: if smoke { 1 } else { 5 },
        p2_runs: if smoke { 50 } else { 1000 },
        p3_deltas: if smoke { 20_000 } else { 1_000_000 },
        subscribers: cli.subscribers.unwrap_or_else(|| {
            if smoke {
                vec![100]
            } else {
                vec![1000, 5000, 10_000]
            }
        }),
        p5_runs: if smoke { 200 } else { 3000 },
        lease_secs: if smoke { 1.0 } else { 5.0 },
        settle: if smoke {
            std::time::Duration::ZERO
        } else {
            meter::SETTLE
        },
        perf: cli.perf.then(|| cli.out.join("perf")),
        growth: growth::GrowthSizes {
            fill: match (smoke, cli.growth_threads) {
                (_, Some(threads)) => Size {
                    threads,
                    ..Size::MONTHS
                },
                (true, None) => Size {
                    threads: 2_000,
                    tenants: 20,
                    users: 5,
                },
                (false, None) => Size::MONTHS,
            },
            depth: if smoke { 100 } else { 1000 },
            turns: if smoke { 10 } else { 100 },
            requests: if smoke { 20 } else { 200 },
        },
    };
    let scenarios = if cli.scenarios.is_empty() {
        Scenario::value_variants().to_vec()
    } else {
        cli.scenarios
    };
    let mut report = Report {
        machine: machine(),
        mode: format!(
            "{}; {} round(s); open-file limit {files}",
            if smoke { "smoke" } else { "full" },
            sizes.rounds
        ),
        ..Report::default()
    };
    eprintln!("spool-bench on {}", report.machine);
    let mut failed = Vec::new();
    for scenario in scenarios {
        eprintln!("{scenario:?}…");
        let result = match scenario {
            Scenario::P1 => scenarios::p1(&sizes, &mut report).await,
            Scenario::P2 => scenarios::p2(&sizes, &mut report).await,
            Scenario::P3 => scenarios::p3(&sizes, &mut report).await,
            Scenario::P4 => scenarios::p4(&sizes, &mut report).await,
            Scenario::P5 => scenarios::p5(&sizes, &mut report).await,
            Scenario::P6 => scenarios::p6(&sizes, &mut report).await,
            Scenario::P7 => growth::p7(&sizes, &mut report).await,
            Scenario::P8 => webhooks::p8(&sizes, &mut report).await,
        };
        if let Err(err) = result {
            eprintln!("{scenario:?} failed: {err:#}");
            failed.push(format!("{scenario:?}: {err:#}"));
        }
    }
    std::fs::create_dir_all(&cli.out)?;
    let markdown = report.markdown();
    std::fs::write(cli.out.join("results.md"), &markdown)?;
    std::fs::write(
        cli.out.join("results.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    println!("{markdown}");
    anyhow::ensure!(failed.is_empty(), "scenarios failed: {failed:?}");
    Ok(())
}
