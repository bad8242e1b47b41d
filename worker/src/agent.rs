//! The agent: a ReAct loop over a chat model and tools, checkpointed step by step.
//!
//! [`run`] prepares the loop (the spec with the run's overrides, the model, the prompt, the
//! checkpoint of earlier attempts, the hooks and the tools), settles the step an earlier attempt
//! left unsettled, then takes one step after another until the model answers in text, a stop
//! condition holds, or `max_steps` is reached (tools are withheld on the last step, so the model
//! must answer in text). Where each concern lives:
//!
//! | concern | module |
//! |---|---|
//! | the attempt's context (database, engine, claimed run, stop signal, events) | [`context`] |
//! | what the run produced, how the loop ended | [`answer`] |
//! | resuming from saved steps (invariant 6) | [`checkpoint`] |
//! | a step's tool calls: classify, execute, pause, commit | [`step`] |
//! | agents as tools: child runs, and the wait for them | [`children`] |
//! | the model call: streaming, retries, continuations, fallbacks | [`model_call`] |
//! | the prompt and the context budget; compaction (summaries of older turns) | [`prompt`] |
//! | the final answer: `response_format` validation and repair, `pre_response` screening | [`output`] |
//! | limits: doom loops, `max_tool_calls`, token budgets (`charge`) | [`limits`] |
//! | the tools: offer, execute, timeouts, truncation, idempotency keys | [`tools`] |
//! | hooks | `hooks` |
//! | models, clients and the default agent of a worker | [`engine`] |
//! | a restarted attempt showing again what its client dropped | [`takeover`] |
//! | the spans' GenAI semantic conventions, and what content they may carry | [`genai`] |
//!
//! Pauses: a call of a client tool, or of a tool that needs approval, is held; the step is
//! saved with the held calls, the run pauses (`requires_action` / `awaiting_approval`) and
//! releases its worker. The answer (tool outputs, a decision, or the approval's expiry, which
//! counts as a denial) lands in the saved step, and the next attempt settles the step and goes
//! on. A cancel request stops the model call or the tools at once and keeps the partial answer.

pub mod answer;
pub mod checkpoint;
mod children;
pub mod context;
pub mod engine;
pub(crate) mod genai;
mod graph;
mod hooks;
mod limits;
pub mod llm;
pub mod model_call;
mod output;
pub mod prompt;
pub mod step;
pub mod takeover;
pub mod tools;

use sqlx::PgPool;

use spool_shared::agent::{AgentKind, AgentSpec, HookEvent, Sampling};
use spool_shared::db::quota::Spent;
use spool_shared::db::runs::Run;
use spool_shared::db::{agents, messages};
use spool_shared::event::{MessageStart, StepStart};
use spool_shared::run::{FailureCode, RunFailure, Usage};
use spool_shared::status::RunStatus;

use answer::{Answer, Exit, LoopEnd};
use checkpoint::{Checkpoint, Unsettled};
pub(crate) use children::cancel_children;
use context::Attempt;
use engine::{Candidate, Engine};
pub(crate) use hooks::Hooks;
use limits::Recent;
use llm::{ChatMessage, ChatRequest};
use model_call::{LlmEnd, call_model};
use tools::ToolSet;

use crate::stop::Halt;

/// The agent that answers `run`: its spec as it was at enqueue, or the worker's default. A
/// run enqueued before specs were stored with runs reads the agent's row (`None` if it was
/// deleted).
pub(crate) async fn load_spec(
    db: &PgPool,
    engine: &Engine,
    run: &Run,
) -> sqlx::Result<Option<AgentSpec>> {
    if let Some(spec) = &run.agent_spec {
        return Ok(Some(spec.0.clone()));
    }
    match run.agent_id {
        None => Ok(Some(engine.default_agent.clone())),
        Some(id) => match agents::find(db, id, &run.tenant_id).await? {
            Some(agent) => {
                let spec =
                    spool_shared::db::tools::resolve(db, &run.tenant_id, agent.spec.0).await?;
                Ok(Some(
                    spool_shared::db::providers::resolve(db, &run.tenant_id, spec).await?,
                ))
            }
            None => Ok(None),
        },
    }
}

