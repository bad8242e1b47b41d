//! Spool's worker: claims runs from Postgres, keeps their leases, executes them, and writes
//! their results once.
//!
//! Parts, one file each: [`config`] (flags and environment), [`worker`] (what the claim loop
//! and every attempt share), [`claim`] (the claim loop and graceful shutdown), [`lease`] (the
//! lease keeper on its own thread), [`attempt`] (one attempt of one run, from the claim to its
//! fenced end), [`stop`] (an attempt's stop signal), [`agent`] (the ReAct loop, its models and
//! tools), [`publish`] (the attempt's events to the thread's Redis Stream), [`webhooks`]
//! (delivering the webhook outbox, off every run's path), [`housekeeping`] (expired rows no
//! run owns) and [`ops`] (the metrics and health port).
//!
//! Dependencies run one way: the claim loop starts attempts, an attempt runs the agent, and the
//! agent sees only its [`agent::context::Attempt`] (the database, the engine, the claimed run,
//! the stop signal and the publisher), never the claim loop or the lease keeper.
//!
//! What must stay true: a claim is one statement; every write of an attempt is fenced on it; a
//! worker that loses a lease stops that run within one heartbeat; SIGTERM never burns an
//! attempt.

pub mod agent;
pub mod attempt;
pub mod claim;
pub mod config;
pub mod housekeeping;
pub mod lease;
pub mod ops;
pub mod publish;
pub mod stop;
pub mod webhooks;
pub mod worker;

pub use agent::llm::demo;
pub use claim::{Executed, run, run_next};
pub use config::WorkerArgs;
pub use publish::Streams;
pub use worker::Worker;
