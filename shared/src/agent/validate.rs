//! Validation: every problem of an agent spec, or of the overrides a pause's answer posts,
//! reported at once by field path (`tools[1].name`), so a client fixes it in one round trip.
//!
//! The API validates before it stores anything; the worker trusts what was stored. The checks
//! an agent's step rules and a run's overrides share (a tool the agent does not have, a named
//! choice outside the tools offered with it) are written once, here.

use std::collections::HashSet;

use serde::Serialize;
use serde_json::Value;

use super::overrides::{MAX_INSTRUCTIONS_BYTES, RunOverrides};
use super::{
    AgentKind, AgentSpec, HISTORY_DEPTH_RANGE, HookEvent, HookKind, HookSpec, MAX_STEPS_RANGE,
    RuleCondition, RuleOperator, StepRule, StopCondition, ToolChoice, ToolResource, ToolSpec,
};
use crate::ids::ToolId;

/// How many tool resources one agent may reference.
pub const MAX_TOOL_IDS: usize = 64;

/// One problem of a spec, by field path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct FieldError {
    /// Where, e.g. `tools[1].parameters`.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

/// The problems found so far.
#[derive(Default)]
struct Problems(Vec<FieldError>);

impl Problems {
    fn add(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(FieldError {
            field: field.into(),
            message: message.into(),
        });
    }

    /// `unknown tool` unless the agent may be told to call `name`.
    fn unknown_tool(&mut self, agent: &AgentSpec, field: impl Into<String>, name: &str) {
        if !agent.callable(name) {
            self.add(field, format!("unknown tool `{name}`"));
        }
    }

    /// A named choice outside the tools offered alongside it: one the provider refuses.
    fn choice_outside(
        &mut self,
        field: impl Into<String>,
        choice: Option<&ToolChoice>,
        active: Option<&Vec<String>>,
    ) {
        if let (Some(ToolChoice::Tool(name)), Some(active)) = (choice, active)
            && !active.contains(name)
        {
            self.add(field, format!("`{name}` is not among the active tools"));
        }
    }
}

impl AgentSpec {
    /// Every problem of the spec; empty if it is valid.
    pub fn validate(&self) -> Vec<FieldError> {
        let mut problems = Problems::default();
        self.validate_limits(&mut problems);
        self.validate_tools(&mut problems);
        self.validate_choices(&mut problems);
        self.validate_step_rules(&mut problems);
        self.validate_origins(&mut problems);
        for (i, hook) in self.hooks.iter().enumerate() {
            validate_hook(i, hook, &mut problems);
        }
        if let Some(format) = &self.response_format {
            if !valid_tool_name(format.name()) {
                problems.add(
                    "response_format.name",
                    "must be 1 to 64 characters of a-z, A-Z, 0-9, _ or -",
                );
            }
            let schema = format.schema();
            if !schema.is_object() {
                problems.add("response_format.schema", "must be a JSON Schema object");
            } else if let Err(err) = jsonschema::meta::validate(schema) {
                problems.add(
                    "response_format.schema",
                    format!("not a valid JSON Schema: {err}"),
                );
            } else if let Err(err) = jsonschema::validator_for(schema) {
                problems.add("response_format.schema", format!("does not compile: {err}"));
            }
        }
        problems.0
    }

