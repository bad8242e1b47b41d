//! Postgres: the record. Threads, messages, runs (the durable jobs), agents and idempotency
//! keys live here; Redis only ever holds a replay buffer.
//!
//! Query functions are named for their effect (`runs::claim`, `runs::heartbeat`) and take
//! `impl PgExecutor<'_>` so a caller can run several of them in one transaction. Queries are
//! checked at run time (`sqlx::query_as` with `FromRow`), not by the `query!` macros: the
//! macros need a live database or a committed `.sqlx/` cache at every build, and the test
//! suite exercises every statement against real Postgres anyway.

pub mod agents;
pub mod api_keys;
pub mod chat_histories;
pub mod enqueue;
pub mod idempotency;
pub mod knowledge_bases;
pub mod messages;
pub mod page;
pub mod providers;
pub mod quota;
pub mod runs;
pub mod steps;
pub mod threads;
pub mod tools;
pub mod usage;
pub mod webhooks;

use std::time::Duration;

use anyhow::Context as _;
use sqlx::migrate::MigrateDatabase as _;
use sqlx::postgres::{PgPool, PgPoolOptions};

use serde_json::Value;
use sqlx::types::Json;

use crate::config::DbArgs;

/// The channel a NOTIFY on it wakes idle workers: a run became claimable.
pub const RUNS_CHANNEL: &str = "spool_runs";

/// The channel on which a cancel request names its workflow id, so the worker holding it
/// stops at once (the heartbeat notices it too, within one interval, if the NOTIFY is lost).
pub const CANCEL_CHANNEL: &str = "spool_cancel";

/// A connection for statements a request may not need: the caller's own (its transaction),
/// or one taken from the pool at the first statement and kept for the rest. A request that
/// waits on something else first (the enqueue's quota take, a round trip to Redis) holds no
/// pooled connection idle while it waits.
pub enum LazyConn<'a> {
    /// The caller's connection.
    Held(&'a mut sqlx::PgConnection),
    /// The pool, and the connection taken from it once a statement needed one.
    Pool(
        &'a PgPool,
        Option<sqlx::pool::PoolConnection<sqlx::Postgres>>,
    ),
}

impl<'a> LazyConn<'a> {
    /// Takes a connection from `pool` only when a statement needs one.
    pub fn pool(pool: &'a PgPool) -> Self {
        Self::Pool(pool, None)
    }

    /// The connection, taken from the pool now if none is yet.
    pub async fn get(&mut self) -> sqlx::Result<&mut sqlx::PgConnection> {
        match self {
            Self::Held(conn) => Ok(conn),
            Self::Pool(pool, taken) => {
                let conn = match taken.take() {
                    Some(conn) => conn,
                    None => pool.acquire().await?,
                };
                Ok(taken.insert(conn))
            }
        }
    }
}

/// The embedded migrations (`migrations/` at the workspace root).
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

/// Connects a pool, creating the database if needed and migrating it unless told not to. Its
/// connections carry `application` as their `application_name` (what `pg_stat_activity`
/// shows), unless `DATABASE_URL` names one.
pub async fn connect(args: &DbArgs, application: &str) -> anyhow::Result<PgPool> {
    if !sqlx::Postgres::database_exists(&args.database_url)
        .await
        .context("checking that the database exists (is Postgres running? see DATABASE_URL)")?
    {
        // Two processes starting at once may both try; the loser sees "already exists".
        if let Err(err) = sqlx::Postgres::create_database(&args.database_url).await
            && !sqlx::Postgres::database_exists(&args.database_url)
                .await
                .unwrap_or(false)
        {
            return Err(err).context("creating the database");
        }
    }
    let check_idle = args.check_idle()?;
    let timeouts = args.timeouts()?;
    let options = connect_options(&args.database_url, application)?;
    let pool = checked_when_idle(PgPoolOptions::new(), check_idle)
        .after_connect(move |conn, _| Box::pin(async move { timeouts.apply(conn).await }))
        .max_connections(args.db_max_connections)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options)
        .await
        .context("connecting to Postgres")?;
    if !args.skip_migrations {
        migrate(&pool).await?;
    }
    Ok(pool)
}

