//! Spool's test harness, shared by the API, worker and end-to-end tests.
//!
//! - [`TestDb`]: a fresh Postgres database per test, copied from a migrated template (fast),
//!   dropped when the test ends.
//! - [`redis_prefix`]: a fresh Redis key prefix per test.
//! - [`Process`]: `spool-api` / `spool-worker` as real child processes, with signals.
//! - [`poll_until`]: waiting for a condition with a deadline, never a bare sleep.
//! - [`token`]: a signed JWT for a user of a tenant.
//! - [`fake_llm`]: an upstream speaking the OpenAI wire format; [`tools`]: a tool server.
//! - [`otlp`]: a loopback OTLP/HTTP collector that keeps the spans it is sent.
//! - [`growth`]: months of threads, messages and runs made in bulk by SQL (plan test, P7).
//!
//! Tests are quiet unless `TEST_LOG=1`.

pub mod conform;
pub mod fake_llm;
pub mod growth;
pub mod otlp;
pub mod peers;
pub mod process;
pub mod servers;
pub mod sse;
pub mod tools;
pub mod webhooks;

use std::time::Duration;

use anyhow::Context as _;
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, Connection as _, PgConnection};
use tokio::sync::OnceCell;

pub use process::Process;

/// The secret the tests sign tokens with and start servers with.
pub const JWT_SECRET: &str = "spool-test-secret-of-at-least-32-bytes";

/// The Postgres server the tests use (any database on it; tests create their own).
pub fn postgres_base_url() -> String {
    std::env::var("SPOOL_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://root@127.0.0.1:5432/postgres".to_owned())
}

/// The Redis the tests use.
pub fn redis_url() -> String {
    std::env::var("SPOOL_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// A fresh key prefix, so tests sharing one Redis never see each other's keys.
pub fn redis_prefix() -> String {
    format!(
        "spool_t_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// Installs a log subscriber if `TEST_LOG=1`.
pub fn init_logging() {
    if std::env::var("TEST_LOG").is_ok_and(|v| v == "1") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "info".into()),
            )
            .with_test_writer()
            .try_init();
    }
}

/// A database of its own for one test, migrated, dropped on drop.
pub struct TestDb {
    /// Its connection URL (for child processes).
    pub url: String,
    /// A pool on it.
    pub pool: PgPool,
    name: String,
}

static TEMPLATE: OnceCell<String> = OnceCell::const_new();

/// The test server's URL naming `database` instead.
fn url_for(database: &str) -> String {
    with_database(&postgres_base_url(), database)
        .unwrap_or_else(|err| panic!("SPOOL_TEST_POSTGRES_URL is not a URL: {err}"))
}

/// `base` with its path set to `database`, the rest kept: its query parameters (`sslmode`,
/// `host` for a socket) too, which cutting the text at its last `/` dropped; and a URL
/// without a path (`postgres://root@127.0.0.1:5432`), which that made `postgres://<database>`.
fn with_database(base: &str, database: &str) -> Result<String, String> {
    let mut url = reqwest::Url::parse(base).map_err(|err| err.to_string())?;
    url.set_path(&format!("/{database}"));
    Ok(url.into())
}

/// Creates (once per migration set, across processes) a migrated template database.
async fn template() -> anyhow::Result<String> {
    TEMPLATE
        .get_or_try_init(|| async {
            let checksum: Vec<u8> = spool_shared::db::MIGRATOR
                .iter()
                .flat_map(|m| m.checksum.iter().copied())
                .collect();
            let hash = spool_shared_hash(&checksum);
            let name = format!("spool_tmpl_{hash}");
            let mut admin = PgConnection::connect(&postgres_base_url())
                .await
                .context("connecting to the test Postgres")?;
            // Serialize template creation across concurrent test processes.
            sqlx::query("SELECT pg_advisory_lock(7342001)")
                .execute(&mut admin)
                .await?;
            let exists: Option<(i32,)> =
                sqlx::query_as("SELECT 1 FROM pg_database WHERE datname = $1")
                    .bind(&name)
                    .fetch_optional(&mut admin)
                    .await?;
            if exists.is_none() {
                let building = format!("{name}_build");
                sqlx::query(AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS {building} WITH (FORCE)"
                )))
                .execute(&mut admin)
                .await?;
                sqlx::query(AssertSqlSafe(format!("CREATE DATABASE {building}")))
                    .execute(&mut admin)
                    .await?;
                let mut conn = PgConnection::connect(&url_for(&building)).await?;
                spool_shared::db::MIGRATOR.run(&mut conn).await?;
                conn.close().await?;
                sqlx::query(AssertSqlSafe(format!(
                    "ALTER DATABASE {building} RENAME TO {name}"
                )))
                .execute(&mut admin)
                .await?;
            }
            sqlx::query("SELECT pg_advisory_unlock(7342001)")
                .execute(&mut admin)
                .await?;
            admin.close().await?;
            Ok(name)
        })
        .await
        .cloned()
}

