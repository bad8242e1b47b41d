//! The six scenarios of BENCHMARKS.md. Each starts its own Spool processes on a fresh database
//! and Redis prefix, measures Spool and its baseline alternately in every round, and reports
//! medians over the rounds.
//!
//! Over 800 lines (a benchmark tool, not served code): each scenario keeps its Spool measure
//! and its baseline side by side, which is what a reader checks first; the counters
//! ([`crate::meter`]), the baselines ([`crate::baseline`]), P7 ([`crate::growth`]) and P8
//! ([`crate::webhooks`]) live in their own modules.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use hdrhistogram::Histogram;
use spool_tests::TestDb;
use spool_tests::sse::{Frame, SseReader};
use sqlx::Connection as _;
use tokio::task::JoinSet;

use crate::baseline::{
    ENQUEUE_SQL, QUOTA_SETTINGS, enqueue_sql_with_notify, enqueue_sql_with_quotas, hop_chain,
    pgbench, xadd_per_second,
};
use crate::count::{Counter, End};
use crate::cpu::{Groups, Perf, Snapshot, machine_busy_secs, pids_named, rss_kib};
use crate::load::{Until, enqueue};
use crate::meter::{Lifecycle, Meter, completed_runs, cost_figures, database_of, lifecycle_twin};
use crate::report::{Figure, Report, histogram, ms};
use crate::stack::{Stack, wait_for};

/// How large and long each scenario is.
#[derive(Clone, Debug)]
pub(crate) struct Sizes {
    pub(crate) rounds: usize,
    /// Concurrent clients of P1 and P5 (and pgbench's clients).
    pub(crate) concurrency: usize,
    /// Length of each P1 round (whole seconds: pgbench's `-T`).
    pub(crate) seconds: u64,
    /// Runs per P2 round.
    pub(crate) p2_runs: usize,
    /// Deltas of the P3 run.
    pub(crate) p3_deltas: usize,
    /// Subscriber counts of P4.
    pub(crate) subscribers: Vec<usize>,
    /// Runs per P5 round.
    pub(crate) p5_runs: u64,
    /// The lease of P6, seconds.
    pub(crate) lease_secs: f64,
    /// How long P1 and P5 wait after their measured phase before reading the servers'
    /// counters (Postgres reports an idle backend's statistics late: [`crate::meter::SETTLE`];
    /// none with `--smoke`, whose counts are then short).
    pub(crate) settle: Duration,
    /// Where `perf record` profiles of the first round go, if anywhere.
    pub(crate) perf: Option<std::path::PathBuf>,
    /// How big P7 is.
    pub(crate) growth: crate::growth::GrowthSizes,
}

/// Our processes plus the Postgres and Redis servers, for `perf`.
fn everything(stack: &Stack) -> Vec<u32> {
    let mut pids = vec![stack.api_pid()];
    pids.extend(stack.worker_pids());
    pids.extend(pids_named("postgres"));
    pids.extend(pids_named("redis-server"));
    pids
}

const WAIT: Duration = Duration::from_secs(120);

fn groups(stack: &Stack) -> Groups {
    Groups {
        api: vec![stack.api_pid()],
        workers: stack.worker_pids(),
    }
}