/// Runs the agent `spec` for this attempt.
pub(crate) async fn run(a: &Attempt<'_>, spec: &AgentSpec) -> anyhow::Result<LoopEnd> {
    // Boxed: the loop's future is most of an attempt's (about 16 KiB), once per run, so the
    // attempt's own future (and every caller's) stays small.
    let ran = if spec.kind == AgentKind::Graph {
        Box::pin(graph::run(a, spec)).await
    } else {
        Box::pin(Loop::run(a, spec)).await
    };
    match ran {
        Ok(end) => Ok(end),
        Err(Exit::End(end)) => Ok(*end),
        Err(Exit::Error(err)) => Err(err),
    }
}

/// What the loop carries from step to step.
pub(crate) struct Loop<'a> {
    /// The agent as this run executes it (the run's overrides applied).
    spec: AgentSpec,
    /// `Some(false)`: at most one tool call per model call (the run's overrides).
    parallel_tool_calls: Option<bool>,
    /// The run's `top_p` and reasoning effort (the run's overrides; its temperature and
    /// output limit are in `spec`).
    sampling: Sampling,
    /// The agent's model, then its fallbacks.
    models: Vec<Candidate>,
    hooks: Hooks<'a>,
    tools: ToolSet,
    conversation: Vec<ChatMessage>,
    answer: Answer,
    recent: Recent,
    /// Whether the final text is held back until it is decided: by `pre_response` hooks, or
    /// by validation against the agent's `response_format`.
    buffer: bool,
    /// Whether `pre_response` hooks screen the final text.
    screened: bool,
    /// Whether the run was claimed because its presented approval ran out of time (settling
    /// the step denies it).
    approval_expired: bool,
    /// A daily token budget of the run's counters found spent: the next step fails the run.
    spent: Option<Spent>,
    /// The length of the conversation's start (instructions, summary, history): what a
    /// compaction rebuilds; the run's own steps follow it.
    prefix: usize,
    /// The thread's messages the start replays, and the summary it starts after.
    history: Vec<messages::HistoryMessage>,
    summary: Option<messages::Summary>,
    /// Whether thread messages older than the replayed window follow the summary.
    backlog: bool,
    /// Summaries written by this attempt (at most [`prompt::MAX_COMPACTIONS`]).
    compactions: u32,
    /// Why a summary of this attempt failed (none is tried again).
    summary_failed: Option<String>,
    /// Whether the results of the run's own steps were cut to fit the window (once).
    cut_own: bool,
    /// Calls of a done tool whose arguments did not validate (the first is the repair round).
    done_invalid: u32,
}

impl<'a> Loop<'a> {
    async fn run(a: &Attempt<'a>, spec: &AgentSpec) -> Result<LoopEnd, Exit> {
        let (mut state, checkpoint) = Self::prepare(a, spec).await?;
        let mut next = checkpoint.next;
        let mut unsettled = checkpoint.unsettled;
        let run = a.claimed.run();
        // After a crash or a release the client kept only what came before the last result.
        let reshow = if run.attempt > 1 && !run.resumed {
            let held = unsettled.as_mut().map(|u| (next, &mut u.results[..]));
            takeover::show_again(a, &checkpoint.settled, held).await
        } else {
            false
        };
        // Turns beyond `history_depth` that no summary covers are summarised, not dropped.
        state.absorb_backlog(a).await?;
        if let Some(unsettled) = unsettled {
            state.resume(a, next, unsettled, reshow).await?;
            next += 1;
        }
        for step in next..=state.spec.max_steps {
            state.step(a, step).await?;
        }
        Ok(LoopEnd::Completed(state.answer))
    }

