//! HTTP tests: the real router on `127.0.0.1:0`, real Postgres, workers in the same process.

mod agents;
mod ai_sdk;
mod api_keys;
mod cancel;
mod common;
mod control;
mod enqueue;
mod external_auth;
mod identity;
mod isolation;
mod keepalive;
mod metrics;
mod openai;
mod openapi;
mod overrides;
mod pauses;
mod permissions;
mod public_agents;
mod stream;
mod stream_tokens;
mod tools;
mod traces;
mod usage;
mod validation;
mod webhooks;
