//! Agent configurations: what the API stores and the worker executes.
//!
//! An agent is `name, instructions, model, temperature, max_steps, history_depth, tool_choice,
//! tools[], stop_conditions[], step_rules[]`. [`AgentSpec::validate`] reports every problem at
//! once, each by field path (`tools[1].name`), so a client can fix a spec in one round trip;
//! nothing invalid is ever stored or run.

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Bounds of `max_steps`.
pub const MAX_STEPS_RANGE: std::ops::RangeInclusive<u32> = 1..=100;
/// Bounds of `history_depth`.
pub const HISTORY_DEPTH_RANGE: std::ops::RangeInclusive<u32> = 0..=200;

/// A stored agent's configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentSpec {
    /// A name for people.
    #[schema(min_length = 1, max_length = 200)]
    pub name: String,
    /// The system prompt.
    #[serde(default)]
    pub instructions: String,
    /// The model name sent to the provider (`demo` is the built-in model).
    #[schema(min_length = 1)]
    pub model: String,
    /// Sampling temperature (0 to 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0.0, maximum = 2.0)]
    pub temperature: Option<f64>,
    /// Model calls per run at most; on the last, tools are withheld.
    #[serde(default = "default_max_steps")]
    #[schema(minimum = 1, maximum = 100, default = 25)]
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
    /// Conditions that end the run after a step.
    #[serde(default)]
    pub stop_conditions: Vec<StopCondition>,
    /// Per-step overrides of `tool_choice` and the active tools.
    #[serde(default)]
    pub step_rules: Vec<StepRule>,
    /// Estimated prompt tokens above which old tool results are pruned.
    #[serde(default = "default_context_budget")]
    #[schema(default = 100_000)]
    pub context_budget_tokens: u32,
    /// Seconds a tool call waits for approval before it counts as denied.
    #[serde(default = "default_approval_timeout")]
    #[schema(minimum = 1, maximum = 86_400, default = 300)]
    pub approval_timeout_secs: u32,
    /// Hooks on the run's events, in order.
    #[serde(default)]
    pub hooks: Vec<HookSpec>,
}

/// When a hook runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum HookEvent {
    /// Before the first step; may block the run.
    OnRunStart,
    /// Before a tool call; may block it, hold it for approval, or rewrite its arguments.
    PreToolUse,
    /// After a tool call; may rewrite its result.
    PostToolUse,
    /// Before the final answer is shown; may block or rewrite it.
    PreResponse,
    /// After the run ends; fire and forget.
    OnRunComplete,
}

/// A hook: an event, an optional tool-name matcher (a regex matching the whole name, for tool
/// events), and what it does.
// No `deny_unknown_fields` here: serde cannot combine it with `flatten`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct HookSpec {
    /// When it runs.
    pub event: HookEvent,
    /// Which tools it applies to (tool events only; default all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matcher: Option<String>,
    /// What it does.
    #[serde(flatten)]
    pub kind: HookKind,
}

/// What a hook does.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum HookKind {
    /// POSTs the event to a URL; the JSON answer `{decision: allow|deny|modify, reason?,
    /// arguments?, output?, text?}` decides. Errors and timeouts allow (fail-open).
    Http {
        /// Where to POST.
        url: String,
        /// Extra headers.
        #[serde(default)]
        headers: BTreeMap<String, String>,
        /// Seconds to wait (default 5).
        #[serde(default = "default_hook_timeout")]
        timeout_secs: u32,
    },
    /// Denies a tool call whose arguments meet every condition (the first matching deny wins).
    Rule {
        /// Conditions on the call's arguments, all of which must hold.
        conditions: Vec<RuleCondition>,
        /// The reason the model sees.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
    /// Holds the tool call for a person's approval.
    Approval {
        /// Seconds before no decision counts as a denial (default: the agent's).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_secs: Option<u32>,
    },
}

