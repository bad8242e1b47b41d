//! The `spool-api` command line: `serve`, `migrate`, `token`, `openapi`, `probe`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use secrecy::{ExposeSecret as _, SecretString};
use tokio_util::sync::CancellationToken;

use spool_shared::config::{DbArgs, RedisArgs, StreamArgs};
use spool_shared::pricing::Usd;
use spool_shared::quota::{
    CONCURRENT_RUNS_RANGE, DAILY_TOKENS_RANGE, MAX_DAILY_BUDGET_USD, QuotaLimits, Quotas,
    RUNS_PER_HOUR_RANGE,
};
use spool_shared::stream::StreamKeys;
use spool_shared::telemetry::{self, LogFormat};

use crate::app::{ApiConfig, AppState};
use crate::auth::{Claims, JwtKeys};
use spool_shared::identity::jwt_secret_or_dev;

/// Spool's HTTP API and SSE gateway.
#[derive(clap::Parser)]
#[command(version, about)]
pub enum Cli {
    /// Serve the API (and, with `--embedded-worker N`, N workers in the same process).
    Serve(Box<ServeArgs>),
    /// Apply database migrations and exit.
    Migrate {
        #[command(flatten)]
        #[expect(missing_docs, reason = "flattened group; its fields are documented")]
        db: DbArgs,
    },
    /// Print a signed token for a user of a tenant.
    Token(TokenArgs),
    /// Print the OpenAPI 3.1 document (what `GET /openapi.json` serves) and exit.
    Openapi,
    /// GET a health URL and exit 0 on a 2xx answer, 1 otherwise: a container health check in
    /// an image without a shell or an HTTP client (`spool-api probe http://127.0.0.1:8080/readyz`).
    Probe {
        /// The URL to GET, e.g. `http://127.0.0.1:9464/readyz` for a worker.
        url: String,
        /// Seconds to wait for the answer.
        #[arg(long, default_value_t = 3.0)]
        timeout_secs: f64,
    },
}

/// Settings of `spool-api serve`.
#[derive(clap::Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "SPOOL_API_ADDR", default_value = "127.0.0.1:8080")]
    pub addr: SocketAddr,

    /// Largest `input_text` accepted, in bytes.
    #[arg(long, env = "SPOOL_MAX_INPUT_BYTES", default_value_t = 32 * 1024)]
    pub max_input_bytes: usize,

    /// Largest request body accepted, in bytes.
    #[arg(long, env = "SPOOL_MAX_BODY_BYTES", default_value_t = 1024 * 1024)]
    pub max_body_bytes: usize,

    /// Origins allowed to call the API from a browser, comma-separated (`*` for any).
    #[arg(long, env = "SPOOL_CORS_ORIGINS", value_delimiter = ',')]
    pub cors_origins: Vec<String>,

    /// Proxies whose `X-Forwarded-For` is believed, comma-separated CIDRs or addresses: a
    /// public session's client address is the last hop not among them (else the socket's
    /// peer), for its agent's `governance.ip`.
    #[arg(long, env = "SPOOL_TRUSTED_PROXIES", value_delimiter = ',')]
    pub trusted_proxies: Vec<ipnet::IpNet>,

    /// Live events buffered per streaming thread; a subscriber further behind is dropped.
    #[arg(long, env = "SPOOL_SSE_BUFFER", default_value_t = 1024)]
    pub sse_buffer: usize,

    /// Streams (SSE) one user may hold open on this process at once; one more gets 429
    /// `too_many_streams`. 0: no limit.
    #[arg(long, env = "SPOOL_SSE_MAX_STREAMS_PER_USER", default_value_t = 20)]
    pub sse_max_streams_per_user: usize,

    /// Streams (SSE) this process holds open in all, whoever opens them; one more gets 503
    /// `server_stream_capacity`. 0: no limit.
    #[arg(long, env = "SPOOL_SSE_MAX_STREAMS", default_value_t = 10_000)]
    pub sse_max_streams: usize,

    /// Seconds a write to a client may wait for the client to read before the connection is
    /// closed (a stream whose client stopped reading); 0: no limit.
    #[arg(long, env = "SPOOL_WRITE_TIMEOUT_SECS", default_value_t = 60.0)]
    pub write_timeout_secs: f64,

    /// Bearer token `GET /metrics` requires (`Authorization: Bearer <token>`); any other
    /// request to it is 401. Unset: `/metrics` is open (keep it off the public network).
    #[arg(long, env = "SPOOL_METRICS_TOKEN", hide_env_values = true)]
    pub metrics_token: Option<SecretString>,

    /// Bytes a second a client must take at least while the API's writes wait on it, measured
    /// over 10 s; a slower one is disconnected (a stream resumes with Last-Event-ID). 0: none.
    #[arg(long, env = "SPOOL_MIN_DRAIN_BYTES_PER_SEC", default_value_t = 1024)]
    pub min_drain_bytes_per_sec: u64,

    /// Run this many workers inside the API process (a one-command local start).
    #[arg(long, env = "SPOOL_EMBEDDED_WORKERS", default_value_t = 0)]
    pub embedded_worker: usize,

    /// Log line format.
    #[arg(long, env = "SPOOL_LOG_FORMAT", value_enum, default_value_t)]
    pub log_format: LogFormat,

    #[command(flatten)]
    #[expect(missing_docs, reason = "flattened group; its fields are documented")]
    pub db: DbArgs,

    #[command(flatten)]
    #[expect(missing_docs, reason = "flattened group; its fields are documented")]
    pub redis: RedisArgs,

    #[command(flatten)]
    #[expect(missing_docs, reason = "flattened group; its fields are documented")]
    pub stream: StreamArgs,

    #[command(flatten)]
    #[expect(missing_docs, reason = "flattened group; its fields are documented")]
    pub quota: QuotaArgs,

    #[command(flatten)]
    #[expect(missing_docs, reason = "flattened group; its fields are documented")]
    pub auth: AuthArgs,

    #[command(flatten)]
    #[expect(missing_docs, reason = "flattened group; its fields are documented")]
    pub worker: spool_worker::WorkerArgs,
}