    /// The name, the model and every limit against its range, one check per field in the
    /// spec's order (about 80 lines: a list, not logic).
    fn validate_limits(&self, problems: &mut Problems) {
        if self.name.trim().is_empty() || self.name.len() > 200 {
            problems.add("name", "must be 1 to 200 characters");
        }
        match (self.kind, &self.graph_spec) {
            (AgentKind::Loop, graph) => {
                // Without `model`, a named provider's `default_model` serves (checked against
                // the providers, which this spec alone does not know).
                if self.model.trim().is_empty() && self.provider.is_none() {
                    problems.add("model", "must not be empty");
                }
                if graph.is_some() {
                    problems.add(
                        "graph_spec",
                        "only a `graph` agent has one: set `kind: \"graph\"`",
                    );
                }
            }
            (AgentKind::Graph, None) => {
                problems.add("graph_spec", "required when `kind` is `graph`");
            }
            (AgentKind::Graph, Some(_)) => {}
        }
        if let Some(window) = self.context_window_tokens
            && !(256..=10_000_000).contains(&window)
        {
            problems.add("context_window_tokens", "must be between 256 and 10000000");
        }
        if self
            .summary_model
            .as_ref()
            .is_some_and(|m| m.trim().is_empty())
        {
            problems.add("summary_model", "must not be empty");
        }
        if self.fallback_models.len() > 5 {
            problems.add("fallback_models", "at most 5 models");
        }
        for (i, model) in self.fallback_models.iter().enumerate() {
            if model.trim().is_empty() {
                problems.add(format!("fallback_models[{i}]"), "must not be empty");
            }
        }
        if let Some(t) = self.temperature
            && !(0.0..=2.0).contains(&t)
        {
            problems.add("temperature", "must be between 0 and 2");
        }
        let ranges = [
            ("max_steps", &MAX_STEPS_RANGE, self.max_steps),
            ("history_depth", &HISTORY_DEPTH_RANGE, self.history_depth),
            (
                "approval_timeout_secs",
                &(1..=86_400),
                self.approval_timeout_secs,
            ),
            (
                "limits.human_timeout_secs",
                &(1..=604_800),
                self.limits.client_timeout_secs(),
            ),
        ];
        let limits = &self.limits;
        let optional = [
            ("limits.max_steps", &MAX_STEPS_RANGE, limits.max_steps),
            ("limits.max_tool_calls", &(0..=500), limits.max_tool_calls),
            (
                "limits.max_parallel_tools",
                &(1..=16),
                limits.max_parallel_tools,
            ),
            ("limits.timeout_secs", &(5..=86_400), limits.timeout_secs),
            (
                "limits.max_output_tokens",
                &(1..=1_000_000),
                limits.max_output_tokens,
            ),
            ("limits.max_call_depth", &(0..=10), limits.max_call_depth),
            (
                "limits.max_agent_calls_per_step",
                &(1..=64),
                limits.max_agent_calls_per_step,
            ),
            ("limits.max_tree_runs", &(1..=1000), limits.max_tree_runs),
        ];
        for (scope, limits) in [
            ("user", &self.governance.user),
            ("tenant", &self.governance.tenant),
        ] {
            for (name, problem) in limits.problems() {
                problems.add(format!("governance.{scope}.{name}"), problem);
            }
        }
        for (name, problem) in self.governance.ip.problems() {
            problems.add(format!("governance.ip.{name}"), problem);
        }
        let ip = &self.governance.ip;
        for (field, set) in [
            ("daily_token_budget", ip.daily_token_budget.is_some()),
            ("daily_budget_usd", ip.daily_budget_usd.is_some()),
        ] {
            if set {
                problems.add(
                    format!("governance.ip.{field}"),
                    "per address only runs_per_hour and max_concurrent_runs",
                );
            }
        }
        let set = optional
            .into_iter()
            .filter_map(|(field, range, value)| Some((field, range, value?)));
        for (field, range, value) in ranges.into_iter().chain(set) {
            if !range.contains(&value) {
                let (low, high) = (range.start(), range.end());
                problems.add(field, format!("must be between {low} and {high}"));
            }
        }
    }

    /// `cors_origins`: at most 20, each an origin (`https://host[:port]`, exactly as a browser
    /// sends it in `Origin`).
    fn validate_origins(&self, problems: &mut Problems) {
        if self.cors_origins.len() > 20 {
            problems.add("cors_origins", "at most 20 origins");
        }
        for (i, origin) in self.cors_origins.iter().enumerate() {
            let exact = reqwest::Url::parse(origin).ok().filter(|url| {
                matches!(url.scheme(), "http" | "https")
                    && url.origin().ascii_serialization() == *origin
            });
            if exact.is_none() {
                problems.add(
                    format!("cors_origins[{i}]"),
                    "must be an origin as browsers send it: `https://host` or `https://host:port`, no path or trailing slash",
                );
            }
        }
    }