/// P1: `POST user_message` to new threads vs pgbench running the same transaction.
pub(crate) async fn p1(sizes: &Sizes, report: &mut Report) -> anyhow::Result<()> {
    const S: &str = "P1 enqueue";
    let stack = Stack::start(&[]).await?;
    // The same API with every quota set (none refusing): its enqueue takes room for each run
    // in the tenant's and the user's counters (in Redis) before its statement.
    let quota_stack = Stack::start(&QUOTA_SETTINGS).await?;
    let quota_sql = enqueue_sql_with_quotas()?;
    let notify_sql = enqueue_sql_with_notify()?;
    let c = sizes.concurrency;
    let round = Duration::from_secs(sizes.seconds);
    enqueue(&stack, c, Until::Elapsed(Duration::from_millis(500))).await?;
    enqueue(&quota_stack, c, Until::Elapsed(Duration::from_millis(500))).await?;
    pgbench(&stack.db.url, ENQUEUE_SQL, c, Duration::from_secs(1)).await?;
    pgbench(&stack.db.url, &notify_sql, c, Duration::from_secs(1)).await?;
    pgbench(&quota_stack.db.url, &quota_sql, c, Duration::from_secs(1)).await?;
    let (mut rate, mut p50, mut p99) = (vec![], vec![], vec![]);
    let (mut b_rate, mut b_p50, mut b_p99) = (vec![], vec![], vec![]);
    let (mut q_rate, mut q_p99, mut qb_rate) = (vec![], vec![], vec![]);
    let (mut n_rate, mut n_p50, mut n_p99) = (vec![], vec![], vec![]);
    let (mut i_rate, mut iq_rate) = (vec![], vec![]);
    let mut meter = Meter::connect(&stack.db.url, &stack.redis_url).await?;
    let database = database_of(&stack.db.url)?;
    let mut costs = vec![];
    for i in 0..sizes.rounds {
        let counted = meter.read(&database).await?;
        let busy = machine_busy_secs();
        let before = Snapshot::take(&groups(&stack));
        let perf = Perf::start(
            sizes.perf.as_deref().filter(|_| i == 0),
            "p1",
            &everything(&stack),
        );
        let load = enqueue(&stack, c, Until::Elapsed(round)).await?;
        let spool_busy = machine_busy_secs() - busy;
        let split = Snapshot::take(&groups(&stack)).since(&before);
        if let Some(perf) = perf {
            perf.finish().await;
        }
        // Not a wait for a condition: Postgres gives no sign that an idle backend's statistics
        // are still to come; this is the bound of their delay.
        tokio::time::sleep(sizes.settle).await;
        let cost = meter.read(&database).await?.since(&counted, load.count, 0);
        if i == 0 {
            report.note(
                S,
                format!(
                    "per request (deltas around the Spool round, {} s after it): {}",
                    sizes.settle.as_secs(),
                    cost.describe()
                ),
            );
        }
        costs.push(cost);
        rate.push(load.rate);
        p50.push(ms(&load.latency, 0.5));
        p99.push(ms(&load.latency, 0.99));
        let busy = machine_busy_secs();
        let base = pgbench(&stack.db.url, ENQUEUE_SQL, c, round).await?;
        let base_busy = machine_busy_secs() - busy;
        b_rate.push(base.tps);
        b_p50.push(ms(&base.latency, 0.5));
        b_p99.push(ms(&base.latency, 0.99));
        let notify = pgbench(&stack.db.url, &notify_sql, c, round).await?;
        n_rate.push(notify.tps);
        n_p50.push(ms(&notify.latency, 0.5));
        n_p99.push(ms(&notify.latency, 0.99));
        let busy = machine_busy_secs();
        let before = Snapshot::take(&groups(&quota_stack));
        let quota_load = enqueue(&quota_stack, c, Until::Elapsed(round)).await?;
        let quota_busy = machine_busy_secs() - busy;
        let quota_split = Snapshot::take(&groups(&quota_stack)).since(&before);
        q_rate.push(quota_load.rate);
        q_p99.push(ms(&quota_load.latency, 0.99));
        qb_rate.push(
            pgbench(&quota_stack.db.url, &quota_sql, c, round)
                .await?
                .tps,
        );
        let (plain, quota) = interleaved(&stack, &quota_stack, c, sizes.seconds).await?;
        i_rate.push(plain);
        iq_rate.push(quota);
        if i == 0 {
            report.note(
                S,
                format!(
                    "{c} clients, distinct new threads, no workers; \
                Spool round: {} requests, CPU {}; machine CPU per request {:.3} ms vs \
                {:.3} ms per pgbench transaction ({} of them)",
                    load.count,
                    split.describe(load.count),
                    spool_busy * 1000.0 / load.count.max(1) as f64,
                    base_busy * 1000.0 / base.transactions.max(1) as f64,
                    base.transactions,
                ),
            );
            report.note(
                S,
                format!(
                    "every quota set: {} requests, CPU {}; machine CPU per request {:.3} ms",
                    quota_load.count,
                    quota_split.describe(quota_load.count),
                    quota_busy * 1000.0 / quota_load.count.max(1) as f64,
                ),
            );
        }
    }
    // Issue 11's goal: P1 must not drop by more than 10% with every quota set. Spool with
    // quotas against Spool without, in the same rounds, is the figure; pgbench cannot run the
    // admission (a Redis script), so the ratio to pgbench with quotas only shows what the
    // admission costs over the rows it writes.
    let ratio = |spool: &[f64], base: &[f64]| -> Vec<f64> {
        spool.iter().zip(base).map(|(s, b)| s / b).collect()
    };
    let p1_ratio = ratio(&rate, &b_rate);
    let p1_quota_ratio = ratio(&q_rate, &qb_rate);
    report.add(Figure::new(S, "requests/s", "req/s", rate.clone()).against(
        "pgbench, the three rows and the NOTIFY in one transaction (issue 14)",
        n_rate,
        Some(0.8),
    ));
    report.add(Figure::new(S, "latency p50", "ms", p50.clone()).against(
        "that pgbench's p50",
        n_p50,
        None,
    ));
    report.add(Figure::new(S, "latency p99", "ms", p99.clone()).against(
        "that pgbench's p99",
        n_p99,
        None,
    ));
    report.add(Figure::new(S, "requests/s", "req/s", rate.clone()).against(
        "pgbench, the same SQL (without the NOTIFY Spool sends apart)",
        b_rate,
        None,
    ));
    report.add(Figure::new(S, "latency p50", "ms", p50).against("that pgbench's p50", b_p50, None));
    report.add(Figure::new(S, "latency p99", "ms", p99.clone()).against(
        "that pgbench's p99",
        b_p99,
        None,
    ));
    report.add(
        Figure::new(S, "requests/s, every quota set", "req/s", q_rate.clone()).against(
            "Spool without quotas, same run",
            rate,
            None,
        ),
    );
    report.add(
        Figure::new(
            S,
            "requests/s, every quota set, interleaved 1 s slices",
            "req/s",
            iq_rate,
        )
        .against(
            "Spool without quotas, the slices between",
            i_rate,
            Some(0.9),
        ),
    );
    report.add(
        Figure::new(S, "latency p99, every quota set", "ms", q_p99).against(
            "Spool p99 without quotas",
            p99,
            None,
        ),
    );
    report.add(
        Figure::new(
            S,
            "requests/s, every quota set (vs pgbench)",
            "req/s",
            q_rate,
        )
        .against(
            "pgbench, the same SQL with the quota column (admission is in Redis)",
            qb_rate,
            None,
        ),
    );
    report.add(
        Figure::new(
            S,
            "P1 ratio (Spool ÷ pgbench, same SQL), every quota set",
            "×",
            p1_quota_ratio,
        )
        .against("P1 ratio without quotas, same run", p1_ratio, None),
    );
    for figure in cost_figures(S, "request", &costs) {
        report.add(figure);
    }
    Ok(())
}

