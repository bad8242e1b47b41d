//! The worker's configuration: flags or environment, validated at start.

use std::time::Duration;

use spool_shared::config::{
    EgressArgs, IdentityArgs, LeaseArgs, ProviderArgs, RetentionArgs, WebhookArgs, bounded_secs,
    seconds,
};

/// Settings of `spool-worker run` (and of `spool-api serve --embedded-worker`).
#[derive(clap::Args, Clone, Debug)]
pub struct WorkerArgs {
    /// Runs this worker executes at once.
    #[arg(long, env = "SPOOL_WORKER_CONCURRENCY", default_value_t = 16)]
    pub concurrency: usize,

    /// Milliseconds between polls for claimable runs when no NOTIFY arrives (expired leases
    /// never notify).
    #[arg(long, env = "SPOOL_POLL_INTERVAL_MS", default_value_t = 500)]
    pub poll_interval_ms: u64,

    /// Seconds in-flight runs may take to finish after SIGTERM before they are released.
    #[arg(long, env = "SPOOL_SHUTDOWN_GRACE_SECS", default_value_t = 20.0)]
    pub shutdown_grace_secs: f64,

    /// Reclaims after expired leases before a run is failed as crashing its workers.
    #[arg(long, env = "SPOOL_MAX_RECLAIMS", default_value_t = 3)]
    pub max_reclaims: i32,

    /// Deltas in a reply of the built-in `demo` model.
    #[arg(long, env = "SPOOL_DEMO_TOKENS", default_value_t = 32)]
    pub demo_tokens: usize,

    /// Milliseconds the `demo` model pauses between deltas (0 = as fast as possible).
    #[arg(long, env = "SPOOL_DEMO_DELAY_MS", default_value_t = 20)]
    pub demo_delay_ms: u64,

    /// Most text one `text_delta` event carries when deltas the publisher has not sent yet are
    /// merged (a model faster than Redis round trips); 0 sends every delta as its own event.
    #[arg(long, env = "SPOOL_COALESCE_MAX_BYTES", default_value_t = 4096)]
    pub coalesce_max_bytes: usize,

    /// Base URL of an OpenAI-compatible Chat Completions API (e.g. `https://api.openai.com/v1`).
    /// Unset: only the built-in `demo` model is available, and the default agent uses it.
    #[arg(long, env = "SPOOL_LLM_BASE_URL")]
    pub llm_base_url: Option<String>,

    /// API key of the provider.
    #[arg(long, env = "SPOOL_LLM_API_KEY", hide_env_values = true)]
    pub llm_api_key: Option<String>,

    #[command(flatten)]
    #[expect(missing_docs, reason = "flattened group; its fields are documented")]
    pub providers: ProviderArgs,

    #[command(flatten)]
    #[expect(missing_docs, reason = "flattened group; its fields are documented")]
    pub identity: IdentityArgs,

    /// The default agent's model (with a provider; otherwise `demo`).
    #[arg(long, env = "SPOOL_LLM_MODEL", default_value = "gpt-4o-mini")]
    pub llm_model: String,

    /// Seconds to wait for each piece of a model's streamed response: a byte before its
    /// headers, a data event during its stream (SSE comments do not count).
    #[arg(long, env = "SPOOL_LLM_TIMEOUT_SECS", default_value_t = 120)]
    pub llm_timeout_secs: u64,

    /// Seconds one model call may take in all, from the request to the end of its stream
    /// (1 to 86400); past it the run fails with `model_error`.
    #[arg(long, env = "SPOOL_LLM_CALL_TIMEOUT_SECS", default_value_t = 600)]
    pub llm_call_timeout_secs: u64,

    /// The default agent's instructions.
    #[arg(
        long,
        env = "SPOOL_DEFAULT_INSTRUCTIONS",
        default_value = "You are a helpful assistant."
    )]
    pub default_instructions: String,

    #[command(flatten)]
    #[expect(missing_docs, reason = "flattened group; its fields are documented")]
    pub egress: EgressArgs,

    /// Seconds a tool call may take.
    #[arg(long, env = "SPOOL_TOOL_TIMEOUT_SECS", default_value_t = 30.0)]
    pub tool_timeout_secs: f64,

    /// The most tools one MCP server's discovery keeps for a run (1 to 1,000); the rest are
    /// dropped and logged.
    #[arg(long, env = "SPOOL_MCP_MAX_TOOLS", default_value_t = 128)]
    pub mcp_max_tools: usize,

    /// Built-in tools agents may use (`type: "builtin"`), comma-separated: `http_request`,
    /// `knowledge_search`. Empty: none (an agent naming one is refused at save).
    #[arg(long, env = "SPOOL_BUILTIN_TOOLS", default_value = "", value_parser = parse_builtins)]
    pub builtin_tools: Builtins,
    /// Put prompts, answers and tool arguments and results in the exported spans (the GenAI
    /// semantic conventions' opt-in content attributes). Off: spans carry names, models,
    /// token counts and ids, no content. Tenants' data: turn it on only where the trace
    /// backend may hold it.
    #[arg(long, env = "SPOOL_OTEL_CAPTURE_CONTENT", default_value_t = false)]
    pub otel_capture_content: bool,

    #[command(flatten)]
    #[expect(missing_docs, reason = "flattened group; its fields are documented")]
    pub lease: LeaseArgs,

    #[command(flatten)]
    #[expect(missing_docs, reason = "flattened group; its fields are documented")]
    pub retention: RetentionArgs,

    #[command(flatten)]
    #[expect(missing_docs, reason = "flattened group; its fields are documented")]
    pub webhooks: WebhookArgs,
}

