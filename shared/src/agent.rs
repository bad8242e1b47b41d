//! Agent configurations: what the API stores and the worker executes.
//!
//! An agent is `name, instructions, model, temperature, max_steps, history_depth, tool_choice,
//! tools[], stop_conditions[], step_rules[], hooks[]`. This module holds the spec as both crates
//! read it, and the one statement of how a step's rules resolve ([`AgentSpec::rules_for`]).
//! Beside it: [`tools`] (the tool kinds and the tool choice), [`hooks`] (what runs on a run's
//! events), [`secrets`] (header values are write-only: redacted on every read, kept when
//! written back), [`overrides`] (the steering a pause's answer posts, kept on the run) and
//! [`validate`] (every problem of a spec or of overrides, reported at once by field path, so a
//! client can fix it in one round trip; nothing invalid is ever stored or run).

pub mod graph;
pub mod hooks;
pub mod overrides;
pub mod secrets;
pub mod tools;
pub mod validate;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use graph::GraphSpec;
pub use hooks::{HookEvent, HookFailure, HookKind, HookSpec};
pub use overrides::{RunDefaults, RunOverrides, Sampling};
pub use secrets::REDACTED;
pub use tools::{
    AgentToolSpec, Builtin, BuiltinToolSpec, ClientToolSpec, DEFAULT_MAX_CALL_DEPTH, HttpToolSpec,
    McpAuth, McpToolSpec, McpTransport, ToolChoice, ToolRef, ToolResource, ToolSpec,
};
pub use validate::FieldError;

use crate::ids::ToolId;
use crate::quota::Quotas;

/// Tool calls a run may make when its agent sets no `limits.max_tool_calls`: finite, so a model
/// that keeps calling (with different arguments each time, which the doom-loop check does not
/// catch) stops; room for the default 25 steps with eight calls each.
pub const DEFAULT_MAX_TOOL_CALLS: u32 = 200;

/// Bounds of `max_steps`.
pub const MAX_STEPS_RANGE: std::ops::RangeInclusive<u32> = 1..=200;
/// Bounds of `history_depth`.
pub const HISTORY_DEPTH_RANGE: std::ops::RangeInclusive<u32> = 0..=200;