fn default_hook_timeout() -> u32 {
    5
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

/// `auto`, `required`, `none`, or the name of one tool the model must call.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum ToolChoice {
    /// The model decides.
    #[default]
    Auto,
    /// The model must call some tool.
    Required,
    /// The model must not call tools.
    None,
    /// The model must call this tool.
    Tool(String),
}

impl utoipa::PartialSchema for ToolChoice {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        // Serialized as one string (`from`/`into` String), so it is documented as one.
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .description(Some(
                "`auto`, `required`, `none`, or the name of one tool the model must call.",
            ))
            .examples(["auto", "required", "none"])
            .into()
    }
}

impl utoipa::ToSchema for ToolChoice {}

impl From<String> for ToolChoice {
    fn from(value: String) -> Self {
        match value.as_str() {
            "auto" => Self::Auto,
            "required" => Self::Required,
            "none" => Self::None,
            _ => Self::Tool(value),
        }
    }
}

impl From<ToolChoice> for String {
    fn from(choice: ToolChoice) -> Self {
        match choice {
            ToolChoice::Auto => "auto".into(),
            ToolChoice::Required => "required".into(),
            ToolChoice::None => "none".into(),
            ToolChoice::Tool(name) => name,
        }
    }
}

/// One tool of an agent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToolSpec {
    /// An HTTP endpoint that receives the arguments as JSON.
    Http(HttpToolSpec),
    /// An MCP server whose tools are discovered at run start.
    Mcp(McpToolSpec),
    /// A tool the client executes (the run waits for its output).
    Client(ClientToolSpec),
}

impl ToolSpec {
    /// The name (for MCP: the prefix of its tools' names).
    pub fn name(&self) -> &str {
        match self {
            Self::Http(t) => &t.name,
            Self::Mcp(t) => &t.name,
            Self::Client(t) => &t.name,
        }
    }
}

/// An HTTP tool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpToolSpec {
    /// The name the model sees.
    #[schema(pattern = "^[a-zA-Z0-9_-]{1,64}$")]
    pub name: String,
    /// What it does, for the model.
    #[serde(default)]
    pub description: String,
    /// JSON Schema of its arguments.
    #[serde(default = "empty_object_schema")]
    #[schema(value_type = Object)]
    pub parameters: Value,
    /// Where to send the arguments.
    pub url: String,
    /// The HTTP method (default POST).
    #[serde(default = "default_method")]
    pub method: String,
    /// Extra request headers.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Whether it only reads (read-only calls of one step run concurrently).
    #[serde(default)]
    pub read_only: bool,
    /// Whether a person must approve each call.
    #[serde(default)]
    pub requires_approval: bool,
}

/// An MCP server.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct McpToolSpec {
    /// The prefix of its tools' names (`{name}_{tool}`).
    #[schema(pattern = "^[a-zA-Z0-9_-]{1,64}$")]
    pub name: String,
    /// Its Streamable HTTP endpoint.
    pub url: String,
    /// Headers sent on every request.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Whether a person must approve each call.
    #[serde(default)]
    pub requires_approval: bool,
}

/// A client tool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClientToolSpec {
    /// The name the model sees.
    #[schema(pattern = "^[a-zA-Z0-9_-]{1,64}$")]
    pub name: String,
    /// What it does, for the model.
    #[serde(default)]
    pub description: String,
    /// JSON Schema of its arguments.
    #[serde(default = "empty_object_schema")]
    #[schema(value_type = Object)]
    pub parameters: Value,
    /// Whether a person must approve each call.
    #[serde(default)]
    pub requires_approval: bool,
}

fn empty_object_schema() -> Value {
    serde_json::json!({"type": "object"})
}
fn default_method() -> String {
    "POST".into()
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

/// Steering posted with a pause's answer (`tool_outputs`): the next model call's tool choice
/// and tools, rules for later steps (ahead of the agent's), and a tool choice for the rest of
/// the run. Stored on the run as JSON; absent fields change nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunOverrides {
    /// The tool choice of the next model call.
    #[serde(default)]
    pub tool_choice: Option<ToolChoice>,
    /// The tools offered in the next model call.
    #[serde(default)]
    pub active_tools: Option<Vec<String>>,
    /// Rules for later steps.
    #[serde(default)]
    pub step_rules: Option<Vec<StepRule>>,
    /// Defaults for the rest of the run.
    #[serde(default)]
    pub defaults: Option<RunDefaults>,
}

