//! One step's tool calls, from the model's request to a settled step.
//!
//! - [`Loop::classify`]: what happens to each call of a new step: run it, hold it for the
//!   client or for a person's approval, or refuse it (a `pre_tool_use` hook, which may also
//!   rewrite the arguments).
//! - [`Loop::settle`]: applies decisions and expiries, executes what may run (read-only calls
//!   concurrently; results through `post_tool_use` hooks), then either pauses the run
//!   (approvals first, one call at a time; client tools once no approval is pending) or commits
//!   the step: saved with its results, added to the answer and the conversation, and checked
//!   against the agent's stop conditions.
//! - Results reach the stream only once the step that holds them is saved. A client keeps what
//!   it was shown up to the last `step` result across `attempt_restarted` (docs/streaming.md),
//!   so a result published before its save, followed by a crash, would be shown twice: once
//!   from the lost attempt and again when the next one repeats the unsaved step. After a crash
//!   between the save and the publish, the next attempt shows it (see [`super::takeover`]).
//! - [`Recent`]: the same call three times in a row is a doom loop and fails the run.

use serde_json::Value;

use spool_shared::agent::{AgentSpec, StopCondition};
use spool_shared::db::agents;
use spool_shared::db::runs::{self, ChildEnd, NewChild, Pause, Wait};
use spool_shared::db::steps::{CallResult, CallState, DecidedBy, Decision};
use spool_shared::event::{StepCall, StepResult};
use spool_shared::run::{AgentCall, Citation, PendingAction, PendingCall};
use spool_shared::status::RunStatus;
use spool_shared::{AgentId, WorkflowId};

use super::Loop;
use super::answer::{Exit, LoopEnd};
use super::context::Attempt;
use super::hooks::ToolDecision;
use super::llm::{ChatMessage, ToolCall};
use super::model_call::ModelOutput;
use super::tools::Kind;
use crate::stop::Halt;

/// The same call this many times in a row is a doom loop.
pub(crate) const DOOM_LOOP: usize = 3;

/// The run's recent tool calls (name and arguments), for doom-loop detection.
#[derive(Debug, Default)]
pub(crate) struct Recent(Vec<(String, String)>);

impl Recent {
    /// How many tool calls the run has asked for so far.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// Records calls that were already made (a replayed or resumed step).
    pub(crate) fn extend(&mut self, calls: &[ToolCall]) {
        self.0
            .extend(calls.iter().map(|c| (c.name.clone(), c.arguments.clone())));
    }

    /// Records a step's calls in order; the first that makes [`DOOM_LOOP`] identical calls in a
    /// row, if any.
    pub(crate) fn doom<'c>(&mut self, calls: &'c [ToolCall]) -> Option<&'c ToolCall> {
        calls.iter().find(|call| {
            self.0.push((call.name.clone(), call.arguments.clone()));
            let tail = &self.0[self.0.len().saturating_sub(DOOM_LOOP)..];
            tail.len() == DOOM_LOOP && tail.iter().all(|c| *c == tail[DOOM_LOOP - 1])
        })
    }
}

