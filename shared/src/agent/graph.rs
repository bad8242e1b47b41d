//! Graph agents (`kind: "graph"`): Butterbase's declarative `graph_spec` (`spec_version: "1"`),
//! a graph of `llm`, `tool`, `human_input` and `end` nodes joined by edges with optional
//! conditions, instead of a free-running loop.
//!
//! This module holds the spec as both crates read it, its validation (every problem by field
//! path from the agent's root, `graph_spec.nodes.answer.output_key`, so a spec is fixed in one
//! round trip) and the templates (`{{input}}`, `{{<output_key>}}`). The worker executes it in
//! `worker/src/agent/graph.rs`, one checkpointed step per node execution.
//!
//! Fields a node needs are read leniently (a missing one is an empty string) so that the
//! validator, not the parser, reports them, all at once and by path; an unknown node type
//! parses as [`GraphNode::Unknown`] for the same reason.

use std::collections::{BTreeMap, BTreeSet};

use regex::Regex;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::validate::{FieldError, valid_tool_name};
use super::{AgentSpec, ToolResource, ToolSpec};
use crate::ids::ToolId;

/// The built-in tools a graph may name (section 12); one the server does not run is a tool
/// error the model (or the tool node's output) sees, never a failed run.
pub const BUILTIN_TOOLS: &[&str] = &["http_request", "knowledge_search"];

/// The key every template may name: the user's message.
pub const INPUT_KEY: &str = "input";

/// An agent's graph (`graph_spec`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GraphSpec {
    /// The spec's version: `"1"`.
    pub spec_version: String,
    /// The id of the first node.
    pub entry: String,
    /// The model of `llm` nodes that name none (else the agent's `model`, else the server's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_model: Option<String>,
    /// The nodes, by id: each `{type: "llm"|"tool"|"human_input"|"end", ...}`.
    #[schema(value_type = Object)]
    pub nodes: BTreeMap<String, GraphNode>,
    /// The edges, in order: from a node, the first whose condition holds is taken.
    #[serde(default)]
    pub edges: Vec<GraphEdge>,
    /// The tools nodes may name.
    #[serde(default, skip_serializing_if = "GraphTools::is_empty")]
    pub tools: GraphTools,
    /// Limits of each run.
    #[serde(default, skip_serializing_if = "GraphLimits::is_empty")]
    pub limits: GraphLimits,
}

/// A node of a graph.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum GraphNode {
    /// A model call: the system prompt, and the rendered input as the user message.
    Llm(LlmNode),
    /// A tool call with templated arguments.
    Tool(ToolNode),
    /// A question to the user; the run pauses until the answer.
    HumanInput(HumanInputNode),
    /// The end: its rendered template is the message's text and output.
    End(EndNode),
    /// A type this version does not know (reported by validation; never stored).
    #[serde(other)]
    Unknown,
}

/// An `llm` node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlmNode {
    /// The model; default the graph's `default_model`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The system prompt (templated).
    #[serde(default)]
    pub system_prompt: String,
    /// The user message (templated).
    #[serde(default)]
    pub input_template: String,
    /// Where its text goes.
    #[serde(default)]
    pub output_key: String,
    /// The tools the model may call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<GraphToolRef>,
    /// Sampling temperature (0 to 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Tokens the model may generate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
}

/// A `tool` node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolNode {
    /// The tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_ref: Option<GraphToolRef>,
    /// The arguments: an object of templated strings.
    #[serde(default)]
    pub args_template: serde_json::Map<String, Value>,
    /// Where its result goes (JSON if it is JSON, else text).
    #[serde(default)]
    pub output_key: String,
}

/// A `human_input` node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HumanInputNode {
    /// The question shown to the user (templated).
    #[serde(default)]
    pub prompt_template: String,
    /// Where the answer goes.
    #[serde(default)]
    pub output_key: String,
}

/// An `end` node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndNode {
    /// The message's text (templated).
    #[serde(default)]
    pub output_template: String,
}