/// Defaults for the rest of a run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunDefaults {
    /// The tool choice of every later step without a rule.
    #[serde(default)]
    pub tool_choice: Option<ToolChoice>,
}

impl RunOverrides {
    /// Every problem of these overrides for a run of `agent` whose next model call is step
    /// `next_step`, by field path in the request that posts them; empty if they are valid.
    pub fn validate(&self, agent: &AgentSpec, next_step: u32) -> Vec<FieldError> {
        let mut errors = Vec::new();
        let mut unknown = |field: String, name: &str| {
            if !agent.callable(name) {
                errors.push(FieldError {
                    field,
                    message: format!("unknown tool `{name}`"),
                });
            }
        };
        let choices = [
            ("tool_choice", self.tool_choice.as_ref()),
            (
                "defaults.tool_choice",
                self.defaults.as_ref().and_then(|d| d.tool_choice.as_ref()),
            ),
        ];
        for (field, choice) in choices {
            if let Some(ToolChoice::Tool(name)) = choice {
                unknown(field.into(), name);
            }
        }
        for (j, name) in self.active_tools.iter().flatten().enumerate() {
            unknown(format!("active_tools[{j}]"), name);
        }
        for (i, rule) in self.step_rules.iter().flatten().enumerate() {
            if let Some(ToolChoice::Tool(name)) = &rule.tool_choice {
                unknown(format!("step_rules[{i}].tool_choice"), name);
            }
            for (j, name) in rule.active_tools.iter().flatten().enumerate() {
                unknown(format!("step_rules[{i}].active_tools[{j}]"), name);
            }
        }
        // A named choice outside the tools offered alongside it is one the provider refuses.
        let mut conflicts =
            |field: String, choice: Option<&ToolChoice>, active: &Option<Vec<String>>| {
                if let (Some(ToolChoice::Tool(name)), Some(active)) = (choice, active)
                    && !active.contains(name)
                {
                    errors.push(FieldError {
                        field,
                        message: format!("`{name}` is not among the active tools"),
                    });
                }
            };
        conflicts(
            "tool_choice".into(),
            self.tool_choice.as_ref(),
            &self.active_tools,
        );
        for (i, rule) in self.step_rules.iter().flatten().enumerate() {
            conflicts(
                format!("step_rules[{i}].tool_choice"),
                rule.tool_choice.as_ref(),
                &rule.active_tools,
            );
        }
        for (i, rule) in self.step_rules.iter().flatten().enumerate() {
            if rule.step < next_step || rule.step > agent.max_steps {
                errors.push(FieldError {
                    field: format!("step_rules[{i}].step"),
                    message: format!(
                        "must be a later step: between {next_step} and max_steps ({})",
                        agent.max_steps
                    ),
                });
            }
        }
        errors
    }

    /// What the run keeps once these overrides answer a pause whose next model call is
    /// `next_step`: the next-step choice becomes a rule for that step, the posted rules go ahead
    /// of those posted at earlier pauses, and the newest default tool choice wins. What earlier
    /// pauses posted lasts for the rest of the run, except their next-step choices, which
    /// applied to steps already taken.
    pub fn accumulate(self, earlier: Option<Self>, next_step: u32) -> Self {
        let earlier = earlier.unwrap_or_default();
        let mut rules = Vec::new();
        if self.tool_choice.is_some() || self.active_tools.is_some() {
            rules.push(StepRule {
                step: next_step,
                tool_choice: self.tool_choice,
                active_tools: self.active_tools,
            });
        }
        rules.extend(self.step_rules.into_iter().flatten());
        rules.extend(earlier.step_rules.into_iter().flatten());
        let defaults = match self.defaults.and_then(|d| d.tool_choice) {
            Some(choice) => Some(RunDefaults {
                tool_choice: Some(choice),
            }),
            None => earlier.defaults,
        };
        Self {
            tool_choice: None,
            active_tools: None,
            step_rules: (!rules.is_empty()).then_some(rules),
            defaults,
        }
    }