/// The server's quotas (docs/operations.md), checked at enqueue for every run; unset is unlimited.
/// A value that does not parse, or is out of range, stops the process with the variable named.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct QuotaArgs {
    /// Runs one user may start per hour (1 to 1,000,000).
    #[arg(long, env = "SPOOL_QUOTA_USER_RUNS_PER_HOUR",
          value_parser = limit("SPOOL_QUOTA_USER_RUNS_PER_HOUR", RUNS_PER_HOUR_RANGE))]
    pub quota_user_runs_per_hour: Option<u64>,

    /// Runs one tenant may start per hour (1 to 1,000,000).
    #[arg(long, env = "SPOOL_QUOTA_TENANT_RUNS_PER_HOUR",
          value_parser = limit("SPOOL_QUOTA_TENANT_RUNS_PER_HOUR", RUNS_PER_HOUR_RANGE))]
    pub quota_tenant_runs_per_hour: Option<u64>,

    /// Active runs one user may have at once (1 to 100,000).
    #[arg(long, env = "SPOOL_QUOTA_USER_CONCURRENT_RUNS",
          value_parser = limit("SPOOL_QUOTA_USER_CONCURRENT_RUNS", CONCURRENT_RUNS_RANGE))]
    pub quota_user_concurrent_runs: Option<u64>,

    /// Active runs one tenant may have at once (1 to 100,000).
    #[arg(long, env = "SPOOL_QUOTA_TENANT_CONCURRENT_RUNS",
          value_parser = limit("SPOOL_QUOTA_TENANT_CONCURRENT_RUNS", CONCURRENT_RUNS_RANGE))]
    pub quota_tenant_concurrent_runs: Option<u64>,

    /// Tokens (prompt + generated) one user's runs may use per UTC day (1 to 10^12).
    #[arg(long, env = "SPOOL_QUOTA_USER_DAILY_TOKENS",
          value_parser = limit("SPOOL_QUOTA_USER_DAILY_TOKENS", DAILY_TOKENS_RANGE))]
    pub quota_user_daily_tokens: Option<u64>,

    /// Tokens (prompt + generated) one tenant's runs may use per UTC day (1 to 10^12).
    #[arg(long, env = "SPOOL_QUOTA_TENANT_DAILY_TOKENS",
          value_parser = limit("SPOOL_QUOTA_TENANT_DAILY_TOKENS", DAILY_TOKENS_RANGE))]
    pub quota_tenant_daily_tokens: Option<u64>,

    /// US dollars one user's runs may spend on model calls per UTC day, at the providers'
    /// prices (more than 0, at most 10^9).
    #[arg(long, env = "SPOOL_QUOTA_USER_DAILY_USD",
          value_parser = dollars("SPOOL_QUOTA_USER_DAILY_USD"))]
    pub quota_user_daily_usd: Option<f64>,

    /// US dollars one tenant's runs may spend on model calls per UTC day, at the providers'
    /// prices (more than 0, at most 10^9).
    #[arg(long, env = "SPOOL_QUOTA_TENANT_DAILY_USD",
          value_parser = dollars("SPOOL_QUOTA_TENANT_DAILY_USD"))]
    pub quota_tenant_daily_usd: Option<f64>,
}

