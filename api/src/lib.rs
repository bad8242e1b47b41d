//! Spool's HTTP API: a thin layer that authenticates, validates, and commits runs to Postgres,
//! answering `202` at once, and the SSE gateway that replays and follows a thread's events.
//!
//! Parts: [`app`] (state, router, `serve`), [`routes`] (one module per resource, thin), [`runs`]
//! (what the API does to runs whichever surface asks: enqueue, wait, cancel, erase),
//! [`gateway`] (the SSE gateway: [`gateway::hub`] for per-thread feeds, a session per client,
//! [`gateway::ai_sdk`] for the AI SDK's format), [`openai`] (the OpenAI-compatible routes),
//! [`page`] (the chat page), [`auth`] (JWT), [`error`] (the one `ApiError` and the error body),
//! [`extract`] (JSON errors for bad input), [`wake`] (the NOTIFY after enqueues), `unread`
//! (`Connection: close` when a body was left unread), [`watch`] (run status changes for
//! `?wait=`), [`metrics`], [`openapi`] and [`cli`] (`serve`, `migrate`, `token`). `main.rs` only
//! parses the command line; everything else is here so tests can start
//! the same router on `127.0.0.1:0`. `bin/spool.rs` is the `spool` terminal client.
//!
//! The API depends on the worker crate for one thing: `spool-api serve --embedded-worker N`
//! ([`cli`]) runs workers in the same process for a one-command local start.

pub mod app;
pub mod auth;
pub mod cli;
mod drain;
pub mod error;
pub mod extract;
pub mod gateway;
pub mod metrics;
pub mod openai;
pub mod openapi;
pub mod page;
pub mod routes;
pub mod runs;
mod unread;
pub mod wake;
pub mod watch;

pub use app::{ApiConfig, AppState, router, serve};