    /// Every step from `next_step` on whose rules, merged as the worker merges them (each field
    /// from the first rule that sets it; these overrides' rules ahead of the agent's), end up
    /// choosing a named tool that is not among that step's active tools: a choice posted at
    /// one pause and tools narrowed at another can clash, and the provider refuses the call.
    /// For overrides already accumulated.
    pub fn clashes(&self, agent: &AgentSpec, next_step: u32) -> Vec<FieldError> {
        let rules: Vec<&StepRule> = self
            .step_rules
            .iter()
            .flatten()
            .chain(&agent.step_rules)
            .collect();
        let default = self
            .defaults
            .as_ref()
            .and_then(|d| d.tool_choice.as_ref())
            .unwrap_or(&agent.tool_choice);
        let mut steps: Vec<u32> = rules
            .iter()
            .map(|r| r.step)
            .filter(|s| *s >= next_step)
            .collect();
        steps.sort_unstable();
        steps.dedup();
        let mut errors = Vec::new();
        for step in steps {
            let of_step = || rules.iter().filter(move |r| r.step == step);
            let active = of_step().find_map(|r| r.active_tools.as_ref());
            let choice = of_step()
                .find_map(|r| r.tool_choice.as_ref())
                .unwrap_or(default);
            if let (ToolChoice::Tool(name), Some(active)) = (choice, active)
                && !active.contains(name)
            {
                errors.push(FieldError {
                    field: "step_rules".into(),
                    message: format!(
                        "at step {step}, with the rules posted earlier, `{name}` would be chosen \
                         but is not among the active tools"
                    ),
                });
            }
        }
        errors
    }

    /// Applies what a run keeps (see [`Self::accumulate`], which pinned every next-step choice
    /// to its step) to the spec it executes: the rules go ahead of the agent's, and the default
    /// tool choice replaces the agent's.
    pub fn apply(self, spec: &mut AgentSpec) {
        if let Some(rules) = self.step_rules {
            spec.step_rules.splice(0..0, rules);
        }
        if let Some(choice) = self.defaults.and_then(|d| d.tool_choice) {
            spec.tool_choice = choice;
        }
    }
}

