//! Agents as tools, on the worker's side: a step's calls of agent tools become child runs, and
//! the run waits for them.
//!
//! A call of an agent tool ([`super::tools::Kind::Agent`]) is held like a client call
//! (`pending_agent`). When the step settles, [`Loop::agent_calls`] settles what it can (a
//! child that has ended gives its final text or failure; a call too deep, of a gone or
//! disabled agent, or without `input` gets a tool error) and returns the rest. Once the step's
//! other calls have run and no approval is pending, [`Loop::wait_for_agents`] starts them: the
//! step saved with the calls' child ids, a child run per call and the run `waiting`, in one
//! transaction fenced on the attempt
//! ([`Claimed::wait_for_children`](spool_shared::db::runs::Claimed::wait_for_children)). The
//! last child's end re-queues the run; its next attempt settles the step again and reads how
//! the children ended ([`runs::children`]).
//!
//! What must stay true: a child is started only in that fenced transaction, so a crash leaves
//! either the step unsettled with no child or every child started, and a later attempt finds
//! each call's child by the id saved with it (never starting a second one).

use serde_json::Value;

use spool_shared::agent::AgentSpec;
use spool_shared::db::agents;
use spool_shared::db::runs::{self, ChildEnd, NewChild, Wait};
use spool_shared::db::steps::{CallResult, CallState};
use spool_shared::event::StepResult;
use spool_shared::run::{AgentCall, PendingAction};
use spool_shared::status::RunStatus;
use spool_shared::{AgentId, WorkflowId};

use super::Loop;
use super::answer::{Exit, LoopEnd};
use super::context::Attempt;
use super::llm::ToolCall;
use super::model_call::ModelOutput;
use super::step::publish;
use super::tools::Kind;
use crate::stop::Halt;

impl Loop<'_> {
    /// Settles the step's agent calls that can be settled now, and says which need a child
    /// run: a call whose child has ended gets the child's final text (or its failure) as its
    /// result; a call that would nest deeper than `limits.max_call_depth`, names an agent that
    /// is gone or disabled, or has no `input`, gets a tool error. The others are returned, with
    /// their agent's spec as it is now, to be started.
    pub(super) async fn agent_calls(
        &self,
        a: &Attempt<'_>,
        output: &ModelOutput,
        results: &mut [CallResult],
    ) -> Result<Vec<AgentStart>, Exit> {
        let run = a.claimed.run();
        let mut starts = Vec::new();
        let mut ended = None;
        for (index, result) in results.iter_mut().enumerate() {
            if result.state != CallState::PendingAgent {
                continue;
            }
            if let Some(child) = result.workflow_id {
                if ended.is_none() {
                    ended = Some(runs::children(a.db, run.id).await?);
                }
                let end = ended.iter().flatten().find(|end| end.id == child);
                let (text, is_error) = child_result(end);
                result.settle(text, is_error);
                continue;
            }
            let Some(Kind::Agent(tool)) = self.tools.find(&result.name).map(|t| &t.kind) else {
                result.settle(format!("unknown tool `{}`", result.name), true);
                continue;
            };
            let depth = u32::try_from(run.depth).unwrap_or(0);
            let limit = self.spec.limits.call_depth();
            if depth >= limit {
                let error = format!(
                    "agents may call agents {limit} levels deep at most (max_call_depth); this \
                     call was not made"
                );
                result.settle(error, true);
                continue;
            }
            let arguments = output
                .tool_calls
                .iter()
                .find(|c| c.id == result.tool_call_id)
                .map_or(Value::Null, ToolCall::parsed_arguments);
            let Some(input) = arguments["input"].as_str().filter(|i| !i.trim().is_empty()) else {
                result.settle("the call needs an `input` string".to_owned(), true);
                continue;
            };
            let agent = agents::find(a.db, tool.agent_id, &run.tenant_id).await?;
            match agent {
                Some(agent) if agent.spec.0.status.is_active() => starts.push(AgentStart {
                    index,
                    agent_id: tool.agent_id,
                    spec: agent.spec.0,
                    input: input.to_owned(),
                }),
                Some(_) => result.settle(format!("the agent {} is disabled", tool.agent_id), true),
                None => result.settle(format!("the agent {} does not exist", tool.agent_id), true),
            }
        }
        Ok(starts)
    }

    /// Starts a child run for each of `starts` and pauses the run (`waiting`) until they have
    /// ended, with the step saved in the same transaction; a cancel requested meanwhile ends
    /// the run instead, starting nothing.
    pub(super) async fn wait_for_agents(
        &mut self,
        a: &Attempt<'_>,
        step: u32,
        output: &ModelOutput,
        mut results: Vec<CallResult>,
        starts: Vec<AgentStart>,
        shown: Vec<StepResult>,
    ) -> Exit {
        let mut calls = Vec::with_capacity(starts.len());
        for start in &starts {
            let result = &mut results[start.index];
            let id = WorkflowId::new();
            result.workflow_id = Some(id);
            calls.push(AgentCall {
                tool_call_id: result.tool_call_id.clone(),
                tool_name: result.name.clone(),
                workflow_id: id,
            });
        }
        let traceparent = spool_shared::telemetry::inject_traceparent();
        let children: Vec<NewChild<'_>> = starts
            .iter()
            .zip(&calls)
            .map(|(start, call)| NewChild {
                id: call.workflow_id,
                tool_call_id: &call.tool_call_id,
                agent_id: start.agent_id,
                agent_spec: &start.spec,
                input: &start.input,
                trace_context: traceparent.as_deref(),
            })
            .collect();
        let saved = output.saved(results.clone(), Vec::new());
        let action = PendingAction::AgentRuns {
            runs: calls.clone(),
        };
        let waited = a
            .claimed
            .wait_for_children(a.db, step, &saved, &children, &action)
            .await;
        match waited {
            Err(err) => Exit::from(err),
            Ok(Wait::Waiting) => {
                publish(a, shown);
                tracing::info!(children = calls.len(), "waiting for agent runs");
                LoopEnd::Paused.into()
            }
            Ok(Wait::CancelRequested) => {
                // Nothing was saved; the calls that ran still show their results.
                publish(a, shown);
                self.answer.add_text(&output.text);
                self.halted(Halt::Cancelled)
            }
            Ok(Wait::Lost) => LoopEnd::LeaseLost.into(),
        }
    }
}

/// An agent call to start: the call's place in the step, the agent and its spec, the input.
pub(crate) struct AgentStart {
    index: usize,
    agent_id: AgentId,
    spec: AgentSpec,
    input: String,
}

/// What an agent call's result is, from how its child run ended.
fn child_result(end: Option<&ChildEnd>) -> (String, bool) {
    let Some(end) = end else {
        return ("the agent run is gone".to_owned(), true);
    };
    match end.status {
        RunStatus::Completed => match &end.output {
            Some(output) => (output.0.to_string(), false),
            None => (end.content.clone(), false),
        },
        RunStatus::Failed => {
            let reason = end.error.as_ref().map_or_else(
                || "unknown".to_owned(),
                |e| format!("{}: {}", e.0.code.as_str(), e.0.message),
            );
            (format!("The agent run failed ({reason})."), true)
        }
        RunStatus::Cancelled => ("The agent run was cancelled.".to_owned(), true),
        status => (
            format!("The agent run has not ended (it is {}).", status.as_str()),
            true,
        ),
    }
}
