//! Worker tests: the provider client against recorded OpenAI transcripts, tools against real
//! local servers (HTTP, MCP), the network policy.

mod mcp;
mod provider;
mod ssrf;
