//! What a measured phase cost the servers, per run: Postgres commits (`pg_stat_database`), WAL
//! (`pg_stat_wal`, PostgreSQL 15+) and Redis commands (`INFO commandstats`), as deltas around
//! the phase divided by the runs in it (issue 44; the review's §3.10 step 2).
//!
//! Only the commits are scoped: to the scenario's own database (each scenario has one). The WAL
//! and Redis counters are the whole server's, so anything else running on the machine (other
//! test suites, autovacuum, a checkpoint) lands in them too: publish these from an idle machine.
//!
//! Postgres's statistics lag: a busy backend reports its counts at most once a second, and a
//! backend that goes idle reports the rest 10 s later (`PGSTAT_IDLE_INTERVAL`; one that exits
//! reports them on its way out). A phase's closing read therefore waits [`SETTLE`] after the
//! phase, outside `--smoke`; whatever runs in that wait (the idle workers' polls) is counted.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context as _;
use sqlx::Connection as _;
use sqlx::postgres::PgConnection;

use crate::report::Figure;

/// How long after a phase its backends' last statistics take to be reported: Postgres's
/// `PGSTAT_IDLE_INTERVAL` (10 s) and a second of margin.
pub(crate) const SETTLE: Duration = Duration::from_secs(11);

/// Commands that start a Lua script or function: one client round trip each, however many
/// commands the script runs (those are counted under their own names too).
const SCRIPT_COMMANDS: [&str; 6] = [
    "evalsha",
    "eval",
    "evalsha_ro",
    "eval_ro",
    "fcall",
    "fcall_ro",
];

/// Reads the counters of one Postgres server and one Redis server.
pub(crate) struct Meter {
    /// A connection to the server's `postgres` database, so that reading the counters adds no
    /// commit to the database being measured.
    pg: PgConnection,
    redis: redis::aio::MultiplexedConnection,
}

/// The counters at one moment.
#[derive(Clone, Debug, Default)]
pub(crate) struct Counters {
    /// `xact_commit` of the database read.
    pub(crate) commits: f64,
    pub(crate) wal_records: f64,
    pub(crate) wal_bytes: f64,
    /// WAL writes (`write()` to the WAL files).
    pub(crate) wal_write: f64,
    /// WAL flushes to disk (`fsync` and the like).
    pub(crate) wal_sync: f64,
    /// Calls by Redis command, lowercase.
    pub(crate) redis: BTreeMap<String, f64>,
}

/// The database named in a Postgres URL.
pub(crate) fn database_of(url: &str) -> anyhow::Result<String> {
    let parsed = reqwest::Url::parse(url).context("a Postgres URL")?;
    Ok(parsed.path().trim_start_matches('/').to_owned())
}

impl Meter {
    pub(crate) async fn connect(db_url: &str, redis_url: &str) -> anyhow::Result<Self> {
        let mut url = reqwest::Url::parse(db_url).context("a Postgres URL")?;
        url.set_path("/postgres");
        let pg = PgConnection::connect(url.as_str())
            .await
            .context("connecting to the postgres database for its statistics")?;
        let node = spool_shared::redis_conn::nodes(redis_url)
            .into_iter()
            .next()
            .unwrap_or_else(|| redis_url.to_owned());
        let redis = redis::Client::open(node)?
            .get_multiplexed_async_connection()
            .await?;
        Ok(Self { pg, redis })
    }

    /// The counters now, the commits those of `database`.
    pub(crate) async fn read(&mut self, database: &str) -> anyhow::Result<Counters> {
        let (commits, wal_records, wal_bytes, wal_write, wal_sync): (i64, i64, f64, i64, i64) =
            sqlx::query_as(
                "SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = $1),
                        wal_records, wal_bytes::float8, wal_write, wal_sync
                   FROM pg_stat_wal",
            )
            .bind(database)
            .fetch_one(&mut self.pg)
            .await
            .context("reading pg_stat_database and pg_stat_wal")?;
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut self.redis)
            .await?;
        Ok(Counters {
            commits: commits as f64,
            wal_records: wal_records as f64,
            wal_bytes,
            wal_write: wal_write as f64,
            wal_sync: wal_sync as f64,
            redis: command_calls(&info),
        })
    }
}

/// `cmdstat_<name>:calls=<n>,...` lines of `INFO commandstats`, by name.
fn command_calls(info: &str) -> BTreeMap<String, f64> {
    info.lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = stats
                .split(',')
                .find_map(|field| field.strip_prefix("calls="))?
                .parse::<f64>()
                .ok()?;
            Some((name.to_ascii_lowercase(), calls))
        })
        .collect()
}

/// A phase's cost per run.
#[derive(Clone, Debug, Default)]
pub(crate) struct PerRun {
    pub(crate) commits: f64,
    pub(crate) wal_records: f64,
    pub(crate) wal_bytes: f64,
    pub(crate) wal_write: f64,
    pub(crate) wal_sync: f64,
    /// Redis commands, those run inside scripts included (`INFO` left out: the meter sends it).
    pub(crate) redis_calls: f64,
    /// Script and function calls (EVALSHA and the like): client round trips.
    pub(crate) redis_scripts: f64,
    /// The most called Redis commands, per run, most first (at most five).
    pub(crate) redis_top: Vec<(String, f64)>,
}