/// The session timeouts of every pooled connection (`SPOOL_DB_*_TIMEOUT_SECS`): no statement
/// runs, waits for a lock, or holds a transaction open without bound, so no request or run can
/// hold locks another tenant's runs wait on for longer than these (DESIGN section 15).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// `statement_timeout`: the longest a statement runs.
    pub statement: Duration,
    /// `lock_timeout`: the longest a statement waits for one lock.
    pub lock: Duration,
    /// `idle_in_transaction_session_timeout`: the longest a session idles inside a
    /// transaction before Postgres ends it (and its locks with it).
    pub idle_in_transaction: Duration,
}

impl Default for Timeouts {
    /// The documented defaults: 30 s, 10 s and 60 s.
    fn default() -> Self {
        Self {
            statement: Duration::from_secs(30),
            lock: Duration::from_secs(10),
            idle_in_transaction: Duration::from_secs(60),
        }
    }
}

impl Timeouts {
    /// These timeouts, none longer than `max` (the lease keeper's: a renewal that cannot finish
    /// within one heartbeat is worth nothing, and must not linger in Postgres after the keeper
    /// gave up on it).
    pub fn at_most(self, max: Duration) -> Self {
        Self {
            statement: self.statement.min(max),
            lock: self.lock.min(max),
            idle_in_transaction: self.idle_in_transaction.min(max),
        }
    }

    /// Sets them on the connection's session (a `SET` works through a session-mode pooler,
    /// where a startup option might not).
    pub async fn apply(self, conn: &mut sqlx::PgConnection) -> sqlx::Result<()> {
        sqlx::query(
            "SELECT set_config('statement_timeout', $1, false),
                    set_config('lock_timeout', $2, false),
                    set_config('idle_in_transaction_session_timeout', $3, false)",
        )
        .bind(millis(self.statement))
        .bind(millis(self.lock))
        .bind(millis(self.idle_in_transaction))
        .execute(conn)
        .await?;
        Ok(())
    }
}

/// A duration as a Postgres setting in milliseconds, at least 1 (0 would mean "no limit").
fn millis(duration: Duration) -> String {
    format!("{}ms", duration.as_millis().max(1))
}

/// A pool of one connection for [`runs::claim`], connected when first used, whose session
/// plans without sequential scans (`SET enable_seqscan = off` once connected, which works
/// through a session-mode pooler too, where a startup option might not).
///
/// Why: Postgres keeps a prepared statement's generic plan until the tables it reads get new
/// statistics, and a new deployment plans the claim on a `runs` table of a few rows. For the
/// claim's lookup of the runs it picked, a sequential scan is then the cheapest plan, and it
/// stays the plan while the table grows, until autovacuum next analyzes it (its launcher
/// wakes once a minute): every claim meanwhile reads the whole table (spool-bench P2 on one
/// thread: Postgres 2.76 → 5.00 ms of CPU per run over 6,000 runs,
/// docs/benchmarks-history.md). Every part of the claim has an index made for it, so the
/// setting only takes the sequential scan away.
/// The setting is the session's, so the claim has a connection of its own; the worker's other
/// statements keep the defaults. Like the main pool (at its default), the connection is
/// checked with a round trip only when it has been idle for a second or more: a worker claims
/// more often than that while runs come.
pub fn claim_pool(
    database_url: &str,
    application: &str,
    timeouts: Timeouts,
) -> anyhow::Result<PgPool> {
    let options = connect_options(database_url, application)?;
    Ok(
        checked_when_idle(PgPoolOptions::new(), Duration::from_secs(1))
            .max_connections(1)
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    sqlx::query("SET enable_seqscan = off")
                        .execute(&mut *conn)
                        .await?;
                    timeouts.apply(conn).await
                })
            })
            .acquire_timeout(Duration::from_secs(10))
            .connect_lazy_with(options),
    )
}

/// The connection options of `database_url`, named `application` unless the URL names one.
fn connect_options(
    database_url: &str,
    application: &str,
) -> anyhow::Result<sqlx::postgres::PgConnectOptions> {
    let options: sqlx::postgres::PgConnectOptions = database_url
        .parse()
        .context("DATABASE_URL is not a Postgres URL")?;
    Ok(if options.get_application_name().is_none() {
        options.application_name(application)
    } else {
        options
    })
}