/// An external identity provider whose tokens the API accepts beside its own HS256 ones
/// (docs/security.md); unset: none.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct AuthArgs {
    /// URL of the provider's JSON Web Key Set (https, or http on loopback). Set: RS256, ES256
    /// and EdDSA tokens it signed are accepted, with `SPOOL_AUTH_ISSUER` and
    /// `SPOOL_AUTH_AUDIENCE` required.
    #[arg(long, env = "SPOOL_AUTH_JWKS_URL")]
    pub auth_jwks_url: Option<String>,

    /// The `iss` the provider's tokens must carry.
    #[arg(long, env = "SPOOL_AUTH_ISSUER")]
    pub auth_issuer: Option<String>,

    /// The `aud` the provider's tokens must carry (this API's identifier there).
    #[arg(long, env = "SPOOL_AUTH_AUDIENCE")]
    pub auth_audience: Option<String>,

    /// The claim of the provider's tokens that names the tenant.
    #[arg(long, env = "SPOOL_AUTH_TENANT_CLAIM", default_value = "tenant")]
    pub auth_tenant_claim: String,

    /// The claim that lists the caller's permissions (a JSON array or a space-separated
    /// string, as OAuth's `scope`); `admin` among them makes an admin.
    #[arg(
        long,
        env = "SPOOL_AUTH_PERMISSIONS_CLAIM",
        default_value = "permissions"
    )]
    pub auth_permissions_claim: String,
}

impl AuthArgs {
    /// The provider's settings, if one is configured; an error names the setting at fault.
    pub fn external(&self) -> anyhow::Result<Option<crate::auth::ExternalSettings>> {
        let set = |value: &Option<String>| {
            value
                .as_deref()
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(str::to_owned)
        };
        let Some(url) = set(&self.auth_jwks_url) else {
            return Ok(None);
        };
        let jwks_url = reqwest::Url::parse(&url)
            .map_err(|err| anyhow::anyhow!("SPOOL_AUTH_JWKS_URL is not a URL ({err})"))?;
        let loopback = match jwks_url.host_str() {
            Some("localhost") => true,
            Some(host) => host
                .trim_matches(['[', ']'])
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback()),
            None => false,
        };
        anyhow::ensure!(
            jwks_url.scheme() == "https" || (jwks_url.scheme() == "http" && loopback),
            "SPOOL_AUTH_JWKS_URL must be https (http only on loopback), not {}",
            jwks_url.scheme()
        );
        let issuer = set(&self.auth_issuer)
            .ok_or_else(|| anyhow::anyhow!("SPOOL_AUTH_JWKS_URL needs SPOOL_AUTH_ISSUER"))?;
        let audience = set(&self.auth_audience)
            .ok_or_else(|| anyhow::anyhow!("SPOOL_AUTH_JWKS_URL needs SPOOL_AUTH_AUDIENCE"))?;
        Ok(Some(crate::auth::ExternalSettings {
            jwks_url,
            issuer,
            audience,
            tenant_claim: self.auth_tenant_claim.clone(),
            permissions_claim: self.auth_permissions_claim.clone(),
        }))
    }
}

