//! `spool-worker run`: claims runs from Postgres and executes them.

use anyhow::Context as _;
use clap::Parser;
use spool_shared::config::{DbArgs, RedisArgs, StreamArgs};
use spool_shared::telemetry::{self, LogFormat};
use tokio_util::sync::CancellationToken;

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
        #[arg(
            long,
            env = "SPOOL_WORKER_METRICS_ADDR",
            default_value = "127.0.0.1:9464"
        )]
        metrics_addr: std::net::SocketAddr,
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
        log_format,
    } = Cli::parse();
    // Kept to the end of `main`: dropping it flushes the spans not exported yet.
    let _telemetry = telemetry::init(log_format, "spool-worker");
    spool_shared::metrics::install();
    worker.validate()?;
    let pool = spool_shared::db::connect(&db).await?;
    let shutdown = CancellationToken::new();
    tokio::spawn(spool_shared::shutdown::on_signal(shutdown.clone()));
    let keys = spool_shared::stream::StreamKeys::new(redis.redis_prefix);
    let streams = spool_worker::Streams::connect(&redis.redis_url, keys, stream.retention())
        .context("REDIS_URL")?;
    let worker = spool_worker::Worker::new(pool, db.database_url, worker, streams)?;
    let listener = tokio::net::TcpListener::bind(metrics_addr)
        .await
        .with_context(|| format!("binding the metrics port {metrics_addr}"))?;
    tracing::info!(addr = %listener.local_addr()?, "metrics and health listening");
    let ops = tokio::spawn(spool_worker::ops::serve(
        listener,
        worker.db.clone(),
        shutdown.clone(),
    ));
    spool_worker::run(worker, shutdown)
        .await
        .context("worker")?;
    ops.await.context("metrics port")?.context("metrics port")
}
