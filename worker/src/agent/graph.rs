//! Graph agents (`kind: "graph"`, DESIGN section 14): the nodes of the agent's `graph_spec`
//! executed one after another on the loop's durable machinery.
//!
//! Each node execution is a step, numbered from 1 across the run and saved (fenced on the
//! attempt) once it is done, with the node, its execution count `n` and its output
//! ([`NodeStep`]). A new attempt replays the saved steps (their outputs, never their model or
//! tool calls) and goes on from the node after the last one, so a worker killed mid-graph
//! repeats at most the node it was in. A tool node's call carries the idempotency key
//! `{workflow_id}:{node}:{n}`, the same in every attempt that repeats it.
//!
//! - `llm`: the system prompt and the rendered input as the one user message (no thread
//!   history), streamed as the step's text block; tool calls the model asks for (of the node's
//!   `tools`) are run and answered until it answers in text.
//! - `tool`: one call with the rendered arguments, shown as `step` events; its result (JSON if
//!   it is JSON) is the output, an error included: the next node sees it.
//! - `human_input`: the step is saved waiting, and the run pauses as `requires_action` without
//!   a worker until `POST /v1/workflows/{id}/input` answers it (or fails with `human_timeout`).
//! - `end`: the rendered template is the message's text and its `output`.

use std::collections::BTreeMap;

use serde_json::Value;

use spool_shared::agent::graph::{GraphNode, GraphSpec, GraphToolRef, LlmNode, ToolNode, render};
use spool_shared::agent::{AgentSpec, DEFAULT_MAX_TOOL_CALLS};
use spool_shared::db::runs::Pause;
use spool_shared::db::steps::{self, AssistantTurn, CallResult, CallState, NodeStep, SavedStep};
use spool_shared::db::{messages, tools as tool_resources};
use spool_shared::event::{MessageStart, StepEnd, StepStart};
use spool_shared::ids::ToolId;
use spool_shared::run::{FailureCode, MessagePart, PendingAction, RunFailure, Usage};
use spool_shared::status::RunStatus;

use super::answer::{Answer, Exit, LoopEnd};
use super::context::Attempt;
use super::limits::charge;
use super::llm::{ChatMessage, ChatRequest, Choice, ToolCall};
use super::model_call::{LlmEnd, call_model};
use super::step::{announce_calls, result_event};
use super::tools::ToolSet;
use crate::stop::Halt;

/// Model calls one `llm` node makes at most (each after the results of the tool calls the
/// previous one asked for).
const MAX_NODE_ROUNDS: usize = 8;

/// The idempotency key of a node's execution.
pub(crate) fn node_key(a: &Attempt<'_>, node: &str, n: u32) -> String {
    format!("{}:{node}:{n}", a.claimed.run().id)
}

/// Runs the graph agent `spec` for this attempt.
pub(crate) async fn run(a: &Attempt<'_>, spec: &AgentSpec) -> Result<LoopEnd, Exit> {
    // Nodes that name no model, in a graph that names none, use the agent's, else the server's.
    let mut spec = spec.clone();
    if spec.model.trim().is_empty() {
        spec.model.clone_from(&a.engine.default_agent.model);
    }
    let spec = &spec;
    let Some(graph) = spec.graph_spec.as_ref() else {
        let failure = RunFailure::new(FailureCode::InternalError, "a graph agent without a graph");
        return Ok(LoopEnd::Failed(Box::new(failure), Answer::default()));
    };
    let run = a.claimed.run();
    if !run.resumed {
        a.events
            .send(MessageStart::new(Some(model_of(spec, graph, None))));
    }
    let mut state = Graph::prepare(a, spec, graph).await?;
    state.execute(a).await
}

/// The model of an `llm` node: its own, else the graph's `default_model`, else the agent's.
fn model_of(spec: &AgentSpec, graph: &GraphSpec, node: Option<&LlmNode>) -> String {
    node.and_then(|n| n.model.clone())
        .or_else(|| graph.default_model.clone())
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| spec.model.clone())
}