    /// Everything the steps need. Ends the run if the model cannot be served or an
    /// `on_run_start` hook blocks it.
    async fn prepare(a: &Attempt<'a>, spec: &AgentSpec) -> Result<(Self, Checkpoint), Exit> {
        let run = a.claimed.run();
        if !run.resumed {
            a.events.send(MessageStart::new(Some(spec.model.clone())));
        }
        // What earlier attempts produced first: every way this attempt ends keeps it.
        let mut checkpoint = checkpoint::restore(a.db, run).await?;
        if let Some(halt) = a.stop.now() {
            return Err(LoopEnd::halted(halt, checkpoint.answer).into());
        }
        let models = match a.engine.models(a.db, &run.tenant_id, spec).await {
            Ok(models) => models,
            Err(err) => {
                let failure = RunFailure::new(FailureCode::ModelUnavailable, err.to_string());
                return Err(LoopEnd::Failed(Box::new(failure), checkpoint.answer).into());
            }
        };
        let (spec, parallel_tool_calls, sampling) = overridden(run, spec);
        let prompt::Prompt {
            mut conversation,
            input,
            history,
            summary,
            backlog,
        } = prompt::start(a.db, run, &spec).await?;
        let prefix = conversation.len();
        conversation.append(&mut checkpoint.conversation);
        let answer = std::mem::take(&mut checkpoint.answer);
        if a.claimed.previous_status() == RunStatus::RequiresAction {
            // Claimed because nobody posted the client tools' outputs in time.
            let secs = spec.limits.client_timeout_secs();
            let message = format!("no client tool outputs arrived within {secs} s");
            let failure = RunFailure::new(FailureCode::HumanTimeout, message);
            return Err(LoopEnd::Failed(Box::new(failure), answer).into());
        }
        let hooks = Hooks::for_run(&spec, a.engine, run);
        if !run.resumed
            && checkpoint.is_fresh()
            && let Some(reason) = hooks.on_run_start(&input).await
        {
            let failure = RunFailure::new(FailureCode::BlockedByHook, reason);
            return Err(LoopEnd::Failed(Box::new(failure), answer).into());
        }
        let tools = ToolSet::for_attempt(a, &spec).await?;
        let spent = limits::charge(a, Usage::default()).await?;
        let screened = hooks.has(HookEvent::PreResponse);
        let state = Self {
            buffer: screened || spec.response_format.is_some(),
            screened,
            approval_expired: a.claimed.previous_status() == RunStatus::AwaitingApproval,
            recent: std::mem::take(&mut checkpoint.recent),
            spec,
            parallel_tool_calls,
            sampling,
            models,
            hooks,
            tools,
            conversation,
            answer,
            spent,
            prefix,
            history,
            summary,
            backlog,
            compactions: 0,
            summary_failed: None,
            cut_own: false,
            done_invalid: 0,
        };
        Ok((state, checkpoint))
    }

    /// Settles the step an earlier attempt saved but did not settle; `reshow`: its text and
    /// calls are shown again (a restarted attempt's client dropped them, see [`takeover`]).
    /// Its results not marked published are published once settled.
    async fn resume(
        &mut self,
        a: &Attempt<'_>,
        step: u32,
        unsettled: Unsettled,
        reshow: bool,
    ) -> Result<(), Exit> {
        let Unsettled { output, results } = unsettled;
        if reshow {
            a.emit_text(step, &output.text);
        }
        self.answer.usage.add(output.usage);
        self.recent.extend(&output.tool_calls);
        self.settle(a, step, output, results, reshow).await
    }

