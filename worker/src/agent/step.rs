//! One step's tool calls, from the model's request to a settled step.
//!
//! - [`Loop::classify`]: what happens to each call of a new step: run it, hold it for the
//!   client or for a person's approval, or refuse it (a `pre_tool_use` hook, which may also
//!   rewrite the arguments).
//! - [`Loop::settle`]: applies decisions and expiries, settles the agent calls it can and
//!   executes what may run (read-only calls concurrently; results through `post_tool_use`
//!   hooks), then either pauses the run (for approvals first, one call at a time; then for the
//!   child runs of agent calls, see [`super::children`]; then for client tools) or commits the
//!   step: saved with its results, added to the answer and the conversation, and checked
//!   against the agent's stop conditions.
//! - Results reach the stream only once the step that holds them is saved. A client keeps what
//!   it was shown up to the last `step` result across `attempt_restarted` (docs/streaming.md),
//!   so a result published before its save, followed by a crash, would be shown twice: once
//!   from the lost attempt and again when the next one repeats the unsaved step. After a crash
//!   between the save and the publish, the next attempt shows it (see [`super::takeover`]).

use serde_json::Value;

use spool_shared::agent::{StopCondition, schema_problems};
use spool_shared::citation::{self, Source};
use spool_shared::db::runs::Pause;
use spool_shared::db::steps::{CallResult, CallState, DecidedBy, Decision, SavedStep};
use spool_shared::event::{StepCall, StepEnd, StepResult};
use spool_shared::run::{FailureCode, PendingAction, PendingCall};
use spool_shared::status::RunStatus;

use super::Loop;
use super::answer::{Exit, LoopEnd};
use super::context::Attempt;
use super::hooks::ToolDecision;
use super::llm::{ChatMessage, ToolCall};
use super::model_call::ModelOutput;
use super::tools::Kind;
use crate::stop::Halt;