impl Counters {
    /// What happened from `before` to `self`, per each of `runs` (less `own_commits`: the
    /// measuring side's own transactions on the database).
    pub(crate) fn since(&self, before: &Self, runs: u64, own_commits: u64) -> PerRun {
        let n = runs.max(1) as f64;
        let mut calls: Vec<(String, f64)> = self
            .redis
            .iter()
            .filter(|(name, _)| name.as_str() != "info")
            .map(|(name, after)| {
                let was = before.redis.get(name).copied().unwrap_or(0.0);
                (name.clone(), (after - was).max(0.0))
            })
            .filter(|(_, delta)| *delta > 0.0)
            .collect();
        calls.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        // Folded from 0.0: an empty f64 sum is -0.0, printed "-0.00".
        let redis_calls = calls.iter().fold(0.0, |sum, (_, d)| sum + d) / n;
        let redis_scripts = (calls.iter())
            .filter(|(name, _)| SCRIPT_COMMANDS.contains(&name.as_str()))
            .fold(0.0, |sum, (_, d)| sum + d)
            / n;
        PerRun {
            commits: (self.commits - before.commits - own_commits as f64).max(0.0) / n,
            wal_records: (self.wal_records - before.wal_records) / n,
            wal_bytes: (self.wal_bytes - before.wal_bytes) / n,
            wal_write: (self.wal_write - before.wal_write) / n,
            wal_sync: (self.wal_sync - before.wal_sync) / n,
            redis_calls,
            redis_scripts,
            redis_top: calls.into_iter().take(5).map(|(c, d)| (c, d / n)).collect(),
        }
    }
}

impl PerRun {
    /// The Postgres part of [`PerRun::describe`] (a pgbench twin makes no Redis calls).
    pub(crate) fn describe_postgres(&self) -> String {
        format!(
            "Postgres commits {:.2} (its database); WAL (server-wide) {:.1} records, {:.0} \
             bytes, {:.2} writes, {:.2} flushes",
            self.commits, self.wal_records, self.wal_bytes, self.wal_write, self.wal_sync,
        )
    }

    /// One line for a scenario's note.
    pub(crate) fn describe(&self) -> String {
        let top = self
            .redis_top
            .iter()
            .map(|(name, calls)| format!("{name} {calls:.2}"))
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "Postgres commits {:.2} (this database); WAL (server-wide) {:.1} records, {:.0} \
             bytes, {:.2} writes, {:.2} flushes; Redis (server-wide) {:.2} commands, scripts' \
             included, of which {:.2} script calls; most called: {}",
            self.commits,
            self.wal_records,
            self.wal_bytes,
            self.wal_write,
            self.wal_sync,
            self.redis_calls,
            self.redis_scripts,
            if top.is_empty() { "none" } else { &top },
        )
    }
}

/// Waits (polling, with a deadline) until no pgbench backend is connected to `database`: a
/// backend reports its statistics before it leaves `pg_stat_activity` (`before_shmem_exit`
/// against `on_shmem_exit`), so the database's counters then hold all of pgbench's work.
pub(crate) async fn until_no_backends(meter: &mut Meter, database: &str) -> anyhow::Result<()> {
    crate::stack::wait_for(
        "pgbench's backends to exit",
        Duration::from_secs(30),
        async || {
            let (n,): (i64,) = sqlx::query_as(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE datname = $1 AND application_name = 'pgbench'",
            )
            .bind(database)
            .fetch_one(&mut meter.pg)
            .await
            .ok()?;
            (n == 0).then_some(())
        },
    )
    .await
}

/// Runs completed in the database `executor` is on.
pub(crate) async fn completed_runs(executor: impl sqlx::PgExecutor<'_>) -> anyhow::Result<i64> {
    let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM runs WHERE status = 'completed'")
        .fetch_one(executor)
        .await?;
    Ok(n)
}

/// Which pgbench twin of the run lifecycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lifecycle {
    /// `tests/bench/lifecycle.sql`: today's, statement by statement.
    Today,
    /// `tests/bench/lifecycle_batched.sql` beside `enqueue.sql`: the redesign (issue 44).
    Batched,
}

/// One pgbench run of a lifecycle twin.
pub(crate) struct Twin {
    /// pgbench's transactions per second (a run each for today's twin; enqueues and cycles
    /// alike for the redesign's).
    pub(crate) tps: f64,
    /// Its transactions.
    pub(crate) transactions: u64,
    /// Machine busy time while it ran, s.
    pub(crate) busy: f64,
    /// Runs completed per second of pgbench's measured time (its connections left out), counted
    /// in the database: the same measure for both twins.
    pub(crate) rate: f64,
    /// Runs completed.
    pub(crate) runs: u64,
    /// Machine CPU (all of `/proc/stat`'s busy time) per run completed, ms.
    pub(crate) machine_ms: f64,
    /// Runs still queued at the end (the redesign's claims of k can fall behind its enqueues
    /// when concurrent claims skip each other's rows).
    pub(crate) queued: i64,
    pub(crate) cost: PerRun,
}

