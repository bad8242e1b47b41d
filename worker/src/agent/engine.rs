//! What every run of a worker shares: the model clients, the default agent, and the HTTP
//! client that enforces the tools' network policy.
//!
//! A tenant's own providers (`/v1/providers`) are read from Postgres when a run calls them
//! (the run's snapshot names the provider's id): their clients are cached per (tenant,
//! provider), and a cached client is checked against the row's `updated_at` once it is
//! [`TENANT_PROVIDER_TTL`] old, so a changed key or URL is used within seconds. Their calls go
//! through the network policy (the tenant chose the address), and their keys are opened with
//! `SPOOL_SECRETS_KEY` only to build the client.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use spool_shared::agent::AgentSpec;
use spool_shared::db::runs::Run;

use anyhow::Context as _;
use spool_shared::pricing::{ModelPrice, Prices, Usd};
use spool_shared::provider::{ProviderKind, ProviderSpec};
use spool_shared::run::Usage;

use super::llm::anthropic::AnthropicClient;
use super::llm::demo::DemoModel;
use super::llm::openai::OpenAiClient;
use super::llm::{ChatModel, LlmError, Timeouts};
use super::tools::identity::{Identity, IdentitySigner};
use crate::config::WorkerArgs;
use spool_shared::db::providers::ProviderSettings;
use spool_shared::egress::{GuardedClients, NetworkPolicy, Redirects};
use spool_shared::ids::ProviderId;
use spool_shared::secrets_key::SecretsKeys;

/// How long a tenant provider's cached client is used before its row is checked again.
pub const TENANT_PROVIDER_TTL: Duration = Duration::from_secs(2);

/// A tenant provider's client, as built from its row at `updated_at`.
#[derive(Clone)]
struct TenantClient {
    client: Arc<dyn ChatModel>,
    settings: ProviderSettings,
    updated_at: DateTime<Utc>,
    checked: Instant,
}

/// Models, tools' HTTP client and defaults, built once per worker.
pub struct Engine {
    demo: Arc<DemoModel>,
    /// The unnamed provider (`SPOOL_LLM_BASE_URL`).
    provider: Option<Arc<OpenAiClient>>,
    /// The prices of the unnamed provider's models (`SPOOL_LLM_PRICES`).
    provider_prices: Prices,
    /// The named providers (`SPOOL_PROVIDERS`), with their clients.
    providers: Vec<(ProviderSpec, Arc<dyn ChatModel>)>,
    /// The agent that answers threads without one.
    pub default_agent: AgentSpec,
    /// HTTP clients that enforce the network policy of tools, MCP servers and hooks.
    pub http: GuardedClients,
    /// How long one tool call may take.
    pub tool_timeout: Duration,
    /// The most tools one MCP server's discovery keeps (`SPOOL_MCP_MAX_TOOLS`).
    pub mcp_max_tools: usize,
    /// The built-in tools the operator enables (`SPOOL_BUILTIN_TOOLS`).
    pub builtin_tools: crate::config::Builtins,
    /// Signs the identity token of outbound calls.
    identity: Option<Arc<IdentitySigner>>,
    /// Opens tenants' provider keys (`SPOOL_SECRETS_KEY`).
    secrets: Option<Arc<SecretsKeys>>,
    /// The network policy tenants' providers are called through.
    egress: Arc<NetworkPolicy>,
    /// The bounds of every model call.
    timeouts: Timeouts,
    /// Tenants' provider clients, by (tenant, provider).
    tenant_clients: Mutex<HashMap<(String, ProviderId), TenantClient>>,
    /// Whether spans carry content (`SPOOL_OTEL_CAPTURE_CONTENT`; see [`super::genai`]).
    pub capture_content: bool,
}