/// A tool a node names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "source", rename_all = "snake_case", deny_unknown_fields)]
pub enum GraphToolRef {
    /// One of the graph's `tools.functions`, by name.
    Function {
        /// Its name.
        name: String,
    },
    /// A tool of one of the graph's `tools.mcp_servers`.
    Mcp {
        /// The MCP server (a tool resource's id).
        server_id: ToolId,
        /// The server's tool.
        name: String,
    },
    /// One of the graph's `tools.builtin`.
    Builtin {
        /// Its name.
        name: String,
    },
}

impl GraphToolRef {
    /// The name the tool's call carries.
    pub fn name(&self) -> &str {
        match self {
            Self::Function { name } | Self::Mcp { name, .. } | Self::Builtin { name } => name,
        }
    }
}

/// An edge.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GraphEdge {
    /// The node it leaves.
    pub from: String,
    /// The node it enters.
    pub to: String,
    /// Taken only if this holds (without it, always).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<EdgeCondition>,
}

/// An edge's condition: an earlier output (as text) contains a text.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EdgeCondition {
    /// The output key.
    pub key: String,
    /// The text it must contain.
    pub contains: String,
}

/// The tools a graph's nodes may name.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GraphTools {
    /// HTTP tools (section 5's `http` kind).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub functions: Vec<ToolSpec>,
    /// MCP servers: ids of the tenant's `mcp` tool resources.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mcp_servers: Vec<ToolId>,
    /// Built-in tools, by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub builtin: Vec<String>,
    /// Set by the server on a run's snapshot (never on a stored agent; a save that sets it is
    /// refused): the `mcp_servers` as they were when the run was enqueued, enabled ones only,
    /// which the run connects to whatever happens to the tools later. Absent on runs enqueued
    /// before snapshots were taken, which read the servers as they are when a node runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(read_only)]
    pub mcp_snapshot: Option<Vec<McpServerSnapshot>>,
}

/// One of a graph's MCP servers as a run snapshots it ([`GraphTools::mcp_snapshot`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct McpServerSnapshot {
    /// The tool resource's id (what nodes name as `server_id`).
    pub id: ToolId,
    /// The server, as the tool resource was.
    pub tool: ToolSpec,
}

impl GraphTools {
    /// Whether it names no tool.
    pub fn is_empty(&self) -> bool {
        self.functions.is_empty() && self.mcp_servers.is_empty() && self.builtin.is_empty()
    }
}

/// A graph's limits (all optional).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GraphLimits {
    /// Node executions per run (1 to 200; default 25); required when the graph has a cycle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 200)]
    pub max_steps: Option<u32>,
    /// Tool calls per run (0 to 500; default 200).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 500)]
    pub max_tool_calls: Option<u32>,
    /// Tool calls of one model call run at once (1 to 16; default 8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 16)]
    pub max_parallel_tools: Option<u32>,
    /// The run's wall clock in seconds (5 to 3600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 5, maximum = 3600)]
    pub timeout_seconds: Option<u32>,
    /// Seconds a `human_input` node waits (60 to 604800; default 86400).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 60, maximum = 604_800)]
    pub human_timeout_seconds: Option<u32>,
}

/// Node executions per run when `limits.max_steps` is unset.
pub const DEFAULT_GRAPH_STEPS: u32 = 25;

impl GraphLimits {
    /// Whether no limit is set.
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }

    /// Node executions per run.
    pub fn steps(&self) -> u32 {
        self.max_steps.unwrap_or(DEFAULT_GRAPH_STEPS)
    }

    /// Seconds a `human_input` node waits.
    pub fn human_timeout(&self) -> u32 {
        self.human_timeout_seconds
            .unwrap_or(super::DEFAULT_HUMAN_TIMEOUT_SECS)
    }
}

