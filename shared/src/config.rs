//! Configuration pieces shared by `spool-api` and `spool-worker`, as `clap` argument groups
//! that read flags or the environment. Each binary flattens the groups it needs and validates
//! them at start, failing fast with a message that names the setting.

use std::time::Duration;

/// Where Postgres is.
#[derive(clap::Args, Clone, Debug)]
pub struct DbArgs {
    /// Postgres connection URL. The database is created if it does not exist.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://root@127.0.0.1:5432/spool"
    )]
    pub database_url: String,

    /// Maximum connections in this process's Postgres pool.
    #[arg(long, env = "SPOOL_DB_MAX_CONNECTIONS", default_value_t = 16)]
    pub db_max_connections: u32,

    /// Seconds a pooled Postgres connection may sit idle before it is checked with a round
    /// trip when taken from the pool (0: check every time). Connections in steady use skip the
    /// check; a check that fails replaces the connection.
    #[arg(long, env = "SPOOL_DB_CHECK_IDLE_SECS", default_value_t = 1.0)]
    pub db_check_idle_secs: f64,

    /// Do not run migrations at start (run `spool-api migrate` yourself).
    #[arg(long, env = "SPOOL_SKIP_MIGRATIONS", default_value_t = false)]
    pub skip_migrations: bool,

    /// Seconds one statement may run before Postgres cancels it (`statement_timeout` of every
    /// pooled connection), so no request or worker statement holds its locks unbounded.
    #[arg(long, env = "SPOOL_DB_STATEMENT_TIMEOUT_SECS", default_value_t = 30.0)]
    pub db_statement_timeout_secs: f64,

    /// Seconds a statement may wait for a lock before it fails (`lock_timeout`), so one
    /// tenant's long transaction makes others fail fast rather than queue behind it.
    #[arg(long, env = "SPOOL_DB_LOCK_TIMEOUT_SECS", default_value_t = 10.0)]
    pub db_lock_timeout_secs: f64,

    /// Seconds a connection may sit idle inside a transaction before Postgres ends its session
    /// (`idle_in_transaction_session_timeout`), releasing every lock it held.
    #[arg(
        long,
        env = "SPOOL_DB_IDLE_IN_TRANSACTION_TIMEOUT_SECS",
        default_value_t = 60.0
    )]
    pub db_idle_in_transaction_timeout_secs: f64,
}

/// Where Redis is and how Spool names its keys there.
#[derive(clap::Args, Clone, Debug)]
pub struct RedisArgs {
    /// Redis connection URL.
    #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379")]
    pub redis_url: String,

    /// Prefix of every Redis key Spool writes, so several deployments can share one Redis.
    #[arg(long, env = "SPOOL_REDIS_PREFIX", default_value = "spool")]
    pub redis_prefix: String,
}

/// Which networks outbound calls to tenants' addresses may reach (see [`crate::egress`]): read
/// by the worker (tools, MCP servers, hooks, webhook deliveries) and the API (webhook URLs).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct EgressArgs {
    /// Networks (CIDRs or IPs, comma-separated) tools, MCP servers, hooks and webhooks may
    /// reach although they are private, loopback or otherwise special. Empty: public addresses
    /// only.
    #[arg(long, env = "SPOOL_TOOLS_ALLOW_NETWORKS", default_value = "")]
    pub tools_allow_networks: String,
}

impl EgressArgs {
    /// The network policy these settings describe; an error names the variable.
    pub fn policy(&self) -> anyhow::Result<crate::egress::NetworkPolicy> {
        use anyhow::Context as _;
        crate::egress::NetworkPolicy::parse(&self.tools_allow_networks)
            .context("SPOOL_TOOLS_ALLOW_NETWORKS")
    }
}

