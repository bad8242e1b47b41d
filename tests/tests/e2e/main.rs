//! End-to-end tests: `spool-api` and `spool-worker` as real processes against real Postgres;
//! workers are killed, stopped and terminated mid-run, and the invariants are checked in the
//! database.

mod agent;
mod ai_sdk;
mod ai_sdk_client;
mod auth;
mod cli;
mod crash;
mod docs;
mod done_tool;
mod functions;
mod graph;
mod growth;
mod identity;
mod mcp_servers;
mod nextjs;
mod openai;
mod openai_refusals;
mod orchestration;
mod page;
mod providers;
mod python_client;
mod queue;
mod quotas;
mod secrets;
mod stack;
mod stalls;
mod stream;
mod telemetry;
mod tenant_providers;
mod timeline;
mod tls;
mod versioning;