impl Loop<'_> {
    /// Decides, for each call of a new step, what happens to it. Hooks may rewrite the
    /// arguments (in `output`, so the saved step holds what runs). A call held for approval
    /// records how long it may wait once presented (a hook's timeout, else the agent's). A call
    /// of a tool the step did not offer (`offered`) is answered with an error, never run.
    pub(crate) async fn classify(
        &self,
        step: u32,
        offered: &[String],
        output: &mut ModelOutput,
    ) -> Vec<CallResult> {
        let timeout = self.spec.approval_timeout_secs;
        let mut results = Vec::with_capacity(output.tool_calls.len());
        for call in &mut output.tool_calls {
            let tool = self.tools.find(&call.name);
            let mut result = CallResult::new(call, CallState::Approved);
            if !offered.contains(&call.name) {
                let error = match tool {
                    Some(_) => format!("the tool `{}` is not available at this step", call.name),
                    None => format!("unknown tool `{}`", call.name),
                };
                result.settle(error, true);
                results.push(result);
                continue;
            }
            let decision = self.hooks.pre_tool_use(step, call).await;
            let hook_timeout = match decision {
                ToolDecision::Deny(reason) => {
                    result.settle(format!("Blocked by a hook: {reason}"), true);
                    result.decision = Some(Decision::now(DecidedBy::Hook, false, Some(reason)));
                    results.push(result);
                    continue;
                }
                ToolDecision::Allow(Some(arguments)) => {
                    call.arguments = arguments.to_string();
                    None
                }
                ToolDecision::Allow(None) => None,
                ToolDecision::Approval(secs) => Some(secs.unwrap_or(timeout)),
            };
            let approval = hook_timeout.or(tool.filter(|t| t.requires_approval).map(|_| timeout));
            if let Some(secs) = approval {
                result.state = CallState::PendingApproval;
                result.timeout_secs = Some(secs);
            } else if let Some(tool) = tool {
                match tool.kind {
                    Kind::Client => result.state = CallState::PendingClient,
                    Kind::Agent(_) => result.state = CallState::PendingAgent,
                    _ => {}
                }
            }
            results.push(result);
        }
        results
    }

    /// Brings the step's calls to a settled state and commits the step, or pauses the run.
    /// `announce` publishes the calls (a new step, or one re-shown after a crash).
    pub(crate) async fn settle(
        &mut self,
        a: &Attempt<'_>,
        step: u32,
        output: ModelOutput,
        mut results: Vec<CallResult>,
        announce: bool,
    ) -> Result<(), Exit> {
        if announce {
            announce_calls(a, step, &output.tool_calls);
        }
        self.apply_decisions(&mut results);
        let starts = self.agent_calls(a, &output, &mut results).await?;
        self.execute(a, step, &output, &mut results).await?;
        if let Some(halt) = a.stop.now() {
            self.answer.add_text(&output.text);
            return Err(self.halted(halt));
        }
        let shown = unpublished_results(step, &mut results);
        let approval = results
            .iter()
            .any(|r| r.state == CallState::PendingApproval);
        if !approval && !starts.is_empty() {
            return Err(self
                .wait_for_agents(a, step, &output, results, starts, shown)
                .await);
        }
        if results.iter().any(|r| {
            matches!(
                r.state,
                CallState::PendingApproval | CallState::PendingClient
            )
        }) {
            return Err(self.pause(a, step, &output, results, shown).await);
        }
        self.commit(a, step, output, results, shown).await
    }

    /// Settles the step's agent calls that can be settled now, and says which need a child
    /// run: a call whose child has ended gets the child's final text (or its failure) as its
    /// result; a call that would nest deeper than `limits.max_call_depth`, names an agent that
    /// is gone or disabled, or has no `input`, gets a tool error. The others are returned, with
    /// their agent's spec as it is now, to be started.
    async fn agent_calls(
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
    async fn wait_for_agents(
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

    /// Settles what people decided, or failed to decide in time: a denial, or the presented
    /// approval left unanswered until its deadline (the run was claimed because the database
    /// clock passed it), reaches the model as an error; a client's output as it is. An
    /// approved client tool now waits for the client.
    fn apply_decisions(&mut self, results: &mut [CallResult]) {
        let mut expired = std::mem::take(&mut self.approval_expired);
        for result in results {
            match result.state {
                CallState::Denied => {
                    let output = match &result.reason {
                        Some(reason) => format!("The user denied this tool call: {reason}"),
                        None => "The user denied this tool call.".to_owned(),
                    };
                    result.settle(output, true);
                }
                // The first pending approval is the one that was presented.
                CallState::PendingApproval if std::mem::take(&mut expired) => {
                    let secs = result
                        .timeout_secs
                        .unwrap_or(self.spec.approval_timeout_secs);
                    let output =
                        format!("No one approved this tool call within {secs} s; it was not made.");
                    result.settle(output, true);
                    result.decision = Some(Decision::now(DecidedBy::Deadline, false, None));
                }
                CallState::Approved => match self.tools.find(&result.name).map(|t| &t.kind) {
                    Some(Kind::Client) => result.state = CallState::PendingClient,
                    Some(Kind::Agent(_)) => result.state = CallState::PendingAgent,
                    _ => {}
                },
                CallState::ClientOutput => result.state = CallState::Done,
                _ => {}
            }
        }
    }

    /// Executes the calls that may run, racing the stop signal; settles each with its result
    /// as `post_tool_use` hooks leave it.
    async fn execute(
        &mut self,
        a: &Attempt<'_>,
        step: u32,
        output: &ModelOutput,
        results: &mut [CallResult],
    ) -> Result<(), Exit> {
        let to_run: Vec<&ToolCall> = output
            .tool_calls
            .iter()
            .zip(results.iter())
            .filter(|(_, r)| r.state == CallState::Approved)
            .map(|(call, _)| call)
            .collect();
        if to_run.is_empty() {
            return Ok(());
        }
        let outputs = tokio::select! {
            outputs = self.tools.execute(a, step, &to_run, self.spec.limits.parallel_tools()) => Ok(outputs),
            halt = a.stop.wait() => Err(halt),
        };
        let outputs = outputs.map_err(|halt| {
            // The step's text was shown with its calls: the partial message keeps it.
            self.answer.add_text(&output.text);
            self.halted(halt)
        })?;
        for (call, timed) in to_run.iter().zip(outputs) {
            if let Some(result) = results.iter_mut().find(|r| r.tool_call_id == call.id) {
                let out = timed.output;
                let output = self.hooks.post_tool_use(step, call, out.content).await;
                result.settle(output, out.is_error);
                result.started_at = Some(timed.started_at);
                result.ended_at = Some(timed.ended_at);
                result.attempt = Some(a.claimed.run().attempt);
            }
        }
        Ok(())
    }

    /// Saves the settled step with its results and citations, adds it to the answer and the
    /// conversation, and ends the run if a stop condition holds.
    async fn commit(
        &mut self,
        a: &Attempt<'_>,
        step: u32,
        output: ModelOutput,
        results: Vec<CallResult>,
        shown: Vec<StepResult>,
    ) -> Result<(), Exit> {
        let citations = results
            .iter()
            .flat_map(|r| citations_in(&r.output, r.is_error))
            .collect();
        let saved = output.saved(results, citations);
        a.save_step(step, &saved).await?;
        publish(a, shown);
        self.answer.add_step(step, &saved);
        let text = saved.assistant.text;
        let calls = saved.assistant.tool_calls;
        let stop =
            self.spec
                .stop_conditions
                .iter()
                .any(|StopCondition::HasToolCall { tool_name }| {
                    calls.iter().any(|c| c.name == *tool_name)
                });
        self.conversation.push(ChatMessage::Assistant {
            content: (!text.is_empty()).then_some(text),
            tool_calls: calls,
        });
        for result in saved.results {
            self.conversation.push(ChatMessage::Tool {
                tool_call_id: result.tool_call_id,
                content: result.output,
            });
        }
        if stop {
            return Err(LoopEnd::Completed(std::mem::take(&mut self.answer)).into());
        }
        Ok(())
    }

    /// Saves the step with its held calls and pauses the run for the first pending approval, or
    /// for every pending client call once no approval is pending; then tells the client. A cancel
    /// requested meanwhile ends the run instead.
    async fn pause(
        &mut self,
        a: &Attempt<'_>,
        step: u32,
        output: &ModelOutput,
        results: Vec<CallResult>,
        shown: Vec<StepResult>,
    ) -> Exit {
        if let Err(exit) = a
            .save_step(step, &output.saved(results.clone(), Vec::new()))
            .await
        {
            return exit;
        }
        publish(a, shown);
        let pending = |result: &CallResult| PendingCall {
            tool_call_id: result.tool_call_id.clone(),
            tool_name: result.name.clone(),
            arguments: output
                .tool_calls
                .iter()
                .find(|c| c.id == result.tool_call_id)
                .map_or(Value::Null, ToolCall::parsed_arguments),
        };
        let approval = results
            .iter()
            .find(|r| r.state == CallState::PendingApproval);
        let (status, action, timeout) = match approval {
            Some(first) => {
                let call = pending(first);
                let action = PendingAction::Approval {
                    tool_call_id: call.tool_call_id,
                    tool_name: call.tool_name,
                    arguments: call.arguments,
                    expires_at: None,
                };
                let timeout = first
                    .timeout_secs
                    .unwrap_or(self.spec.approval_timeout_secs);
                (RunStatus::AwaitingApproval, action, timeout)
            }
            None => {
                let calls: Vec<PendingCall> = results
                    .iter()
                    .filter(|r| r.state == CallState::PendingClient)
                    .map(pending)
                    .collect();
                let action = PendingAction::SubmitToolOutputs {
                    tool_calls: calls,
                    expires_at: None,
                };
                let timeout = self.spec.limits.client_timeout_secs();
                (RunStatus::RequiresAction, action, timeout)
            }
        };
        match a.pause(status, &action, timeout).await {
            Err(exit) => exit,
            // The run was not paused: end it as the cancel asked, with what it produced.
            Ok(Pause::CancelRequested) => self.halted(Halt::Cancelled),
            Ok(Pause::Lost) => LoopEnd::LeaseLost.into(),
            Ok(Pause::Paused(deadline)) => {
                if let Some(event) = action.until(deadline).event() {
                    a.events.send(event);
                }
                LoopEnd::Paused.into()
            }
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

/// Publishes a `step` event (`phase: call`) per call.
pub(crate) fn announce_calls(a: &Attempt<'_>, step: u32, calls: &[ToolCall]) {
    for call in calls {
        a.events.send(StepCall {
            step,
            tool_call_id: call.id.clone(),
            tool_name: call.name.clone(),
            arguments: call.parsed_arguments(),
        });
    }
}

/// The `step` events (`phase: result`) of the settled calls not published yet, which are marked
/// published: the caller saves the step (so a resumed attempt does not show them again), then
/// [`publish`]es them.
fn unpublished_results(step: u32, results: &mut [CallResult]) -> Vec<StepResult> {
    results
        .iter_mut()
        .filter(|r| r.state == CallState::Done && !r.published)
        .map(|result| {
            result.published = true;
            result_event(step, result)
        })
        .collect()
}

/// The data of a call's `step` event of phase `result`.
pub(crate) fn result_event(step: u32, result: &CallResult) -> StepResult {
    StepResult {
        step,
        tool_call_id: result.tool_call_id.clone(),
        tool_name: result.name.clone(),
        output: result.output.clone(),
        is_error: result.is_error,
    }
}

/// Publishes results from [`unpublished_results`], once their step is saved.
fn publish(a: &Attempt<'_>, shown: Vec<StepResult>) {
    for result in shown {
        a.events.send(result);
    }
}

/// The citations a tool result carries: `{"citations": [{title, url, snippet}]}` in JSON.
pub(crate) fn citations_in(output: &str, is_error: bool) -> Vec<Citation> {
    if is_error {
        return Vec::new();
    }
    let Ok(value) = serde_json::from_str::<Value>(output) else {
        return Vec::new();
    };
    value["citations"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["url"].is_string() || c["title"].is_string())
        .map(|c| Citation {
            title: c["title"].clone(),
            url: c["url"].clone(),
            snippet: c["snippet"].clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn citations_are_read_from_json_results() {
        let output = r#"{"answer": 1, "citations": [{"title": "T", "url": "https://x", "snippet": "s", "extra": 1}]}"#;
        assert_eq!(
            citations_in(output, false),
            [Citation {
                title: json!("T"),
                url: json!("https://x"),
                snippet: json!("s")
            }]
        );
        assert!(citations_in("plain text", false).is_empty());
    }

    #[test]
    fn three_identical_calls_in_a_row_are_a_doom_loop_and_two_are_not() {
        let call = |id: &str, args: &str| ToolCall {
            id: id.into(),
            name: "look".into(),
            arguments: args.into(),
        };
        let mut recent = Recent::default();
        recent.extend(&[call("1", "{}")]);
        assert!(recent.doom(&[call("2", "{}")]).is_none());
        assert!(recent.doom(&[call("3", "{\"x\":1}")]).is_none());
        assert!(recent.doom(&[call("4", "{}"), call("5", "{}")]).is_none());
        let third = [call("6", "{}")];
        assert_eq!(recent.doom(&third).map(|c| c.id.as_str()), Some("6"));
    }
}