/// A stored agent's configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentSpec {
    /// A name for people.
    #[schema(min_length = 1, max_length = 200)]
    pub name: String,
    /// `loop` (the default: a ReAct loop) or `graph` (a declarative `graph_spec`). A PATCH
    /// cannot change it.
    #[serde(default, skip_serializing_if = "AgentKind::is_loop")]
    pub kind: AgentKind,
    /// The graph of a `graph` agent (section 14 of the design).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph_spec: Option<GraphSpec>,
    /// The system prompt.
    #[serde(default)]
    pub instructions: String,
    /// The model name sent to the provider (`demo` is the built-in model). May be left out
    /// when `provider` names a provider with a `default_model`, which it then is, and when
    /// `kind` is `graph` (whose `llm` nodes that name no model use it, else the server's).
    #[serde(default)]
    pub model: String,
    /// The provider that serves the model: the name of one of the tenant's providers
    /// (`/v1/providers`), else of one of the server's (`SPOOL_PROVIDERS`). Unset: the first
    /// configured provider that lists the model, else `SPOOL_LLM_BASE_URL`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// Set by the server on a run's snapshot (never on a stored agent): the tenant provider
    /// `provider` named when the run was enqueued, which the run calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(read_only)]
    pub provider_id: Option<crate::ids::ProviderId>,
    /// Models of the same provider asked in order when the model keeps failing (its retries
    /// of a 429, 5xx or timeout spent before any text was shown); the step records which one
    /// answered.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(max_items = 5)]
    pub fallback_models: Vec<String>,
    /// Sampling temperature (0 to 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0.0, maximum = 2.0)]
    pub temperature: Option<f64>,
    /// Model calls per run at most; on the last, tools are withheld.
    #[serde(default = "default_max_steps")]
    #[schema(minimum = 1, maximum = 200, default = 25)]
    pub max_steps: u32,
    /// Messages of the thread given to the model.
    #[serde(default = "default_history_depth")]
    #[schema(maximum = 200, default = 10)]
    pub history_depth: u32,
    /// Whether and which tool the model must call.
    #[serde(default)]
    pub tool_choice: ToolChoice,
    /// The tools.
    #[serde(default)]
    pub tools: Vec<ToolSpec>,
    /// The tenant's tool resources (`/v1/tools`) it offers beside `tools`: ids, or
    /// `{tool_id, read_only?, requires_approval?}`. Disabled ones are not offered; a run
    /// offers them as they were when it was enqueued.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(max_items = 64)]
    pub tool_ids: Vec<ToolRef>,
    /// Conditions that end the run after a step.
    #[serde(default)]
    pub stop_conditions: Vec<StopCondition>,
    /// The tools offered on every step (names; default all), unless a step rule or the
    /// run's overrides say otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_tools: Option<Vec<String>>,
    /// Per-step overrides of `tool_choice` and the active tools.
    #[serde(default)]
    pub step_rules: Vec<StepRule>,
    /// Estimated prompt tokens above which old tool results are pruned.
    #[serde(default = "default_context_budget")]
    #[schema(default = 100_000)]
    pub context_budget_tokens: u32,
    /// The model's context window in tokens: a prompt estimated larger (4 characters a token),
    /// or one the provider refuses as too long, has the thread's oldest turns summarised into
    /// a stored summary (up to 3 times; then the run fails with `context_overflow`). Unset:
    /// only a provider's refusal summarises.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 256, maximum = 10_000_000)]
    pub context_window_tokens: Option<u32>,
    /// The model (of the agent's provider) that writes those summaries; default the agent's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary_model: Option<String>,
    /// Seconds a tool call waits for approval before it counts as denied.
    #[serde(default = "default_approval_timeout")]
    #[schema(minimum = 1, maximum = 86_400, default = 300)]
    pub approval_timeout_secs: u32,
    /// Hooks on the run's events, in order.
    #[serde(default)]
    pub hooks: Vec<HookSpec>,
    /// Limits of each run.
    #[serde(default, skip_serializing_if = "Limits::is_empty")]
    pub limits: Limits,
    /// Quotas of this agent's own runs, per user and per tenant (counted apart from the
    /// server's `SPOOL_QUOTA_*`, which apply as well).
    #[serde(default, skip_serializing_if = "Quotas::is_empty")]
    pub governance: Quotas,
    /// `active` (the default) or `disabled`: a disabled agent refuses new runs (409
    /// `agent_disabled`); runs already enqueued finish.
    #[serde(default, skip_serializing_if = "AgentStatus::is_active")]
    pub status: AgentStatus,
    /// What the final answer must be: JSON valid against a schema. The answer is held back
    /// until it validates (one repair round), then shown and stored as the message's `output`;
    /// a run whose answer never validates fails with `invalid_output`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<ResponseFormat>,
    /// Who may use it: `tenant` (the default: every user of the tenant), `private` (callers
    /// that may write agents only) or `public` (also anonymous end users, through
    /// `POST /v1/public/agents/{id}/sessions`).
    #[serde(default, skip_serializing_if = "Visibility::is_tenant")]
    pub visibility: Visibility,
    /// The browser origins (`https://shop.example`) allowed to use its public sessions; a
    /// session's request from another origin is refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(max_items = 20)]
    pub cors_origins: Vec<String>,
    /// Acknowledges that anonymous users of this public agent can make it call tools that
    /// write (an HTTP or MCP tool without `read_only: true`): required for such an agent.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub safety_acknowledged: bool,
    /// Lets any caller post `instructions` with a message, appended to the agent's for that
    /// run (admin tokens may always).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_instruction_override: bool,
}

