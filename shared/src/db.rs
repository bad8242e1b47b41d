//! Postgres: the record. Threads, messages, runs (the durable jobs), agents and idempotency
//! keys live here; Redis only ever holds a replay buffer.
//!
//! Query functions are named for their effect (`runs::claim_next`, `runs::heartbeat`) and take
//! `impl PgExecutor<'_>` so a caller can run several of them in one transaction. Queries are
//! checked at run time (`sqlx::query_as` with `FromRow`), not by the `query!` macros: the
//! macros need a live database or a committed `.sqlx/` cache at every build, and the test
//! suite exercises every statement against real Postgres anyway.

pub mod agents;
pub mod enqueue;
pub mod idempotency;
pub mod messages;
pub mod runs;
pub mod steps;
pub mod threads;

use std::time::Duration;

use anyhow::Context as _;
use sqlx::migrate::MigrateDatabase as _;
use sqlx::postgres::{PgPool, PgPoolOptions};

use crate::config::DbArgs;

/// The channel a NOTIFY on it wakes idle workers: a run became claimable.
pub const RUNS_CHANNEL: &str = "spool_runs";

/// The channel on which a cancel request names its workflow id, so the worker holding it
/// stops at once (the heartbeat notices it too, within one interval, if the NOTIFY is lost).
pub const CANCEL_CHANNEL: &str = "spool_cancel";

/// The embedded migrations (`migrations/` at the workspace root).
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

/// Connects a pool, creating the database if needed and migrating it unless told not to.
pub async fn connect(args: &DbArgs) -> anyhow::Result<PgPool> {
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
    anyhow::ensure!(
        args.db_check_idle_secs.is_finite() && args.db_check_idle_secs >= 0.0,
        "SPOOL_DB_CHECK_IDLE_SECS must be zero or more"
    );
    let check_idle = Duration::from_secs_f64(args.db_check_idle_secs);
    let pool = PgPoolOptions::new()
        .max_connections(args.db_max_connections)
        // sqlx pings every connection it hands out: one more round trip per statement on the
        // worker (a run's lifecycle is five statements) and per request on the API. Only a
        // connection idle for a while has had time to die unnoticed; one in steady use is
        // handed out as it is (spool-bench P1 and P5, BENCHMARKS.md).
        .test_before_acquire(false)
        .before_acquire(move |conn, meta| {
            Box::pin(async move {
                if meta.idle_for >= check_idle {
                    sqlx::Connection::ping(conn).await?;
                }
                Ok(true)
            })
        })
        .acquire_timeout(Duration::from_secs(10))
        .connect(&args.database_url)
        .await
        .context("connecting to Postgres")?;
    if !args.skip_migrations {
        migrate(&pool).await?;
    }
    Ok(pool)
}

/// Applies pending migrations. Concurrent callers serialize on sqlx's advisory lock.
pub async fn migrate(pool: &PgPool) -> anyhow::Result<()> {
    MIGRATOR
        .run(pool)
        .await
        .context("running database migrations")
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

/// Whether an error is the violation of the named unique index or constraint.
pub fn is_unique_violation(err: &sqlx::Error, constraint: &str) -> bool {
    match err {
        sqlx::Error::Database(db) => {
            db.is_unique_violation() && db.constraint() == Some(constraint)
        }
        _ => false,
    }
}