    /// Names (valid, unreserved, unique, clear of MCP prefixes), schemas, URLs and methods.
    fn validate_tools(&self, problems: &mut Problems) {
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
            let field = format!("tools[{i}].name");
            if !valid_tool_name(name) {
                problems.add(field, "must be 1 to 64 characters of a-z, A-Z, 0-9, _ or -");
            } else if matches!(name, "auto" | "required" | "none") {
                problems.add(field, format!("`{name}` is reserved by tool_choice"));
            } else if !names.insert(name.to_owned()) {
                problems.add(field, format!("duplicate tool name `{name}`"));
            } else if !matches!(tool, ToolSpec::Mcp(_))
                && let Some(prefix) = mcp_prefixes
                    .iter()
                    .find(|p| name.starts_with(&format!("{p}_")))
            {
                problems.add(
                    field,
                    format!(
                        "`{name}` collides with the tools of MCP server `{prefix}` (named \
                         `{prefix}_*`)"
                    ),
                );
            }
            // Two servers whose names make the same `{name}_{tool}` from different tools
            // (`gh` + `admin_delete`, `gh_admin` + `delete`): each prefix must not start
            // with another's followed by `_`.
            if let ToolSpec::Mcp(_) = tool
                && let Some(other) = mcp_prefixes
                    .iter()
                    .find(|p| **p != name && name.starts_with(&format!("{p}_")))
            {
                problems.add(
                    format!("tools[{i}].name"),
                    format!(
                        "the tools of MCP server `{name}` (`{name}_*`) could take the names of \
                         those of MCP server `{other}` (`{other}_*`): neither name may start \
                         with the other's followed by `_`"
                    ),
                );
            }
            match tool {
                ToolSpec::Http(t) => {
                    check_schema(&t.parameters, &format!("tools[{i}].parameters"), problems);
                    check_url(&t.url, &format!("tools[{i}].url"), problems);
                    if !matches!(
                        t.method.as_str(),
                        "GET" | "POST" | "PUT" | "PATCH" | "DELETE"
                    ) {
                        problems.add(
                            format!("tools[{i}].method"),
                            "must be GET, POST, PUT, PATCH or DELETE",
                        );
                    }
                }
                ToolSpec::Mcp(t) => validate_mcp(i, t, problems),
                ToolSpec::Client(t) => {
                    check_schema(&t.parameters, &format!("tools[{i}].parameters"), problems)
                }
                // Whether the agent exists (in the tenant) is checked where agents are saved;
                // whether the operator enables a built-in tool, too (a setting of the API).
                ToolSpec::Agent(_) | ToolSpec::Builtin(_) => {}
            }
        }
    }

    /// The tool choice and the stop conditions name tools the agent has.
    fn validate_choices(&self, problems: &mut Problems) {
        if let ToolChoice::Tool(name) = &self.tool_choice {
            problems.unknown_tool(self, "tool_choice", name);
        }
        for (j, name) in self.active_tools.iter().flatten().enumerate() {
            problems.unknown_tool(self, format!("active_tools[{j}]"), name);
        }
        problems.choice_outside(
            "tool_choice",
            Some(&self.tool_choice),
            self.active_tools.as_ref(),
        );
        for (i, condition) in self.stop_conditions.iter().enumerate() {
            let StopCondition::HasToolCall { tool_name } = condition;
            problems.unknown_tool(self, format!("stop_conditions[{i}].tool_name"), tool_name);
        }
    }

    fn validate_step_rules(&self, problems: &mut Problems) {
        for (i, rule) in self.step_rules.iter().enumerate() {
            if rule.step == 0 || rule.step > self.max_steps {
                problems.add(
                    format!("step_rules[{i}].step"),
                    format!("must be between 1 and max_steps ({})", self.max_steps),
                );
            }
            rule_names(self, &format!("step_rules[{i}]"), rule, problems);
            problems.choice_outside(
                format!("step_rules[{i}].tool_choice"),
                rule.tool_choice.as_ref(),
                rule.active_tools.as_ref(),
            );
        }
    }
}

impl AgentSpec {
    /// The spec with every tool it references (`referenced`, the tenant's tools among its
    /// `tool_ids`, enabled or not) appended to `tools`: what [`AgentSpec::validate_with`]
    /// checks, so a name taken twice is refused whether or not the tool is enabled now.
    pub fn with_referenced(&self, referenced: &[(ToolId, ToolResource)]) -> Self {
        let mut merged = self.clone();
        merged.tools.extend(self.tool_ids.iter().filter_map(|r| {
            referenced
                .iter()
                .find(|(id, _)| *id == r.tool_id)
                .map(|(_, tool)| tool.tool.clone().referenced_as(r))
        }));
        merged.tool_ids.clear();
        merged
    }