    /// One step: a model call, then the tool calls it asks for, saved before they run (a new
    /// attempt repeats these calls with the same ids, and so the same idempotency keys, never
    /// the model call that chose them). Ends the loop on a text answer.
    async fn step(&mut self, a: &Attempt<'_>, step: u32) -> Result<(), Exit> {
        if let Some(halt) = a.stop.now() {
            return Err(self.halted(halt));
        }
        self.within_budget()?;
        a.events.send(StepStart {
            step,
            model: self.spec.model.clone(),
        });
        let (mut output, offered) = loop {
            let request = self.request(step);
            let window = self.spec.context_window_tokens.map(|w| w as usize);
            if window.is_some_and(|w| prompt::estimate_tokens(&request.messages) > w) {
                self.make_room(a).await?;
                continue;
            }
            let offered = request.callable();
            match call_model(a, &self.models, request, step, self.buffer).await {
                Ok(output) => break (output, offered),
                Err(LlmEnd::Error(err)) if err.is_context_overflow() => {
                    tracing::info!(error = %err, "the provider found the prompt too long");
                    self.make_room(a).await?;
                }
                Err(end) => return Err(self.model_failed(end)),
            }
        };
        self.spend(a, output.usage).await?;
        if self.parallel_tool_calls == Some(false) {
            // One call per model call, whatever the provider did with the request's flag.
            output.tool_calls.truncate(1);
        }
        if output.tool_calls.is_empty() {
            self.answer.final_step = Some(Box::new((step, output.saved(Vec::new(), Vec::new()))));
            return Err(self.final_answer(a, step, output.text).await);
        }
        if self.buffer {
            a.emit_text(step, &output.text);
        }
        self.within_call_limits(&output)?;
        let results = self.classify(step, &offered, &mut output).await;
        a.save_step(step, &output.saved(results.clone(), Vec::new()))
            .await?;
        self.settle(a, step, output, results, true).await
    }

    /// The model request of `step`: the tools its rules offer (none on the last step), and the
    /// conversation within the context budget.
    fn request(&mut self, step: u32) -> ChatRequest {
        let last = step == self.spec.max_steps;
        let (tools, tool_choice) = self.tools.offer(&self.spec, step, last);
        // The run's own old tool results go first, before any summary: within the budget, and
        // within the model's window when that is smaller.
        let budget = self
            .spec
            .context_window_tokens
            .map_or(self.spec.context_budget_tokens, |window| {
                window.min(self.spec.context_budget_tokens)
            });
        prompt::prune(&mut self.conversation, budget);
        ChatRequest {
            model: self.spec.model.clone(),
            messages: self.conversation.clone(),
            tools,
            tool_choice,
            temperature: self.spec.temperature,
            max_output_tokens: self.spec.limits.max_output_tokens,
            response_format: self.spec.response_format.clone(),
            parallel_tool_calls: self.parallel_tool_calls,
            top_p: self.sampling.top_p,
            reasoning_effort: self.sampling.reasoning_effort.clone(),
        }
    }

    /// The end a model call that did not answer makes: a halt, or a failure (after the retries
    /// of a retryable error).
    fn model_failed(&mut self, end: LlmEnd) -> Exit {
        match end {
            LlmEnd::Halt(halt, partial) => {
                self.answer.add_text(&partial);
                self.halted(halt)
            }
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

    /// The end a halt makes, with what was produced so far.
    fn halted(&mut self, halt: Halt) -> Exit {
        LoopEnd::halted(halt, std::mem::take(&mut self.answer)).into()
    }

    /// A failure, with what was produced so far.
    fn failed(&mut self, code: FailureCode, message: impl Into<String>) -> Exit {
        let failure = RunFailure::new(code, message);
        LoopEnd::Failed(Box::new(failure), std::mem::take(&mut self.answer)).into()
    }
}

/// The agent's spec as the run's message changes it (its overrides, checked and pinned to
/// their steps by the API, and its `max_steps`: the agent's within its ceiling, unless the
/// message raised or lowered it), with the message's `parallel_tool_calls` and sampling.
fn overridden(run: &Run, spec: &AgentSpec) -> (AgentSpec, Option<bool>, Sampling) {
    let mut spec = spec.clone();
    let steps = run
        .overrides
        .as_ref()
        .map_or_else(|| spec.default_steps(), |o| o.0.run_steps(&spec));
    let parallel_tool_calls = run.overrides.as_ref().and_then(|o| o.0.parallel_tool_calls);
    let sampling = run
        .overrides
        .as_ref()
        .and_then(|o| o.0.sampling.clone())
        .unwrap_or_default();
    if let Some(overrides) = &run.overrides {
        overrides.0.clone().apply(&mut spec);
    }
    spec.max_steps = steps;
    (spec, parallel_tool_calls, sampling)
}