/// What runs an agent: a loop, or a graph.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AgentKind {
    /// A ReAct loop over the model and the tools (section 5).
    #[default]
    Loop,
    /// A declarative graph of nodes (`graph_spec`, section 14).
    Graph,
}

impl AgentKind {
    /// Whether it is `loop`.
    pub fn is_loop(&self) -> bool {
        *self == Self::Loop
    }
}

/// Who may use an agent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Visibility {
    /// Callers that may write agents only (`agents:write`, or `admin`).
    Private,
    /// Every user of the tenant.
    #[default]
    Tenant,
    /// Every user of the tenant, and anonymous end users through public sessions.
    Public,
}

impl Visibility {
    /// Whether it is `tenant`.
    pub fn is_tenant(&self) -> bool {
        *self == Self::Tenant
    }
}

/// The form of an agent's final answer (`response_format`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ResponseFormat {
    /// A JSON value valid against `schema` (sent to the provider as OpenAI's `json_schema`
    /// response format).
    JsonSchema {
        /// The schema's name for the provider (1 to 64 of a-z, A-Z, 0-9, `_` or `-`; default
        /// `response`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        /// The JSON Schema the answer must validate against.
        #[schema(value_type = Object)]
        schema: Value,
        /// Asks the provider to adhere to the schema strictly (OpenAI's `strict`); the answer is
        /// validated here either way.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        strict: Option<bool>,
    },
}

impl ResponseFormat {
    /// The schema's name for the provider.
    pub fn name(&self) -> &str {
        let Self::JsonSchema { name, .. } = self;
        name.as_deref().unwrap_or("response")
    }

    /// The schema.
    pub fn schema(&self) -> &Value {
        let Self::JsonSchema { schema, .. } = self;
        schema
    }

    /// Why the schema does not compile, if it does not.
    pub fn schema_error(&self) -> Option<String> {
        jsonschema::validator_for(self.schema())
            .err()
            .map(|err| err.to_string())
    }

    /// `strict`, if set.
    pub fn strict(&self) -> Option<bool> {
        let Self::JsonSchema { strict, .. } = self;
        *strict
    }

    /// The answer `text` as JSON valid against the schema, or what is wrong with it (at most
    /// five problems, each with where in the answer). A fence around the JSON (```` ```json ````)
    /// is tolerated: models add one.
    pub fn check(&self, text: &str) -> Result<Value, String> {
        let trimmed = text.trim();
        let unfenced = trimmed
            .strip_prefix("```")
            .and_then(|rest| rest.strip_suffix("```"))
            .map(|inner| inner.strip_prefix("json").unwrap_or(inner))
            .unwrap_or(trimmed);
        let value: Value = serde_json::from_str(unfenced.trim())
            .map_err(|err| format!("the answer is not JSON: {err}"))?;
        schema_problems(self.schema(), &value)?;
        Ok(value)
    }
}

/// Whether `value` validates against the JSON Schema `schema`; else what is wrong with it (at
/// most five problems, each with where in the value).
pub fn schema_problems(schema: &Value, value: &Value) -> Result<(), String> {
    let validator = jsonschema::validator_for(schema)
        .map_err(|err| format!("the schema does not compile: {err}"))?;
    let problems: Vec<String> = validator
        .iter_errors(value)
        .take(5)
        .map(|err| {
            let at = err.instance_path().to_string();
            let at = if at.is_empty() { "/".to_owned() } else { at };
            format!("at {at}: {err}")
        })
        .collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; "))
    }
}

/// Whether an agent takes new runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AgentStatus {
    /// It takes new runs.
    #[default]
    Active,
    /// New runs are refused; runs already enqueued finish.
    Disabled,
}

impl AgentStatus {
    /// Whether it is `active`.
    pub fn is_active(&self) -> bool {
        *self == Self::Active
    }
}

/// How long a run waits for client tool outputs when the agent does not say.
pub const DEFAULT_HUMAN_TIMEOUT_SECS: u32 = 86_400;

