//! `spool-api`: `serve`, `migrate`, `token`.

use clap::Parser as _;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    spool_api::cli::main(spool_api::cli::Cli::parse()).await
}