/// A parser of a whole number in `range` whose errors name `variable`.
fn limit(
    variable: &'static str,
    range: std::ops::RangeInclusive<u64>,
) -> impl Fn(&str) -> Result<u64, String> + Clone + Send + Sync + 'static {
    move |text| {
        let (low, high) = (range.start(), range.end());
        match text.trim().parse::<u64>() {
            Ok(value) if range.contains(&value) => Ok(value),
            _ => Err(format!(
                "{variable} must be a whole number from {low} to {high} (unset: unlimited), \
                 not `{text}`"
            )),
        }
    }
}

/// A parser of a daily budget in dollars that names `variable` when it fails.
fn dollars(
    variable: &'static str,
) -> impl Fn(&str) -> Result<f64, String> + Clone + Send + Sync + 'static {
    move |text| match text.trim().parse::<f64>() {
        Ok(value) if value > 0.0 && value <= MAX_DAILY_BUDGET_USD => Ok(value),
        _ => Err(format!(
            "{variable} must be a number of US dollars more than 0 and at most \
             {MAX_DAILY_BUDGET_USD} (unset: unlimited), not `{text}`"
        )),
    }
}

impl QuotaArgs {
    /// The quotas they set.
    pub fn quotas(&self) -> Quotas {
        let small = |value: Option<u64>| value.map(|v| u32::try_from(v).unwrap_or(u32::MAX));
        Quotas {
            user: QuotaLimits {
                runs_per_hour: small(self.quota_user_runs_per_hour),
                max_concurrent_runs: small(self.quota_user_concurrent_runs),
                daily_token_budget: self.quota_user_daily_tokens,
                daily_budget_usd: self.quota_user_daily_usd.map(Usd),
            },
            tenant: QuotaLimits {
                runs_per_hour: small(self.quota_tenant_runs_per_hour),
                max_concurrent_runs: small(self.quota_tenant_concurrent_runs),
                daily_token_budget: self.quota_tenant_daily_tokens,
                daily_budget_usd: self.quota_tenant_daily_usd.map(Usd),
            },
            ip: QuotaLimits::default(),
        }
    }
}

/// Settings of `spool-api token`.
#[derive(clap::Args)]
pub struct TokenArgs {
    /// The user (`sub` claim).
    #[arg(long)]
    pub sub: String,
    /// The tenant (`tenant` claim).
    #[arg(long)]
    pub tenant: String,
    /// Every permission (`admin: true`).
    #[arg(long)]
    pub admin: bool,
    /// A permission the token holds (repeatable): `agents:read`, `agents:write`,
    /// `tools:write`, `providers:write`, `runs:create`, `runs:read:tenant`, `webhooks:admin`,
    /// `usage:read`, `api_keys:admin`, `admin`. Without any (and without `--admin`), the token
    /// has `agents:read` and `runs:create`.
    #[arg(long = "permission", value_name = "PERMISSION", value_parser = permission)]
    pub permissions: Vec<String>,
    /// Seconds until the token expires.
    #[arg(long, default_value_t = 24 * 3600)]
    pub ttl: u64,
    /// HS256 secret (the same as the server's).
    #[arg(long, env = "SPOOL_JWT_SECRET", hide_env_values = true)]
    pub jwt_secret: Option<SecretString>,
}

/// A `--permission`: one of [`crate::auth::Permission`]'s names.
fn permission(name: &str) -> Result<String, String> {
    crate::auth::Permission::parse(name)
        .map(|p| p.as_str().to_owned())
        .ok_or_else(|| {
            let names: Vec<&str> = crate::auth::Permission::ALL
                .iter()
                .map(|p| p.as_str())
                .collect();
            format!("not a permission; one of {}", names.join(", "))
        })
}

/// `SPOOL_WRITE_TIMEOUT_SECS` as a timeout (0: none).
fn write_timeout(secs: f64) -> anyhow::Result<Option<Duration>> {
    let timeout = Duration::try_from_secs_f64(secs).map_err(|_| {
        anyhow::anyhow!("SPOOL_WRITE_TIMEOUT_SECS must be zero or more, not {secs}")
    })?;
    Ok((!timeout.is_zero()).then_some(timeout))
}