/// What the graph's execution carries from node to node.
struct Graph<'s> {
    spec: &'s AgentSpec,
    graph: &'s GraphSpec,
    /// `input` and every output so far, by key.
    values: BTreeMap<String, Value>,
    /// Executions of each node so far.
    visits: BTreeMap<String, u32>,
    /// The next step's number.
    step: u32,
    /// The node to execute next.
    next: Option<String>,
    /// A saved `human_input` step that waits (after a crash between its save and the pause).
    waiting: Option<(u32, NodeStep)>,
    /// Tool calls so far.
    tool_calls: u32,
    answer: Answer,
    tools: ToolSet,
    /// The name of each MCP server of the graph (its tools' prefix), by id.
    mcp_prefixes: BTreeMap<ToolId, String>,
    /// The step of the last saved node, if it was a `human_input` node.
    visits_last: Option<u32>,
}

impl<'s> Graph<'s> {
    /// The state the saved steps leave: outputs, visits, the next node.
    async fn prepare(
        a: &Attempt<'_>,
        spec: &'s AgentSpec,
        graph: &'s GraphSpec,
    ) -> Result<Self, Exit> {
        let run = a.claimed.run();
        let input = messages::find_in_thread(a.db, run.user_message_id, run.thread_id)
            .await?
            .map(|m| m.content)
            .unwrap_or_default();
        let (holder, mcp_prefixes) = tool_holder(a, spec, graph).await?;
        let mut state = Self {
            spec,
            graph,
            values: BTreeMap::from([("input".to_owned(), Value::String(input))]),
            visits: BTreeMap::new(),
            step: 1,
            next: Some(graph.entry.clone()),
            waiting: None,
            tool_calls: 0,
            answer: Answer::default(),
            tools: ToolSet::for_attempt(a, &holder).await?,
            mcp_prefixes,
            visits_last: None,
        };
        let saved = if run.attempt > 1 {
            steps::load(a.db, run.id).await?
        } else {
            Vec::new()
        };
        for saved in saved {
            let number = u32::try_from(saved.step).unwrap_or(0);
            let data = saved.data.0;
            let Some(node) = data.node.clone() else {
                continue;
            };
            state.step = number.saturating_add(1);
            state.visits.insert(node.node.clone(), node.n);
            state.answer.usage.add(data.usage);
            state.tool_calls = state
                .tool_calls
                .saturating_add(u32::try_from(data.results.len()).unwrap_or(u32::MAX));
            state.visits_last = node.human_input.then_some(number);
            match node.output.clone() {
                Some(output) => state.replay(&node.node, number, &data, output),
                None => {
                    state.step = number;
                    state.waiting = Some((number, node));
                }
            }
        }
        // A human_input node answered since the last attempt: its step ends now.
        if run.resumed
            && state.waiting.is_none()
            && let Some(node) = state.visits_last.take()
        {
            a.events.send(StepEnd {
                step: node,
                usage: Usage::default(),
                finish_reason: "stop".to_owned(),
            });
        }
        if state.waiting.is_some() && a.claimed.previous_status() == RunStatus::RequiresAction {
            // Claimed because nobody answered in time.
            let secs = graph.limits.human_timeout();
            let message = format!("no answer to the human_input node arrived within {secs} s");
            return Err(state.failed(FailureCode::HumanTimeout, message));
        }
        Ok(state)
    }

    /// Restores a settled node's output and its place in the message.
    fn replay(&mut self, node: &str, step: u32, data: &SavedStep, output: Value) {
        self.answer.add_step(step, data);
        if let Some(key) = self.graph.nodes.get(node).and_then(GraphNode::output_key) {
            self.values.insert(key.to_owned(), output.clone());
        }
        self.next = match self.graph.nodes.get(node) {
            Some(GraphNode::End(_)) => {
                self.finish(&output);
                None
            }
            _ => self.graph.next(node, &self.values).map(str::to_owned),
        };
    }

    /// The end node's output as the message's text and `output`.
    fn finish(&mut self, output: &Value) {
        let text = spool_shared::agent::graph::render_value(output);
        self.answer.content.clone_from(&text);
        self.answer
            .parts
            .retain(|p| !matches!(p, MessagePart::Text { .. }));
        self.answer.parts.push(MessagePart::Text { text });
        self.answer.output = Some(Box::new(output.clone()));
    }