impl GraphNode {
    /// The type's name.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Llm(_) => "llm",
            Self::Tool(_) => "tool",
            Self::HumanInput(_) => "human_input",
            Self::End(_) => "end",
            Self::Unknown => "unknown",
        }
    }

    /// The key its output goes to (`end` and unknown nodes have none).
    pub fn output_key(&self) -> Option<&str> {
        match self {
            Self::Llm(n) => Some(&n.output_key),
            Self::Tool(n) => Some(&n.output_key),
            Self::HumanInput(n) => Some(&n.output_key),
            Self::End(_) | Self::Unknown => None,
        }
    }

    /// Its templates, by field name (`args_template.q` for a tool's arguments).
    fn templates(&self) -> Vec<(String, &str)> {
        match self {
            Self::Llm(n) => vec![
                ("system_prompt".to_owned(), n.system_prompt.as_str()),
                ("input_template".to_owned(), n.input_template.as_str()),
            ],
            Self::Tool(n) => n
                .args_template
                .iter()
                .filter_map(|(k, v)| Some((format!("args_template.{k}"), v.as_str()?)))
                .collect(),
            Self::HumanInput(n) => vec![("prompt_template".to_owned(), n.prompt_template.as_str())],
            Self::End(n) => vec![("output_template".to_owned(), n.output_template.as_str())],
            Self::Unknown => Vec::new(),
        }
    }
}

fn template_pattern() -> &'static Regex {
    static PATTERN: std::sync::OnceLock<Regex> = std::sync::OnceLock::new();
    PATTERN.get_or_init(|| {
        Regex::new(r"\{\{\s*([A-Za-z0-9_.\-]*)\s*\}\}").expect("the template pattern compiles")
    })
}

/// The keys a template names, in order.
pub fn template_keys(template: &str) -> Vec<&str> {
    template_pattern()
        .captures_iter(template)
        .filter_map(|c| c.get(1).map(|m| m.as_str()))
        .collect()
}

/// The text a value renders as in a template: a string as it is, anything else as its JSON.
pub fn render_value(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// `template` with every `{{key}}` replaced by `values[key]` rendered ([`render_value`]); a key
/// with no value renders as nothing.
pub fn render(template: &str, values: &BTreeMap<String, Value>) -> String {
    template_pattern()
        .replace_all(template, |c: &regex::Captures<'_>| {
            values.get(&c[1]).map(render_value).unwrap_or_default()
        })
        .into_owned()
}

/// Whether an edge's condition holds for the outputs so far.
pub fn holds(when: Option<&EdgeCondition>, values: &BTreeMap<String, Value>) -> bool {
    when.is_none_or(|w| {
        values
            .get(&w.key)
            .is_some_and(|v| render_value(v).contains(&w.contains))
    })
}

impl GraphSpec {
    /// The node after `node`, given the outputs so far: the target of the first edge from it
    /// whose condition holds.
    pub fn next(&self, node: &str, values: &BTreeMap<String, Value>) -> Option<&str> {
        self.edges
            .iter()
            .filter(|e| e.from == node)
            .find(|e| holds(e.when.as_ref(), values))
            .map(|e| e.to.as_str())
    }

    /// The function tool named `name`.
    pub fn function(&self, name: &str) -> Option<&ToolSpec> {
        self.tools.functions.iter().find(|t| t.name() == name)
    }

    /// The nodes reachable from `from` in one or more edges.
    fn reachable_from(&self, from: &str) -> BTreeSet<&str> {
        let mut seen = BTreeSet::new();
        let mut stack: Vec<&str> = vec![from];
        while let Some(node) = stack.pop() {
            for edge in self.edges.iter().filter(|e| e.from == node) {
                if self.nodes.contains_key(&edge.to) && seen.insert(edge.to.as_str()) {
                    stack.push(&edge.to);
                }
            }
        }
        seen
    }

    /// A cycle among the nodes reachable from the entry, as the node ids along it.
    fn cycle(&self) -> Option<Vec<String>> {
        let mut starts: Vec<&str> = vec![self.entry.as_str()];
        starts.extend(self.reachable_from(&self.entry));
        starts
            .into_iter()
            .find(|node| self.reachable_from(node).contains(node))
            .map(|node| {
                // The shortest way back, for the message.
                let mut path = vec![node.to_owned()];
                let mut current = node;
                for _ in 0..self.nodes.len() {
                    let step = self
                        .edges
                        .iter()
                        .filter(|e| e.from == current && self.nodes.contains_key(&e.to))
                        .find(|e| e.to == node || self.reachable_from(&e.to).contains(&node));
                    let Some(step) = step else { break };
                    path.push(step.to.clone());
                    if step.to == node {
                        break;
                    }
                    current = step.to.as_str();
                }
                path
            })
    }

