//! Agents as tools, on the worker's side: a step's calls of agent tools become child runs, and
//! the run waits for them.
//!
//! A call of an agent tool ([`super::tools::Kind::Agent`]) is held like a client call
//! (`pending_agent`). When the step settles, [`Loop::agent_calls`] settles what it can (a
//! child that has ended gives its final text or failure; a call past `limits.max_call_depth`,
//! of a gone or disabled agent, or without `input` gets a tool error) and returns the rest.
//! Once the step's other calls have run and no approval is pending, [`Loop::wait_for_agents`]
//! bounds them and starts what it may: at most `limits.max_agent_calls_per_step` of the step,
//! at most `limits.max_tree_runs` in the root's tree, each admitted against its root's
//! concurrency quota (a take in the quota counters, as an enqueue makes). A call past a bound
//! is answered with a tool error that starts with its code, and the run goes on. Then the step
//! saved with the calls' child ids, a child run per call and the run `waiting`, in one
//! transaction fenced on the attempt
//! ([`Claimed::wait_for_children`](spool_shared::db::runs::Claimed::wait_for_children)),
//! which counts the tree again under its root's lock. The last child's end re-queues the run;
//! its next attempt settles the step again and reads how the children ended
//! ([`runs::children`]). A wait has the run's own time limit as its deadline: past it the claim
//! takes the run back, it fails with `timeout`, and [`cancel_children`] cancels its tree.
//!
//! A child's limits are its own agent's narrowed to what its caller allows
//! ([`Limits::for_child`](spool_shared::agent::Limits::for_child)): one level of calls less
//! than the caller has left, the caller's tree bound, and the caller's time left.
//!
//! What must stay true: a child is started only in that fenced transaction, so a crash leaves
//! either the step unsettled with no child or every child started, and a later attempt finds
//! each call's child by the id saved with it (never starting a second one). A child's room in
//! its quota is taken before that transaction and given back when it fails or starts nothing.

use serde_json::Value;

use spool_shared::agent::AgentSpec;
use spool_shared::db::runs::{self, ChildEnd, NewChild, Run, Wait, WaitBounds};
use spool_shared::db::steps::{CallResult, CallState};
use spool_shared::db::{LazyConn, agents, tools};
use spool_shared::event::{MessageEnd, MessageStart, Origin, StepResult, end_of_message};
use spool_shared::quota::RunQuota;
use spool_shared::quota::admission::AdmitError;
use spool_shared::run::{AgentCall, PendingAction, Usage};
use spool_shared::status::RunStatus;
use spool_shared::{AgentId, WorkflowId, stream};

use super::Loop;
use super::answer::{Exit, LoopEnd};
use super::context::Attempt;
use super::llm::ToolCall;
use super::model_call::ModelOutput;
use super::step::{publish, unpublished_results};
use super::tools::Kind;
use crate::stop::Halt;
use crate::worker::Worker;

/// The deepest any run nests whatever its limits say (`limits.max_call_depth` is at most 10):
/// a guard for runs whose limits were not narrowed (started before children carried them).
const MAX_DEPTH: i16 = 10;