/// `SPOOL_METRICS_TOKEN`, if set: not empty (an empty one would look like protection).
fn metrics_token(token: Option<SecretString>) -> anyhow::Result<Option<SecretString>> {
    if let Some(token) = &token {
        anyhow::ensure!(
            !token.expose_secret().trim().is_empty(),
            "SPOOL_METRICS_TOKEN is set but empty; unset it to leave /metrics open"
        );
    }
    Ok(token)
}

/// Runs the command.
pub async fn main(cli: Cli) -> anyhow::Result<()> {
    match cli {
        Cli::Serve(args) => serve(*args).await,
        Cli::Openapi => {
            use std::io::Write as _;
            let json = crate::openapi::document().to_pretty_json()?;
            match writeln!(std::io::stdout().lock(), "{json}") {
                // A reader that stopped early (`| head`) is not an error.
                Err(err) if err.kind() != std::io::ErrorKind::BrokenPipe => Err(err.into()),
                _ => Ok(()),
            }
        }
        Cli::Probe { url, timeout_secs } => {
            let timeout = Duration::try_from_secs_f64(timeout_secs)
                .context("--timeout-secs must be a non-negative number")?;
            let response = reqwest::Client::builder()
                .timeout(timeout)
                .build()?
                .get(&url)
                .send()
                .await
                .with_context(|| format!("GET {url}"))?;
            anyhow::ensure!(
                response.status().is_success(),
                "GET {url}: {}",
                response.status()
            );
            Ok(())
        }
        Cli::Migrate { db } => {
            let _telemetry = telemetry::init(LogFormat::Pretty, "spool-api");
            spool_shared::db::connect(
                &DbArgs {
                    skip_migrations: false,
                    ..db
                },
                "spool-api",
            )
            .await?;
            println!("migrations applied");
            Ok(())
        }
        Cli::Token(args) => {
            let (secret, _) = jwt_secret_or_dev(args.jwt_secret.as_ref())?;
            let exp = u64::try_from(chrono::Utc::now().timestamp())? + args.ttl;
            let claims = Claims {
                sub: args.sub,
                tenant: args.tenant,
                exp,
                admin: args.admin,
                permissions: (!args.permissions.is_empty()).then_some(args.permissions),
            };
            println!("{}", JwtKeys::new(&secret).sign(&claims)?);
            Ok(())
        }
    }
}

/// What verifies bearer tokens: the HS256 secret, and the external provider if one is set.
fn verifier(secret: &SecretString, auth: &AuthArgs) -> anyhow::Result<JwtKeys> {
    let jwt = JwtKeys::new(secret);
    let Some(external) = auth.external()? else {
        return Ok(jwt);
    };
    tracing::info!(jwks_url = %external.jwks_url, issuer = %external.issuer,
        "accepting the tokens of an external identity provider");
    Ok(jwt.with_external(crate::auth::ExternalAuth::new(external)?))
}

/// The settings the handlers read, from the command line (and what `serve` checked of it).
fn api_config(
    args: &ServeArgs,
    write_timeout: Option<Duration>,
    secrets: Option<spool_shared::secrets_key::SecretsKeys>,
    identity_jwks: spool_shared::identity::Jwks,
) -> anyhow::Result<ApiConfig> {
    Ok(ApiConfig {
        max_input_bytes: args.max_input_bytes,
        max_body_bytes: args.max_body_bytes,
        max_streams_per_user: args.sse_max_streams_per_user,
        max_streams: args.sse_max_streams,
        write_timeout,
        min_drain_bytes_per_sec: args.min_drain_bytes_per_sec,
        cors_origins: args.cors_origins.clone(),
        trusted_proxies: args.trusted_proxies.clone(),
        stream_retention: args.stream.retention(),
        quotas: args.quota.quotas(),
        providers: args.worker.providers.providers(),
        secrets: secrets.map(Arc::new),
        network_policy: Arc::new(args.worker.egress.policy()?),
        builtin_tools: args.worker.builtin_tools.clone(),
        retention: args.worker.retention.clone(),
        max_webhooks_per_tenant: args.worker.webhooks.webhooks_max_per_tenant,
        metrics_token: metrics_token(args.metrics_token.clone())?,
        identity_jwks,
    })
}