    /// Executes nodes until the end, a pause or a failure.
    async fn execute(&mut self, a: &Attempt<'_>) -> Result<LoopEnd, Exit> {
        if let Some((step, node)) = self.waiting.take() {
            // Saved waiting, but the pause never happened (a crash between the two).
            let prompt = self.prompt_of(&node.node);
            let _ = step;
            return Ok(self.pause(a, &node.node, prompt).await);
        }
        let max_steps = self.graph.limits.steps();
        loop {
            let Some(id) = self.next.clone() else {
                return Ok(LoopEnd::Completed(std::mem::take(&mut self.answer)));
            };
            if let Some(halt) = a.stop.now() {
                return Err(self.halted(halt));
            }
            if self.step > max_steps {
                let message = format!(
                    "the graph executed limits.max_steps ({max_steps}) nodes without reaching an \
                     end node"
                );
                return Err(self.failed(FailureCode::MaxStepsExceeded, message));
            }
            let Some(node) = self.graph.nodes.get(&id) else {
                let message = format!("the graph has no node `{id}`");
                return Err(self.failed(FailureCode::InternalError, message));
            };
            let step = self.step;
            let n = self.visits.get(&id).copied().unwrap_or(0).saturating_add(1);
            let model = match node {
                GraphNode::Llm(llm) => model_of(self.spec, self.graph, Some(llm)),
                _ => String::new(),
            };
            a.events.send(StepStart { step, model });
            let (saved, output) = match node {
                GraphNode::Llm(llm) => self.llm(a, step, llm).await?,
                GraphNode::Tool(tool) => {
                    let arguments = self.arguments(tool);
                    self.tool(a, step, (&id, n), tool.tool_ref.as_ref(), arguments)
                        .await?
                }
                GraphNode::HumanInput(human) => {
                    let prompt = render(&human.prompt_template, &self.values);
                    return self.ask(a, step, (&id, n), prompt).await;
                }
                GraphNode::End(end) => {
                    let text = render(&end.output_template, &self.values);
                    (SavedStep::default(), Value::String(text))
                }
                GraphNode::Unknown => {
                    let message = format!("the node `{id}` has a type this worker does not know");
                    return Err(self.failed(FailureCode::InternalError, message));
                }
            };
            self.settle(a, step, (&id, n), saved, output).await?;
            if self.next.is_none() && !matches!(node, GraphNode::End(_)) {
                let message = format!("no edge from the node `{id}` holds");
                return Err(self.failed(FailureCode::MaxStepsExceeded, message));
            }
        }
    }

    /// A `tool` node's arguments: its `args_template`, each value rendered.
    fn arguments(&self, tool: &ToolNode) -> Value {
        let arguments: serde_json::Map<String, Value> = tool
            .args_template
            .iter()
            .map(|(k, v)| {
                let text = v.as_str().unwrap_or_default();
                (k.clone(), Value::String(render(text, &self.values)))
            })
            .collect();
        Value::Object(arguments)
    }

    /// A `human_input` node (its `n`th execution): its step saved waiting, then the pause for
    /// the answer to `prompt`.
    async fn ask(
        &mut self,
        a: &Attempt<'_>,
        step: u32,
        (id, n): (&str, u32),
        prompt: String,
    ) -> Result<LoopEnd, Exit> {
        let waiting = SavedStep {
            node: Some(NodeStep {
                node: id.to_owned(),
                n,
                output: None,
                human_input: true,
            }),
            ..SavedStep::default()
        };
        a.save_step(step, &waiting).await?;
        Ok(self.pause(a, id, prompt).await)
    }