/// Limits of a run of the agent (all optional).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Seconds a run may wait for client tool outputs (`requires_action`) before it fails with
    /// `human_timeout` (default 86400; approvals keep `approval_timeout_secs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 604_800)]
    pub human_timeout_secs: Option<u32>,
    /// Model calls per run at most (1 to 200): the ceiling a message may raise its run's
    /// `max_steps` to (unset: the agent's `max_steps`); below `max_steps`, it lowers every run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 200)]
    pub max_steps: Option<u32>,
    /// Tool calls per run at most (0 to 500, default [`DEFAULT_MAX_TOOL_CALLS`]): a step that
    /// would exceed it fails the run with `max_tool_calls_exceeded` before its calls run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 500, default = 200)]
    pub max_tool_calls: Option<u32>,
    /// Read-only tool calls of a step run at once at most (1 to 16, default 8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 16, default = 8)]
    pub max_parallel_tools: Option<u32>,
    /// The run's wall clock in seconds (5 to 86400), from enqueue to end by the database
    /// clock, pauses and crashes included: past it the run fails with `timeout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 5, maximum = 86_400)]
    pub timeout_secs: Option<u32>,
    /// Tokens the model may generate per call (sent to the provider as `max_tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 1_000_000)]
    pub max_output_tokens: Option<u32>,
    /// How many levels of agent calls a run of this agent may start below itself (0 to 10,
    /// default 3); a child run gets the smaller of its own agent's and what its caller has left.
    /// A call past it is refused with a tool error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 10, default = 3)]
    pub max_call_depth: Option<u32>,
    /// Agent tool calls one step may start at once (1 to 64, default 8); the calls past it are
    /// answered with a tool error and the run goes on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 64, default = 8)]
    pub max_agent_calls_per_step: Option<u32>,
    /// Agent runs one root run's tree may hold in all, at every depth (1 to 1000, default 50);
    /// a child run gets the smaller of its own agent's and its caller's. The calls past it are
    /// answered with a tool error and the run goes on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 1000, default = 50)]
    pub max_tree_runs: Option<u32>,
}

/// Agent calls one step may start when `limits.max_agent_calls_per_step` is unset.
pub const DEFAULT_MAX_AGENT_CALLS_PER_STEP: u32 = 8;

/// Agent runs one root run's tree may hold when `limits.max_tree_runs` is unset.
pub const DEFAULT_MAX_TREE_RUNS: u32 = 50;

/// Read-only tool calls of a step that run at once when `limits.max_parallel_tools` is unset.
pub const DEFAULT_MAX_PARALLEL_TOOLS: u32 = 8;

impl Limits {
    /// Whether no limit is set.
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }

    /// How long a run waits for client tool outputs, in seconds.
    pub fn client_timeout_secs(&self) -> u32 {
        self.human_timeout_secs
            .unwrap_or(DEFAULT_HUMAN_TIMEOUT_SECS)
    }

    /// How many levels of agent calls may nest below a run.
    pub fn call_depth(&self) -> u32 {
        self.max_call_depth.unwrap_or(DEFAULT_MAX_CALL_DEPTH)
    }

    /// How many agent calls one step may start.
    pub fn agent_calls_per_step(&self) -> u32 {
        self.max_agent_calls_per_step
            .unwrap_or(DEFAULT_MAX_AGENT_CALLS_PER_STEP)
    }

    /// How many agent runs a root run's tree may hold.
    pub fn tree_runs(&self) -> u32 {
        self.max_tree_runs.unwrap_or(DEFAULT_MAX_TREE_RUNS)
    }

    /// The limits of a child run started by a run with limits `caller` (as that run executes
    /// them), `caller_left` seconds before the caller's time limit, if it has one: its own
    /// agent's (these), each narrowed to what the caller allows. It nests at most one level
    /// less deep than the caller may, its tree is bounded by the caller's bound too, and it
    /// ends by the caller's time limit at the latest. So no run of a tree goes past what its
    /// root allows, whatever the agents it calls say.
    pub fn for_child(&self, caller: &Self, caller_left: Option<u32>) -> Self {
        let mut limits = self.clone();
        let depth_left = caller.call_depth().saturating_sub(1);
        limits.max_call_depth = Some(self.call_depth().min(depth_left));
        limits.max_tree_runs = Some(self.tree_runs().min(caller.tree_runs()));
        if let Some(left) = caller_left {
            limits.timeout_secs = Some(self.timeout_secs.map_or(left, |own| own.min(left)));
        }
        limits
    }

    /// How many read-only calls of a step run at once.
    pub fn parallel_tools(&self) -> usize {
        self.max_parallel_tools
            .unwrap_or(DEFAULT_MAX_PARALLEL_TOOLS)
            .max(1) as usize
    }
}