/// Runs `twin` with `clients` clients for `duration` on `db`, a database of its own (the
/// commits are then the twin's alone, and reported as its backends exit: no wait).
pub(crate) async fn lifecycle_twin(
    meter: &mut Meter,
    db: &spool_tests::TestDb,
    twin: Lifecycle,
    clients: usize,
    duration: Duration,
) -> anyhow::Result<Twin> {
    let name = database_of(&db.url)?;
    let done = completed_runs(&db.pool).await?;
    let before = meter.read(&name).await?;
    let busy = crate::cpu::machine_busy_secs();
    let run = match twin {
        Lifecycle::Today => {
            crate::baseline::pgbench(&db.url, crate::baseline::LIFECYCLE_SQL, clients, duration)
                .await?
        }
        Lifecycle::Batched => {
            crate::baseline::pgbench_batched_lifecycle(&db.url, clients, duration).await?
        }
    };
    let busy = crate::cpu::machine_busy_secs() - busy;
    until_no_backends(meter, &name).await?;
    let after = meter.read(&name).await?;
    let runs = u64::try_from(completed_runs(&db.pool).await? - done).unwrap_or(0);
    let (queued,): (i64,) = sqlx::query_as("SELECT count(*) FROM runs WHERE status = 'queued'")
        .fetch_one(&db.pool)
        .await?;
    let secs = run.transactions as f64 / run.tps.max(f64::MIN_POSITIVE);
    Ok(Twin {
        tps: run.tps,
        transactions: run.transactions,
        busy,
        rate: runs as f64 / secs.max(f64::MIN_POSITIVE),
        runs,
        machine_ms: busy * 1000.0 / runs.max(1) as f64,
        queued,
        cost: after.since(&before, runs, 0),
    })
}

/// The figures of a phase's cost per `unit` (run or request), one per counter, each round's
/// value and their median.
pub(crate) fn cost_figures(scenario: &str, unit: &str, rounds: &[PerRun]) -> Vec<Figure> {
    let each = |f: fn(&PerRun) -> f64| rounds.iter().map(f).collect::<Vec<_>>();
    let per = format!("/{unit}");
    vec![
        Figure::new(
            scenario,
            &format!("Postgres commits per {unit} (its database)"),
            &per,
            each(|c| c.commits),
        ),
        Figure::new(
            scenario,
            &format!("WAL flushes (wal_sync) per {unit} (server-wide)"),
            &per,
            each(|c| c.wal_sync),
        ),
        Figure::new(
            scenario,
            &format!("WAL writes per {unit} (server-wide)"),
            &per,
            each(|c| c.wal_write),
        ),
        Figure::new(
            scenario,
            &format!("WAL records per {unit} (server-wide)"),
            &per,
            each(|c| c.wal_records),
        ),
        Figure::new(
            scenario,
            &format!("WAL bytes per {unit} (server-wide)"),
            "B",
            each(|c| c.wal_bytes),
        ),
        Figure::new(
            scenario,
            &format!("Redis commands per {unit}, scripts' own included (server-wide)"),
            &per,
            each(|c| c.redis_calls),
        ),
        Figure::new(
            scenario,
            &format!("Redis script calls (EVALSHA...) per {unit} (server-wide)"),
            &per,
            each(|c| c.redis_scripts),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commandstats_lines_are_read_by_name() {
        let info = "# Commandstats\r\n\
            cmdstat_evalsha:calls=12,usec=300,usec_per_call=25.00,rejected_calls=0,failed_calls=0\r\n\
            cmdstat_XADD:calls=7,usec=70,usec_per_call=10.00,rejected_calls=0,failed_calls=0\r\n";
        let calls = command_calls(info);
        assert_eq!(calls.get("evalsha"), Some(&12.0));
        assert_eq!(calls.get("xadd"), Some(&7.0));
        assert_eq!(calls.len(), 2);
    }

    #[test]
    fn deltas_are_per_run_without_info_and_the_measurers_commits() {
        let before = Counters {
            commits: 100.0,
            wal_sync: 10.0,
            redis: command_calls("cmdstat_evalsha:calls=2\ncmdstat_info:calls=1\n"),
            ..Counters::default()
        };
        let after = Counters {
            commits: 130.0,
            wal_sync: 20.0,
            redis: command_calls(
                "cmdstat_evalsha:calls=22\ncmdstat_info:calls=9\ncmdstat_xadd:calls=30\n",
            ),
            ..Counters::default()
        };
        let per = after.since(&before, 10, 10);
        assert_eq!(per.commits, 2.0);
        assert_eq!(per.wal_sync, 1.0);
        assert_eq!(per.redis_calls, 5.0);
        assert_eq!(per.redis_scripts, 2.0);
        assert_eq!(per.redis_top[0], ("xadd".to_owned(), 3.0));
    }
}