    /// A done node's step (its `n`th execution): saved with its output (fenced), its results
    /// and its end shown, then the node after it chosen.
    async fn settle(
        &mut self,
        a: &Attempt<'_>,
        step: u32,
        (id, n): (&str, u32),
        mut saved: SavedStep,
        output: Value,
    ) -> Result<(), Exit> {
        saved.node = Some(NodeStep {
            node: id.to_owned(),
            n,
            output: Some(output.clone()),
            human_input: false,
        });
        let shown: Vec<_> = saved
            .results
            .iter_mut()
            .map(|r| {
                r.published = true;
                result_event(step, r)
            })
            .collect();
        a.save_step(step, &saved).await?;
        for result in shown {
            a.events.send(result);
        }
        a.events.send(StepEnd {
            step,
            usage: saved.usage,
            finish_reason: saved
                .model_call
                .as_ref()
                .map_or_else(|| "stop".to_owned(), |c| c.finish_reason.clone()),
        });
        self.visits.insert(id.to_owned(), n);
        self.step = step.saturating_add(1);
        self.replay(id, step, &saved, output);
        Ok(())
    }

    /// An `llm` node: the model call (and the calls of the node's tools it asks for, answered
    /// until it answers in text). The saved step holds the last call's text, every tool call
    /// and result, and the usage of all.
    async fn llm(
        &mut self,
        a: &Attempt<'_>,
        step: u32,
        node: &LlmNode,
    ) -> Result<(SavedStep, Value), Exit> {
        let mut spec = self.spec.clone();
        spec.model = model_of(self.spec, self.graph, Some(node));
        spec.fallback_models.clear();
        let models = match a
            .engine
            .models(a.db, &a.claimed.run().tenant_id, &spec)
            .await
        {
            Ok(models) => models,
            Err(err) => return Err(self.failed(FailureCode::ModelUnavailable, err.to_string())),
        };
        let names: Vec<String> = node.tools.iter().map(|r| self.tool_name(r)).collect();
        let offered: Vec<_> = names
            .iter()
            .filter_map(|name| self.tools.find(name).map(|t| t.def.clone()))
            .collect();
        let mut messages = Vec::new();
        let system = render(&node.system_prompt, &self.values);
        if !system.is_empty() {
            messages.push(ChatMessage::System { content: system });
        }
        messages.push(ChatMessage::User {
            content: render(&node.input_template, &self.values),
        });
        let mut saved = SavedStep::default();
        for round in 0..MAX_NODE_ROUNDS {
            let last = round + 1 == MAX_NODE_ROUNDS;
            let request = ChatRequest {
                model: spec.model.clone(),
                messages: messages.clone(),
                tools: if last { Vec::new() } else { offered.clone() },
                tool_choice: Choice::Auto,
                temperature: node.temperature,
                max_output_tokens: node.max_tokens,
                response_format: None,
                parallel_tool_calls: None,
                top_p: None,
                reasoning_effort: None,
            };
            let output = match call_model(a, &models, request, step, false).await {
                Ok(output) => output,
                Err(end) => return Err(self.model_failed(end)),
            };
            saved.usage.add(output.usage);
            self.answer.usage.add(output.usage);
            if let Some(spent) = charge(a, output.usage).await? {
                return Err(self.failed(FailureCode::BudgetExceeded, spent.message()));
            }
            saved.model_call.clone_from(&output.model_call);
            saved.assistant.text.clone_from(&output.text);
            if output.tool_calls.is_empty() {
                return Ok((saved, Value::String(output.text)));
            }
            self.count_calls(output.tool_calls.len())?;
            announce_calls(a, step, &output.tool_calls);
            let to_run: Vec<&ToolCall> = output.tool_calls.iter().collect();
            let results = self.run_calls(a, step, &to_run, None).await?;
            messages.push(ChatMessage::Assistant {
                content: (!output.text.is_empty()).then(|| output.text.clone()),
                tool_calls: output.tool_calls.clone(),
            });
            for result in &results {
                messages.push(ChatMessage::Tool {
                    tool_call_id: result.tool_call_id.clone(),
                    content: result.output.clone(),
                });
            }
            saved.assistant.tool_calls.extend(output.tool_calls);
            saved.results.extend(results);
        }
        let text = saved.assistant.text.clone();
        Ok((saved, Value::String(text)))
    }