/// `pool` checking a connection it hands out with a round trip only when the connection has
/// been idle for `check_idle` or more. sqlx pings every connection it hands out: one more
/// round trip per statement on the worker (a run's lifecycle is five statements) and per
/// request on the API. Only a connection idle for a while has had time to die unnoticed; one
/// in steady use is handed out as it is (spool-bench P1 and P5, BENCHMARKS.md).
fn checked_when_idle(pool: PgPoolOptions, check_idle: Duration) -> PgPoolOptions {
    pool.test_before_acquire(false)
        .before_acquire(move |conn, meta| {
            Box::pin(async move {
                if meta.idle_for >= check_idle {
                    sqlx::Connection::ping(conn).await?;
                }
                Ok(true)
            })
        })
}

/// Applies pending migrations. Concurrent callers serialize on sqlx's advisory lock.
///
/// On a connection of its own without the pool's [`Timeouts`]: a migration may build an index
/// on a large table for minutes, and a second process starting at once waits for the first's
/// migrations on the advisory lock. The connection is closed after, never handed back to the
/// pool with its timeouts off.
pub async fn migrate(pool: &PgPool) -> anyhow::Result<()> {
    let mut conn = pool
        .acquire()
        .await
        .context("connecting to migrate")?
        .detach();
    sqlx::query(
        "SELECT set_config('statement_timeout', '0', false), set_config('lock_timeout', '0', false),
                set_config('idle_in_transaction_session_timeout', '0', false)",
    )
    .execute(&mut conn)
    .await
    .context("lifting the timeouts to migrate")?;
    let migrated = rolling_migrator()
        .run(&mut conn)
        .await
        .context("running database migrations");
    let migrated = match migrated {
        Ok(()) => report_newer_migrations(&mut conn).await,
        Err(err) => Err(err),
    };
    let _ = sqlx::Connection::close(conn).await;
    migrated
}

/// [`MIGRATOR`]'s migrations, run without sqlx's refusal of applied migrations it does not
/// know. During a rolling deploy the new version migrates first and pods of the version
/// before it still start (or restart) beside it: refusing would crash-loop them. A newer
/// version's migrations only add (docs/compatibility.md: the schema promise), so the older
/// binary runs on them. Its own migrations are still applied and their checksums still
/// checked.
fn rolling_migrator() -> sqlx::migrate::Migrator {
    let mut migrator = sqlx::migrate::Migrator::with_migrations(MIGRATOR.iter().cloned().collect());
    migrator.set_ignore_missing(true);
    migrator
}

/// Logs the applied migrations this binary does not know (a newer version's), once at start.
async fn report_newer_migrations(conn: &mut sqlx::PgConnection) -> anyhow::Result<()> {
    let known: Vec<i64> = MIGRATOR.iter().map(|m| m.version).collect();
    // Bounded: the migrations table holds one row per migration ever applied.
    let unknown: Vec<(i64, String)> = sqlx::query_as(
        "SELECT version, description FROM _sqlx_migrations
         WHERE NOT (version = ANY($1)) ORDER BY version",
    )
    .bind(&known)
    .fetch_all(&mut *conn)
    .await
    .context("listing the applied migrations")?;
    if let Some((newest, description)) = unknown.last() {
        tracing::warn!(
            unknown = unknown.len(),
            newest_version = newest,
            newest_description = %description,
            "the database has migrations this binary does not know (applied by a newer \
             version): running on the newer schema"
        );
    }
    Ok(())
}

/// Wakes idle workers: a run became claimable. Delivered when the surrounding transaction
/// commits, so a worker never wakes for a run it cannot see yet.
pub async fn notify_runs(executor: impl sqlx::PgExecutor<'_>) -> sqlx::Result<()> {
    sqlx::query("SELECT pg_notify($1, '')")
        .bind(RUNS_CHANNEL)
        .execute(executor)
        .await?;
    Ok(())
}

/// Signals a cancel request to the worker holding the run.
pub async fn notify_cancel(
    executor: impl sqlx::PgExecutor<'_>,
    id: crate::WorkflowId,
) -> sqlx::Result<()> {
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(CANCEL_CHANNEL)
        .bind(id.to_string())
        .execute(executor)
        .await?;
    Ok(())
}

/// What a worker writes from model and tool output, made storable: Postgres keeps no NUL
/// (U+0000) in `text` or `jsonb`, and a model or a tool can produce one (as a raw character or
/// a `\u0000` escape in JSON). Every string of the value, keys included, has its NULs replaced
/// by U+FFFD, so the write succeeds instead of failing on every retry (a crash loop that would
/// repeat the step's tool calls).
pub fn storable<T: serde::Serialize + ?Sized>(value: &T) -> sqlx::Result<Json<Value>> {
    let mut value = serde_json::to_value(value).map_err(|err| sqlx::Error::Encode(err.into()))?;
    scrub(&mut value);
    Ok(Json(value))
}