/// A condition on one argument of a tool call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RuleCondition {
    /// The argument: a top-level key, or a JSON pointer (`/path/0`).
    pub argument: String,
    /// How to compare.
    pub operator: RuleOperator,
    /// What to compare with (a string; for `in`, an array).
    pub value: Value,
}

/// A comparison of a rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RuleOperator {
    /// The argument (as text) contains the value.
    Contains,
    /// The argument (as text) starts with the value.
    StartsWith,
    /// The argument (as text) matches the regex.
    Matches,
    /// The argument equals one of the values.
    In,
}

fn default_max_steps() -> u32 {
    25
}
fn default_history_depth() -> u32 {
    10
}
fn default_context_budget() -> u32 {
    100_000
}
fn default_approval_timeout() -> u32 {
    300
}

/// A condition that ends the run after the step in which it holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum StopCondition {
    /// The model called this tool.
    HasToolCall {
        /// The tool's name.
        tool_name: String,
    },
}

/// Overrides for one step (1-based).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StepRule {
    /// The step it applies to (1 to the agent's `max_steps`).
    #[schema(minimum = 1)]
    pub step: u32,
    /// The tool choice for that step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ToolChoice>,
    /// The tools offered in that step (names; default all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_tools: Option<Vec<String>>,
}

impl AgentSpec {
    /// The server's default agent: `model` with no tools.
    pub fn default_agent(model: &str, instructions: &str) -> Self {
        Self {
            name: "default".into(),
            kind: AgentKind::Loop,
            graph_spec: None,
            instructions: instructions.into(),
            model: model.into(),
            provider: None,
            provider_id: None,
            fallback_models: Vec::new(),
            temperature: None,
            max_steps: default_max_steps(),
            history_depth: default_history_depth(),
            tool_choice: ToolChoice::Auto,
            tools: Vec::new(),
            tool_ids: Vec::new(),
            stop_conditions: Vec::new(),
            active_tools: None,
            step_rules: Vec::new(),
            context_budget_tokens: default_context_budget(),
            context_window_tokens: None,
            summary_model: None,
            approval_timeout_secs: default_approval_timeout(),
            hooks: Vec::new(),
            limits: Limits::default(),
            governance: Quotas::default(),
            status: AgentStatus::Active,
            response_format: None,
            visibility: Visibility::Tenant,
            cors_origins: Vec::new(),
            safety_acknowledged: false,
            allow_instruction_override: false,
        }
    }

    /// The run's wall clock in seconds, if it has one: `limits.timeout_secs`, else a graph's
    /// `limits.timeout_seconds`.
    pub fn time_limit_secs(&self) -> Option<u32> {
        self.limits.timeout_secs.or_else(|| {
            self.graph_spec
                .as_ref()
                .and_then(|g| g.limits.timeout_seconds)
        })
    }

    /// The most model calls a run may make: `limits.max_steps`, else `max_steps` (a message
    /// may raise its run's `max_steps` up to it, never past it).
    pub fn step_ceiling(&self) -> u32 {
        self.limits.max_steps.unwrap_or(self.max_steps)
    }

    /// The model calls a run makes when its message asks nothing else: `max_steps`, within
    /// the ceiling.
    pub fn default_steps(&self) -> u32 {
        self.max_steps.min(self.step_ceiling())
    }