    /// Every problem of the graph, by field path from the agent's root (`graph_spec.…`), given
    /// the tenant's tools among its `tools.mcp_servers` (`referenced`).
    pub fn validate(&self, referenced: &[(ToolId, ToolResource)]) -> Vec<FieldError> {
        let mut problems = Vec::new();
        let mut add = |field: String, message: String| {
            problems.push(FieldError { field, message });
        };
        if self.spec_version != "1" {
            add("graph_spec.spec_version".into(), "must be \"1\"".into());
        }
        if self.nodes.is_empty() {
            add("graph_spec.nodes".into(), "needs at least one node".into());
        }
        if !self.nodes.contains_key(&self.entry) {
            add(
                "graph_spec.entry".into(),
                format!("no node `{}`", self.entry),
            );
        }
        if self
            .default_model
            .as_ref()
            .is_some_and(|m| m.trim().is_empty())
        {
            add(
                "graph_spec.default_model".into(),
                "must not be empty".into(),
            );
        }
        if !self.nodes.values().any(|n| matches!(n, GraphNode::End(_))) {
            add("graph_spec.nodes".into(), "needs an `end` node".into());
        }
        self.validate_tools(referenced, &mut add);
        for (id, node) in &self.nodes {
            self.validate_node(id, node, &mut add);
        }
        self.validate_edges(&mut add);
        self.validate_limits(&mut add);
        problems
    }

    fn validate_tools(
        &self,
        referenced: &[(ToolId, ToolResource)],
        add: &mut impl FnMut(String, String),
    ) {
        // The functions are section 5's tools: checked as an agent's would be, by their paths.
        let mut holder = AgentSpec::default_agent("graph", "");
        holder.tools.clone_from(&self.tools.functions);
        for problem in holder.validate() {
            if let Some(rest) = problem.field.strip_prefix("tools") {
                add(format!("graph_spec.tools.functions{rest}"), problem.message);
            }
        }
        for (i, tool) in self.tools.functions.iter().enumerate() {
            if !matches!(tool, ToolSpec::Http(_)) {
                add(
                    format!("graph_spec.tools.functions[{i}].type"),
                    format!(
                        "a graph's functions are `http` tools (`{}` is not supported here; MCP \
                         servers go in `tools.mcp_servers`)",
                        tool.kind()
                    ),
                );
            }
        }
        if self.tools.mcp_snapshot.is_some() {
            add(
                "graph_spec.tools.mcp_snapshot".into(),
                "is set by the server on a run's snapshot; leave it out".into(),
            );
        }
        for (i, id) in self.tools.mcp_servers.iter().enumerate() {
            match referenced.iter().find(|(r, _)| r == id) {
                None => add(
                    format!("graph_spec.tools.mcp_servers[{i}]"),
                    format!("no tool {id} in this tenant"),
                ),
                Some((_, tool)) if tool.tool.as_mcp().is_none() => add(
                    format!("graph_spec.tools.mcp_servers[{i}]"),
                    format!(
                        "tool {id} is not an MCP server (it is `{}`)",
                        tool.tool.kind()
                    ),
                ),
                Some(_) => {}
            }
        }
        for (i, name) in self.tools.builtin.iter().enumerate() {
            if !BUILTIN_TOOLS.contains(&name.as_str()) {
                add(
                    format!("graph_spec.tools.builtin[{i}]"),
                    format!(
                        "unknown built-in tool `{name}` (known: {})",
                        BUILTIN_TOOLS.join(", ")
                    ),
                );
            }
        }
    }