/// Issue 11's measure, paired: `slices` one-second slices of P1 against each stack,
/// alternated (plain, quota, quota, plain, ...), so that the machine's drift within a round (a
/// checkpoint, autovacuum, the tables' growth: P1's 5 s rounds move by up to 40 % from one to
/// the next) falls on both alike instead of on whichever ran in the worse seconds. Returns the
/// requests/s of each over its slices: without quotas, with every quota set.
async fn interleaved(
    plain: &Stack,
    quota: &Stack,
    c: usize,
    slices: u64,
) -> anyhow::Result<(f64, f64)> {
    let slice = Until::Elapsed(Duration::from_secs(1));
    let (mut counts, mut secs) = ([0u64; 2], [0f64; 2]);
    for k in 0..slices * 2 {
        // Which stack runs this slice: ABBA order, 0 = without quotas.
        let which = (k.div_ceil(2) % 2) as usize;
        let started = Instant::now();
        let load = enqueue([plain, quota][which], c, slice).await?;
        counts[which] += load.count;
        secs[which] += started.elapsed().as_secs_f64();
    }
    Ok((counts[0] as f64 / secs[0], counts[1] as f64 / secs[1]))
}

/// A frame's entry id's millisecond timestamp (Redis's clock, the same machine's).
fn id_ms(frame: &Frame) -> Option<u64> {
    frame.id.as_deref()?.split('-').next()?.parse().ok()
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Reads `reader` until `done`; returns the `done` frame.
async fn until_done(reader: &mut SseReader) -> anyhow::Result<Frame> {
    loop {
        let frame = reader
            .next(Duration::from_secs(30))
            .await
            .context("the stream ended before done")?;
        if frame.event == "done" {
            return Ok(frame);
        }
    }
}

/// Posts a turn on `thread` and follows its stream to `done`; returns the `done`'s id, the
/// cursor the next turn resumes from. A run can finish before its stream is opened (a stream
/// opened without a cursor then answers `message_not_streaming`, as the contract says; a client
/// would fetch the message over REST): the turn is posted again, up to five times. A client the
/// gateway drops as too slow resumes from its last id.
async fn first_turn(stack: &Stack, thread: uuid::Uuid, text: &str) -> anyhow::Result<String> {
    for _ in 0..5 {
        stack.post(thread, text).await?;
        let mut last: Option<String> = None;
        let deadline = Instant::now() + Duration::from_secs(600);
        'stream: loop {
            let mut reader = SseReader::new(stack.stream(thread, last.as_deref()).await?);
            while let Some(frame) = reader.next(Duration::from_secs(60)).await {
                match frame.event.as_str() {
                    "done" => return frame.id.context("done has an id"),
                    "message_not_streaming" if last.is_none() => break 'stream,
                    _ => {}
                }
                last = frame.id.or(last);
            }
            anyhow::ensure!(last.is_some(), "the stream ended before any event");
            anyhow::ensure!(Instant::now() < deadline, "no done within 10 minutes");
        }
    }
    bail!("five runs in a row finished before their stream was opened")
}

