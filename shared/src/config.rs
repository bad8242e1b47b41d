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
    /// `[{"name", "kind": "openai" | "anthropic", "base_url", "api_key_env"?, "models"?}]`.
    #[arg(long, env = "SPOOL_PROVIDERS", value_parser = crate::provider::Providers::parse)]
    pub providers: Option<crate::provider::Providers>,
}

impl ProviderArgs {
    /// The providers (none when unset).
    pub fn providers(&self) -> crate::provider::Providers {
        self.providers.clone().unwrap_or_default()
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
        Duration::from_secs_f64(self.lease_secs)
    }

    /// The heartbeat interval as a duration.
    pub fn heartbeat(&self) -> Duration {
        Duration::from_secs_f64(self.heartbeat_secs)
    }

    /// Checks that a healthy worker can always renew before its lease runs out.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.lease_secs.is_finite() && self.lease_secs >= 0.5,
            "SPOOL_LEASE_SECS must be at least 0.5"
        );
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
