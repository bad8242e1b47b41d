//! Spool's HTTP API: a thin layer that authenticates, validates, and commits runs to Postgres,
//! answering `202` at once, and the SSE gateway that replays and follows a thread's events. `main.rs` only parses the command line; everything else is here so
//! tests can start the same router on `127.0.0.1:0`.

pub mod app;
pub mod auth;
pub mod cli;
pub mod error;
pub mod extract;
pub mod metrics;
pub mod openapi;
pub mod routes;
pub mod stream;

pub use app::{ApiConfig, AppState, router, serve};