    /// The spec with its references resolved: each tool of `resolved` (the referenced tools as
    /// stored, by id) that is enabled, as the reference changes it, appended to `tools` in the
    /// order of `tool_ids`, which is emptied; a graph's `tools.mcp_servers` found there,
    /// enabled and MCP servers, as its `tools.mcp_snapshot`. What a run snapshots at enqueue;
    /// a reference `resolved` lacks (a tool deleted meanwhile) is dropped.
    pub fn resolve_tools(mut self, resolved: &[(ToolId, ToolResource)]) -> Self {
        let enabled = |id: ToolId| {
            resolved
                .iter()
                .find(|(found, tool)| *found == id && tool.enabled)
                .map(|(_, tool)| &tool.tool)
        };
        for reference in std::mem::take(&mut self.tool_ids) {
            if let Some(tool) = enabled(reference.tool_id) {
                self.tools.push(tool.clone().referenced_as(&reference));
            }
        }
        if let Some(graph) = &mut self.graph_spec {
            let servers = graph.tools.mcp_servers.iter().filter_map(|&id| {
                let tool = enabled(id).filter(|tool| tool.as_mcp().is_some())?;
                Some(graph::McpServerSnapshot {
                    id,
                    tool: tool.clone(),
                })
            });
            graph.tools.mcp_snapshot = Some(servers.collect());
        }
        self
    }

    /// The tools that may write (an HTTP tool without `read_only: true`, any MCP server), if
    /// the agent is public and `safety_acknowledged` is not set: each needs the
    /// acknowledgement (422 `safety_acknowledgement_required`).
    pub fn unacknowledged_write_tools(&self) -> Vec<&str> {
        if self.visibility != Visibility::Public || self.safety_acknowledged {
            return Vec::new();
        }
        self.tools
            .iter()
            .filter(|tool| match tool {
                ToolSpec::Http(http) => !http.read_only,
                ToolSpec::Mcp(_) => true,
                ToolSpec::Client(_) | ToolSpec::Agent(_) | ToolSpec::Builtin(_) => false,
            })
            .map(ToolSpec::name)
            .collect()
    }

    /// Whether the model may be told to call `name`: one of the tools, or a name an MCP
    /// server's tools would have (`{prefix}_*`; they are discovered at run start).
    pub fn callable(&self, name: &str) -> bool {
        self.tools.iter().any(|tool| match tool {
            ToolSpec::Mcp(m) => name
                .strip_prefix(m.name.as_str())
                .is_some_and(|rest| rest.starts_with('_')),
            other => other.name() == name,
        })
    }

    /// What the rules of `step` decide: each field from the first of its rules that sets it
    /// (so a rule posted later that only narrows the tools keeps an earlier rule's tool choice),
    /// else the agent's own tool choice and active tools (all of them when it names none).
    pub fn rules_for(&self, step: u32) -> StepPlan<'_> {
        let of_step = || self.step_rules.iter().filter(move |r| r.step == step);
        StepPlan {
            active: of_step()
                .find_map(|r| r.active_tools.as_deref())
                .or(self.active_tools.as_deref()),
            choice: of_step()
                .find_map(|r| r.tool_choice.as_ref())
                .unwrap_or(&self.tool_choice),
        }
    }
}

/// What a step's rules decide ([`AgentSpec::rules_for`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepPlan<'a> {
    /// The names of the tools offered; `None`: all of them.
    pub active: Option<&'a [String]>,
    /// The tool choice.
    pub choice: &'a ToolChoice,
}

impl<'a> StepPlan<'a> {
    /// The tool the plan names as its choice while leaving it out of the tools it offers (the
    /// provider would refuse such a call).
    pub fn clash(self) -> Option<&'a str> {
        match (self.choice, self.active) {
            (ToolChoice::Tool(name), Some(active)) if !active.contains(name) => Some(name),
            _ => None,
        }
    }
}