    /// A `tool` node: one call with `arguments`, keyed `{workflow_id}:{node}:{n}`.
    async fn tool(
        &mut self,
        a: &Attempt<'_>,
        step: u32,
        (node, n): (&str, u32),
        reference: Option<&GraphToolRef>,
        arguments: Value,
    ) -> Result<(SavedStep, Value), Exit> {
        let name = reference.map_or_else(String::new, |r| self.tool_name(r));
        let call = ToolCall {
            id: format!("{node}-{n}"),
            name,
            arguments: arguments.to_string(),
        };
        self.count_calls(1)?;
        announce_calls(a, step, std::slice::from_ref(&call));
        let key = node_key(a, node, n);
        let results = self.run_calls(a, step, &[&call], Some(&key)).await?;
        let result = results.first();
        let output = result.map_or(Value::Null, |r| {
            serde_json::from_str(&r.output).unwrap_or_else(|_| Value::String(r.output.clone()))
        });
        let saved = SavedStep {
            assistant: AssistantTurn {
                text: String::new(),
                tool_calls: vec![call],
            },
            results,
            ..SavedStep::default()
        };
        Ok((saved, output))
    }

    /// Runs `calls`, racing the stop signal; each settled with its result.
    async fn run_calls(
        &mut self,
        a: &Attempt<'_>,
        step: u32,
        calls: &[&ToolCall],
        key: Option<&str>,
    ) -> Result<Vec<CallResult>, Exit> {
        let parallel = self
            .graph
            .limits
            .max_parallel_tools
            .map_or(8, |p| p.max(1) as usize);
        let outputs = tokio::select! {
            outputs = self.tools.execute_keyed(a, step, calls, parallel, key) => Ok(outputs),
            halt = a.stop.wait() => Err(halt),
        };
        let outputs = match outputs {
            Ok(outputs) => outputs,
            Err(halt) => return Err(self.halted(halt)),
        };
        Ok(calls
            .iter()
            .zip(outputs)
            .map(|(call, timed)| {
                let mut result = CallResult::new(call, CallState::Approved);
                result.settle(timed.output.content, timed.output.is_error);
                result.started_at = Some(timed.started_at);
                result.ended_at = Some(timed.ended_at);
                result.attempt = Some(a.claimed.run().attempt);
                result
            })
            .collect())
    }

    /// Counts `more` tool calls against `limits.max_tool_calls`.
    fn count_calls(&mut self, more: usize) -> Result<(), Exit> {
        let max = self
            .graph
            .limits
            .max_tool_calls
            .unwrap_or(DEFAULT_MAX_TOOL_CALLS);
        self.tool_calls = self
            .tool_calls
            .saturating_add(u32::try_from(more).unwrap_or(u32::MAX));
        if self.tool_calls > max {
            let message = format!(
                "the graph asked for tool call {} of the run; limits.max_tool_calls is {max}",
                self.tool_calls
            );
            return Err(self.failed(FailureCode::MaxToolCallsExceeded, message));
        }
        Ok(())
    }

    /// The name a tool reference's calls carry in this run's tool set: a function's name, an
    /// MCP server's tool as `{server}_{tool}`, a built-in's name.
    fn tool_name(&self, reference: &GraphToolRef) -> String {
        match reference {
            GraphToolRef::Mcp { server_id, name } => match self.mcp_prefixes.get(server_id) {
                Some(prefix) => format!("{prefix}_{name}"),
                None => name.clone(),
            },
            other => other.name().to_owned(),
        }
    }

    /// The rendered question of the `human_input` node `id`.
    fn prompt_of(&self, id: &str) -> String {
        match self.graph.nodes.get(id) {
            Some(GraphNode::HumanInput(node)) => render(&node.prompt_template, &self.values),
            _ => String::new(),
        }
    }