impl WorkerArgs {
    /// Fails fast on settings that cannot work.
    pub fn validate(&self) -> anyhow::Result<()> {
        self.lease.validate()?;
        self.retention.validate()?;
        self.webhooks.validate()?;
        // Before any connection: a key equal to the JWT secret, or one that does not parse,
        // stops the process at once.
        self.identity.identity_keys()?;
        anyhow::ensure!(
            self.concurrency >= 1,
            "SPOOL_WORKER_CONCURRENCY must be at least 1"
        );
        anyhow::ensure!(
            self.poll_interval_ms >= 1,
            "SPOOL_POLL_INTERVAL_MS must be at least 1"
        );
        seconds("SPOOL_SHUTDOWN_GRACE_SECS", self.shutdown_grace_secs, 0.0)?;
        // Above zero: a tool timeout of 0 would fail every call.
        seconds("SPOOL_TOOL_TIMEOUT_SECS", self.tool_timeout_secs, 0.001)?;
        anyhow::ensure!(
            (1..=1000).contains(&self.mcp_max_tools),
            "SPOOL_MCP_MAX_TOOLS must be from 1 to 1000, not {}",
            self.mcp_max_tools
        );
        anyhow::ensure!(
            (1..=86_400).contains(&self.llm_call_timeout_secs),
            "SPOOL_LLM_CALL_TIMEOUT_SECS must be between 1 and 86400, not {}",
            self.llm_call_timeout_secs
        );
        anyhow::ensure!(
            self.max_reclaims >= 0,
            "SPOOL_MAX_RECLAIMS must be zero or more"
        );
        anyhow::ensure!(
            self.demo_tokens >= 1,
            "SPOOL_DEMO_TOKENS must be at least 1"
        );
        Ok(())
    }

    /// The polling fallback interval.
    pub fn poll_interval(&self) -> Duration {
        Duration::from_millis(self.poll_interval_ms)
    }

    /// The tool call timeout.
    pub fn tool_timeout(&self) -> Duration {
        bounded_secs(self.tool_timeout_secs)
    }

    /// The SIGTERM grace period.
    pub fn shutdown_grace(&self) -> Duration {
        bounded_secs(self.shutdown_grace_secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(extra: &[&str]) -> WorkerArgs {
        #[derive(clap::Parser)]
        struct Command {
            #[command(flatten)]
            worker: WorkerArgs,
        }
        let args = [&["worker"], extra].concat();
        <Command as clap::Parser>::parse_from(args).worker
    }

    #[test]
    fn a_tool_timeout_that_is_not_a_positive_number_is_refused_at_start() {
        assert!(parsed(&[]).validate().is_ok());
        for bad in ["0", "-1", "NaN", "inf", "1e30"] {
            let flag = format!("--tool-timeout-secs={bad}");
            let err = parsed(&[&flag]).validate().expect_err(bad).to_string();
            assert!(err.contains("SPOOL_TOOL_TIMEOUT_SECS"), "{bad}: {err}");
        }
    }

    #[test]
    fn huge_seconds_settings_are_start_errors_not_panics() {
        for (flag, name) in [
            ("--tool-timeout-secs=1e30", "SPOOL_TOOL_TIMEOUT_SECS"),
            ("--shutdown-grace-secs=1e30", "SPOOL_SHUTDOWN_GRACE_SECS"),
            ("--lease-secs=1e30", "SPOOL_LEASE_SECS"),
        ] {
            let args = parsed(&[flag]);
            let err = args.validate().expect_err(flag).to_string();
            assert!(err.contains(name), "{flag}: {err}");
            // Even unchecked, the accessors give a duration rather than panic.
            let _ = (
                args.tool_timeout(),
                args.shutdown_grace(),
                args.lease.lease(),
            );
        }
    }
}

/// The built-in tools the operator enables (`SPOOL_BUILTIN_TOOLS`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Builtins(pub Vec<spool_shared::agent::Builtin>);

impl Builtins {
    /// Whether `tool` is enabled.
    pub fn enabled(&self, tool: spool_shared::agent::Builtin) -> bool {
        self.0.contains(&tool)
    }
}

/// `http_request,knowledge_search` (spaces and empty items ignored); an unknown name is an
/// error that lists the known ones.
fn parse_builtins(value: &str) -> Result<Builtins, String> {
    let mut tools = Vec::new();
    for name in value.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let tool = spool_shared::agent::Builtin::parse(name).ok_or_else(|| {
            format!("unknown built-in tool `{name}`: `http_request` or `knowledge_search`")
        })?;
        if !tools.contains(&tool) {
            tools.push(tool);
        }
    }
    Ok(Builtins(tools))
}