/// Specs and overrides from JSON, for the tests of this module and its children.
#[cfg(test)]
pub(crate) mod test_support {
    use serde_json::Value;

    use super::{AgentSpec, RunOverrides};

    pub(crate) fn spec(value: Value) -> AgentSpec {
        serde_json::from_value(value).expect("parses")
    }

    pub(crate) fn overrides(value: Value) -> RunOverrides {
        serde_json::from_value(value).expect("parses")
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::spec;
    use super::*;
    use serde_json::json;

    #[test]
    fn a_child_s_limits_are_its_own_narrowed_to_what_its_caller_allows() {
        let caller = Limits {
            max_call_depth: Some(2),
            max_tree_runs: Some(10),
            ..Limits::default()
        };
        let own = Limits {
            max_call_depth: Some(10),
            max_tree_runs: Some(500),
            timeout_secs: Some(600),
            max_steps: Some(7),
            ..Limits::default()
        };
        let child = own.for_child(&caller, Some(60));
        assert_eq!(
            (
                child.max_call_depth,
                child.max_tree_runs,
                child.timeout_secs
            ),
            (Some(1), Some(10), Some(60)),
            "one level less than the caller has, its tree bound, its time left"
        );
        assert_eq!(child.max_steps, Some(7), "the rest is its own");
        let grandchild = Limits::default().for_child(&child, None);
        assert_eq!(
            grandchild.max_call_depth,
            Some(0),
            "no deeper than the root allows"
        );
        // Stricter limits of its own stay.
        let strict = Limits {
            max_call_depth: Some(0),
            max_tree_runs: Some(3),
            timeout_secs: Some(30),
            ..Limits::default()
        };
        let child = strict.for_child(&Limits::default(), Some(3_000));
        assert_eq!(
            (
                child.max_call_depth,
                child.max_tree_runs,
                child.timeout_secs
            ),
            (Some(0), Some(3), Some(30))
        );
    }

    #[test]
    fn a_tool_choice_reads_as_a_string_or_an_object_and_is_written_as_a_string() {
        let read = |value: serde_json::Value| serde_json::from_value::<ToolChoice>(value);
        assert_eq!(
            read(json!({"type": "tool", "tool_name": "search"})).ok(),
            Some(ToolChoice::Tool("search".into()))
        );
        assert_eq!(read(json!({"type": "none"})).ok(), Some(ToolChoice::None));
        assert_eq!(
            read(json!("search")).ok(),
            Some(ToolChoice::Tool("search".into()))
        );
        for wrong in [
            json!({"type": "tool"}),
            json!({"type": "auto", "tool_name": "x"}),
            json!({"type": "function", "tool_name": "x"}),
            json!({"type": "tool", "tool_name": "x", "extra": 1}),
            json!(3),
        ] {
            assert!(read(wrong.clone()).is_err(), "{wrong}");
        }
        let written = serde_json::to_value(ToolChoice::Tool("search".into())).expect("json");
        assert_eq!(written, json!("search"));
    }

    #[test]
    fn each_field_of_a_step_comes_from_the_first_rule_that_sets_it() {
        let agent = spec(json!({"name": "a", "model": "demo",
            "tool_choice": "required", "tools": [{"type": "client", "name": "read"},
            {"type": "client", "name": "list"}],
            "step_rules": [{"step": 2, "active_tools": ["list"]},
                           {"step": 2, "tool_choice": "read", "active_tools": ["read"]},
                           {"step": 3, "tool_choice": "none"}]}));
        let two = agent.rules_for(2);
        assert_eq!(two.active, Some(&["list".to_owned()][..]));
        assert_eq!(two.choice, &ToolChoice::Tool("read".into()));
        assert_eq!(two.clash(), Some("read"));
        let three = agent.rules_for(3);
        assert_eq!((three.active, three.choice), (None, &ToolChoice::None));
        assert_eq!(agent.rules_for(1).choice, &ToolChoice::Required);
        assert_eq!(agent.rules_for(1).clash(), None);
    }
}