/// The `--embedded-worker` workers, started: one pool of their own, as a worker process would
/// have, so runs do not take the API's connections from its requests (review M10), and a
/// Redis connection each.
async fn embedded_workers(
    args: &ServeArgs,
    keys: &StreamKeys,
    shutdown: &CancellationToken,
) -> anyhow::Result<tokio::task::JoinSet<anyhow::Result<()>>> {
    let mut workers = tokio::task::JoinSet::new();
    if args.embedded_worker == 0 {
        return Ok(workers);
    }
    let worker_db = DbArgs {
        skip_migrations: true,
        ..args.db.clone()
    };
    let worker_db = spool_shared::db::connect(&worker_db, "spool-worker").await?;
    for _ in 0..args.embedded_worker {
        let streams = spool_worker::Streams::connect(
            &args.redis.redis_url,
            keys.clone(),
            args.stream.retention(),
        )
        .context("REDIS_URL")?;
        let worker = spool_worker::Worker::new(
            worker_db.clone(),
            args.db.database_url.clone(),
            args.db.timeouts()?,
            args.worker.clone(),
            streams,
        )?;
        workers.spawn(spool_worker::run(worker, shutdown.clone()));
    }
    Ok(workers)
}

/// `spool-api serve`: telemetry, the database, Redis and the hub, the state, the embedded
/// workers, the listener, then serving until a signal, each step in its order here.
async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    // Kept to the end of `serve`: dropping it flushes the spans not exported yet.
    let _telemetry = telemetry::init(args.log_format, "spool-api");
    spool_shared::metrics::install();
    args.worker.validate()?;
    let write_timeout = write_timeout(args.write_timeout_secs)?;
    let (secret, dev_secret) = args.worker.identity.jwt_secret()?;
    // Checked here as well as by the embedded workers: the API publishes these keys.
    let identity_keys = args.worker.identity.identity_keys()?;
    let jwt = verifier(&secret, &args.auth)?;
    if dev_secret {
        anyhow::ensure!(
            args.addr.ip().is_loopback(),
            "SPOOL_JWT_SECRET is not set: refusing to serve on {} with the development secret",
            args.addr
        );
        tracing::warn!("SPOOL_JWT_SECRET is not set: using the insecure development secret");
    }
    let db = spool_shared::db::connect(&args.db, "spool-api").await?;
    let secrets = args.worker.providers.check_secrets(&db).await?;
    let shutdown = CancellationToken::new();
    tokio::spawn(spool_shared::shutdown::on_signal(shutdown.clone()));
    let keys = StreamKeys::new(args.redis.redis_prefix.clone());
    let streams = crate::gateway::Hub::start(
        &args.redis.redis_url,
        keys.clone(),
        args.sse_buffer,
        shutdown.clone(),
    )
    .context("REDIS_URL")?;
    let admission = spool_shared::quota::admission::Admission::new(streams.conn(), &keys);
    let config = api_config(&args, write_timeout, secrets, identity_keys.jwks())?;
    let state = AppState {
        db: db.clone(),
        streams,
        shutdown: shutdown.clone(),
        jwt: Arc::new(jwt),
        config: Arc::new(config),
        runs: crate::watch::RunWatch::start(db.clone(), shutdown.clone()),
        wake: crate::wake::Wake::start(db.clone(), shutdown.clone()),
        admission,
    };
    let mut workers = embedded_workers(&args, &keys, &shutdown).await?;

    let listener = tokio::net::TcpListener::bind(args.addr)
        .await
        .with_context(|| format!("binding {}", args.addr))?;
    tracing::info!(addr = %listener.local_addr()?, embedded_workers = args.embedded_worker,
        "spool-api listening");
    crate::app::serve(listener, state, shutdown.clone())
        .await
        .context("serving")?;
    while let Some(result) = workers.join_next().await {
        result
            .context("embedded worker panicked")?
            .context("embedded worker")?;
    }
    // Let in-flight log lines out before the runtime goes away.
    tokio::time::sleep(Duration::from_millis(10)).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_timeout_is_zero_or_more_seconds_and_zero_is_none() {
        assert_eq!(write_timeout(0.0).expect("0"), None);
        assert_eq!(
            write_timeout(1.5).expect("1.5"),
            Some(Duration::from_millis(1500))
        );
        for bad in [-1.0, f64::NAN, f64::INFINITY, 1e30] {
            let err = write_timeout(bad).expect_err("refused").to_string();
            assert!(err.contains("SPOOL_WRITE_TIMEOUT_SECS"), "{err}");
        }
    }

    #[test]
    fn a_jwt_secret_shorter_than_32_bytes_is_refused_with_the_variable_named() {
        use spool_shared::identity::MIN_JWT_SECRET_BYTES as MIN_SECRET_BYTES;
        let short = jwt_secret_or_dev(Some(&SecretString::from("too-short".to_owned())));
        let err = short.expect_err("refused").to_string();
        assert!(
            err.contains("SPOOL_JWT_SECRET") && err.contains("9 bytes"),
            "{err}"
        );
        let good = "3f9c1a0e7b5d4c2a8e6f1b3d5c7a9e0f".to_owned();
        let (_, dev) = jwt_secret_or_dev(Some(&SecretString::from(good))).expect("accepted");
        assert!(!dev);
        for (guessable, says) in [
            ("REPLACE_ME_WITH_32_RANDOM_BYTES_HEX", "REPLACE_ME"),
            (&"k".repeat(MIN_SECRET_BYTES), "one character repeated"),
        ] {
            let err = jwt_secret_or_dev(Some(&SecretString::from(guessable.to_owned())))
                .expect_err("refused")
                .to_string();
            assert!(
                err.contains("SPOOL_JWT_SECRET") && err.contains(says),
                "{err}"
            );
        }
        let (secret, dev) = jwt_secret_or_dev(None).expect("development secret");
        assert!(dev && secret.expose_secret().len() >= MIN_SECRET_BYTES);
    }

    #[test]
    fn an_external_jwks_url_must_be_https_or_loopback_http_with_issuer_and_audience() {
        let auth = |url: &str| AuthArgs {
            auth_jwks_url: Some(url.to_owned()),
            auth_issuer: Some("https://idp/".to_owned()),
            auth_audience: Some("spool".to_owned()),
            ..AuthArgs::default()
        };
        for ok in [
            "https://idp.example.com/jwks",
            "http://127.0.0.1:9/jwks",
            "http://[::1]:9/jwks",
        ] {
            assert!(auth(ok).external().expect(ok).is_some(), "{ok}");
        }
        for bad in [
            "http://idp.example.com/jwks",
            "ftp://127.0.0.1/",
            "not a url",
        ] {
            let err = auth(bad).external().expect_err(bad).to_string();
            assert!(err.contains("SPOOL_AUTH_JWKS_URL"), "{bad}: {err}");
        }
        let mut missing = auth("https://idp.example.com/jwks");
        missing.auth_audience = None;
        let err = missing.external().expect_err("refused").to_string();
        assert!(err.contains("SPOOL_AUTH_AUDIENCE"), "{err}");
        assert!(AuthArgs::default().external().expect("unset").is_none());
    }

    #[test]
    fn a_quota_that_does_not_parse_stops_the_start_with_the_variable_named() {
        use clap::Parser as _;
        for (value, ok) in [("10", true), ("0", false), ("ten", false), ("1.5", false)] {
            let parsed =
                Cli::try_parse_from(["spool-api", "serve", "--quota-user-runs-per-hour", value]);
            match parsed {
                Ok(Cli::Serve(args)) => {
                    assert!(ok, "{value} accepted");
                    assert_eq!(args.quota.quotas().user.runs_per_hour, Some(10));
                }
                Ok(_) => unreachable!("serve parses as serve"),
                Err(err) => {
                    assert!(!ok, "{value} refused: {err}");
                    let err = err.to_string();
                    assert!(err.contains("SPOOL_QUOTA_USER_RUNS_PER_HOUR"), "{err}");
                }
            }
        }
    }
}