/// P2: POST → first event at the client, one thread, turn after turn, demo model at zero delay.
pub(crate) async fn p2(sizes: &Sizes, report: &mut Report) -> anyhow::Result<()> {
    const S: &str = "P2 first event";
    let mut stack = Stack::start(&[]).await?;
    stack.worker(&[("SPOOL_DEMO_TOKENS", "3")]).await?;
    let thread = uuid::Uuid::new_v4();
    // The first turn creates the thread; every later turn resumes from the last `done`, as a
    // chat client does (the run may finish before the stream request arrives).
    let mut cursor = first_turn(&stack, thread, "hello").await?;
    let (mut p50, mut p99, mut post50, mut lag99) = (vec![], vec![], vec![], vec![]);
    let (mut hop50, mut hop99) = (vec![], vec![]);
    let mut runs = 0;
    for i in 0..sizes.rounds {
        let before = Snapshot::take(&groups(&stack));
        let (mut first, mut post, mut lag) = (histogram(), histogram(), histogram());
        let perf = Perf::start(
            sizes.perf.as_deref().filter(|_| i == 0),
            "p2",
            &everything(&stack),
        );
        for _ in 0..sizes.p2_runs {
            let sent = Instant::now();
            stack.post(thread, "hi").await?;
            post.saturating_record(sent.elapsed().as_micros() as u64);
            let mut reader = SseReader::new(stack.stream(thread, Some(&cursor)).await?);
            let frame = reader
                .next(Duration::from_secs(30))
                .await
                .context("no event")?;
            first.saturating_record(sent.elapsed().as_micros() as u64);
            if frame.event != "message_start" {
                bail!("the first event was {}", frame.event);
            }
            if let Some(at) = id_ms(&frame) {
                lag.saturating_record((now_us() / 1000).saturating_sub(at) * 1000);
            }
            cursor = until_done(&mut reader)
                .await?
                .id
                .context("done has an id")?;
            runs += 1;
        }
        let split = Snapshot::take(&groups(&stack)).since(&before);
        if let Some(perf) = perf {
            perf.finish().await;
        }
        if i == 0 {
            report.note(
                S,
                format!(
                    "{} runs per round on one thread, demo model (3 deltas, no \
                delay), 1 worker; each turn: POST, then GET stream with Last-Event-ID = the \
                last `done`; POST alone p50 {:.2} ms; CPU per run: {}",
                    sizes.p2_runs,
                    ms(&post, 0.5),
                    split.describe(sizes.p2_runs as u64)
                ),
            );
        }
        p50.push(ms(&first, 0.5));
        p99.push(ms(&first, 0.99));
        let hops = hop_chain(&stack.db.url, &stack.redis_url, sizes.p2_runs).await?;
        hop50.push(ms(&hops, 0.5));
        hop99.push(ms(&hops, 0.99));
        post50.push(ms(&post, 0.5));
        lag99.push(ms(&lag, 0.99));
    }
    report.note(S, format!("{runs} runs measured"));
    let floor = "raw hops: NOTIFY → LISTEN → XADD+PUBLISH → subscriber";
    report.add(
        Figure::new(S, "POST → first event p50", "ms", p50)
            .against(floor, hop50, None)
            .at_most(5.0),
    );
    report.add(
        Figure::new(S, "POST → first event p99", "ms", p99)
            .against(floor, hop99, None)
            .at_most(20.0),
    );
    report.add(Figure::new(S, "POST → 202 p50", "ms", post50));
    report.add(Figure::new(
        S,
        "XADD → client p99 (1 ms clock)",
        "ms",
        lag99,
    ));
    Ok(())
}