/// How many times a wait counts the tree again when other runs of the tree took its room
/// between the count and the wait.
const TREE_RECOUNTS: usize = 3;

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
                result.settle_whole(text, is_error);
                continue;
            }
            let Some(Kind::Agent(tool)) = self.tools.find(&result.name).map(|t| &t.kind) else {
                result.settle(format!("unknown tool `{}`", result.name), true);
                continue;
            };
            if self.spec.limits.call_depth() == 0 || run.depth >= MAX_DEPTH {
                let error = format!(
                    "max_call_depth_exceeded: this run is {} levels below its root and may \
                     start no deeper agent runs (limits.max_call_depth); this call was not made",
                    run.depth
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
                    // The child run snapshots the tools its agent references and its tenant
                    // provider's id, as an enqueue does.
                    spec: spool_shared::db::providers::resolve(
                        a.db,
                        &run.tenant_id,
                        tools::resolve(a.db, &run.tenant_id, agent.spec.0).await?,
                    )
                    .await?,
                    input: input.to_owned(),
                }),
                Some(_) => result.settle(format!("the agent {} is disabled", tool.agent_id), true),
                None => result.settle(format!("the agent {} does not exist", tool.agent_id), true),
            }
        }
        Ok(starts)
    }

    /// Bounds the step's agent calls and starts a child run for each it may (see the module
    /// doc), then pauses the run (`waiting`) until they have ended, with the step saved in the
    /// same transaction. A call past a bound is settled with a tool error (and added to
    /// `shown`). Returns how the loop ends: waiting, cancelled (a cancel requested meanwhile
    /// starts nothing), the lease lost; or `None` when no call may start, and the step goes on
    /// (its calls all settled now).
    pub(super) async fn wait_for_agents(
        &mut self,
        a: &Attempt<'_>,
        step: u32,
        output: &ModelOutput,
        results: &mut [CallResult],
        mut starts: Vec<AgentStart>,
        shown: &mut Vec<StepResult>,
    ) -> Option<Exit> {
        let limits = self.spec.limits.clone();
        refuse_past_per_step(results, &mut starts, limits.agent_calls_per_step());
        let (root, mut size) = match tree_of(a, a.claimed.run()).await {
            Ok(counted) => counted,
            Err(err) => return Some(Exit::from(err)),
        };
        let max_tree = limits.tree_runs();
        let tree_full = |_: &AgentStart| {
            format!(
                "max_tree_runs_exceeded: the run's tree of agent runs holds {max_tree} runs at \
                 most (limits.max_tree_runs); this call was not made"
            )
        };
        for _ in 0..TREE_RECOUNTS {
            let room = usize::try_from(max_tree.saturating_sub(size)).unwrap_or(usize::MAX);
            refuse(results, starts.split_off(room.min(starts.len())), tree_full);
            let admitted = match admit(a, &mut starts, results).await {
                Ok(admitted) => admitted,
                Err(exit) => return Some(exit),
            };
            shown.extend(unpublished_results(step, results));
            if starts.is_empty() {
                return None;
            }
            let waited = self
                .start_children(a, step, output, results, &starts, &admitted, root)
                .await;
            let waited = match waited {
                Ok(waited) => waited,
                Err(err) => {
                    admitted.undo(a).await;
                    return Some(Exit::from(err));
                }
            };
            match waited {
                Wait::Waiting => {
                    publish(a, std::mem::take(shown));
                    tracing::info!(children = starts.len(), "waiting for agent runs");
                    return Some(LoopEnd::Paused.into());
                }
                Wait::CancelRequested => {
                    admitted.undo(a).await;
                    // Nothing was saved; the calls that ran still show their results.
                    publish(a, std::mem::take(shown));
                    self.answer.add_text(&output.text);
                    return Some(self.halted(Halt::Cancelled));
                }
                Wait::Lost => {
                    admitted.undo(a).await;
                    return Some(LoopEnd::LeaseLost.into());
                }
                Wait::TreeFull(now) => {
                    // Other runs of the tree started children since the count: count again.
                    admitted.undo(a).await;
                    for start in &starts {
                        results[start.index].workflow_id = None;
                    }
                    size = now;
                }
            }
        }
        refuse(results, starts, tree_full);
        shown.extend(unpublished_results(step, results));
        None
    }

    /// The wait itself: the calls' child ids in the step, a child run per start (its spec's
    /// limits narrowed to what this run allows), and the run `waiting`.
    #[expect(
        clippy::too_many_arguments,
        reason = "one call site; the pieces of one wait"
    )]
    async fn start_children(
        &self,
        a: &Attempt<'_>,
        step: u32,
        output: &ModelOutput,
        results: &mut [CallResult],
        starts: &[AgentStart],
        admitted: &Admitted,
        root: WorkflowId,
    ) -> sqlx::Result<Wait> {
        let limits = &self.spec.limits;
        // The caller's time left, in whole seconds (at least one), if it has a time limit.
        let left = a
            .stop
            .remaining()
            .map(|left| u32::try_from(left.as_secs().saturating_add(1)).unwrap_or(u32::MAX));
        let specs: Vec<AgentSpec> = starts
            .iter()
            .map(|start| {
                let mut spec = start.spec.clone();
                spec.limits = spec.limits.for_child(limits, left);
                spec
            })
            .collect();
        let mut calls = Vec::with_capacity(starts.len());
        for (start, id) in starts.iter().zip(&admitted.ids) {
            let result = &mut results[start.index];
            result.workflow_id = Some(*id);
            calls.push(AgentCall {
                tool_call_id: result.tool_call_id.clone(),
                tool_name: result.name.clone(),
                workflow_id: *id,
            });
        }
        let traceparent = spool_shared::telemetry::inject_traceparent();
        let children: Vec<NewChild<'_>> = starts
            .iter()
            .zip(&calls)
            .zip(&specs)
            .map(|((start, call), spec)| NewChild {
                id: call.workflow_id,
                tool_call_id: &call.tool_call_id,
                agent_id: start.agent_id,
                agent_spec: spec,
                input: &start.input,
                trace_context: traceparent.as_deref(),
            })
            .collect();
        let saved = output.saved(results.to_vec(), Vec::new());
        let action = PendingAction::AgentRuns {
            runs: calls.clone(),
        };
        let bounds = WaitBounds {
            root,
            max_tree_runs: limits.tree_runs(),
            time_limit_secs: limits.timeout_secs,
        };
        a.claimed
            .wait_for_children(a.db, step, &saved, &children, &action, bounds)
            .await
    }
}

