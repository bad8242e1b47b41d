//! `spool-api`: `serve`, `migrate`, `token`.

use clap::Parser as _;

/// mimalloc rather than glibc's malloc: see the workspace manifest.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    spool_api::cli::main(spool_api::cli::Cli::parse()).await
}