/// P3: one run streaming many tiny deltas; events/s at one client vs redis-benchmark XADD.
/// Twice: as deployed (deltas the publisher has not sent yet are merged, up to 4 KiB), and with
/// `SPOOL_COALESCE_MAX_BYTES=0`, where every delta is an event of its own.
pub(crate) async fn p3(sizes: &Sizes, report: &mut Report) -> anyhow::Result<()> {
    const S: &str = "P3 event throughput";
    for coalesce in ["4096", "0"] {
        let merged = coalesce != "0";
        let label = if merged {
            "coalesced (default)"
        } else {
            "one event per delta"
        };
        let mut stack = Stack::start(&[]).await?;
        let deltas = sizes.p3_deltas.to_string();
        stack
            .worker(&[
                ("SPOOL_DEMO_TOKENS", &deltas),
                ("SPOOL_WORKER_CONCURRENCY", "1"),
                ("SPOOL_COALESCE_MAX_BYTES", coalesce),
            ])
            .await?;
        let (mut events_s, mut deltas_s, mut plain, mut piped) = (vec![], vec![], vec![], vec![]);
        let key = format!("{}:xadd-baseline", stack.prefix);
        let payload = 200;
        // One thread, a first turn to get a cursor: a measured run is followed from the last
        // `done`, so it is streamed whole even if it finishes before the stream is opened.
        let thread = uuid::Uuid::new_v4();
        let mut cursor = first_turn(&stack, thread, "warm up").await?;
        for i in 0..sizes.rounds {
            let before = Snapshot::take(&groups(&stack));
            let name = if merged { "p3" } else { "p3-uncoalesced" };
            let perf = Perf::start(
                sizes.perf.as_deref().filter(|_| i == 0),
                name,
                &everything(&stack),
            );
            // Timed from the POST: the run may be over before its stream is opened (its
            // events are then replayed), so the stream's opening is no start to count from.
            let start = Instant::now();
            stack.post(thread, "go").await?;
            // A client that falls more than the gateway's ring behind is dropped and resumes
            // from its last id, as EventSource does; the resumes are counted.
            let mut counter = Counter::after(&cursor);
            let mut response = stack.stream(thread, Some(&cursor)).await?;
            let mut resumed = 0;
            loop {
                match counter.read(response, Duration::from_secs(60)).await? {
                    End::Done => break,
                    End::Closed => {
                        let last = counter.last_id.as_deref().context("no cursor")?;
                        response = stack.stream(thread, Some(last)).await?;
                        resumed += 1;
                    }
                    // The worker gave up publishing what it had queued after its flush window
                    // (a machine too slow for a million events, say): the round cannot count.
                    End::Gone(what) => bail!(
                        "{name}: the stream ended with {what} after {} events: the run's \
                         events did not all reach Redis (see the worker's log)",
                        counter.events
                    ),
                }
            }
            cursor = counter.last_id.clone().context("done has an id")?;
            let (events, bytes) = (counter.events, counter.bytes);
            let elapsed = start.elapsed().as_secs_f64();
            let split = Snapshot::take(&groups(&stack)).since(&before);
            if let Some(perf) = perf {
                perf.finish().await;
            }
            events_s.push(events as f64 / elapsed);
            deltas_s.push(sizes.p3_deltas as f64 / elapsed);
            let plain_n = 100_000.min(sizes.p3_deltas);
            plain.push(xadd_per_second(&stack.redis_url, &key, payload, 1, plain_n).await?);
            piped
                .push(xadd_per_second(&stack.redis_url, &key, payload, 64, sizes.p3_deltas).await?);
            if i == 0 {
                report.note(
                    S,
                    format!(
                        "{label}: {} deltas in {events} events, {elapsed:.2} s from \
                    the POST to done at the client (which resumes from the last turn's `done`), {} bytes of event data on average, {resumed} \
                    resumes after the gateway dropped the client as too slow; \
                    redis-benchmark: 1 connection, XADD of a {payload}-byte field; CPU: {}",
                        sizes.p3_deltas,
                        bytes / events.max(1) as usize,
                        split.describe(events)
                    ),
                );
            }
        }
        let pipelined = "redis-benchmark XADD pipelined (-P 64)";
        let target = (!merged).then_some(0.25);
        report.add(
            Figure::new(
                S,
                &format!("SSE events/s, {label}"),
                "events/s",
                events_s.clone(),
            )
            .against(pipelined, piped.clone(), target),
        );
        report.add(
            Figure::new(S, &format!("SSE events/s, {label}"), "events/s", events_s).against(
                "redis-benchmark XADD (-P 1)",
                plain,
                None,
            ),
        );
        report.add(
            Figure::new(S, &format!("model deltas/s, {label}"), "deltas/s", deltas_s).against(
                pipelined,
                piped,
                merged.then_some(0.25),
            ),
        );
    }
    Ok(())
}

