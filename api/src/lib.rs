//! Spool's HTTP API: a thin layer that authenticates, validates, and commits runs to Postgres,
//! answering `202` at once, and the SSE gateway that replays and follows a thread's events.
//!
//! Parts: [`app`] (state, router, `serve`), [`routes`] (one module per resource), [`gateway`]
//! (the SSE gateway, with [`gateway::hub`] for per-thread feeds), [`auth`] (JWT), [`error`] (the
//! one `ApiError` and the error body), [`extract`] (JSON errors for bad input), [`metrics`],
//! [`openapi`] and [`cli`] (`serve`, `migrate`, `token`). `main.rs` only parses the command
//! line; everything else is here so tests can start the same router on `127.0.0.1:0`.
//!
//! The API depends on the worker crate for two things: `spool-api serve --embedded-worker N`
//! ([`cli`]) runs workers in the same process for a one-command local start, and webhook URLs
//! pass the tools' network policy (`agent::tools::ssrf`, in [`app`] and `routes::webhooks`).
//! The gateway imports nothing from it.

pub mod app;
pub mod auth;
pub mod cli;
pub mod error;
pub mod extract;
pub mod gateway;
pub mod metrics;
pub mod openai;
pub mod openapi;
pub mod page;
pub mod routes;
pub mod wake;
pub mod watch;

pub use app::{ApiConfig, AppState, router, serve};
