//! Spool's domain and the infrastructure every process shares: ids, run and message types,
//! Postgres queries (`db`), configuration pieces and telemetry set-up.
//!
//! No HTTP and no agent logic lives here: the API and the worker both depend on this crate,
//! and neither depends on the other.

pub mod agent;
pub mod config;
pub mod db;
pub mod event;
pub mod ids;
pub mod metrics;
pub mod run;
pub mod shutdown;
pub mod status;
pub mod stream;
pub mod telemetry;

pub use ids::{AgentId, MessageId, ThreadId, WorkflowId};