    /// Pauses the run for the `human_input` node `node` (saved waiting), without a worker.
    async fn pause(&mut self, a: &Attempt<'_>, node: &str, prompt: String) -> LoopEnd {
        let action = PendingAction::HumanInput {
            node: node.to_owned(),
            prompt,
            expires_at: None,
        };
        let timeout = self.graph.limits.human_timeout();
        match a.pause(RunStatus::RequiresAction, &action, timeout).await {
            Err(Exit::End(end)) => *end,
            Err(Exit::Error(err)) => {
                tracing::warn!(error = %err, "pausing for human input failed");
                LoopEnd::LeaseLost
            }
            Ok(Pause::CancelRequested) => {
                LoopEnd::halted(Halt::Cancelled, std::mem::take(&mut self.answer))
            }
            Ok(Pause::Lost) => LoopEnd::LeaseLost,
            Ok(Pause::Paused(deadline)) => {
                if let Some(event) = action.until(deadline).event() {
                    a.events.send(event);
                }
                LoopEnd::Paused
            }
        }
    }

    fn model_failed(&mut self, end: LlmEnd) -> Exit {
        match end {
            LlmEnd::Halt(halt, _) => self.halted(halt),
            LlmEnd::Error(err) => {
                let code = if err.is_retryable() {
                    FailureCode::ModelUnavailable
                } else {
                    FailureCode::ModelError
                };
                self.failed(code, err.to_string())
            }
        }
    }

    fn halted(&mut self, halt: Halt) -> Exit {
        LoopEnd::halted(halt, std::mem::take(&mut self.answer)).into()
    }

    fn failed(&mut self, code: FailureCode, message: impl Into<String>) -> Exit {
        let failure = RunFailure::new(code, message);
        LoopEnd::Failed(Box::new(failure), std::mem::take(&mut self.answer)).into()
    }
}

/// An agent spec whose tools are the graph's: its functions and its MCP servers (as the run
/// snapshot them at enqueue; for a run enqueued before snapshots were taken, the tenant's tool
/// resources as they are now, disabled or deleted ones left out).
async fn tool_holder(
    a: &Attempt<'_>,
    spec: &AgentSpec,
    graph: &GraphSpec,
) -> Result<(AgentSpec, BTreeMap<ToolId, String>), Exit> {
    let mut holder = AgentSpec::default_agent(&spec.model, "");
    holder.name.clone_from(&spec.name);
    holder.tools.clone_from(&graph.tools.functions);
    // Built-in tools run as in the loop (a call of one the operator no longer enables answers
    // an error the model sees).
    holder.tools.extend(
        graph
            .tools
            .builtin
            .iter()
            .filter_map(|name| spool_shared::agent::Builtin::parse(name))
            .map(|name| {
                spool_shared::agent::ToolSpec::Builtin(spool_shared::agent::BuiltinToolSpec {
                    name,
                    requires_approval: false,
                })
            }),
    );
    let servers = match &graph.tools.mcp_snapshot {
        Some(snapshot) => snapshot
            .iter()
            .map(|server| (server.id, server.tool.clone()))
            .collect(),
        None => {
            let run = a.claimed.run();
            let stored =
                tool_resources::find_many(a.db, &graph.tools.mcp_servers, &run.tenant_id).await?;
            stored
                .into_iter()
                .filter(|(_, tool)| tool.enabled && tool.tool.as_mcp().is_some())
                .map(|(id, tool)| (id, tool.tool))
                .collect::<Vec<_>>()
        }
    };
    let mut prefixes = BTreeMap::new();
    for (id, tool) in servers {
        prefixes.insert(id, tool.name().to_owned());
        holder.tools.push(tool);
    }
    Ok((holder, prefixes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_s_model_is_its_own_else_the_graph_s_else_the_agent_s() {
        let graph: GraphSpec = serde_json::from_value(serde_json::json!({
            "spec_version": "1", "entry": "a", "nodes": {"a": {"type": "end", "output_template": "x"}}
        }))
        .expect("parses");
        let spec = AgentSpec::default_agent("agent-model", "");
        assert_eq!(model_of(&spec, &graph, None), "agent-model");
        let mut with_default = graph.clone();
        with_default.default_model = Some("graph-model".into());
        assert_eq!(model_of(&spec, &with_default, None), "graph-model");
        let node = LlmNode {
            model: Some("node-model".into()),
            ..LlmNode::default()
        };
        assert_eq!(model_of(&spec, &with_default, Some(&node)), "node-model");
    }
}