/// The operator's named model providers: read by the worker (which calls them) and the API
/// (which checks agents' `provider` at save).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ProviderArgs {
    /// Named model providers that agents choose with `provider` (JSON):
    /// `[{"name", "kind": "openai" | "anthropic", "base_url", "api_key_env"?, "models"?,
    /// "prices"?}]`.
    #[arg(long, env = "SPOOL_PROVIDERS", value_parser = crate::provider::Providers::parse)]
    pub providers: Option<crate::provider::Providers>,

    /// Prices of the unnamed provider's models (`SPOOL_LLM_BASE_URL`), US dollars per million
    /// tokens (JSON): `{"model": {"input_per_mtok", "output_per_mtok",
    /// "cached_input_per_mtok"?}}`. A model without a price is unpriced (`cost_usd` null).
    #[arg(long, env = "SPOOL_LLM_PRICES", value_parser = |s: &str| crate::pricing::Prices::parse("SPOOL_LLM_PRICES", s))]
    pub llm_prices: Option<crate::pricing::Prices>,

    /// The key that seals tenants' provider API keys at rest (`/v1/providers`): 32 bytes as 64
    /// hex characters (`openssl rand -hex 32`), the same on every API and worker process.
    /// Unset: tenants cannot store providers (503 `secrets_not_configured`), and a process
    /// refuses to start once some are stored.
    #[arg(long, env = "SPOOL_SECRETS_KEY", hide_env_values = true)]
    pub secrets_key: Option<secrecy::SecretString>,

    /// Former `SPOOL_SECRETS_KEY` values (comma-separated) that still open the keys they
    /// sealed, while a rotation is under way.
    #[arg(long, env = "SPOOL_SECRETS_KEYS_RETIRED", hide_env_values = true)]
    pub secrets_keys_retired: Option<secrecy::SecretString>,
}

impl ProviderArgs {
    /// The providers (none when unset).
    pub fn providers(&self) -> crate::provider::Providers {
        self.providers.clone().unwrap_or_default()
    }

    /// The secrets keys (`None`: `SPOOL_SECRETS_KEY` unset or empty); an error names the
    /// variable, never the value.
    pub fn secrets_keys(&self) -> anyhow::Result<Option<crate::secrets_key::SecretsKeys>> {
        use secrecy::ExposeSecret as _;
        let Some(current) = self
            .secrets_key
            .as_ref()
            .map(|k| k.expose_secret())
            .filter(|k| !k.trim().is_empty())
        else {
            return Ok(None);
        };
        let retired = self
            .secrets_keys_retired
            .as_ref()
            .map(|k| k.expose_secret())
            .unwrap_or("");
        crate::secrets_key::SecretsKeys::parse(current, retired)
            .map(Some)
            .map_err(anyhow::Error::msg)
    }

    /// The start-up check of every process that reads providers: once a tenant has stored a
    /// provider, `SPOOL_SECRETS_KEY` must be set, well formed, and (with the retired keys)
    /// open every stored key. With none stored, a missing key only disables provider writes.
    pub async fn check_secrets(
        &self,
        db: &sqlx::PgPool,
    ) -> anyhow::Result<Option<crate::secrets_key::SecretsKeys>> {
        use anyhow::Context as _;
        let versions = crate::db::providers::key_versions(db)
            .await
            .context("reading the versions of the stored provider keys")?;
        let keys = match self.secrets_keys() {
            Ok(keys) => keys,
            Err(err) if versions.is_empty() => {
                tracing::warn!(
                    error = %err,
                    "SPOOL_SECRETS_KEY is malformed: tenants cannot store providers until it is fixed"
                );
                return Ok(None);
            }
            Err(err) => return Err(err),
        };
        if versions.is_empty() {
            return Ok(keys);
        }
        let keys = keys.context(
            "SPOOL_SECRETS_KEY is not set, but tenants have stored providers whose keys it seals",
        )?;
        let unknown: Vec<&String> = versions.iter().filter(|v| !keys.knows(v)).collect();
        anyhow::ensure!(
            unknown.is_empty(),
            "stored provider keys were sealed with key versions {unknown:?}, which neither \
             SPOOL_SECRETS_KEY nor SPOOL_SECRETS_KEYS_RETIRED is"
        );
        Ok(Some(keys))
    }
}