/// One problem of a spec, by field path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct FieldError {
    /// Where, e.g. `tools[1].parameters`.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl AgentSpec {
    /// The server's default agent: `model` with no tools.
    pub fn default_agent(model: &str, instructions: &str) -> Self {
        Self {
            name: "default".into(),
            instructions: instructions.into(),
            model: model.into(),
            temperature: None,
            max_steps: default_max_steps(),
            history_depth: default_history_depth(),
            tool_choice: ToolChoice::Auto,
            tools: Vec::new(),
            stop_conditions: Vec::new(),
            step_rules: Vec::new(),
            context_budget_tokens: default_context_budget(),
            approval_timeout_secs: default_approval_timeout(),
            hooks: Vec::new(),
        }
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

    /// Every problem of the spec; empty if it is valid.
    pub fn validate(&self) -> Vec<FieldError> {
        let mut errors = Vec::new();
        let mut fail = |field: String, message: String| errors.push(FieldError { field, message });
        if self.name.trim().is_empty() || self.name.len() > 200 {
            fail("name".into(), "must be 1 to 200 characters".into());
        }
        if self.model.trim().is_empty() {
            fail("model".into(), "must not be empty".into());
        }
        if let Some(t) = self.temperature
            && !(0.0..=2.0).contains(&t)
        {
            fail("temperature".into(), "must be between 0 and 2".into());
        }
        if !MAX_STEPS_RANGE.contains(&self.max_steps) {
            fail(
                "max_steps".into(),
                format!(
                    "must be between {} and {}",
                    MAX_STEPS_RANGE.start(),
                    MAX_STEPS_RANGE.end()
                ),
            );
        }
        if !HISTORY_DEPTH_RANGE.contains(&self.history_depth) {
            fail(
                "history_depth".into(),
                format!(
                    "must be between {} and {}",
                    HISTORY_DEPTH_RANGE.start(),
                    HISTORY_DEPTH_RANGE.end()
                ),
            );
        }
        if !(1..=86_400).contains(&self.approval_timeout_secs) {
            fail(
                "approval_timeout_secs".into(),
                "must be between 1 and 86400".into(),
            );
        }
        let mut names = HashSet::new();
        let mcp_prefixes: Vec<&str> = self
            .tools
            .iter()
            .filter_map(|t| match t {
                ToolSpec::Mcp(m) => Some(m.name.as_str()),
                _ => None,
            })
            .collect();
        for (i, tool) in self.tools.iter().enumerate() {
            let name = tool.name();
            if !valid_tool_name(name) {
                fail(
                    format!("tools[{i}].name"),
                    "must be 1 to 64 characters of a-z, A-Z, 0-9, _ or -".into(),
                );
            } else if matches!(name, "auto" | "required" | "none") {
                fail(
                    format!("tools[{i}].name"),
                    format!("`{name}` is reserved by tool_choice"),
                );
            } else if !names.insert(name.to_owned()) {
                fail(
                    format!("tools[{i}].name"),
                    format!("duplicate tool name `{name}`"),
                );
            } else if !matches!(tool, ToolSpec::Mcp(_))
                && let Some(prefix) = mcp_prefixes
                    .iter()
                    .find(|p| name.starts_with(&format!("{p}_")))
            {
                fail(
                    format!("tools[{i}].name"),
                    format!(
                        "`{name}` collides with the tools of MCP server `{prefix}` (named `{prefix}_*`)"
                    ),
                );
            }
            match tool {
                ToolSpec::Http(t) => {
                    check_schema(&t.parameters, &format!("tools[{i}].parameters"), &mut fail);
                    check_url(&t.url, &format!("tools[{i}].url"), &mut fail);
                    if !matches!(
                        t.method.as_str(),
                        "GET" | "POST" | "PUT" | "PATCH" | "DELETE"
                    ) {
                        fail(
                            format!("tools[{i}].method"),
                            "must be GET, POST, PUT, PATCH or DELETE".into(),
                        );
                    }
                }
                ToolSpec::Mcp(t) => check_url(&t.url, &format!("tools[{i}].url"), &mut fail),
                ToolSpec::Client(t) => {
                    check_schema(&t.parameters, &format!("tools[{i}].parameters"), &mut fail)
                }
            }
        }
        let callable = |name: &str| self.callable(name);
        if let ToolChoice::Tool(name) = &self.tool_choice
            && !callable(name)
        {
            fail("tool_choice".into(), format!("unknown tool `{name}`"));
        }
        for (i, condition) in self.stop_conditions.iter().enumerate() {
            let StopCondition::HasToolCall { tool_name } = condition;
            if !callable(tool_name) {
                fail(
                    format!("stop_conditions[{i}].tool_name"),
                    format!("unknown tool `{tool_name}`"),
                );
            }
        }
        for (i, rule) in self.step_rules.iter().enumerate() {
            if rule.step == 0 || rule.step > self.max_steps {
                fail(
                    format!("step_rules[{i}].step"),
                    format!("must be between 1 and max_steps ({})", self.max_steps),
                );
            }
            if let Some(ToolChoice::Tool(name)) = &rule.tool_choice
                && !callable(name)
            {
                fail(
                    format!("step_rules[{i}].tool_choice"),
                    format!("unknown tool `{name}`"),
                );
            }
            for (j, name) in rule.active_tools.iter().flatten().enumerate() {
                if !callable(name) {
                    fail(
                        format!("step_rules[{i}].active_tools[{j}]"),
                        format!("unknown tool `{name}`"),
                    );
                }
            }
            if let (Some(ToolChoice::Tool(name)), Some(active)) =
                (&rule.tool_choice, &rule.active_tools)
                && !active.contains(name)
            {
                fail(
                    format!("step_rules[{i}].tool_choice"),
                    format!("`{name}` is not among the active tools"),
                );
            }
        }
        for (i, hook) in self.hooks.iter().enumerate() {
            let tool_event = matches!(hook.event, HookEvent::PreToolUse | HookEvent::PostToolUse);
            if let Some(matcher) = &hook.matcher {
                if !tool_event {
                    fail(
                        format!("hooks[{i}].matcher"),
                        "only tool events take a matcher".into(),
                    );
                } else if let Err(err) = regex::Regex::new(&format!("^(?:{matcher})$")) {
                    fail(
                        format!("hooks[{i}].matcher"),
                        format!("not a valid regex: {err}"),
                    );
                }
            }
            match &hook.kind {
                HookKind::Http {
                    url, timeout_secs, ..
                } => {
                    check_url(url, &format!("hooks[{i}].url"), &mut fail);
                    if !(1..=60).contains(timeout_secs) {
                        fail(
                            format!("hooks[{i}].timeout_secs"),
                            "must be between 1 and 60".into(),
                        );
                    }
                }
                HookKind::Rule { conditions, .. } => {
                    if hook.event != HookEvent::PreToolUse {
                        fail(
                            format!("hooks[{i}].type"),
                            "rule hooks apply to pre_tool_use".into(),
                        );
                    }
                    if conditions.is_empty() {
                        fail(
                            format!("hooks[{i}].conditions"),
                            "needs at least one condition".into(),
                        );
                    }
                    for (j, c) in conditions.iter().enumerate() {
                        let field = format!("hooks[{i}].conditions[{j}].value");
                        match c.operator {
                            RuleOperator::In if !c.value.is_array() => {
                                fail(field, "`in` takes an array".into())
                            }
                            RuleOperator::Matches => {
                                match c.value.as_str().map(regex::Regex::new) {
                                    Some(Ok(_)) => {}
                                    Some(Err(err)) => {
                                        fail(field, format!("not a valid regex: {err}"))
                                    }
                                    None => fail(field, "`matches` takes a regex string".into()),
                                }
                            }
                            RuleOperator::Contains | RuleOperator::StartsWith
                                if !c.value.is_string() =>
                            {
                                fail(field, "takes a string".into())
                            }
                            _ => {}
                        }
                    }
                }
                HookKind::Approval { timeout_secs } => {
                    if hook.event != HookEvent::PreToolUse {
                        fail(
                            format!("hooks[{i}].type"),
                            "approval hooks apply to pre_tool_use".into(),
                        );
                    }
                    if timeout_secs.is_some_and(|t| !(1..=86_400).contains(&t)) {
                        fail(
                            format!("hooks[{i}].timeout_secs"),
                            "must be between 1 and 86400".into(),
                        );
                    }
                }
            }
        }
        errors
    }
}

