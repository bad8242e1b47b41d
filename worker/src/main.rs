//! `spool-worker run`: claims runs from Postgres and executes them.

use std::net::SocketAddr;

use anyhow::Context as _;
use clap::Parser;
use spool_shared::config::{DbArgs, RedisArgs, StreamArgs};
use spool_shared::telemetry::{self, LogFormat};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// mimalloc rather than glibc's malloc: see the workspace manifest.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Spool's worker.
#[derive(Parser)]
#[command(version, about)]
enum Cli {
    /// Claim and execute runs until SIGTERM or Ctrl-C.
    Run {
        #[command(flatten)]
        db: DbArgs,
        #[command(flatten)]
        redis: RedisArgs,
        #[command(flatten)]
        stream: StreamArgs,
        #[command(flatten)]
        worker: spool_worker::WorkerArgs,
        /// Address of the worker's metrics and health port (`/metrics`, `/healthz`, `/readyz`).
        /// Unset: 127.0.0.1:9464, or a free loopback port (logged) when another worker on the
        /// host has that one. Set: exactly this address, or an error if it is taken.
        #[arg(long, env = "SPOOL_WORKER_METRICS_ADDR")]
        metrics_addr: Option<SocketAddr>,
        /// Bearer token the metrics port's `GET /metrics` requires (`Authorization: Bearer
        /// <token>`); any other request to it is 401. Unset: `/metrics` is open.
        #[arg(long, env = "SPOOL_METRICS_TOKEN", hide_env_values = true)]
        metrics_token: Option<secrecy::SecretString>,
        /// Log line format.
        #[arg(long, env = "SPOOL_LOG_FORMAT", value_enum, default_value_t)]
        log_format: LogFormat,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let Cli::Run {
        db,
        redis,
        stream,
        worker,
        metrics_addr,
        metrics_token,
        log_format,
    } = Cli::parse();
    // Kept to the end of `main`: dropping it flushes the spans not exported yet.
    let _telemetry = telemetry::init(log_format, "spool-worker");
    spool_shared::metrics::install();
    worker.validate()?;
    if let Some(token) = &metrics_token {
        use secrecy::ExposeSecret as _;
        anyhow::ensure!(
            !token.expose_secret().trim().is_empty(),
            "SPOOL_METRICS_TOKEN is set but empty; unset it to leave /metrics open"
        );
    }
    // The ops port first: an address that is taken is a configuration error the operator sees
    // at once, before any Postgres connection is opened.
    let listener = bind_ops(metrics_addr).await?;
    let pool = spool_shared::db::connect(&db, "spool-worker").await?;
    worker.providers.check_secrets(&pool).await?;
    let shutdown = CancellationToken::new();
    tokio::spawn(spool_shared::shutdown::on_signal(shutdown.clone()));
    let keys = spool_shared::stream::StreamKeys::new(redis.redis_prefix);
    let streams = spool_worker::Streams::connect(&redis.redis_url, keys, stream.retention())
        .context("REDIS_URL")?;
    let timeouts = db.timeouts()?;
    let worker = spool_worker::Worker::new(pool, db.database_url, timeouts, worker, streams)?;
    tracing::info!(addr = %listener.local_addr()?, "metrics and health listening");
    let ops = tokio::spawn(spool_worker::ops::serve(
        listener,
        worker.db.clone(),
        metrics_token,
        shutdown.clone(),
    ));
    spool_worker::run(worker, shutdown)
        .await
        .context("worker")?;
    ops.await.context("metrics port")?.context("metrics port")
}

/// The ops port when none is configured.
const DEFAULT_OPS_ADDR: &str = "127.0.0.1:9464";

/// Binds the ops port: `addr` if the operator set one (a taken address is an error, with the
/// variable that set it), else the default, else (another process on the host has it) a free
/// loopback port, so any number of workers run on one host with the same configuration.
async fn bind_ops(addr: Option<SocketAddr>) -> anyhow::Result<TcpListener> {
    if let Some(addr) = addr {
        return TcpListener::bind(addr).await.with_context(|| {
            format!("binding the metrics port {addr} (SPOOL_WORKER_METRICS_ADDR)")
        });
    }
    match TcpListener::bind(DEFAULT_OPS_ADDR).await {
        Ok(listener) => Ok(listener),
        Err(err) if err.kind() == std::io::ErrorKind::AddrInUse => {
            tracing::info!(
                taken = DEFAULT_OPS_ADDR,
                "the default metrics port is taken (another worker on this host?); using a free one"
            );
            TcpListener::bind("127.0.0.1:0")
                .await
                .context("binding a free loopback port for metrics")
        }
        Err(err) => {
            Err(err).with_context(|| format!("binding the metrics port {DEFAULT_OPS_ADDR}"))
        }
    }
}