fn spool_shared_hash(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    hex::encode(&sha2::Sha256::digest(bytes)[..6])
}

impl TestDb {
    /// A fresh migrated database.
    pub async fn new() -> anyhow::Result<Self> {
        init_logging();
        let template = template().await?;
        let name = format!("spool_t_{}", uuid::Uuid::new_v4().simple());
        let mut admin = PgConnection::connect(&postgres_base_url()).await?;
        // Concurrent copies of one template can collide on its lock; retry briefly.
        let mut tries = 0;
        loop {
            let created = sqlx::query(AssertSqlSafe(format!(
                "CREATE DATABASE {name} TEMPLATE {template}"
            )))
            .execute(&mut admin)
            .await;
            match created {
                Ok(_) => break,
                Err(err) if tries < 50 => {
                    tries += 1;
                    tracing::debug!(error = %err, "template busy; retrying");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(err) => return Err(err).context("creating the test database"),
            }
        }
        admin.close().await?;
        let url = url_for(&name);
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .connect(&url)
            .await?;
        Ok(Self { url, pool, name })
    }

    /// `SELECT count(*)` of a table.
    pub async fn count(&self, table: &str) -> i64 {
        let sql = format!("SELECT count(*) FROM {table}");
        let (n,): (i64,) = sqlx::query_as(AssertSqlSafe(sql))
            .fetch_one(&self.pool)
            .await
            .unwrap_or((-1,));
        n
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Drop from a thread of its own: Drop cannot await, and the test's runtime may be
        // shutting down.
        let _ = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async {
                if let Ok(mut admin) = PgConnection::connect(&postgres_base_url()).await {
                    let _ = sqlx::query(AssertSqlSafe(format!(
                        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                    )))
                    .execute(&mut admin)
                    .await;
                }
            });
        })
        .join();
    }
}

/// The value of the unlabelled metric `name` on the Prometheus page at `url` (a process's
/// `/metrics`); `None` if the page cannot be read or has no such line.
pub async fn gauge(http: &reqwest::Client, url: &str, name: &str) -> Option<f64> {
    let text = http.get(url).send().await.ok()?.text().await.ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// Serves `app` on a fresh loopback port for the rest of the test; returns its base URL
/// (`http://127.0.0.1:PORT`).
pub async fn serve(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let base = format!("http://{}", listener.local_addr().expect("its address"));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    base
}

/// Polls `check` until it returns `Some`, or fails after `timeout` naming `what`.
pub async fn poll_until<T>(
    what: &str,
    timeout: Duration,
    check: impl AsyncFnMut() -> Option<T>,
) -> T {
    match try_poll_until(what, timeout, Duration::from_millis(20), check).await {
        Ok(value) => value,
        Err(err) => panic!("{err}"),
    }
}

/// Polls `check` every `every` until it returns `Some`; an error naming `what` after `timeout`.
pub async fn try_poll_until<T>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> anyhow::Result<T> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return Ok(value);
        }
        if tokio::time::Instant::now() >= deadline {
            anyhow::bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(every).await;
    }
}

/// A token for `sub` of `tenant`, valid for an hour.
pub fn token(sub: &str, tenant: &str) -> String {
    token_with(sub, tenant, false, 3600, JWT_SECRET)
}

/// A token with every knob: admin, lifetime in seconds (negative: already expired), secret.
pub fn token_with(sub: &str, tenant: &str, admin: bool, ttl: i64, secret: &str) -> String {
    let exp = chrono::Utc::now().timestamp() + ttl;
    let claims = serde_json::json!({"sub": sub, "tenant": tenant, "exp": exp, "admin": admin});
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()),
    )
    .unwrap_or_default()
}