fn valid_tool_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn check_schema(schema: &Value, field: &str, fail: &mut impl FnMut(String, String)) {
    if !schema.is_object() {
        fail(field.into(), "must be a JSON Schema object".into());
        return;
    }
    if let Err(err) = jsonschema::meta::validate(schema) {
        fail(field.into(), format!("not a valid JSON Schema: {err}"));
        return;
    }
    if schema.get("type").is_some_and(|t| t != "object") {
        fail(
            field.into(),
            "the arguments schema must have \"type\": \"object\"".into(),
        );
    }
}

fn check_url(url: &str, field: &str, fail: &mut impl FnMut(String, String)) {
    let Some((scheme, rest)) = url.split_once("://") else {
        fail(field.into(), "must be an absolute http or https URL".into());
        return;
    };
    if !matches!(scheme, "http" | "https") {
        fail(field.into(), "must use http or https".into());
    } else if rest.is_empty() || rest.starts_with('/') || rest.contains(char::is_whitespace) {
        fail(field.into(), "must name a host".into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(value: Value) -> AgentSpec {
        serde_json::from_value(value).expect("parses")
    }

    #[test]
    fn the_contract_s_example_agent_is_valid_and_gets_defaults() {
        let agent = spec(
            json!({"name": "support", "instructions": "You are ...", "model": "gpt-4o-mini",
            "temperature": 0.2, "max_steps": 25, "history_depth": 10, "tool_choice": "auto",
            "tools": [
              {"type": "http", "name": "get_weather", "description": "...", "parameters": {"type": "object"},
               "url": "https://tools.example.com/weather", "method": "POST", "headers": {}, "read_only": true},
              {"type": "mcp", "name": "github", "url": "https://mcp.example.com/mcp", "headers": {}},
              {"type": "client", "name": "read_local_file", "description": "...", "parameters": {"type": "object"},
               "requires_approval": false}],
            "stop_conditions": [{"type": "has_tool_call", "tool_name": "get_weather"}]}),
        );
        assert_eq!(agent.validate(), []);
        let minimal = spec(json!({"name": "m", "model": "demo"}));
        assert_eq!((minimal.max_steps, minimal.history_depth), (25, 10));
        assert_eq!(minimal.tool_choice, ToolChoice::Auto);
    }

    #[test]
    fn every_problem_is_reported_by_field_path() {
        let agent = spec(
            json!({"name": "", "model": "demo", "max_steps": 0, "temperature": 3.0,
            "tool_choice": "nope",
            "tools": [
              {"type": "http", "name": "a", "url": "ftp://x", "parameters": {"type": "banana"}},
              {"type": "client", "name": "a"},
              {"type": "mcp", "name": "gh", "url": "not a url"},
              {"type": "client", "name": "gh_issues"}],
            "stop_conditions": [{"type": "has_tool_call", "tool_name": "missing"}],
            "step_rules": [{"step": 9, "active_tools": ["ghost"]},
                           {"step": 1, "tool_choice": "a", "active_tools": ["gh_issues"]}]}),
        );
        let fields: Vec<String> = agent.validate().into_iter().map(|e| e.field).collect();
        for expected in [
            "name",
            "temperature",
            "max_steps",
            "tools[0].parameters",
            "tools[0].url",
            "tools[1].name",
            "tools[2].url",
            "tools[3].name",
            "tool_choice",
            "stop_conditions[0].tool_name",
            "step_rules[0].step",
            "step_rules[0].active_tools[0]",
            "step_rules[1].tool_choice",
        ] {
            assert!(
                fields.contains(&expected.to_owned()),
                "{expected} missing from {fields:?}"
            );
        }
    }

    fn overrides(value: Value) -> RunOverrides {
        serde_json::from_value(value).expect("parses")
    }

    #[test]
    fn overrides_may_name_the_agent_s_tools_and_mcp_tools_but_not_the_server_itself() {
        let agent = spec(
            json!({"name": "a", "model": "demo", "max_steps": 4, "tools": [
            {"type": "client", "name": "read"},
            {"type": "mcp", "name": "gh", "url": "https://mcp.example.com/mcp"}]}),
        );
        let good = overrides(
            json!({"tool_choice": "read", "active_tools": ["read", "gh_issues"],
            "step_rules": [{"step": 3, "tool_choice": "gh_pulls"}, {"step": 4}],
            "defaults": {"tool_choice": "none"}}),
        );
        assert_eq!(good.validate(&agent, 3), []);
        let bad = overrides(
            json!({"tool_choice": "gh", "active_tools": ["ghost", "read"],
            "step_rules": [{"step": 2}, {"step": 5, "active_tools": ["gh_"]},
                           {"step": 3, "tool_choice": "read", "active_tools": ["gh_issues"]}],
            "defaults": {"tool_choice": "reader"}}),
        );
        let fields: Vec<String> = bad
            .validate(&agent, 3)
            .into_iter()
            .map(|e| e.field)
            .collect();
        assert_eq!(
            fields,
            [
                "tool_choice",
                "defaults.tool_choice",
                "active_tools[0]",
                "tool_choice",
                "step_rules[2].tool_choice",
                "step_rules[0].step",
                "step_rules[1].step",
            ]
        );
    }

    #[test]
    fn overrides_posted_at_later_pauses_add_to_those_of_earlier_ones() {
        let first = overrides(json!({"tool_choice": "read", "step_rules": [{"step": 5,
            "tool_choice": "none"}], "defaults": {"tool_choice": "required"}}))
        .accumulate(None, 2);
        let second = overrides(json!({"active_tools": [], "step_rules": [{"step": 5,
            "tool_choice": "auto"}]}))
        .accumulate(Some(first), 4);
        let rules: Vec<(u32, Option<ToolChoice>, Option<usize>)> = second
            .step_rules
            .iter()
            .flatten()
            .map(|r| {
                (
                    r.step,
                    r.tool_choice.clone(),
                    r.active_tools.as_ref().map(Vec::len),
                )
            })
            .collect();
        assert_eq!(
            rules,
            [
                (4, None, Some(0)),
                (5, Some(ToolChoice::Auto), None),
                (2, Some(ToolChoice::Tool("read".into())), None),
                (5, Some(ToolChoice::None), None),
            ],
            "newest first, each next-step choice pinned to its step"
        );
        assert_eq!(second.tool_choice, None);
        assert_eq!(
            second.defaults.and_then(|d| d.tool_choice),
            Some(ToolChoice::Required),
            "the defaults of the first pause last"
        );
    }

    #[test]
    fn a_choice_from_one_pause_and_tools_narrowed_at_another_clash() {
        let agent = spec(json!({"name": "a", "model": "demo", "tools": [
            {"type": "client", "name": "read"}, {"type": "client", "name": "list"}]}));
        let first = overrides(json!({"step_rules": [{"step": 3, "tool_choice": "read"}]}))
            .accumulate(None, 2);
        assert_eq!(first.clashes(&agent, 2), []);
        let narrowed =
            overrides(json!({"active_tools": ["list"]})).accumulate(Some(first.clone()), 3);
        let clashes = narrowed.clashes(&agent, 3);
        assert_eq!(clashes.len(), 1, "{clashes:?}");
        assert!(clashes[0].message.contains("at step 3"), "{clashes:?}");
        let widened =
            overrides(json!({"active_tools": ["list", "read"]})).accumulate(Some(first), 3);
        assert_eq!(widened.clashes(&agent, 3), []);
    }

    #[test]
    fn overrides_become_rules_ahead_of_the_agent_s_and_absent_ones_change_nothing() {
        let agent = spec(
            json!({"name": "a", "model": "demo", "tool_choice": "required",
            "tools": [{"type": "client", "name": "read"}],
            "step_rules": [{"step": 2, "tool_choice": "read"}]}),
        );
        let mut unchanged = agent.clone();
        // What the API stores when nothing is overridden.
        overrides(
            json!({"tool_choice": null, "active_tools": null, "step_rules": null,
            "defaults": null}),
        )
        .accumulate(None, 2)
        .apply(&mut unchanged);
        assert_eq!(unchanged, agent);

        let mut steered = agent.clone();
        overrides(
            json!({"tool_choice": "none", "step_rules": [{"step": 3, "active_tools": []}],
            "defaults": {"tool_choice": "auto"}}),
        )
        .accumulate(None, 2)
        .apply(&mut steered);
        assert_eq!(steered.tool_choice, ToolChoice::Auto);
        let rules: Vec<(u32, Option<ToolChoice>)> = steered
            .step_rules
            .iter()
            .map(|r| (r.step, r.tool_choice.clone()))
            .collect();
        assert_eq!(
            rules,
            [
                (2, Some(ToolChoice::None)),
                (3, None),
                (2, Some(ToolChoice::Tool("read".into()))),
            ]
        );
    }
}