/// `text` with its NULs replaced by U+FFFD (see [`storable`]).
pub fn storable_text(text: &str) -> std::borrow::Cow<'_, str> {
    if text.contains('\0') {
        text.replace('\0', "\u{fffd}").into()
    } else {
        text.into()
    }
}

fn scrub(value: &mut Value) {
    match value {
        Value::String(text) if text.contains('\0') => *text = text.replace('\0', "\u{fffd}"),
        Value::Array(items) => items.iter_mut().for_each(scrub),
        Value::Object(map) if map.keys().any(|k| k.contains('\0')) => {
            let entries = std::mem::take(map);
            for (key, mut item) in entries {
                scrub(&mut item);
                map.insert(storable_text(&key).into_owned(), item);
            }
        }
        Value::Object(map) => map.values_mut().for_each(scrub),
        _ => {}
    }
}

/// Whether an error is Postgres giving up on a statement because of a timeout:
/// `lock_timeout` (`55P03`, lock not available) or `statement_timeout` (`57014`, cancelled).
/// The transaction is aborted and changed nothing; the same request may succeed later.
pub fn is_timeout(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Database(db) => matches!(db.code().as_deref(), Some("55P03" | "57014")),
        _ => false,
    }
}

/// Whether an error is the violation of the named unique index or constraint.
pub fn is_unique_violation(err: &sqlx::Error, constraint: &str) -> bool {
    match err {
        sqlx::Error::Database(db) => {
            db.is_unique_violation() && db.constraint() == Some(constraint)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The three timeouts as the session shows them.
    async fn shown(pool: &PgPool) -> [String; 3] {
        let mut conn = pool.acquire().await.expect("a connection");
        let mut shown = [String::new(), String::new(), String::new()];
        for (i, name) in [
            "statement_timeout",
            "lock_timeout",
            "idle_in_transaction_session_timeout",
        ]
        .into_iter()
        .enumerate()
        {
            let (value,): (String,) = sqlx::query_as(sqlx::AssertSqlSafe(format!("SHOW {name}")))
                .fetch_one(&mut *conn)
                .await
                .expect("show");
            shown[i] = value;
        }
        shown
    }

    #[tokio::test]
    async fn every_pool_s_connections_carry_the_configured_session_timeouts() {
        let db = spool_tests::TestDb::new().await.expect("db");
        let args = DbArgs {
            database_url: db.url.clone(),
            // One connection: the one that migrated (its timeouts lifted) must not be it.
            db_max_connections: 1,
            db_check_idle_secs: 1.0,
            skip_migrations: false,
            db_statement_timeout_secs: 12.5,
            db_lock_timeout_secs: 3.0,
            db_idle_in_transaction_timeout_secs: 45.0,
        };
        let want = ["12500ms", "3s", "45s"];
        // The API's, a worker's and the embedded workers' pool (housekeeping, webhook
        // deliveries and cancel notifications use the worker's).
        let main = connect(&args, "spool-test").await.expect("pool");
        assert_eq!(shown(&main).await, want, "the main pool");
        let timeouts = args.timeouts().expect("valid");
        let claims = claim_pool(&db.url, "spool-test", timeouts).expect("claim pool");
        assert_eq!(shown(&claims).await, want, "the claim's pool");
        let default = DbArgs {
            db_statement_timeout_secs: 30.0,
            db_lock_timeout_secs: 10.0,
            db_idle_in_transaction_timeout_secs: 60.0,
            ..args
        };
        assert_eq!(default.timeouts().expect("valid"), Timeouts::default());
    }

    #[test]
    fn nul_characters_are_replaced_everywhere_in_what_is_stored() {
        let value = json!({"text": "a\u{0}b", "list": ["\u{0}", 1, {"k\u{0}": "v\u{0}"}]});
        let stored = storable(&value).expect("serializes").0.to_string();
        assert!(!stored.contains("\\u0000"), "{stored}");
        assert_eq!(stored.matches('\u{fffd}').count(), 4, "{stored}");
        assert_eq!(storable_text("x\0y"), "x\u{fffd}y");
        assert!(matches!(
            storable_text("clean"),
            std::borrow::Cow::Borrowed("clean")
        ));
    }
}