/// The API's HS256 secret and the identity keys: read by the API (which verifies tokens and
/// publishes the identity keys) and the worker (which signs identity tokens with a key derived
/// from the secret when none is set), so every process agrees (see [`crate::identity`]).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct IdentityArgs {
    /// HS256 secret (at least 32 bytes) that signs API tokens. Unset: an insecure development
    /// secret (the API serves only on loopback with it).
    #[arg(long, env = "SPOOL_JWT_SECRET", hide_env_values = true)]
    pub jwt_secret: Option<secrecy::SecretString>,

    /// Ed25519 private key (PKCS#8 PEM, or its 32-byte seed in base64url) that signs the
    /// `X-Spool-Identity` token of tool, MCP and hook calls. Unset: derived from
    /// `SPOOL_JWT_SECRET`. Must differ from `SPOOL_JWT_SECRET`.
    #[arg(long, env = "SPOOL_IDENTITY_KEY", hide_env_values = true)]
    pub identity_key: Option<secrecy::SecretString>,

    /// Former identity keys (same formats, comma-separated) whose public keys stay published
    /// at `/.well-known/jwks.json`, so tokens signed before a rotation keep verifying.
    #[arg(long, env = "SPOOL_IDENTITY_KEYS_RETIRED", hide_env_values = true)]
    pub identity_keys_retired: Option<secrecy::SecretString>,
}

impl IdentityArgs {
    /// `SPOOL_JWT_SECRET` checked, else the development secret (`true`).
    pub fn jwt_secret(&self) -> anyhow::Result<(secrecy::SecretString, bool)> {
        crate::identity::jwt_secret_or_dev(self.jwt_secret.as_ref())
    }

    /// The identity keys these settings give; an error names the setting at fault.
    pub fn identity_keys(&self) -> anyhow::Result<crate::identity::IdentityKeys> {
        let (secret, _) = self.jwt_secret()?;
        crate::identity::IdentityKeys::new(
            &secret,
            self.identity_key.as_ref(),
            self.identity_keys_retired.as_ref(),
        )
    }
}

/// Lease and heartbeat timing of runs.
#[derive(clap::Args, Clone, Debug)]
pub struct LeaseArgs {
    /// Seconds a claim holds a run without a heartbeat before any worker may reclaim it.
    #[arg(long, env = "SPOOL_LEASE_SECS", default_value_t = 30.0)]
    pub lease_secs: f64,

    /// Seconds between lease renewals (and `heartbeat` events) of a running run.
    #[arg(long, env = "SPOOL_HEARTBEAT_SECS", default_value_t = 10.0)]
    pub heartbeat_secs: f64,
}

impl LeaseArgs {
    /// The lease as a duration.
    pub fn lease(&self) -> Duration {
        bounded_secs(self.lease_secs)
    }

    /// The heartbeat interval as a duration.
    pub fn heartbeat(&self) -> Duration {
        bounded_secs(self.heartbeat_secs)
    }

    /// Checks that a healthy worker can always renew before its lease runs out.
    pub fn validate(&self) -> anyhow::Result<()> {
        seconds("SPOOL_LEASE_SECS", self.lease_secs, 0.5)?;
        anyhow::ensure!(
            self.heartbeat_secs.is_finite()
                && self.heartbeat_secs > 0.0
                && self.heartbeat_secs * 2.0 <= self.lease_secs,
            "SPOOL_HEARTBEAT_SECS must be positive and at most half of SPOOL_LEASE_SECS \
             (heartbeat {}, lease {})",
            self.heartbeat_secs,
            self.lease_secs
        );
        Ok(())
    }
}

/// How long a thread's events stay replayable.
#[derive(clap::Args, Clone, Debug)]
pub struct StreamArgs {
    /// Seconds a thread's stream is kept after a run completes (then trimmed; idle streams expire).
    #[arg(long, env = "SPOOL_STREAM_RETENTION_SECS", default_value_t = 86_400)]
    pub stream_retention_secs: u64,
}

impl StreamArgs {
    /// The retention window.
    pub fn retention(&self) -> Duration {
        Duration::from_secs(self.stream_retention_secs.max(1))
    }
}

/// How long operational rows are kept (DESIGN section 15, docs/operations.md "Retention"): read
/// by the worker's housekeeping, which deletes what is older, and by the API (idempotency keys,
/// the usage report's window edges).
#[derive(clap::Args, Clone, Debug)]
pub struct RetentionArgs {
    /// Days a run's step payloads and timeline are kept after it ended (0: forever).
    #[arg(long, env = "SPOOL_RETENTION_STEPS_DAYS", default_value_t = 30)]
    pub retention_steps_days: u32,