    /// What a tool reference resolves to; `None` if it is fine.
    fn unresolved(&self, reference: &GraphToolRef) -> Option<String> {
        match reference {
            GraphToolRef::Function { name } => self
                .function(name)
                .is_none()
                .then(|| format!("no function `{name}` in graph_spec.tools.functions")),
            GraphToolRef::Mcp { server_id, name } => {
                if !self.tools.mcp_servers.contains(server_id) {
                    Some(format!(
                        "MCP server {server_id} is not in graph_spec.tools.mcp_servers"
                    ))
                } else if !valid_tool_name(name) {
                    Some("the tool's name must be 1 to 64 of a-z, A-Z, 0-9, _ or -".into())
                } else {
                    None
                }
            }
            GraphToolRef::Builtin { name } => (!self.tools.builtin.contains(name))
                .then(|| format!("no built-in `{name}` in graph_spec.tools.builtin")),
        }
    }

    /// The output keys set by the nodes that can run before `id`.
    fn earlier_keys(&self, id: &str) -> BTreeSet<&str> {
        self.nodes
            .iter()
            .filter(|(other, _)| self.reachable_from(other).contains(&id))
            .filter(|(other, _)| *other != id || self.reachable_from(id).contains(&id))
            .filter_map(|(_, node)| node.output_key())
            .collect()
    }

    /// Every problem of the node `id`: its id, its type's fields, its output key, the keys its
    /// templates name, and its place in the graph (a node of an unknown type: only that).
    fn validate_node(&self, id: &str, node: &GraphNode, add: &mut impl FnMut(String, String)) {
        if !valid_tool_name(id) {
            add(
                format!("graph_spec.nodes.{id}"),
                "a node id is 1 to 64 characters of a-z, A-Z, 0-9, _ or -".into(),
            );
        }
        if let GraphNode::Unknown = node {
            add(
                node_field(id, "type"),
                "unknown node type: one of llm, tool, human_input, end".into(),
            );
            return;
        }
        self.validate_fields(id, node, add);
        validate_output_key(id, node, add);
        self.validate_template_keys(id, node, add);
        self.validate_place(id, node, add);
    }

    /// The fields of the node's type: required templates, ranges, and the tools it names.
    fn validate_fields(&self, id: &str, node: &GraphNode, add: &mut impl FnMut(String, String)) {
        let at = |field: &str| node_field(id, field);
        let required = |value: &str, field: &str, add: &mut dyn FnMut(String, String)| {
            if value.trim().is_empty() {
                add(at(field), "required".into());
            }
        };
        match node {
            // Reported by `validate_node`, which checks nothing more of it.
            GraphNode::Unknown => {}
            GraphNode::Llm(n) => {
                required(&n.input_template, "input_template", add);
                if n.model.as_ref().is_some_and(|m| m.trim().is_empty()) {
                    add(at("model"), "must not be empty".into());
                }
                if let Some(t) = n.temperature
                    && !(0.0..=2.0).contains(&t)
                {
                    add(at("temperature"), "must be between 0 and 2".into());
                }
                if n.max_tokens.is_some_and(|m| !(1..=1_000_000).contains(&m)) {
                    add(at("max_tokens"), "must be between 1 and 1000000".into());
                }
                for (i, reference) in n.tools.iter().enumerate() {
                    if let Some(problem) = self.unresolved(reference) {
                        add(at(&format!("tools[{i}]")), problem);
                    }
                }
            }
            GraphNode::Tool(n) => match &n.tool_ref {
                None => add(at("tool_ref"), "required".into()),
                Some(reference) => {
                    if let Some(problem) = self.unresolved(reference) {
                        add(at("tool_ref"), problem);
                    }
                    for (key, value) in &n.args_template {
                        if !value.is_string() {
                            add(
                                at(&format!("args_template.{key}")),
                                "must be a (templated) string".into(),
                            );
                        }
                    }
                }
            },
            GraphNode::HumanInput(n) => required(&n.prompt_template, "prompt_template", add),
            GraphNode::End(n) => {
                required(&n.output_template, "output_template", add);
                if self.edges.iter().any(|e| e.from == id) {
                    add(
                        format!("graph_spec.nodes.{id}"),
                        "an `end` node has no outgoing edges".into(),
                    );
                }
            }
        }
    }

