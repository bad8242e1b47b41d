//! What every run of a worker shares: the model clients, the default agent, and the HTTP
//! client that enforces the tools' network policy.

use std::sync::Arc;
use std::time::Duration;

use secrecy::ExposeSecret as _;
use spool_shared::agent::AgentSpec;
use spool_shared::db::runs::Run;

use super::llm::demo::DemoModel;
use super::llm::openai::OpenAiClient;
use super::llm::{ChatModel, LlmError};
use super::tools::identity::{Identity, IdentitySigner};
use super::tools::ssrf::{GuardedClients, NetworkPolicy};
use crate::config::WorkerArgs;

/// Models, tools' HTTP client and defaults, built once per worker.
pub struct Engine {
    demo: Arc<DemoModel>,
    provider: Option<Arc<OpenAiClient>>,
    /// The agent that answers threads without one.
    pub default_agent: AgentSpec,
    /// HTTP clients that enforce the network policy of tools, MCP servers and hooks.
    pub http: GuardedClients,
    /// How long one tool call may take.
    pub tool_timeout: Duration,
    /// Signs the identity token of outbound calls, if a secret is configured.
    identity: Option<Arc<IdentitySigner>>,
}

impl Engine {
    /// Builds the engine from the worker's settings.
    pub fn new(args: &WorkerArgs) -> anyhow::Result<Self> {
        // An empty variable (common in compose files and manifests) means unset.
        let base_url = args
            .llm_base_url
            .as_deref()
            .map(str::trim)
            .filter(|u| !u.is_empty());
        let api_key = args.llm_api_key.clone().filter(|k| !k.trim().is_empty());
        let provider = match base_url {
            Some(url) => Some(Arc::new(OpenAiClient::new(
                url,
                api_key,
                Duration::from_secs(args.llm_timeout_secs.max(1)),
            )?)),
            None => None,
        };
        let model = if provider.is_some() {
            args.llm_model.as_str()
        } else {
            super::llm::demo::MODEL_NAME
        };
        let policy = Arc::new(NetworkPolicy::parse(&args.tools_allow_networks)?);
        let http = GuardedClients::new(&policy, args.tool_timeout())?;
        // An empty variable means unset, as for the provider.
        let identity = match &args.tool_identity_secret {
            Some(secret) if !secret.expose_secret().is_empty() => {
                Some(Arc::new(IdentitySigner::new(secret)?))
            }
            _ => {
                tracing::info!(
                    "SPOOL_TOOL_IDENTITY_SECRET is not set: tool, MCP and hook calls carry \
                     X-Spool-Tenant and X-Spool-User but no signed X-Spool-Identity"
                );
                None
            }
        };
        Ok(Self {
            demo: Arc::new(DemoModel {
                tokens: args.demo_tokens,
                delay: Duration::from_millis(args.demo_delay_ms),
            }),
            provider,
            default_agent: AgentSpec::default_agent(model, &args.default_instructions),
            http,
            tool_timeout: args.tool_timeout(),
            identity,
        })
    }

    /// The identity `run` acts with on every outbound call.
    pub fn identity(&self, run: &Run) -> Identity {
        Identity::new(
            &run.tenant_id,
            &run.owner_id,
            &run.id.to_string(),
            self.identity.clone(),
        )
    }

    /// The model that serves `name`: `demo` is built in; anything else needs a provider.
    pub fn model(&self, name: &str) -> Result<Arc<dyn ChatModel>, LlmError> {
        if name == super::llm::demo::MODEL_NAME {
            return Ok(self.demo.clone());
        }
        match &self.provider {
            Some(provider) => Ok(provider.clone()),
            None => Err(LlmError::Unavailable(format!(
                "no model provider is configured (SPOOL_LLM_BASE_URL) to serve model `{name}`"
            ))),
        }
    }
}