    /// Days each run's usage figures are kept after it ended (0: forever); usage older than
    /// that is reported by whole UTC days, from the daily roll-up.
    #[arg(long, env = "SPOOL_RETENTION_USAGE_DETAIL_DAYS", default_value_t = 90)]
    pub retention_usage_detail_days: u32,

    /// Hours an `Idempotency-Key` answers a repeated request (1 to 8760).
    #[arg(long, env = "SPOOL_RETENTION_IDEMPOTENCY_HOURS", default_value_t = 24)]
    pub retention_idempotency_hours: u32,
}

impl Default for RetentionArgs {
    fn default() -> Self {
        Self {
            retention_steps_days: 30,
            retention_usage_detail_days: 90,
            retention_idempotency_hours: 24,
        }
    }
}

/// The longest retention window in days (a hundred years: "forever" is 0).
pub const MAX_RETENTION_DAYS: u32 = 36_500;

impl RetentionArgs {
    /// Checks each window; an error names the variable.
    pub fn validate(&self) -> anyhow::Result<()> {
        for (name, days) in [
            ("SPOOL_RETENTION_STEPS_DAYS", self.retention_steps_days),
            (
                "SPOOL_RETENTION_USAGE_DETAIL_DAYS",
                self.retention_usage_detail_days,
            ),
        ] {
            anyhow::ensure!(
                days <= MAX_RETENTION_DAYS,
                "{name} must be a number of days from 0 (forever) to {MAX_RETENTION_DAYS}, \
                 not {days}"
            );
        }
        anyhow::ensure!(
            (1..=8760).contains(&self.retention_idempotency_hours),
            "SPOOL_RETENTION_IDEMPOTENCY_HOURS must be a number of hours from 1 to 8760, not {}",
            self.retention_idempotency_hours
        );
        Ok(())
    }

    /// How long step payloads are kept (`None`: forever).
    pub fn steps(&self) -> Option<chrono::Duration> {
        days(self.retention_steps_days)
    }

    /// How long per-run usage figures are kept (`None`: forever).
    pub fn usage_detail(&self) -> Option<chrono::Duration> {
        days(self.retention_usage_detail_days)
    }

    /// How long an idempotency key answers.
    pub fn idempotency(&self) -> chrono::Duration {
        chrono::Duration::hours(i64::from(self.retention_idempotency_hours.clamp(1, 8760)))
    }
}

fn days(days: u32) -> Option<chrono::Duration> {
    (days > 0).then(|| chrono::Duration::days(i64::from(days.min(MAX_RETENTION_DAYS))))
}

/// Webhook delivery: how many at once, how many endpoints a tenant may have, how long the
/// outbox keeps what it delivered or gave up on. Read by workers and by the API (the cap).
#[derive(clap::Args, Clone, Debug)]
pub struct WebhookArgs {
    /// Webhook deliveries one worker has in flight at once (1 to 1024); it claims more as
    /// soon as one ends.
    #[arg(long, env = "SPOOL_WEBHOOKS_CONCURRENCY", default_value_t = 32)]
    pub webhooks_concurrency: usize,

    /// Webhook tries one tenant may have in flight at once, across all workers (1 to 1024;
    /// default half of `SPOOL_WEBHOOKS_CONCURRENCY`, at least 1): a tenant whose endpoints
    /// never answer holds at most this many slots, so another tenant's delivery finds one free.
    #[arg(long, env = "SPOOL_WEBHOOKS_MAX_IN_FLIGHT_PER_TENANT")]
    pub webhooks_max_in_flight_per_tenant: Option<usize>,

    /// Webhook endpoints one tenant may have (1 to 1000); one more is 429 `too_many_webhooks`.
    #[arg(long, env = "SPOOL_WEBHOOKS_MAX_PER_TENANT", default_value_t = 20)]
    pub webhooks_max_per_tenant: u32,

    /// Days delivered and abandoned webhook deliveries (with their tries) are kept (1 to
    /// 3650); housekeeping deletes older ones.
    #[arg(long, env = "SPOOL_RETENTION_WEBHOOKS_DAYS", default_value_t = 7)]
    pub retention_webhooks_days: u32,
}