    /// Every problem of the spec with its references (`referenced`: the tenant's tools among
    /// its `tool_ids`; one missing is a reference to no tool of the tenant). A problem of a
    /// referenced tool (a name it shares with another tool) is named by its reference,
    /// `tool_ids[j]`.
    pub fn validate_with(&self, referenced: &[(ToolId, ToolResource)]) -> Vec<FieldError> {
        let mut problems = Problems::default();
        if self.tool_ids.len() > MAX_TOOL_IDS {
            problems.add("tool_ids", format!("at most {MAX_TOOL_IDS} tools"));
        }
        let mut seen = HashSet::new();
        // The position, among the merged tools, of each reference that resolves.
        let mut positions = Vec::new();
        for (j, reference) in self.tool_ids.iter().enumerate() {
            let field = format!("tool_ids[{j}]");
            let found = referenced.iter().find(|(id, _)| *id == reference.tool_id);
            if !seen.insert(reference.tool_id) {
                problems.add(
                    format!("{field}.tool_id"),
                    format!("tool {} is referenced twice", reference.tool_id),
                );
            }
            match found {
                None => problems.add(
                    format!("{field}.tool_id"),
                    format!("no tool {} in this tenant", reference.tool_id),
                ),
                Some((_, tool)) => {
                    if reference.read_only.is_some() && !matches!(tool.tool, ToolSpec::Http(_)) {
                        problems.add(
                            format!("{field}.read_only"),
                            format!(
                                "only an http tool has read_only; `{}` is a {} tool",
                                tool.tool.name(),
                                tool.tool.kind()
                            ),
                        );
                    }
                    positions.push(j);
                }
            }
        }
        let inline = self.tools.len();
        for mut problem in self.with_referenced(referenced).validate() {
            if let Some(rest) = problem.field.strip_prefix("tools[")
                && let Some((index, tail)) = rest.split_once(']')
                && let Ok(index) = index.parse::<usize>()
                && let Some(j) = index.checked_sub(inline).and_then(|k| positions.get(k))
            {
                problem.field = format!("tool_ids[{j}]{tail}");
            }
            problems.0.push(problem);
        }
        if let (AgentKind::Graph, Some(graph)) = (self.kind, &self.graph_spec) {
            problems.0.extend(graph.validate(referenced));
        }
        problems.0
    }
}

impl ToolResource {
    /// Every problem of the tool, by field path (`name`, `parameters`, `url`, ...); empty if it
    /// is valid. Whether an agent tool's agent exists is the caller's to check.
    pub fn validate(&self) -> Vec<FieldError> {
        let mut holder = AgentSpec::default_agent("demo", "");
        holder.tools.push(self.tool.clone());
        holder
            .validate()
            .into_iter()
            .filter_map(|mut problem| {
                let field = problem.field.strip_prefix("tools[0].")?;
                problem.field = field.to_owned();
                Some(problem)
            })
            .collect()
    }
}

/// The tools a step rule names (its choice, its active tools) are the agent's.
fn rule_names(agent: &AgentSpec, field: &str, rule: &StepRule, problems: &mut Problems) {
    if let Some(ToolChoice::Tool(name)) = &rule.tool_choice {
        problems.unknown_tool(agent, format!("{field}.tool_choice"), name);
    }
    for (j, name) in rule.active_tools.iter().flatten().enumerate() {
        problems.unknown_tool(agent, format!("{field}.active_tools[{j}]"), name);
    }
}

fn validate_hook(i: usize, hook: &HookSpec, problems: &mut Problems) {
    let tool_event = matches!(hook.event, HookEvent::PreToolUse | HookEvent::PostToolUse);
    match hook.matcher_regex() {
        Some(_) if !tool_event => {
            problems.add(
                format!("hooks[{i}].matcher"),
                "only tool events take a matcher",
            );
        }
        Some(Err(err)) => {
            problems.add(
                format!("hooks[{i}].matcher"),
                format!("not a valid regex: {err}"),
            );
        }
        _ => {}
    }
    let pre_tool_use_only = |problems: &mut Problems, kind: &str| {
        if hook.event != HookEvent::PreToolUse {
            problems.add(
                format!("hooks[{i}].type"),
                format!("{kind} hooks apply to pre_tool_use"),
            );
        }
    };
    if !hook.fail.is_open() {
        if !matches!(hook.kind, HookKind::Http { .. }) {
            problems.add(
                format!("hooks[{i}].fail"),
                "only http hooks can fail (rule and approval hooks always decide)",
            );
        } else if !hook.event.guards() {
            problems.add(
                format!("hooks[{i}].fail"),
                "`closed` applies to guard hooks: on_run_start, pre_tool_use, pre_response",
            );
        }
    }
    match &hook.kind {
        HookKind::Http {
            url, timeout_secs, ..
        } => {
            check_url(url, &format!("hooks[{i}].url"), problems);
            if !(1..=60).contains(timeout_secs) {
                problems.add(
                    format!("hooks[{i}].timeout_secs"),
                    "must be between 1 and 60",
                );
            }
        }
        HookKind::Rule { conditions, .. } => {
            pre_tool_use_only(problems, "rule");
            if conditions.is_empty() {
                problems.add(
                    format!("hooks[{i}].conditions"),
                    "needs at least one condition",
                );
            }
            for (j, condition) in conditions.iter().enumerate() {
                check_condition(
                    condition,
                    &format!("hooks[{i}].conditions[{j}].value"),
                    problems,
                );
            }
        }
        HookKind::Approval { timeout_secs } => {
            pre_tool_use_only(problems, "approval");
            if timeout_secs.is_some_and(|t| !(1..=86_400).contains(&t)) {
                problems.add(
                    format!("hooks[{i}].timeout_secs"),
                    "must be between 1 and 86400",
                );
            }
        }
    }
}