/// P4: many SSE subscribers on one API process: memory, Redis connections, delivery latency.
pub(crate) async fn p4(sizes: &Sizes, report: &mut Report) -> anyhow::Result<()> {
    const S: &str = "P4 fan-out";
    let mut levels: Vec<(usize, bool)> = sizes.subscribers.iter().map(|&n| (n, false)).collect();
    // And the largest count again over HTTP/2 (h2c, 100 streams per connection), as a proxy
    // that multiplexes its clients' streams would connect.
    if let Some(&largest) = sizes.subscribers.iter().max() {
        levels.push((largest, true));
    }
    for (n, http2) in levels {
        // The bench's one user stands for every subscriber's: no per-user stream limit; and
        // `--subscribers` may ask for more than the process's default limit.
        let mut stack = Stack::start(&[
            ("SPOOL_SSE_MAX_STREAMS_PER_USER", "0"),
            ("SPOOL_SSE_MAX_STREAMS", "0"),
        ])
        .await?;
        let threads = n.div_ceil(100).max(1);
        let mut ids = Vec::with_capacity(threads);
        for _ in 0..threads {
            let thread = uuid::Uuid::new_v4();
            stack.post(thread, "fan out").await?;
            ids.push(thread);
        }
        // Warm the gateway (its Redis connections, allocator) before the idle baseline.
        let mut warm = SseReader::new(stack.stream(ids[0], None).await?);
        let _ = warm.next(Duration::from_millis(1)).await;
        drop(warm);
        let api = stack.api_pid();
        let idle = rss_kib(api).context("api rss")?;
        let opened = Arc::new(AtomicUsize::new(0));
        let mut readers = JoinSet::new();
        let mut clients = vec![stack.client()];
        if http2 {
            clients = (0..n.div_ceil(100))
                .map(|_| stack.client_over_http2())
                .collect::<anyhow::Result<_>>()?;
        }
        let started = Instant::now();
        let gate = Arc::new(tokio::sync::Semaphore::new(256));
        for k in 0..n {
            let thread = ids[k % threads];
            let client = clients[(k / 100) % clients.len()].clone();
            let (opened, gate) = (opened.clone(), gate.clone());
            readers.spawn(async move {
                let permit = gate.acquire_owned().await?;
                let response = client.stream(thread, None).await?;
                drop(permit);
                opened.fetch_add(1, Ordering::Relaxed);
                let mut reader = SseReader::new(response);
                let mut latency = histogram();
                loop {
                    let frame = reader
                        .next(Duration::from_secs(120))
                        .await
                        .context("the stream ended before done")?;
                    if let Some(at) = id_ms(&frame) {
                        latency.saturating_record((now_us().saturating_sub(at * 1000)).max(1));
                    }
                    if frame.event == "done" {
                        return anyhow::Ok(latency);
                    }
                }
            });
        }
        wait_for("every subscriber to be connected", WAIT, async || {
            (opened.load(Ordering::Relaxed) == n).then_some(())
        })
        .await?;
        let connect = started.elapsed().as_secs_f64();
        let open = wait_for("the gateway to count every stream", WAIT, async || {
            let url = stack.url("/metrics");
            let open = spool_tests::gauge(&stack.http, &url, "spool_sse_streams_open").await?;
            (open as usize >= n).then_some(open)
        })
        .await?;
        let busy = rss_kib(api).context("api rss")?;
        let per = (busy.saturating_sub(idle)) as f64 * 1024.0 / n as f64;
        let redis_conns = spool_tests::process::connections_to_port(api, 6379);
        // Now stream to all of them: one run per thread, 20 deltas 100 ms apart.
        let concurrency = threads.to_string();
        let before = Snapshot::take(&groups(&stack));
        stack
            .worker(&[
                ("SPOOL_DEMO_TOKENS", "20"),
                ("SPOOL_DEMO_DELAY_MS", "100"),
                ("SPOOL_WORKER_CONCURRENCY", &concurrency),
            ])
            .await?;
        let perf = Perf::start(
            sizes.perf.as_deref(),
            &format!("p4-{n}"),
            &everything(&stack),
        );
        let mut latency: Histogram<u64> = histogram();
        while let Some(reader) = readers.join_next().await {
            latency.add(reader??)?;
        }
        let split = Snapshot::take(&groups(&stack)).since(&before);
        if let Some(perf) = perf {
            perf.finish().await;
        }
        let peak = rss_kib(api).unwrap_or(0);
        let label = format!("{n} subscribers{}", if http2 { " over HTTP/2" } else { "" });
        report.note(
            S,
            format!(
                "{label} on {threads} threads (connected in \
            {connect:.1} s); API RSS {idle} KiB idle → {busy} KiB with every stream open \
            ({open} open per its metrics) → {peak} KiB after streaming; {} deliveries; CPU \
            while streaming: {}",
                latency.len(),
                split.describe(0)
            ),
        );
        report.add(
            Figure::new(
                S,
                &format!("RSS per idle subscriber, {label}"),
                "KiB",
                vec![per / 1024.0],
            )
            .at_most(8.0),
        );
        report.add(
            Figure::new(
                S,
                &format!("Redis connections, {label}"),
                "conns",
                vec![redis_conns as f64],
            )
            .at_most(8.0),
        );
        report.add(Figure::new(
            S,
            &format!("delivery p99 while streaming, {label}"),
            "ms",
            vec![ms(&latency, 0.99)],
        ));
        report.add(Figure::new(
            S,
            &format!("delivery p50 while streaming, {label}"),
            "ms",
            vec![ms(&latency, 0.5)],
        ));
    }
    Ok(())
}

