//! A rolling deploy: the new version migrates first, and processes of the version before it
//! still start (or restart) beside it on the newer schema (docs/compatibility.md). Simulated
//! here by what a newer version's migration leaves behind: a row in `_sqlx_migrations` this
//! binary does not know, and an added column and table.

use serde_json::Value;
use spool_tests::{Process, TestDb};

use crate::stack::{Stack, TIMEOUT};

/// A version later than any migration of this binary.
const NEWER_VERSION: i64 = 99_991_231_000_000;

/// Applies "a newer version's migration" to `db`: its schema change and its migrations row.
async fn apply_newer_migration(db: &TestDb) {
    for statement in [
        "ALTER TABLE runs ADD COLUMN added_by_a_newer_version text",
        "CREATE TABLE added_by_a_newer_version (id bigint PRIMARY KEY)",
    ] {
        sqlx::query(statement)
            .execute(&db.pool)
            .await
            .expect(statement);
    }
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
         VALUES ($1, 'a newer version''s migration', true, '\\x00'::bytea, 1)",
    )
    .bind(NEWER_VERSION)
    .execute(&db.pool)
    .await
    .expect("the newer migration's row");
}

/// The first JSON log line of `process` whose message starts with `prefix`.
fn log_line(process: &str, prefix: &str) -> Option<Value> {
    process
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|l| l["message"].as_str().is_some_and(|m| m.starts_with(prefix)))
}

#[tokio::test]
async fn an_older_binary_starts_and_runs_on_a_schema_a_newer_version_migrated() {
    let db = TestDb::new().await.expect("test database");
    apply_newer_migration(&db).await;

    // The API migrates at start by default (SPOOL_SKIP_MIGRATIONS unset), as does a worker.
    let stack = Stack::start_on(db, &spool_tests::redis_url(), &[]).await;
    let warning = log_line(
        &stack.api_log(),
        "the database has migrations this binary does not know",
    )
    .unwrap_or_else(|| panic!("no warning logged:\n{}", stack.api_log()));
    assert_eq!(warning["level"], "WARN", "{warning}");
    assert_eq!(warning["newest_version"], NEWER_VERSION, "{warning}");
    assert_eq!(warning["unknown"], 1, "{warning}");
    let (status, ready) = stack.get_json("/readyz").await;
    assert_eq!(status, reqwest::StatusCode::OK, "{ready}");

    let worker = stack.worker(&[]).await;
    assert!(
        log_line(
            &worker.output(),
            "the database has migrations this binary does not know"
        )
        .is_some(),
        "the worker migrated and did not say so:\n{}",
        worker.output()
    );
    let accepted = stack
        .enqueue(&spool_tests::token("alice", "acme"), "hello")
        .await;
    stack.wait_run(&accepted, "completed").await;
    let messages = stack.messages(&accepted).await;
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert_eq!(messages[1].1, "completed", "{messages:?}");
    // Nothing of the newer version's was touched: its row is still there, once.
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations WHERE version = $1")
        .bind(NEWER_VERSION)
        .fetch_one(&stack.db.pool)
        .await
        .expect("count");
    assert_eq!(rows, 1);
}

/// Tolerating a newer version's migrations is not tolerating a changed one: a migration of this
/// binary whose applied checksum differs still stops it, with the reason.
#[tokio::test]
async fn a_changed_migration_of_its_own_still_stops_the_binary() {
    let db = TestDb::new().await.expect("test database");
    apply_newer_migration(&db).await;
    let version: i64 = sqlx::query_scalar(
        "UPDATE _sqlx_migrations SET checksum = '\\x01'::bytea
         WHERE version = (SELECT min(version) FROM _sqlx_migrations) RETURNING version",
    )
    .fetch_one(&db.pool)
    .await
    .expect("tamper with the first migration");
    let (redis_url, prefix) = (spool_tests::redis_url(), spool_tests::redis_prefix());
    let mut api = Process::spawn(
        "spool-api",
        &["serve"],
        &spool_tests::process::vars(&[
            ("DATABASE_URL", db.url.as_str()),
            ("REDIS_URL", redis_url.as_str()),
            ("SPOOL_REDIS_PREFIX", prefix.as_str()),
            ("SPOOL_API_ADDR", "127.0.0.1:0"),
            ("SPOOL_JWT_SECRET", spool_tests::JWT_SECRET),
            ("SPOOL_DB_MAX_CONNECTIONS", "2"),
        ]),
    )
    .expect("spawn");
    let code = api.wait(TIMEOUT).await;
    assert!(
        code.is_some_and(|c| c != 0),
        "exit {code:?}:\n{}",
        api.output()
    );
    let output = api.output();
    assert!(
        output.contains(&format!(
            "migration {version} was previously applied but has been modified"
        )),
        "{output}"
    );
}