fn check_condition(condition: &RuleCondition, field: &str, problems: &mut Problems) {
    match condition.operator {
        RuleOperator::In if !condition.value.is_array() => {
            problems.add(field, "`in` takes an array");
        }
        RuleOperator::Matches => match condition.value.as_str().map(regex::Regex::new) {
            Some(Ok(_)) => {}
            Some(Err(err)) => problems.add(field, format!("not a valid regex: {err}")),
            None => problems.add(field, "`matches` takes a regex string"),
        },
        RuleOperator::Contains | RuleOperator::StartsWith if !condition.value.is_string() => {
            problems.add(field, "takes a string");
        }
        _ => {}
    }
}

impl RunOverrides {
    /// Every problem of these overrides for a run of `agent` whose next model call is step
    /// `next_step`, by field path in the request that posts them; empty if they are valid.
    pub fn validate(&self, agent: &AgentSpec, next_step: u32) -> Vec<FieldError> {
        let mut problems = Problems::default();
        self.validate_tool_names(agent, &mut problems);
        self.validate_bounds(agent, &mut problems);
        for (i, condition) in self.stop_conditions.iter().flatten().enumerate() {
            let StopCondition::HasToolCall { tool_name } = condition;
            problems.unknown_tool(agent, format!("stop_conditions[{i}].tool_name"), tool_name);
        }
        let long = |text: &Option<String>| {
            text.as_ref()
                .is_some_and(|i| i.len() > MAX_INSTRUCTIONS_BYTES)
        };
        if long(&self.instructions) || long(&self.extra_instructions) {
            problems.add(
                "instructions",
                format!("must be at most {MAX_INSTRUCTIONS_BYTES} bytes"),
            );
        }
        let rules = self.step_rules.as_deref().unwrap_or_default();
        for (i, rule) in rules.iter().enumerate() {
            rule_names(agent, &format!("step_rules[{i}]"), rule, &mut problems);
        }
        problems.choice_outside(
            "tool_choice",
            self.tool_choice.as_ref(),
            self.active_tools.as_ref(),
        );
        for (i, rule) in rules.iter().enumerate() {
            problems.choice_outside(
                format!("step_rules[{i}].tool_choice"),
                rule.tool_choice.as_ref(),
                rule.active_tools.as_ref(),
            );
        }
        // The run's own max_steps: the message's, or the agent's default.
        let steps = self.run_steps(agent);
        for (i, rule) in rules.iter().enumerate() {
            if rule.step < next_step || rule.step > steps {
                problems.add(
                    format!("step_rules[{i}].step"),
                    format!("must be a later step: between {next_step} and max_steps ({steps})"),
                );
            }
        }
        problems.0
    }

    /// The tools `tool_choice`, `active_tools` and their `defaults` name: the agent's, and the
    /// default choice among the default active tools.
    fn validate_tool_names(&self, agent: &AgentSpec, problems: &mut Problems) {
        let defaults = self.defaults.clone().unwrap_or_default();
        let choices = [
            ("tool_choice", self.tool_choice.as_ref()),
            ("defaults.tool_choice", defaults.tool_choice.as_ref()),
        ];
        for (field, choice) in choices {
            if let Some(ToolChoice::Tool(name)) = choice {
                problems.unknown_tool(agent, field, name);
            }
        }
        let actives = [
            ("active_tools", self.active_tools.as_ref()),
            ("defaults.active_tools", defaults.active_tools.as_ref()),
        ];
        for (field, names) in actives {
            for (j, name) in names.into_iter().flatten().enumerate() {
                problems.unknown_tool(agent, format!("{field}[{j}]"), name);
            }
        }
        problems.choice_outside(
            "defaults.tool_choice",
            defaults.tool_choice.as_ref(),
            defaults.active_tools.as_ref(),
        );
    }