/// Settles the starts past the first `per_step` of a step with a tool error the model sees.
fn refuse_past_per_step(results: &mut [CallResult], starts: &mut Vec<AgentStart>, per_step: u32) {
    let per_step = usize::try_from(per_step).unwrap_or(usize::MAX);
    refuse(
        results,
        starts.split_off(per_step.min(starts.len())),
        |_| {
            format!(
                "max_agent_calls_per_step_exceeded: a step may start {per_step} agent runs at most \
             (limits.max_agent_calls_per_step); this call was not made"
            )
        },
    );
}

/// The root of `run`'s tree of agent runs (itself for a thread's own run) and how many runs
/// the tree holds now.
async fn tree_of(a: &Attempt<'_>, run: &Run) -> sqlx::Result<(WorkflowId, u32)> {
    let root = match run.parent_workflow_id {
        None => run.id,
        Some(_) => runs::root_of(a.db, run.id).await?,
    };
    Ok((root, runs::tree_size(a.db, root).await?))
}

/// Settles each of `refused` with the tool error `why` gives it.
fn refuse(
    results: &mut [CallResult],
    refused: Vec<AgentStart>,
    why: impl Fn(&AgentStart) -> String,
) {
    for start in refused {
        results[start.index].settle(why(&start), true);
    }
}

/// The room the children of one wait took in their root's quota counters.
struct Admitted {
    /// Each start's child id, in order.
    ids: Vec<WorkflowId>,
    /// The counters the children carry (`None`: no counter limits them), and each take's
    /// time (to undo it).
    quota: Option<RunQuota>,
    taken: Vec<(WorkflowId, i64)>,
}

impl Admitted {
    /// Gives back the room of children that were not started (best effort, as an enqueue's
    /// undo: a place not given back is pruned when its counter is full).
    async fn undo(&self, a: &Attempt<'_>) {
        let Some(quota) = &self.quota else { return };
        let tenant = &a.claimed.run().tenant_id;
        for (id, taken_ms) in &self.taken {
            a.admission.undo(tenant, *id, quota, *taken_ms).await;
        }
    }
}