/// A token for `sub` of `tenant`, valid for an hour, whose `permissions` claim lists exactly
/// `permissions` (`[]`: none at all).
pub fn token_with_permissions(sub: &str, tenant: &str, permissions: &[&str]) -> String {
    let exp = chrono::Utc::now().timestamp() + 3600;
    let claims =
        serde_json::json!({"sub": sub, "tenant": tenant, "exp": exp, "permissions": permissions});
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(JWT_SECRET.as_bytes()),
    )
    .unwrap_or_default()
}

/// The JSON Web Key Set a process with these identity settings publishes (what
/// `GET /.well-known/jwks.json` serves): `--jwt-secret`, `--identity-key`, ... as flags.
pub fn identity_jwks(flags: &[&str]) -> serde_json::Value {
    #[derive(clap::Parser)]
    struct Command {
        #[command(flatten)]
        identity: spool_shared::config::IdentityArgs,
    }
    let args = [&["identity"], flags].concat();
    let keys = <Command as clap::Parser>::parse_from(args)
        .identity
        .identity_keys()
        .expect("identity keys");
    serde_json::to_value(keys.jwks()).unwrap_or_default()
}

/// Verifies an `X-Spool-Identity` token as a tool at `origin` would: with the key of `jwks`
/// whose `kid` the header names, EdDSA only, `typ` = `spool-identity+jwt`, `iss` = `spool`,
/// `aud` = `origin`, not expired; its claims, or why it was refused.
pub fn verify_identity(
    token: &str,
    origin: &str,
    jwks: &serde_json::Value,
) -> Result<serde_json::Value, String> {
    let set: jsonwebtoken::jwk::JwkSet =
        serde_json::from_value(jwks.clone()).map_err(|err| err.to_string())?;
    let header = jsonwebtoken::decode_header(token).map_err(|err| err.to_string())?;
    if header.typ.as_deref() != Some("spool-identity+jwt") {
        return Err(format!("typ {:?}", header.typ));
    }
    let jwk = set
        .find(header.kid.as_deref().unwrap_or_default())
        .ok_or("no key with the token's kid")?;
    let key = jsonwebtoken::DecodingKey::from_jwk(jwk).map_err(|err| err.to_string())?;
    let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::EdDSA);
    validation.set_audience(&[origin]);
    validation.set_issuer(&["spool"]);
    validation.set_required_spec_claims(&["exp", "aud", "iss", "sub"]);
    jsonwebtoken::decode::<serde_json::Value>(token, &key, &validation)
        .map(|data| data.claims)
        .map_err(|err| err.to_string())
}

/// A run's row, read directly from Postgres.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct RunRow {
    /// The run.
    pub id: uuid::Uuid,
    /// Status as stored.
    pub status: String,
    /// Claims so far.
    pub attempt: i32,
    /// Claims after expired leases.
    pub reclaims: i32,
    /// The last worker that held it.
    pub lease_owner: Option<String>,
    /// `{code, message}` if failed.
    pub error: Option<serde_json::Value>,
    /// Last change.
    pub updated_at: chrono::DateTime<chrono::Utc>,
}

/// Reads a run's row.
pub async fn run_row(pool: &PgPool, id: uuid::Uuid) -> Option<RunRow> {
    sqlx::query_as(
        "SELECT id, status, attempt, reclaims, lease_owner, error, updated_at FROM runs WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(pool)
    .await
    .ok()
    .flatten()
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn a_test_database_url_keeps_the_server_and_its_parameters() {
        let cases = [
            (
                "postgres://root@127.0.0.1:5432/postgres",
                "postgres://root@127.0.0.1:5432/spool_t1",
            ),
            (
                "postgres://root@127.0.0.1:5432",
                "postgres://root@127.0.0.1:5432/spool_t1",
            ),
            (
                "postgres://root@127.0.0.1:5432/postgres?sslmode=disable",
                "postgres://root@127.0.0.1:5432/spool_t1?sslmode=disable",
            ),
            (
                "postgres://root@[::1]:5433/db?application_name=t",
                "postgres://root@[::1]:5433/spool_t1?application_name=t",
            ),
        ];
        for (base, url) in cases {
            assert_eq!(
                with_database(base, "spool_t1"),
                Ok(url.to_owned()),
                "{base}"
            );
        }
        assert!(with_database("not a url", "spool_t1").is_err());
    }
}
