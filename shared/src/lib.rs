//! Spool's domain and the infrastructure every process shares: ids ([`ids`]), statuses
//! ([`status`]), what a run records ([`run`]) and the citations of its answer ([`citation`]), agent specs and their validation ([`agent`]),
//! the Postgres queries ([`db`], with the run queue in [`db::runs`], the saved step in
//! [`db::steps`] and the enqueue in [`db::enqueue`]), the event envelope ([`event`]), the
//! Redis stream layout ([`stream`]), quotas and their counters in Redis ([`quota`]), named
//! model providers ([`provider`]; a tenant's own in [`db::providers`], their keys sealed with
//! [`secrets_key`]) and their prices ([`pricing`]), configuration pieces ([`config`]), metrics ([`metrics`]),
//! telemetry set-up ([`telemetry`]) and process signals ([`shutdown`]).
//!
//! No HTTP and no agent loop lives here: the API and the worker both depend on this crate. The
//! API depends on the worker to run workers in its own process (`spool-api serve
//! --embedded-worker N`) and for the tools' network policy, which webhook URLs pass too.

pub mod agent;
pub mod citation;
pub mod config;
pub mod db;
pub mod egress;
pub mod event;
pub mod identity;
pub mod ids;
pub mod metrics;
pub mod pricing;
pub mod provider;
pub mod quota;
pub mod redis_conn;
pub mod run;
pub mod secrets_key;
pub mod shutdown;
pub mod status;
pub mod stream;
pub mod telemetry;

pub use ids::{AgentId, MessageId, ThreadId, WorkflowId};
