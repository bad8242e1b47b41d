//! Worker tests: the agent loop driven one run at a time (`run_next`) against a fake upstream
//! and real local tool and hook servers, the provider client against recorded OpenAI
//! transcripts, tools against real local servers (HTTP, MCP), the network policy, a webhook
//! try against a real receiver.

mod agent_loop;
mod agents;
mod anthropic;
mod citations;
mod context;
mod harness;
mod hooks;
mod hostile_provider;
mod identity;
mod limits;
mod mcp;
mod mcp_tools;
mod provider;
mod providers;
mod quotas;
mod ssrf;
mod structured;
mod webhooks;