impl Loop<'_> {
    /// Decides, for each call of a new step, what happens to it. Hooks may rewrite the
    /// arguments (in `output`, so the saved step holds what runs). A call held for approval
    /// records how long it may wait once presented (a hook's timeout, else the agent's). A call
    /// of a tool the step did not offer (`offered`) is answered with an error, never run.
    pub(crate) async fn classify(
        &mut self,
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
                    Kind::Client if self.is_done_tool(&call.name) => {
                        self.settle_done(call, &mut result);
                    }
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
        self.apply_decisions(&output, &mut results);
        let starts = self.agent_calls(a, &output, &mut results).await?;
        self.execute(a, step, &output, &mut results).await?;
        if let Some(halt) = a.stop.now() {
            self.answer.add_text(&output.text);
            return Err(self.halted(halt));
        }
        let mut shown = unpublished_results(step, &mut results);
        let approval = results
            .iter()
            .any(|r| r.state == CallState::PendingApproval);
        if !approval && !starts.is_empty() {
            let waited = self.wait_for_agents(a, step, &output, &mut results, starts, &mut shown);
            if let Some(exit) = waited.await {
                return Err(exit);
            }
            // No agent call could start (each got its bound's tool error): the step goes on.
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

    /// Settles what people decided, or failed to decide in time: a denial, or the presented
    /// approval left unanswered until its deadline (the run was claimed because the database
    /// clock passed it), reaches the model as an error; a client's output as it is. An
    /// approved client tool now waits for the client.
    fn apply_decisions(&mut self, output: &ModelOutput, results: &mut [CallResult]) {
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
                    Some(Kind::Client) if self.is_done_tool(&result.name) => {
                        let call = output
                            .tool_calls
                            .iter()
                            .find(|c| c.id == result.tool_call_id);
                        if let Some(call) = call {
                            self.settle_done(call, result);
                        }
                    }
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

    /// Saves the settled step with its results (retrieval results numbered for the model, see
    /// [`number_sources`]), adds it to the answer and the conversation, and ends the run if a
    /// stop condition holds.
    async fn commit(
        &mut self,
        a: &Attempt<'_>,
        step: u32,
        output: ModelOutput,
        results: Vec<CallResult>,
        mut shown: Vec<StepResult>,
    ) -> Result<(), Exit> {
        let mut results = results;
        let sources = number_sources(&mut results, self.answer.next_source());
        for result in &mut shown {
            if let Some(r) = results
                .iter()
                .find(|r| r.tool_call_id == result.tool_call_id)
            {
                result.output.clone_from(&r.output);
            }
        }
        let saved = output.saved(results, sources);
        a.save_step(step, &saved).await?;
        publish(a, shown);
        a.events.send(step_end(step, &saved));
        self.answer.add_step(step, &saved);
        let text = saved.assistant.text;
        let calls = saved.assistant.tool_calls;
        // A done tool's call ends the run with its arguments as the output, once they validate.
        let mut done_output = None;
        for call in calls.iter().filter(|c| self.is_done_tool(&c.name)) {
            let result = saved.results.iter().find(|r| r.tool_call_id == call.id);
            if result.is_some_and(|r| r.state == CallState::Done && !r.is_error) {
                done_output = Some(call.parsed_arguments());
            }
        }
        let stop =
            done_output.is_some()
                || self.spec.stop_conditions.iter().any(
                    |StopCondition::HasToolCall { tool_name }| {
                        calls
                            .iter()
                            .any(|c| c.name == *tool_name && !self.is_done_tool(&c.name))
                    },
                );
        if done_output.is_none() && self.done_invalid > 1 {
            let message = "the arguments of the done tool's call do not validate against its \
                           parameters, even after a repair round";
            return Err(self.failed(FailureCode::InvalidOutput, message));
        }
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
            if let Some(output) = done_output {
                self.answer.output = Some(Box::new(output));
            }
            return Err(LoopEnd::Completed(std::mem::take(&mut self.answer)).into());
        }
        Ok(())
    }

    /// Whether `name` is a done tool: a client tool named in a `has_tool_call` stop condition,
    /// whose call ends the run instead of pausing it.
    fn is_done_tool(&self, name: &str) -> bool {
        self.tools
            .find(name)
            .is_some_and(|tool| matches!(tool.kind, Kind::Client))
            && self
                .spec
                .stop_conditions
                .iter()
                .any(|StopCondition::HasToolCall { tool_name }| tool_name == name)
    }

    /// Settles a done tool's call: never sent to the client; its arguments, checked against
    /// the tool's `parameters`, are the run's output. Arguments that do not validate are
    /// answered to the model as an error, for it to call again (the repair round; a second
    /// failure fails the run with `invalid_output` when the step is committed).
    fn settle_done(&mut self, call: &ToolCall, result: &mut CallResult) {
        let Some(tool) = self.tools.find(&call.name) else {
            return;
        };
        let arguments = call.parsed_arguments();
        match schema_problems(&tool.def.parameters, &arguments) {
            Ok(()) => result.settle("Done.".to_owned(), false),
            Err(problems) => {
                self.done_invalid += 1;
                let output = format!(
                    "The arguments do not match the parameters of `{}`: {problems}. Call it \
                     again with arguments that do.",
                    call.name
                );
                result.settle(output, true);
            }
        }
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
pub(super) fn unpublished_results(step: u32, results: &mut [CallResult]) -> Vec<StepResult> {
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

/// The `step_end` of a saved step: its model call's usage and finish reason (`tool_calls` for a
/// step saved before the reason was recorded, `stop` for a final one).
pub(crate) fn step_end(step: u32, saved: &SavedStep) -> StepEnd {
    let finish_reason = match &saved.model_call {
        Some(call) => call.finish_reason.clone(),
        None if saved.assistant.tool_calls.is_empty() => "stop".to_owned(),
        None => "tool_calls".to_owned(),
    };
    StepEnd {
        step,
        usage: saved.usage,
        finish_reason,
    }
}

/// Publishes results from [`unpublished_results`], once their step is saved.
pub(super) fn publish(a: &Attempt<'_>, shown: Vec<StepResult>) {
    for result in shown {
        a.events.send(result);
    }
}

/// Numbers the chunks of the step's retrieval results for the model, from `first` on, in the
/// calls' order: each such result becomes the numbered text (what the model and the client
/// see), and the chunks are returned to be saved with the step. A step settled again after a
/// crash numbers the same results from the same place, so the numbers never change.
pub(crate) fn number_sources(results: &mut [CallResult], first: u32) -> Vec<Source> {
    let mut sources: Vec<Source> = Vec::new();
    for result in results.iter_mut().filter(|r| !r.is_error) {
        let next = sources.last().map_or(first, |s| s.number.saturating_add(1));
        if let Some((text, mut chunks)) = citation::number(&result.output, next) {
            result.output = text;
            sources.append(&mut chunks);
        }
    }
    sources
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(id: &str, output: &str, is_error: bool) -> CallResult {
        let call = ToolCall {
            id: id.into(),
            name: "search".into(),
            arguments: "{}".into(),
        };
        let mut result = CallResult::new(&call, CallState::Approved);
        result.settle(output.into(), is_error);
        result
    }

    #[test]
    fn retrieval_results_are_numbered_on_from_the_run_s_earlier_chunks() {
        let chunks = r#"{"chunks": [{"id": "a", "text": "A"}, {"id": "b", "text": "B"}]}"#;
        let mut results = [
            result("c1", chunks, false),
            result("c2", "plain", false),
            result("c3", chunks, true),
            result("c4", chunks, false),
        ];
        let sources = number_sources(&mut results, 3);
        let numbers: Vec<u32> = sources.iter().map(|s| s.number).collect();
        assert_eq!(numbers, [3, 4, 5, 6]);
        assert!(results[0].output.contains("[3]") && results[0].output.contains("[4]"));
        assert_eq!(results[1].output, "plain");
        assert_eq!(
            results[2].output, chunks,
            "an error is not a retrieval result"
        );
        assert!(results[3].output.contains("[6]"));
        // Settled again: the numbered text is no retrieval result, nothing moves.
        assert!(number_sources(&mut results, 3).is_empty());
    }
}