/// P5: no-op runs completed per second with 2 workers vs pgbench running their SQL lifecycle.
pub(crate) async fn p5(sizes: &Sizes, report: &mut Report) -> anyhow::Result<()> {
    const S: &str = "P5 run throughput";
    let mut stack = Stack::start(&[]).await?;
    for _ in 0..2 {
        stack.worker(&[("SPOOL_DEMO_TOKENS", "3")]).await?;
    }
    // The baseline runs on a database of its own, so the workers never claim its runs; the
    // redesign's twin on another, so each twin's commits are its own.
    let scratch = TestDb::new().await?;
    let scratch_batched = TestDb::new().await?;
    let mut meter = Meter::connect(&stack.db.url, &stack.redis_url).await?;
    let database = database_of(&stack.db.url)?;
    // The completion poll's own connection: its queries are commits in the measured database,
    // counted out of the figure (it is warmed up, so its statement is prepared already).
    let mut poll = sqlx::PgConnection::connect(&stack.db.url).await?;
    completed_runs(&mut poll).await?;
    let (mut costs, mut today, mut batched) = (vec![], vec![], vec![]);
    let c = sizes.concurrency;
    let (mut rate, mut b_rate) = (vec![], vec![]);
    let (mut arq, mut procrastinate) = (vec![], vec![]);
    let peers = spool_tests::peers::python_in("bench/peers");
    if let Err(err) = &peers {
        report.note(
            S,
            format!("the job-queue peers (tests/bench/peers) could not be installed: {err:#}"),
        );
    }
    let mut completed = 0;
    for i in 0..sizes.rounds {
        let counted = meter.read(&database).await?;
        let mut polls = 0;
        let before = Snapshot::take(&groups(&stack));
        let perf = Perf::start(
            sizes.perf.as_deref().filter(|_| i == 0),
            "p5",
            &everything(&stack),
        );
        let busy = machine_busy_secs();
        let started = Instant::now();
        enqueue(&stack, c, Until::Posted(sizes.p5_runs)).await?;
        completed += sizes.p5_runs as i64;
        wait_for("every run to complete", WAIT, async || {
            polls += 1;
            let done = completed_runs(&mut poll).await.ok()?;
            (done >= completed).then_some(())
        })
        .await?;
        let elapsed = started.elapsed().as_secs_f64();
        let spool_busy = machine_busy_secs() - busy;
        let split = Snapshot::take(&groups(&stack)).since(&before);
        if let Some(perf) = perf {
            perf.finish().await;
        }
        rate.push(sizes.p5_runs as f64 / elapsed);
        // Not a wait for a condition: the bound of Postgres's delay in reporting statistics.
        tokio::time::sleep(sizes.settle).await;
        let cost = meter
            .read(&database)
            .await?
            .since(&counted, sizes.p5_runs, polls);
        let secs = (elapsed.round() as u64).max(1);
        // Today's twin (the baseline), then the redesign's, measured alike (runs completed,
        // commits in their own databases) for the redesign's ceiling against today's.
        let length = Duration::from_secs(secs);
        let now = lifecycle_twin(&mut meter, &scratch, Lifecycle::Today, c, length).await?;
        b_rate.push(now.tps);
        let next =
            lifecycle_twin(&mut meter, &scratch_batched, Lifecycle::Batched, c, length).await?;
        if i == 0 {
            report.note(
                S,
                format!(
                    "per run (deltas around the Spool round, read {} s after it; the completion \
                     poll's own queries left out): {}",
                    sizes.settle.as_secs(),
                    cost.describe()
                ),
            );
            for (name, twin) in [
                ("today's lifecycle.sql", &now),
                ("the redesign's lifecycle_batched.sql (k = 4)", &next),
            ] {
                report.note(
                    S,
                    format!(
                        "pgbench twin, {name}: {} runs completed ({} left queued), {:.0} \
                         runs/s, machine CPU per run {:.3} ms; per run: {}",
                        twin.runs,
                        twin.queued,
                        twin.rate,
                        twin.machine_ms,
                        twin.cost.describe_postgres()
                    ),
                );
            }
        }
        if let Ok(python) = &peers {
            let jobs = sizes.p5_runs;
            arq.push(peer(python, "arq", jobs, c, &stack.redis_url, &scratch.url).await?);
            procrastinate.push(peer(python, "procrastinate", jobs, c, "", &scratch.url).await?);
        }
        if i == 0 {
            report.note(
                S,
                format!(
                    "{} runs per round posted by {c} clients to new threads \
                while 2 workers (16 slots each, demo model: 3 deltas, no delay) run them; the \
                round ends when all are completed; CPU per run: {}; machine CPU per run \
                {:.3} ms vs {:.3} ms per pgbench lifecycle ({c} clients, {} lifecycles)",
                    sizes.p5_runs,
                    split.describe(sizes.p5_runs),
                    spool_busy * 1000.0 / sizes.p5_runs as f64,
                    now.busy * 1000.0 / now.transactions.max(1) as f64,
                    now.transactions
                ),
            );
        }
        costs.push(cost);
        today.push(now);
        batched.push(next);
    }
    report.add(
        Figure::new(S, "runs completed/s", "runs/s", rate.clone()).against(
            "pgbench, the run's SQL lifecycle",
            b_rate.clone(),
            Some(0.7),
        ),
    );
    for figure in cost_figures(S, "run", &costs) {
        report.add(figure);
    }
    // Issue 44: the redesign's SQL ceiling against today's, measured alike in the same rounds.
    let each = |twins: &[crate::meter::Twin], f: fn(&crate::meter::Twin) -> f64| {
        twins.iter().map(f).collect::<Vec<_>>()
    };
    let named = "pgbench, today's lifecycle.sql";
    report.add(
        Figure::new(
            S,
            "pgbench runs completed/s, redesigned lifecycle (lifecycle_batched.sql, k = 4)",
            "runs/s",
            each(&batched, |t| t.rate),
        )
        .against(named, each(&today, |t| t.rate), None),
    );
    report.add(
        Figure::new(
            S,
            "pgbench machine CPU per run, redesigned lifecycle",
            "ms",
            each(&batched, |t| t.machine_ms),
        )
        .against(named, each(&today, |t| t.machine_ms), None),
    );
    report.add(
        Figure::new(
            S,
            "pgbench commits per run, redesigned lifecycle",
            "/run",
            each(&batched, |t| t.cost.commits),
        )
        .against(named, each(&today, |t| t.cost.commits), None),
    );
    report.add(
        Figure::new(
            S,
            "pgbench WAL flushes per run (server-wide), redesigned lifecycle",
            "/run",
            each(&batched, |t| t.cost.wal_sync),
        )
        .against(named, each(&today, |t| t.cost.wal_sync), None),
    );
    if peers.is_ok() {
        // The ceiling of the ratios below: Spool's own SQL for a run, without Spool, on the
        // same machine in the same rounds.
        report.add(
            Figure::new(
                S,
                "pgbench lifecycles/s (Spool's SQL alone)",
                "runs/s",
                b_rate,
            )
            .against(
                "procrastinate 3.10, 2 workers at its defaults (concurrency 1)",
                procrastinate.clone(),
                None,
            ),
        );
        for (name, rounds) in [
            ("arq 0.28, 2 workers at its defaults (max_jobs 10)", arq),
            (
                "procrastinate 3.10, 2 workers at its defaults (concurrency 1)",
                procrastinate,
            ),
        ] {
            report.add(
                Figure::new(S, "runs completed/s", "runs/s", rate.clone()).against(
                    name,
                    rounds,
                    Some(3.0),
                ),
            );
        }
    }
    Ok(())
}