    /// Each `{{key}}` of the node's templates names `input` or the output key of a node that
    /// can run before it.
    fn validate_template_keys(
        &self,
        id: &str,
        node: &GraphNode,
        add: &mut impl FnMut(String, String),
    ) {
        let earlier = self.earlier_keys(id);
        for (field, template) in node.templates() {
            for key in template_keys(template) {
                if key != INPUT_KEY && !earlier.contains(key) {
                    add(
                        node_field(id, &field),
                        format!("`{{{{{key}}}}}` names an output_key that no earlier node sets"),
                    );
                }
            }
        }
    }

    /// The node's place: an edge out of it (unless it is an `end` node), and a path to it
    /// from the entry.
    fn validate_place(&self, id: &str, node: &GraphNode, add: &mut impl FnMut(String, String)) {
        if !matches!(node, GraphNode::End(_)) && !self.edges.iter().any(|e| e.from == id) {
            add(
                format!("graph_spec.nodes.{id}"),
                "has no outgoing edge (only `end` nodes may finish)".into(),
            );
        }
        if id != self.entry
            && self.nodes.contains_key(&self.entry)
            && !self.reachable_from(&self.entry).contains(&id)
        {
            add(
                format!("graph_spec.nodes.{id}"),
                format!("unreachable from the entry `{}`", self.entry),
            );
        }
    }

    fn validate_edges(&self, add: &mut impl FnMut(String, String)) {
        for (i, edge) in self.edges.iter().enumerate() {
            for (field, node) in [("from", &edge.from), ("to", &edge.to)] {
                if !self.nodes.contains_key(node) {
                    add(
                        format!("graph_spec.edges[{i}].{field}"),
                        format!("no node `{node}`"),
                    );
                }
            }
            if let Some(when) = &edge.when {
                // The key must be set by the edge's own node or one before it.
                let mut earlier = self.earlier_keys(&edge.from);
                if let Some(key) = self.nodes.get(&edge.from).and_then(GraphNode::output_key) {
                    earlier.insert(key);
                }
                if when.key != INPUT_KEY && !earlier.contains(when.key.as_str()) {
                    add(
                        format!("graph_spec.edges[{i}].when.key"),
                        format!(
                            "`{}` is an output_key that neither `{}` nor a node before it sets",
                            when.key, edge.from
                        ),
                    );
                }
            }
        }
    }

    fn validate_limits(&self, add: &mut impl FnMut(String, String)) {
        let l = &self.limits;
        let ranges = [
            ("max_steps", l.max_steps, 1..=200),
            ("max_tool_calls", l.max_tool_calls, 0..=500),
            ("max_parallel_tools", l.max_parallel_tools, 1..=16),
            ("timeout_seconds", l.timeout_seconds, 5..=3600),
            (
                "human_timeout_seconds",
                l.human_timeout_seconds,
                60..=604_800,
            ),
        ];
        for (field, value, range) in ranges {
            if let Some(value) = value
                && !range.contains(&value)
            {
                add(
                    format!("graph_spec.limits.{field}"),
                    format!("must be between {} and {}", range.start(), range.end()),
                );
            }
        }
        if l.max_steps.is_none()
            && self.nodes.contains_key(&self.entry)
            && let Some(cycle) = self.cycle()
        {
            add(
                "graph_spec.limits.max_steps".into(),
                format!(
                    "the graph has a cycle ({}): set limits.max_steps to bound it",
                    cycle.join(" -> ")
                ),
            );
        }
    }
}

/// The path of a node's field in an agent's spec.
fn node_field(id: &str, field: &str) -> String {
    format!("graph_spec.nodes.{id}.{field}")
}

/// The node's output key, if its type has one: set, a valid name, and not `input`.
fn validate_output_key(id: &str, node: &GraphNode, add: &mut impl FnMut(String, String)) {
    let Some(key) = node.output_key() else {
        return;
    };
    if key.trim().is_empty() {
        add(node_field(id, "output_key"), "required".into());
    } else if !valid_tool_name(key) || key.contains('.') {
        add(
            node_field(id, "output_key"),
            "1 to 64 characters of a-z, A-Z, 0-9, _ or -".into(),
        );
    } else if key == INPUT_KEY {
        add(
            node_field(id, "output_key"),
            "`input` is the user's message; choose another key".into(),
        );
    }
}

#[cfg(test)]
mod tests;
