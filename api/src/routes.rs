//! The HTTP routes, one module per resource, each with its own `router()`.

pub mod agents;
pub mod api_keys;
pub mod health;
pub mod identity;
pub mod knowledge_bases;
pub mod list;
pub mod providers;
pub mod threads;
pub mod tools;
pub mod usage;
pub mod webhooks;
pub mod workflows;