impl WebhookArgs {
    /// Fails fast on settings out of range; the error names the variable.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            (1..=1024).contains(&self.webhooks_concurrency),
            "SPOOL_WEBHOOKS_CONCURRENCY must be from 1 to 1024, not {}",
            self.webhooks_concurrency
        );
        if let Some(cap) = self.webhooks_max_in_flight_per_tenant {
            anyhow::ensure!(
                (1..=1024).contains(&cap),
                "SPOOL_WEBHOOKS_MAX_IN_FLIGHT_PER_TENANT must be from 1 to 1024, not {cap}"
            );
        }
        anyhow::ensure!(
            (1..=1000).contains(&self.webhooks_max_per_tenant),
            "SPOOL_WEBHOOKS_MAX_PER_TENANT must be from 1 to 1000, not {}",
            self.webhooks_max_per_tenant
        );
        anyhow::ensure!(
            (1..=3650).contains(&self.retention_webhooks_days),
            "SPOOL_RETENTION_WEBHOOKS_DAYS must be from 1 to 3650, not {}",
            self.retention_webhooks_days
        );
        Ok(())
    }

    /// The tries one tenant may have in flight: the setting, or half the concurrency.
    pub fn in_flight_per_tenant(&self) -> usize {
        self.webhooks_max_in_flight_per_tenant
            .unwrap_or(self.webhooks_concurrency / 2)
            .max(1)
    }

    /// How long finished deliveries are kept.
    pub fn retention(&self) -> Duration {
        Duration::from_secs(u64::from(self.retention_webhooks_days) * 86_400)
    }
}

// Settings in seconds (f64), made durations only once they are known to be representable:
// `Duration::from_secs_f64` panics on a value such as 1e30, which passes `is_finite`.

/// The longest duration any setting in seconds may give: a day. Longer ones are typos, and a
/// deadline `now + d` must stay representable wherever it is computed (reqwest, Tokio, SQL).
pub const MAX_SETTING_SECS: f64 = 86_400.0;

/// The setting `name` (its variable) of `value` seconds as a duration, if it is a number from
/// `min` to [`MAX_SETTING_SECS`]; otherwise an error that names the setting (a clear start
/// error, never a panic).
pub fn seconds(name: &str, value: f64, min: f64) -> anyhow::Result<Duration> {
    let max = MAX_SETTING_SECS;
    anyhow::ensure!(
        (min..=max).contains(&value),
        "{name} must be a number of seconds from {min} to {max}, not {value}"
    );
    Duration::try_from_secs_f64(value)
        .map_err(|_| anyhow::anyhow!("{name} must be a number of seconds, not {value}"))
}

/// `value` seconds as a duration, clamped to 0..=[`MAX_SETTING_SECS`] (0 for NaN): for
/// accessors of settings that [`seconds`] checked at start, so that even an unchecked value
/// cannot panic.
pub fn bounded_secs(value: f64) -> Duration {
    Duration::try_from_secs_f64(value.clamp(0.0, MAX_SETTING_SECS)).unwrap_or_default()
}

/// The shortest HS256 signing secret: the key should have at least 256 bits (RFC 7518, 3.2).
pub const MIN_SECRET_BYTES: usize = 32;

/// Checks the HS256 signing secret of the setting `name`: at least [`MIN_SECRET_BYTES`] long,
/// and not a value that is public or guessable though long enough: the placeholders of
/// `deploy/helm/secret.example.yaml` (`REPLACE_ME…`, 35 bytes) applied as they are, or one
/// character repeated. The error names the setting and says how to make a good one.
pub fn check_signing_secret(name: &str, secret: &str) -> anyhow::Result<()> {
    let len = secret.len();
    let how = "generate one with `openssl rand -hex 32`";
    anyhow::ensure!(
        len >= MIN_SECRET_BYTES,
        "{name} is {len} bytes; HS256 needs at least {MIN_SECRET_BYTES} ({how})"
    );
    anyhow::ensure!(
        !secret.to_ascii_uppercase().contains("REPLACE_ME"),
        "{name} is still the example's placeholder (it contains `REPLACE_ME`), a value anyone \
         can read; {how}"
    );
    let mut chars = secret.chars();
    let first = chars.next();
    anyhow::ensure!(
        !chars.all(|c| Some(c) == first),
        "{name} is one character repeated, which anyone can guess; {how}"
    );
    Ok(())
}