/// One round of a job-queue peer (`tests/bench/peers/queue_peers.py`): `jobs` no-op jobs
/// enqueued by `clients` clients and run by two of its workers; jobs completed per second.
async fn peer(
    python: &std::path::Path,
    name: &str,
    jobs: u64,
    clients: usize,
    redis_url: &str,
    db_url: &str,
) -> anyhow::Result<f64> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/peers/queue_peers.py");
    let redis = redis_url
        .split(',')
        .next()
        .filter(|u| !u.is_empty())
        .unwrap_or("redis://127.0.0.1:6379");
    let output = tokio::process::Command::new(python)
        .arg(script)
        .arg(name)
        .args([
            "--jobs",
            &jobs.to_string(),
            "--clients",
            &clients.to_string(),
        ])
        .args(["--redis", redis, "--db", db_url])
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .with_context(|| format!("running the {name} peer"))?;
    if !output.status.success() {
        bail!(
            "the {name} peer failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let line: serde_json::Value = serde_json::from_slice(&output.stdout)
        .with_context(|| format!("the {name} peer's answer"))?;
    line["jobs_per_sec"]
        .as_f64()
        .with_context(|| format!("no jobs_per_sec from the {name} peer: {line}"))
}

/// P6: `kill -9` a worker mid-run: time until the run's next event at the client.
pub(crate) async fn p6(sizes: &Sizes, report: &mut Report) -> anyhow::Result<()> {
    const S: &str = "P6 recovery";
    let mut stack = Stack::start(&[]).await?;
    let lease = sizes.lease_secs.to_string();
    let heartbeat = (sizes.lease_secs / 5.0).to_string();
    let settings = [
        ("SPOOL_LEASE_SECS", lease.as_str()),
        ("SPOOL_HEARTBEAT_SECS", heartbeat.as_str()),
        ("SPOOL_DEMO_TOKENS", "100000"),
        ("SPOOL_DEMO_DELAY_MS", "10"),
    ];
    let mut current = stack.worker(&settings).await?;
    let mut gaps = vec![];
    for _ in 0..sizes.rounds {
        let thread = uuid::Uuid::new_v4();
        let accepted = stack.post(thread, "crash me").await?;
        let mut reader = SseReader::new(stack.stream(thread, None).await?);
        let attempt = loop {
            let frame = reader
                .next(Duration::from_secs(30))
                .await
                .context("no delta")?;
            if frame.event == "text_delta" {
                break frame.json()["attempt"].as_i64().unwrap_or(0);
            }
        };
        let standby = stack.worker(&settings).await?;
        let killed = Instant::now();
        stack.kill_worker(current).await;
        let next = loop {
            let frame = reader
                .next(Duration::from_secs(60))
                .await
                .context("no event after the kill")?;
            if frame.json()["attempt"].as_i64().unwrap_or(0) > attempt {
                break frame;
            }
        };
        gaps.push(killed.elapsed().as_secs_f64());
        if next.event != "attempt_restarted" {
            bail!("the new attempt began with {}", next.event);
        }
        let workflow = accepted["workflow_id"].as_str().unwrap_or_default();
        stack
            .http
            .post(stack.url(&format!("/v1/workflows/{workflow}/cancel")))
            .bearer_auth(&stack.token)
            .send()
            .await?;
        until_done(&mut reader).await?;
        current = standby;
    }
    report.note(
        S,
        format!(
            "lease {lease} s, heartbeat {heartbeat} s, poll interval 500 ms \
        (default); a standby worker is running before the kill; measured from kill -9 to \
        the new attempt's first event (`attempt_restarted`) at the client; median of {:?} s",
            gaps.iter()
                .map(|g| (g * 100.0).round() / 100.0)
                .collect::<Vec<_>>()
        ),
    );
    let figure = Figure::new(S, "kill -9 → next event", "s", gaps)
        .against("the configured lease", vec![sizes.lease_secs], None)
        .at_most(sizes.lease_secs + 1.0);
    report.add(figure);
    Ok(())
}
