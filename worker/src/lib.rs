//! Spool's worker: claims runs from Postgres, keeps their leases, executes them, and writes
//! their results once.
//!
//! Parts, one file each: [`config`] (flags and environment), [`claim`] (the claim loop and
//! graceful shutdown), [`lease`] (the lease keeper on its own thread), [`run`] (one attempt of
//! one run), [`ops`] (the metrics and health port), [`publish`] (its events to the thread's Redis Stream) and [`demo`] (the built-in
//! model).
//!
//! What must stay true: a claim is one statement; every write of an attempt is fenced on it; a
//! worker that loses a lease stops that run within one heartbeat; SIGTERM never burns an
//! attempt.

pub mod agent;
pub mod claim;
pub mod config;
pub mod demo;
pub mod lease;
pub mod ops;
pub mod publish;
pub mod run;

pub use claim::{Worker, run};
pub use config::WorkerArgs;
pub use publish::Streams;