impl Engine {
    /// Builds the engine from the worker's settings; tools, MCP servers and hooks reach what
    /// `egress` permits.
    pub fn new(args: &WorkerArgs, egress: &Arc<NetworkPolicy>) -> anyhow::Result<Self> {
        // An empty variable (common in compose files and manifests) means unset.
        let base_url = args
            .llm_base_url
            .as_deref()
            .map(str::trim)
            .filter(|u| !u.is_empty());
        let api_key = args.llm_api_key.clone().filter(|k| !k.trim().is_empty());
        let timeouts = Timeouts {
            idle: Duration::from_secs(args.llm_timeout_secs.max(1)),
            call: Duration::from_secs(args.llm_call_timeout_secs.max(1)),
        };
        let provider = match base_url {
            Some(url) => Some(Arc::new(OpenAiClient::with_timeouts(
                url, api_key, timeouts,
            )?)),
            None => None,
        };
        let providers = args
            .providers
            .providers
            .iter()
            .flat_map(|p| p.0.iter())
            .map(|spec| Ok((spec.clone(), named_client(spec, timeouts)?)))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let model = if provider.is_some() {
            args.llm_model.as_str()
        } else {
            super::llm::demo::MODEL_NAME
        };
        let http = GuardedClients::new(egress, args.tool_timeout())?;
        let identity = Some(Arc::new(IdentitySigner::new(
            args.identity.identity_keys()?,
        )));
        if args.identity.jwt_secret.is_none() && args.identity.identity_key.is_none() {
            tracing::warn!(
                "neither SPOOL_IDENTITY_KEY nor SPOOL_JWT_SECRET is set: identity tokens are \
                 signed with a key derived from the public development secret"
            );
        }
        if std::env::var_os("SPOOL_TOOL_IDENTITY_SECRET").is_some() {
            tracing::warn!(
                "SPOOL_TOOL_IDENTITY_SECRET is no longer read: X-Spool-Identity is an EdDSA \
                 token that tools verify with GET /.well-known/jwks.json (docs/security.md)"
            );
        }
        Ok(Self {
            demo: Arc::new(DemoModel {
                tokens: args.demo_tokens,
                delay: Duration::from_millis(args.demo_delay_ms),
            }),
            provider,
            provider_prices: args.providers.llm_prices.clone().unwrap_or_default(),
            providers,
            default_agent: AgentSpec::default_agent(model, &args.default_instructions),
            http,
            tool_timeout: args.tool_timeout(),
            mcp_max_tools: args.mcp_max_tools,
            builtin_tools: args.builtin_tools.clone(),
            identity,
            // A malformed key was refused at start if tenants have providers; else there is
            // nothing to open.
            secrets: args.providers.secrets_keys().ok().flatten().map(Arc::new),
            egress: Arc::clone(egress),
            timeouts,
            tenant_clients: Mutex::default(),
            capture_content: args.otel_capture_content,
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

    /// The models a run of `spec` (of `tenant`) may call: its model, then its
    /// `fallback_models`, each with the client that serves it: the tenant provider the run
    /// snapshotted, else the operator's.
    pub(crate) async fn models(
        &self,
        db: &PgPool,
        tenant: &str,
        spec: &AgentSpec,
    ) -> Result<Vec<Candidate>, LlmError> {
        let tenant_provider = match spec.provider_id {
            Some(id) => Some(self.tenant_provider(db, tenant, id).await?),
            None => None,
        };
        std::iter::once(&spec.model)
            .chain(&spec.fallback_models)
            .map(|name| {
                let (model, price) = match &tenant_provider {
                    Some(provider) => provider.serving(name),
                    None => self.model(spec.provider.as_deref(), name)?,
                };
                Ok(Candidate {
                    name: name.clone(),
                    model,
                    price,
                })
            })
            .collect()
    }

    /// The model that writes the summaries of a thread's older turns: the agent's
    /// `summary_model` (else its model), served as its model is.
    pub(crate) async fn summarizer(
        &self,
        db: &PgPool,
        tenant: &str,
        spec: &AgentSpec,
    ) -> Result<Candidate, LlmError> {
        let name = spec.summary_model.as_ref().unwrap_or(&spec.model);
        let (model, price) = match spec.provider_id {
            Some(id) => self.tenant_provider(db, tenant, id).await?.serving(name),
            None => self.model(spec.provider.as_deref(), name)?,
        };
        Ok(Candidate {
            name: name.clone(),
            model,
            price,
        })
    }

    /// The client of the tenant's provider `id`: cached, and rebuilt when its row changed.
    async fn tenant_provider(
        &self,
        db: &PgPool,
        tenant: &str,
        id: ProviderId,
    ) -> Result<TenantClient, LlmError> {
        let key = (tenant.to_owned(), id);
        let cached = self.cache().get(&key).cloned();
        if let Some(cached) = &cached
            && cached.checked.elapsed() < TENANT_PROVIDER_TTL
        {
            return Ok(cached.clone());
        }
        let row = spool_shared::db::providers::find(db, id, tenant)
            .await
            .map_err(|err| {
                tracing::warn!(error = %err, provider.id = %id, "reading the tenant's provider");
                LlmError::Unavailable("the tenant's provider could not be read".into())
            })?;
        let Some(row) = row else {
            self.cache().remove(&key);
            return Err(LlmError::Unavailable(
                "the tenant's provider this run names was deleted".into(),
            ));
        };
        let fresh = match cached {
            Some(cached) if cached.updated_at == row.updated_at => TenantClient {
                checked: Instant::now(),
                ..cached
            },
            _ => TenantClient {
                client: self.tenant_client(&row)?,
                settings: row.settings,
                updated_at: row.updated_at,
                checked: Instant::now(),
            },
        };
        self.cache().insert(key, fresh.clone());
        Ok(fresh)
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, HashMap<(String, ProviderId), TenantClient>> {
        self.tenant_clients
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A client for a tenant's provider: its key opened, its URL through the network policy,
    /// no redirect followed. The errors name neither the key nor the URL (end users read them).
    fn tenant_client(
        &self,
        row: &spool_shared::db::providers::StoredProvider,
    ) -> Result<Arc<dyn ChatModel>, LlmError> {
        let name = &row.settings.name;
        let secrets = self.secrets.as_ref().ok_or_else(|| {
            LlmError::Unavailable(format!(
                "provider `{name}`: this worker has no SPOOL_SECRETS_KEY to open its key"
            ))
        })?;
        let api_key = row.api_key(secrets).map_err(|err| {
            tracing::error!(error = %err, provider.id = %row.id, "opening a provider's key");
            LlmError::Unavailable(format!("provider `{name}`: its key does not open here"))
        })?;
        let url = reqwest::Url::parse(&row.settings.base_url)
            .map_err(|_| LlmError::Unavailable(format!("provider `{name}`: invalid base_url")))?;
        self.egress.check_url(&url).map_err(|reason| {
            LlmError::Unavailable(format!(
                "provider `{name}`: the network policy refuses its base_url: {reason}"
            ))
        })?;
        let http = spool_shared::egress::guarded_client(
            Arc::clone(&self.egress),
            self.timeouts.call,
            Redirects::Never,
        )
        .map_err(|err| LlmError::Unavailable(format!("provider `{name}`: {err}")))?;
        let base = &row.settings.base_url;
        Ok(match row.settings.kind {
            ProviderKind::Openai => Arc::new(OpenAiClient(super::llm::Endpoint::with_client(
                http,
                base,
                "chat/completions",
                Some(api_key),
                self.timeouts,
            ))),
            ProviderKind::Anthropic => {
                Arc::new(AnthropicClient(super::llm::Endpoint::with_client(
                    http,
                    base,
                    "messages",
                    Some(api_key),
                    self.timeouts,
                )))
            }
        })
    }

    /// The client that serves `name` and the model's price there (`None`: unpriced): the named
    /// provider's; else `demo` (built in, free), the first named provider that lists the
    /// model, or the unnamed provider.
    fn model(
        &self,
        provider: Option<&str>,
        name: &str,
    ) -> Result<(Arc<dyn ChatModel>, Option<ModelPrice>), LlmError> {
        let named = |found: Option<&(ProviderSpec, Arc<dyn ChatModel>)>| {
            found.map(|(p, c)| (c.clone(), p.prices.get(name).copied()))
        };
        if let Some(provider) = provider {
            return named(self.providers.iter().find(|(p, _)| p.name == provider)).ok_or_else(
                || {
                    LlmError::Unavailable(format!(
                        "no provider `{provider}` is configured on this worker (SPOOL_PROVIDERS)"
                    ))
                },
            );
        }
        if name == super::llm::demo::MODEL_NAME {
            let free = ModelPrice {
                input_per_mtok: Usd(0.0),
                output_per_mtok: Usd(0.0),
                cached_input_per_mtok: None,
            };
            let demo: Arc<dyn ChatModel> = self.demo.clone();
            return Ok((demo, Some(free)));
        }
        let listing = self
            .providers
            .iter()
            .find(|(p, _)| p.models.iter().flatten().any(|m| m == name));
        if let Some(client) = named(listing) {
            return Ok(client);
        }
        match &self.provider {
            Some(provider) => {
                let client: Arc<dyn ChatModel> = provider.clone();
                Ok((client, self.provider_prices.get(name).copied()))
            }
            None => Err(LlmError::Unavailable(format!(
                "no model provider is configured (SPOOL_LLM_BASE_URL, or one in SPOOL_PROVIDERS \
                 listing it) to serve model `{name}`"
            ))),
        }
    }
}

/// The client of a named provider, its key read from the variable it names.
fn named_client(spec: &ProviderSpec, timeouts: Timeouts) -> anyhow::Result<Arc<dyn ChatModel>> {
    let key = match &spec.api_key_env {
        Some(var) => Some(std::env::var(var).ok().filter(|k| !k.trim().is_empty()).with_context(
            || {
                format!(
                    "SPOOL_PROVIDERS: provider `{}` reads its API key from {var}, which is not set",
                    spec.name
                )
            },
        )?),
        None => None,
    };
    Ok(match spec.kind {
        ProviderKind::Openai => {
            Arc::new(OpenAiClient::with_timeouts(&spec.base_url, key, timeouts)?)
        }
        ProviderKind::Anthropic => Arc::new(AnthropicClient::with_timeouts(
            &spec.base_url,
            key,
            timeouts,
        )?),
    })
}

impl TenantClient {
    /// The client and the price of `model` at this provider (`None`: unpriced).
    fn serving(&self, model: &str) -> (Arc<dyn ChatModel>, Option<ModelPrice>) {
        (
            Arc::clone(&self.client),
            self.settings.prices.get(model).copied(),
        )
    }
}

/// A model the call may use: the agent's, then its fallbacks in order.
pub(crate) struct Candidate {
    /// The model's name (sent as the request's `model`).
    pub(crate) name: String,
    /// The client that serves it.
    pub(crate) model: Arc<dyn ChatModel>,
    /// Its price at the provider that serves it (`None`: unpriced).
    pub(crate) price: Option<ModelPrice>,
}

impl Candidate {
    /// `usage` of a call this model answered, with its cost.
    pub(crate) fn priced(&self, usage: Usage) -> Usage {
        usage.priced(self.price.as_ref())
    }
}