/// Admits each of `starts` against the root's concurrency quota (and its token budgets), as
/// an enqueue is admitted: a take in the counters for a new child id. A start that is refused
/// is settled with a tool error naming the code (`concurrency_limited`, `budget_exceeded`, or
/// `quotas_unavailable` when the counters cannot be read) and removed. A database error
/// gives back what was taken and ends the loop.
async fn admit(
    a: &Attempt<'_>,
    starts: &mut Vec<AgentStart>,
    results: &mut [CallResult],
) -> Result<Admitted, Exit> {
    let run = a.claimed.run();
    let quota = run.quota.as_ref().map(|q| q.0.for_child());
    let quota = quota.filter(|q| !q.counters.is_empty());
    let mut admitted = Admitted {
        ids: Vec::with_capacity(starts.len()),
        quota,
        taken: Vec::new(),
    };
    let mut kept = Vec::with_capacity(starts.len());
    for start in std::mem::take(starts) {
        let id = WorkflowId::new();
        let Some(quota) = &admitted.quota else {
            admitted.ids.push(id);
            kept.push(start);
            continue;
        };
        let mut db = LazyConn::pool(a.db);
        match a.admission.take(&mut db, &run.tenant_id, id, quota).await {
            Ok(taken_ms) => {
                admitted.taken.push((id, taken_ms));
                admitted.ids.push(id);
                kept.push(start);
            }
            Err(AdmitError::Refused(refusal)) => {
                let error = format!(
                    "{}: {}; the agent run was not started",
                    refusal.code,
                    refusal.message()
                );
                results[start.index].settle(error, true);
            }
            Err(AdmitError::Unavailable(err)) => {
                tracing::warn!(error = %err, "quota counters unavailable; an agent call is refused");
                let error = "quotas_unavailable: the quota counters cannot be read now; the \
                             agent run was not started";
                results[start.index].settle(error.to_owned(), true);
            }
            Err(AdmitError::Db(err)) => {
                admitted.undo(a).await;
                return Err(Exit::from(err));
            }
        }
    }
    *starts = kept;
    Ok(admitted)
}

/// Cancels the tree of agent runs below `run`, which has just ended without waiting for them
/// (its wait passed its time limit): asks each run that has not ended to cancel, deepest
/// first; one no worker holds is cancelled here (its quota room given back, its stream ended),
/// one a worker holds is told through `NOTIFY` and its worker ends it. Best effort: a failure is
/// logged, and a run left waiting for a parent that ended has its own time limit.
pub(crate) async fn cancel_children(worker: &Worker, run: &Run) {
    if let Err(err) = cancel_below(worker, run).await {
        tracing::warn!(error = %err, "could not cancel the agent runs of a run that timed out");
    }
}

async fn cancel_below(worker: &Worker, run: &Run) -> sqlx::Result<()> {
    let owner = spool_shared::db::threads::Owner {
        tenant_id: run.tenant_id.clone(),
        user_id: run.owner_id.clone(),
    };
    let reason = Some("its calling agent run timed out");
    for child in runs::active_descendants(&worker.db, run.id).await? {
        let Some(status) = runs::request_cancel(&worker.db, child.id, &owner, reason).await? else {
            continue;
        };
        if status != RunStatus::Running
            && let Some(attempt) = runs::cancel_unclaimed(&worker.db, child.id).await?
        {
            if let Some(quota) = &child.quota {
                worker
                    .admission
                    .release(&child.tenant_id, child.id, &quota.0)
                    .await;
            }
            publish_cancelled(worker, &child, attempt).await;
        } else {
            spool_shared::db::notify_cancel(&worker.db, child.id).await?;
        }
    }
    Ok(())
}

/// Ends the stream of a child cancelled without a worker (best effort).
async fn publish_cancelled(worker: &Worker, run: &Run, attempt: i32) {
    let origin = Origin::of(run, attempt);
    let end = MessageEnd {
        status: RunStatus::Cancelled,
        usage: Usage::default(),
        blocked: false,
        output: None,
    };
    let events: Vec<_> = std::iter::once(MessageStart::new(None).into())
        .chain(end_of_message(end, None))
        .map(|data| origin.event(data))
        .collect();
    let id = uuid::Uuid::new_v4().simple().to_string();
    let batch = stream::Batch {
        thread: run.thread_id,
        workflow: run.id,
        attempt,
        id: &id,
        previous: None,
        events: &events,
    };
    let mut conn = worker.streams.conn.clone();
    let keys = &worker.streams.keys;
    if let Err(err) = stream::publish(&mut conn, keys, &batch, worker.streams.retention).await {
        tracing::warn!(workflow.id = %run.id, error = %err, "could not publish a cancellation");
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