impl DbArgs {
    /// `SPOOL_DB_CHECK_IDLE_SECS` as a duration (0 to a day).
    pub fn check_idle(&self) -> anyhow::Result<Duration> {
        seconds("SPOOL_DB_CHECK_IDLE_SECS", self.db_check_idle_secs, 0.0)
    }

    /// The session timeouts every pooled connection gets, each from 1 ms to a day (0 would
    /// mean "none" to Postgres, which is what they exist to prevent).
    pub fn timeouts(&self) -> anyhow::Result<crate::db::Timeouts> {
        let min = 0.001;
        Ok(crate::db::Timeouts {
            statement: seconds(
                "SPOOL_DB_STATEMENT_TIMEOUT_SECS",
                self.db_statement_timeout_secs,
                min,
            )?,
            lock: seconds("SPOOL_DB_LOCK_TIMEOUT_SECS", self.db_lock_timeout_secs, min)?,
            idle_in_transaction: seconds(
                "SPOOL_DB_IDLE_IN_TRANSACTION_TIMEOUT_SECS",
                self.db_idle_in_transaction_timeout_secs,
                min,
            )?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_settings_out_of_range_are_errors_that_name_them_never_panics() {
        for bad in [1e30, f64::MAX, f64::INFINITY, f64::NAN, -1.0, 86_401.0] {
            let err = seconds("SPOOL_X_SECS", bad, 0.0).expect_err("refused");
            assert!(err.to_string().contains("SPOOL_X_SECS"), "{bad}: {err}");
            assert!(bounded_secs(bad) <= Duration::from_secs(86_400), "{bad}");
        }
        assert_eq!(
            seconds("SPOOL_X_SECS", 1.5, 0.0).expect("fine"),
            Duration::from_millis(1500)
        );
        let lease = LeaseArgs {
            lease_secs: 1e30,
            heartbeat_secs: 1e29,
        };
        let err = lease.validate().expect_err("refused").to_string();
        assert!(err.contains("SPOOL_LEASE_SECS"), "{err}");
        let db = DbArgs {
            database_url: String::new(),
            db_max_connections: 1,
            db_check_idle_secs: 1e30,
            skip_migrations: true,
            db_statement_timeout_secs: 30.0,
            db_lock_timeout_secs: 0.0,
            db_idle_in_transaction_timeout_secs: 60.0,
        };
        let err = db.check_idle().expect_err("refused").to_string();
        assert!(err.contains("SPOOL_DB_CHECK_IDLE_SECS"), "{err}");
        let err = db.timeouts().expect_err("refused").to_string();
        assert!(err.contains("SPOOL_DB_LOCK_TIMEOUT_SECS"), "{err}");
    }

    #[test]
    fn a_retention_window_out_of_range_is_an_error_that_names_it_and_zero_days_keep_forever() {
        let defaults = RetentionArgs::default();
        defaults.validate().expect("the defaults are valid");
        assert_eq!(defaults.idempotency(), chrono::Duration::hours(24));
        assert_eq!(defaults.steps(), Some(chrono::Duration::days(30)));
        for (bad, name) in [
            (
                RetentionArgs {
                    retention_idempotency_hours: 0,
                    ..RetentionArgs::default()
                },
                "SPOOL_RETENTION_IDEMPOTENCY_HOURS",
            ),
            (
                RetentionArgs {
                    retention_steps_days: MAX_RETENTION_DAYS + 1,
                    ..RetentionArgs::default()
                },
                "SPOOL_RETENTION_STEPS_DAYS",
            ),
            (
                RetentionArgs {
                    retention_usage_detail_days: u32::MAX,
                    ..RetentionArgs::default()
                },
                "SPOOL_RETENTION_USAGE_DETAIL_DAYS",
            ),
        ] {
            let err = bad.validate().expect_err("refused").to_string();
            assert!(err.contains(name), "{err}");
        }
        let forever = RetentionArgs {
            retention_steps_days: 0,
            retention_usage_detail_days: 0,
            ..RetentionArgs::default()
        };
        forever.validate().expect("0 is forever");
        assert_eq!((forever.steps(), forever.usage_detail()), (None, None));
    }
}