    /// `max_steps` within the agent's ceiling and `max_call_depth` within its limit.
    fn validate_bounds(&self, agent: &AgentSpec, problems: &mut Problems) {
        let ceiling = agent.step_ceiling();
        if let Some(max_steps) = self.max_steps
            && !(MAX_STEPS_RANGE.contains(&max_steps) && max_steps <= ceiling)
        {
            let low = MAX_STEPS_RANGE.start();
            problems.add(
                "max_steps",
                format!(
                    "must be between {low} and the agent's ceiling, {ceiling} (its \
                     `limits.max_steps`, else its `max_steps`)"
                ),
            );
        }
        let depth = agent.limits.call_depth();
        if self.max_call_depth.is_some_and(|d| d > depth) {
            problems.add(
                "max_call_depth",
                format!("must be between 0 and the agent's `limits.max_call_depth`, {depth}"),
            );
        }
    }
}

/// Whether `name` is a name providers accept for a tool: 1 to 64 characters of a-z, A-Z, 0-9,
/// `_` or `-` (the worker checks the names MCP servers give their tools with it too).
pub fn valid_tool_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn check_schema(schema: &Value, field: &str, problems: &mut Problems) {
    if !schema.is_object() {
        problems.add(field, "must be a JSON Schema object");
        return;
    }
    if let Err(err) = jsonschema::meta::validate(schema) {
        problems.add(field, format!("not a valid JSON Schema: {err}"));
        return;
    }
    if schema.get("type").is_some_and(|t| t != "object") {
        problems.add(field, "the arguments schema must have \"type\": \"object\"");
    }
}

/// How many names an MCP server's `allowed_tools` may list.
pub const MAX_ALLOWED_TOOLS: usize = 256;

/// An MCP server's URL, `allowed_tools` and `auth`.
fn validate_mcp(i: usize, t: &super::McpToolSpec, problems: &mut Problems) {
    check_url(&t.url, &format!("tools[{i}].url"), problems);
    if let Some(allowed) = &t.allowed_tools {
        if allowed.len() > MAX_ALLOWED_TOOLS {
            problems.add(
                format!("tools[{i}].allowed_tools"),
                format!("at most {MAX_ALLOWED_TOOLS} names"),
            );
        }
        for (j, name) in allowed.iter().enumerate() {
            if name.is_empty() || name.len() > 128 {
                problems.add(
                    format!("tools[{i}].allowed_tools[{j}]"),
                    "a tool's name on the server: 1 to 128 bytes",
                );
            } else if allowed[..j].contains(name) {
                problems.add(
                    format!("tools[{i}].allowed_tools[{j}]"),
                    format!("`{name}` is listed twice"),
                );
            }
        }
    }
    match &t.auth {
        None => {}
        Some(super::McpAuth::Bearer { token }) => {
            if token.is_empty() {
                problems.add(format!("tools[{i}].auth.token"), "must not be empty");
            } else if token.chars().any(|c| !c.is_ascii_graphic()) {
                problems.add(
                    format!("tools[{i}].auth.token"),
                    "must be visible ASCII (no spaces or control characters)",
                );
            }
        }
        Some(super::McpAuth::OauthClientCredentials {
            token_url,
            client_id,
            client_secret,
            ..
        }) => {
            check_url(token_url, &format!("tools[{i}].auth.token_url"), problems);
            if client_id.is_empty() {
                problems.add(format!("tools[{i}].auth.client_id"), "must not be empty");
            }
            if client_secret.is_empty() {
                problems.add(
                    format!("tools[{i}].auth.client_secret"),
                    "must not be empty",
                );
            }
        }
    }
}

fn check_url(url: &str, field: &str, problems: &mut Problems) {
    let Some((scheme, rest)) = url.split_once("://") else {
        problems.add(field, "must be an absolute http or https URL");
        return;
    };
    if !matches!(scheme, "http" | "https") {
        problems.add(field, "must use http or https");
    } else if rest.is_empty() || rest.starts_with('/') || rest.contains(char::is_whitespace) {
        problems.add(field, "must name a host");
    }
}

#[cfg(test)]
mod tests;
