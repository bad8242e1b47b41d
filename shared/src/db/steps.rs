//! Checkpoints: the steps of a run, each saved before the next model call, and the one type that
//! says what a saved step holds ([`SavedStep`]).
//!
//! A step is one model call and the tool calls it asked for. The worker saves it twice, fenced
//! on its attempt: with its calls before they run (each in a state that says what happens to
//! it), then with their results. A step whose calls are not all [`CallState::Done`] is
//! *unsettled*: cut short by a crash, or paused for the client or a person. The API answers a
//! pause by editing the unsettled step through [`SavedStep::answer_client`] and
//! [`SavedStep::decide`]; the next attempt settles it and goes on. Nobody reads or writes the
//! stored JSON but through these types.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::PgExecutor;
use sqlx::types::Json;

use crate::citation::Source;
use crate::ids::WorkflowId;
use crate::run::Usage;

/// Longest reason recorded with an approval decision, in characters.
pub const MAX_REASON_CHARS: usize = 1000;

/// A tool call the model asked for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The provider's id of the call.
    pub id: String,
    /// The tool's name.
    pub name: String,
    /// The arguments, as the JSON text the model wrote.
    pub arguments: String,
}

impl ToolCall {
    /// The arguments as JSON; text that is not JSON comes back as a JSON string.
    pub fn parsed_arguments(&self) -> Value {
        serde_json::from_str(&self.arguments)
            .unwrap_or_else(|_| Value::String(self.arguments.clone()))
    }
}

/// The model's side of a step: its text and the tool calls it asked for.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssistantTurn {
    /// The text it wrote.
    #[serde(default)]
    pub text: String,
    /// The tool calls it asked for, in its order.
    #[serde(default)]
    pub tool_calls: Vec<ToolCall>,
}

/// Where one tool call of a saved step stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CallState {
    /// Settled: `output` is what the model sees.
    Done,
    /// Waits for the client's output.
    PendingClient,
    /// The client posted its output; the next attempt settles it.
    ClientOutput,
    /// Waits for a person's decision; presented one at a time, each for `timeout_secs` from
    /// the moment it is presented.
    PendingApproval,
    /// To execute (allowed at once, or approved by a person).
    Approved,
    /// Denied by a person (`reason`).
    Denied,
    /// A call of an agent tool: waits for the child run it started (`workflow_id`; none yet
    /// while the step is being saved to start it).
    PendingAgent,
}

/// Tool results longer than this many characters are cut, whoever produced them (a tool, a
/// client, a hook's rewrite): the model, the stream and the saved step see the same text.
pub const MAX_RESULT_CHARS: usize = 50_000;

/// Room kept for the marker of a cut result.
const MARKER_ROOM: usize = 40;

/// Cuts `text` to at most [`MAX_RESULT_CHARS`] characters, its end a marker saying how many
/// were cut. A text within the limit (a cut one too) is left as it is, so cutting twice (a
/// tool's result, then what a hook made of it) changes nothing.
pub fn truncate(text: String) -> String {
    if text.chars().nth(MAX_RESULT_CHARS).is_none() {
        return text;
    }
    let keep = MAX_RESULT_CHARS - MARKER_ROOM;
    let end = text.char_indices().nth(keep).map_or(text.len(), |(i, _)| i);
    let more = text[end..].chars().count();
    format!("{}\n[truncated: {more} more characters]", &text[..end])
}

/// One tool call's result, or where it stands, in a saved step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallResult {
    /// The call it belongs to.
    pub tool_call_id: String,
    /// The tool.
    pub name: String,
    /// The result the model sees (once settled).
    #[serde(default)]
    pub output: String,
    /// Whether the call failed.
    #[serde(default)]
    pub is_error: bool,
    /// Where it stands.
    pub state: CallState,
    /// How long a pending approval waits once presented (`None`: the agent's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u32>,
    /// Why a person decided as they did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Whether its `step` result event went out (a paused step publishes what is final).
    #[serde(default)]
    pub published: bool,
    /// When it was executed (by the worker's clock; for the timeline, never for a decision).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<DateTime<Utc>>,
    /// When its execution ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<DateTime<Utc>>,
    /// The attempt that executed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<i32>,
    /// Who decided what happens to it, other than the tool policy: a person, a hook, the
    /// approval's deadline, or the client that ran it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<Decision>,
    /// The child run an agent tool call started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow_id: Option<WorkflowId>,
}

/// Who decides a call's fate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DecidedBy {
    /// A person, through `POST .../approvals/{tool_call_id}`.
    Person,
    /// A `pre_tool_use` hook.
    Hook,
    /// Nobody approved it before its deadline: it counts as denied.
    Deadline,
    /// The client, posting the output of a client tool.
    Client,
}

/// A decision on one tool call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Decision {
    /// Who decided.
    pub by: DecidedBy,
    /// Whether the call was allowed (a client's output: `true`).
    pub approved: bool,
    /// Why, if a reason was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When (by the clock of the process that recorded it).
    pub at: DateTime<Utc>,
}

impl Decision {
    /// A decision by `by`, now.
    pub fn now(by: DecidedBy, approved: bool, reason: Option<String>) -> Self {
        Self {
            by,
            approved,
            reason,
            at: Utc::now(),
        }
    }
}

impl CallResult {
    /// A call of `call` in `state`, with no output yet.
    pub fn new(call: &ToolCall, state: CallState) -> Self {
        Self {
            tool_call_id: call.id.clone(),
            name: call.name.clone(),
            output: String::new(),
            is_error: false,
            state,
            timeout_secs: None,
            reason: None,
            published: false,
            started_at: None,
            ended_at: None,
            attempt: None,
            decision: None,
            workflow_id: None,
        }
    }

    /// Settles the call with `output` (an error the model sees, if `is_error`), cut at
    /// [`MAX_RESULT_CHARS`].
    pub fn settle(&mut self, output: String, is_error: bool) {
        self.settle_whole(truncate(output), is_error);
    }

    /// Settles the call with `output` whole: an agent call's result, the child's answer, which
    /// is the caller's working material (the prompt's budget, not a cut, keeps it in bounds).
    pub fn settle_whole(&mut self, output: String, is_error: bool) {
        self.output = output;
        self.is_error = is_error;
        self.state = CallState::Done;
    }
}

/// A step's model call, for the timeline: which model answered, when, and why it stopped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ModelCall {
    /// The model that answered.
    pub model: String,
    /// When the call started (by the worker's clock), first try included.
    pub started_at: DateTime<Utc>,
    /// When its last token arrived.
    pub ended_at: DateTime<Utc>,
    /// Why the model stopped: `stop`, `tool_calls`, `length`, `content_filter` or the
    /// provider's own word.
    pub finish_reason: String,
}

/// A step as it is saved: what the model said and asked for, where each call stands, the
/// tokens the model call used, and the retrieval chunks its results numbered.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SavedStep {
    /// The model's text and tool calls.
    pub assistant: AssistantTurn,
    /// One per tool call, in the calls' order.
    #[serde(default)]
    pub results: Vec<CallResult>,
    /// Tokens of the step's model call.
    #[serde(default)]
    pub usage: Usage,
    /// The chunks of its retrieval results, numbered for the model (once settled; steps
    /// saved before numbering held `citations`, which are not read).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<Source>,
    /// Its model call (absent in steps saved before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_call: Option<ModelCall>,
    /// The graph node this step executed (a graph agent's steps only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<NodeStep>,
}

/// One execution of a graph node, as its step saves it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeStep {
    /// The node's id.
    pub node: String,
    /// Which execution of the node this is (from 1): the idempotency key is
    /// `{workflow_id}:{node}:{n}`.
    pub n: u32,
    /// What it produced, under its `output_key`; `None` while a `human_input` node waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    /// Whether it is a `human_input` node (the API answers it with `POST .../input`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub human_input: bool,
}

/// Why client tool outputs cannot answer a paused step.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    /// An output for a call that is not pending, or a second output for one.
    #[error("`{0}` is not a pending call of this run (or is given twice)")]
    Unknown(String),
    /// Pending calls without an output.
    #[error("every pending tool call needs an output")]
    Missing(Vec<String>),
}

/// Why a decision cannot answer a paused step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecideError {
    /// No call of that id waits for approval.
    #[error("no pending approval for this tool call")]
    NotPending,
    /// The approval expired; the call counts as denied.
    #[error("the approval expired; the call counts as denied")]
    Expired,
}

impl SavedStep {
    /// Whether every call is done: nothing is left to run, answer or decide.
    pub fn is_settled(&self) -> bool {
        self.results.iter().all(|r| r.state == CallState::Done)
            && self.node.as_ref().is_none_or(|n| n.output.is_some())
    }

    /// Answers the `human_input` node this step waits on with `text`; `false` (nothing
    /// changed) if it waits on none.
    pub fn answer_input(&mut self, text: &str) -> bool {
        match &mut self.node {
            Some(node) if node.human_input && node.output.is_none() => {
                node.output = Some(Value::String(text.to_owned()));
                true
            }
            _ => false,
        }
    }

    /// The ids of the calls that wait for the client's output.
    pub fn pending_client_ids(&self) -> impl Iterator<Item = &str> {
        self.results
            .iter()
            .filter(|r| r.state == CallState::PendingClient)
            .map(|r| r.tool_call_id.as_str())
    }

    /// Answers every pending client call with its output (`(tool_call_id, output)`), or
    /// changes nothing and says why not.
    pub fn answer_client(&mut self, outputs: Vec<(String, String)>) -> Result<(), AnswerError> {
        let pending: Vec<String> = self.pending_client_ids().map(str::to_owned).collect();
        let mut seen = std::collections::HashSet::new();
        for (id, _) in &outputs {
            if !pending.contains(id) || !seen.insert(id.as_str()) {
                return Err(AnswerError::Unknown(id.clone()));
            }
        }
        let missing: Vec<String> = pending
            .iter()
            .filter(|id| !seen.contains(id.as_str()))
            .cloned()
            .collect();
        if !missing.is_empty() {
            return Err(AnswerError::Missing(missing));
        }
        for (id, output) in outputs {
            if let Some(result) = self.results.iter_mut().find(|r| r.tool_call_id == id) {
                result.output = truncate(output);
                result.is_error = false;
                result.state = CallState::ClientOutput;
                result.decision = Some(Decision::now(DecidedBy::Client, true, None));
            }
        }
        Ok(())
    }

    /// Records a person's decision on the call `tool_call_id` that waits for approval, unless
    /// its approval has `expired` (as the database clock judges the one presented).
    pub fn decide(
        &mut self,
        tool_call_id: &str,
        approved: bool,
        reason: Option<String>,
        expired: bool,
    ) -> Result<(), DecideError> {
        let result = self
            .results
            .iter_mut()
            .find(|r| r.tool_call_id == tool_call_id && r.state == CallState::PendingApproval)
            .ok_or(DecideError::NotPending)?;
        if expired {
            return Err(DecideError::Expired);
        }
        result.state = if approved {
            CallState::Approved
        } else {
            CallState::Denied
        };
        if let Some(reason) = reason {
            result.reason = Some(reason.chars().take(MAX_REASON_CHARS).collect());
        }
        result.decision = Some(Decision::now(
            DecidedBy::Person,
            approved,
            result.reason.clone(),
        ));
        Ok(())
    }
}

/// A saved step and its number.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct Step {
    /// Its number (1-based).
    pub step: i32,
    /// The attempt that saved it last.
    pub attempt: i32,
    /// When it was first saved (database clock).
    pub created_at: DateTime<Utc>,
    /// What it holds.
    pub data: Json<SavedStep>,
}

/// The run's saved steps, in order.
pub async fn load(
    executor: impl PgExecutor<'_>,
    workflow_id: WorkflowId,
) -> sqlx::Result<Vec<Step>> {
    sqlx::query_as("SELECT step, attempt, created_at, data FROM run_steps WHERE workflow_id = $1 ORDER BY step")
        .bind(workflow_id)
        .fetch_all(executor)
        .await
}

/// A page of the run's saved steps: at most `limit` of those numbered after `after`, in order.
pub async fn page(
    executor: impl PgExecutor<'_>,
    workflow_id: WorkflowId,
    after: i32,
    limit: i64,
) -> sqlx::Result<Vec<Step>> {
    sqlx::query_as(
        "SELECT step, attempt, created_at, data FROM run_steps
          WHERE workflow_id = $1 AND step > $2 ORDER BY step LIMIT $3",
    )
    .bind(workflow_id)
    .bind(after)
    .bind(limit)
    .fetch_all(executor)
    .await
}

/// The number of the run's last saved step (0 if none): one probe of the primary key.
pub async fn last_number(
    executor: impl PgExecutor<'_>,
    workflow_id: WorkflowId,
) -> sqlx::Result<i32> {
    let last: Option<i32> = sqlx::query_scalar(
        "SELECT step FROM run_steps WHERE workflow_id = $1 ORDER BY step DESC LIMIT 1",
    )
    .bind(workflow_id)
    .fetch_optional(executor)
    .await?;
    Ok(last.unwrap_or(0))
}

/// Saves a step, fenced on the attempt: `false` (nothing saved) if this attempt no longer holds
/// the run. A step is saved twice: with its tool calls (before they run), then with their
/// results; the second save replaces the first. The run row is locked `FOR SHARE`, so a
/// concurrent reclaim either happens before (and the write sees the new attempt) or waits.
/// A worker saves through [`super::runs::Claimed::save_step`], which binds its attempt.
pub(crate) async fn save(
    executor: impl PgExecutor<'_>,
    workflow_id: WorkflowId,
    attempt: i32,
    step: i32,
    data: &SavedStep,
) -> sqlx::Result<bool> {
    let saved: Option<(i32,)> = sqlx::query_as(
        "WITH held AS (
             SELECT id FROM runs WHERE id = $1 AND attempt = $2 AND status = 'running' FOR SHARE)
         INSERT INTO run_steps (workflow_id, step, attempt, data, text)
         SELECT held.id, $3, $2, $4, $5 FROM held
         ON CONFLICT (workflow_id, step)
         DO UPDATE SET data = EXCLUDED.data, text = EXCLUDED.text, attempt = EXCLUDED.attempt
         RETURNING step",
    )
    .bind(workflow_id)
    .bind(attempt)
    .bind(step)
    .bind(super::storable(data)?)
    .bind(super::storable_text(&data.assistant.text))
    .fetch_optional(executor)
    .await?;
    Ok(saved.is_some())
}

/// The run's last saved step, locked for an update.
pub async fn last_for_update(
    executor: impl PgExecutor<'_>,
    workflow_id: WorkflowId,
) -> sqlx::Result<Option<Step>> {
    sqlx::query_as(
        "SELECT step, attempt, created_at, data FROM run_steps WHERE workflow_id = $1
          ORDER BY step DESC LIMIT 1 FOR UPDATE",
    )
    .bind(workflow_id)
    .fetch_optional(executor)
    .await
}

/// Replaces a step's data without a fence: for the API answering a pause, which holds the
/// run row's lock instead. The model's text does not change.
pub async fn replace(
    executor: impl PgExecutor<'_>,
    workflow_id: WorkflowId,
    step: i32,
    data: &SavedStep,
) -> sqlx::Result<()> {
    sqlx::query("UPDATE run_steps SET data = $3 WHERE workflow_id = $1 AND step = $2")
        .bind(workflow_id)
        .bind(step)
        .bind(Json(data))
        .execute(executor)
        .await?;
    Ok(())
}

/// When retention deleted the run's step payloads (`None`: they are kept, or it has none).
pub async fn expired_at(
    executor: impl PgExecutor<'_>,
    workflow_id: WorkflowId,
) -> sqlx::Result<Option<DateTime<Utc>>> {
    let at: Option<Option<DateTime<Utc>>> =
        sqlx::query_scalar("SELECT steps_expired_at FROM runs WHERE id = $1")
            .bind(workflow_id)
            .fetch_optional(executor)
            .await?;
    Ok(at.flatten())
}

// The steps purge of a batch (`$1` the window, `$2` the batch of runs): see [`purge_expired`].
pub(crate) const PURGE_EXPIRED: &str = "WITH expired AS (
         SELECT id FROM runs
          WHERE finished_at IS NOT NULL AND steps_expired_at IS NULL
            AND finished_at < now() - $1::interval
            AND usage_rolled_up_at IS NOT NULL
            AND status IN ('completed', 'failed', 'cancelled')
          ORDER BY finished_at LIMIT $2
            FOR NO KEY UPDATE SKIP LOCKED),
     gone AS (DELETE FROM run_steps s USING expired e WHERE s.workflow_id = e.id),
     marked AS (
         UPDATE runs r SET steps_expired_at = now(), final_step = NULL
           FROM expired e WHERE r.id = e.id
         RETURNING 1)
     SELECT count(*) FROM marked";

/// Deletes the step payloads (`run_steps` rows and `runs.final_step`) of up to `limit` runs
/// that ended more than `window` ago, oldest first, and marks them (`runs.steps_expired_at`);
/// returns how many runs. Only an ended run whose usage was rolled up
/// ([`super::usage::roll_up`]) qualifies: its steps are the detail the usage report by model
/// reads until then, and a running or paused run has no `finished_at`. A batch deletes at most
/// `limit` runs' steps (each run has at most `max_steps` of them, 200), in one statement.
pub async fn purge_expired(
    executor: impl PgExecutor<'_>,
    window: chrono::Duration,
    limit: i64,
) -> sqlx::Result<u64> {
    let (purged,): (i64,) = sqlx::query_as(PURGE_EXPIRED)
        .bind(window)
        .bind(limit)
        .fetch_one(executor)
        .await?;
    Ok(purged.unsigned_abs())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(id: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: "t".into(),
            arguments: "{}".into(),
        }
    }

    fn step(states: &[(&str, CallState)]) -> SavedStep {
        SavedStep {
            results: states
                .iter()
                .map(|(id, state)| CallResult::new(&call(id), *state))
                .collect(),
            ..SavedStep::default()
        }
    }

    #[test]
    fn client_outputs_answer_every_pending_call_or_change_nothing() {
        let mut paused = step(&[
            ("a", CallState::PendingClient),
            ("b", CallState::PendingClient),
            ("c", CallState::Done),
        ]);
        let before = paused.clone();
        let answer = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(id, out)| ((*id).to_owned(), (*out).to_owned()))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            paused.answer_client(answer(&[("a", "1")])),
            Err(AnswerError::Missing(vec!["b".into()]))
        );
        assert_eq!(
            paused.answer_client(answer(&[("a", "1"), ("a", "2"), ("b", "3")])),
            Err(AnswerError::Unknown("a".into()))
        );
        assert_eq!(
            paused.answer_client(answer(&[("c", "1")])),
            Err(AnswerError::Unknown("c".into()))
        );
        assert_eq!(paused, before, "a refused answer changes nothing");
        assert_eq!(
            paused.answer_client(answer(&[("b", "2"), ("a", "1")])),
            Ok(())
        );
        assert_eq!(paused.results[0].output, "1");
        assert_eq!(paused.results[1].state, CallState::ClientOutput);
        assert!(
            !paused.is_settled(),
            "the next attempt settles client outputs"
        );
    }

    #[test]
    fn a_decision_needs_a_pending_approval_that_has_not_expired() {
        let mut paused = step(&[
            ("a", CallState::PendingApproval),
            ("b", CallState::PendingApproval),
            ("c", CallState::PendingClient),
        ]);
        assert_eq!(
            paused.decide("c", true, None, false),
            Err(DecideError::NotPending)
        );
        assert_eq!(
            paused.decide("b", true, None, true),
            Err(DecideError::Expired)
        );
        let long = "x".repeat(MAX_REASON_CHARS + 10);
        assert_eq!(paused.decide("a", false, Some(long), false), Ok(()));
        assert_eq!(paused.results[0].state, CallState::Denied);
        assert_eq!(
            paused.results[0].reason.as_deref().map(str::len),
            Some(MAX_REASON_CHARS)
        );
        assert_eq!(
            paused.decide("a", true, None, false),
            Err(DecideError::NotPending),
            "decided once"
        );
    }

    #[test]
    fn the_stored_json_keeps_the_shape_earlier_releases_wrote() {
        let stored = serde_json::json!({
            "assistant": {"text": "Let me look.", "tool_calls": [{"id": "c1", "name": "t",
                "arguments": "{\"q\":1}"}]},
            "results": [{"tool_call_id": "c1", "name": "t", "output": "", "is_error": false,
                "state": "pending_approval", "expires_at": "2026-11-23T10:00:00Z",
                "published": false}],
            "usage": {"input_tokens": 3, "output_tokens": 4}});
        let step: SavedStep = serde_json::from_value(stored).expect("parses");
        assert_eq!(step.results[0].state, CallState::PendingApproval);
        assert_eq!(step.assistant.tool_calls[0].parsed_arguments()["q"], 1);
        assert!(step.sources.is_empty());
        assert!(!step.is_settled());
    }

    #[test]
    fn a_result_over_the_limit_is_cut_once_with_a_marker() {
        assert_eq!(truncate("x".repeat(10)), "x".repeat(10));
        let exact = "é".repeat(MAX_RESULT_CHARS);
        assert_eq!(
            truncate(exact.clone()),
            exact,
            "at the limit nothing is cut"
        );
        let cut = truncate("é".repeat(MAX_RESULT_CHARS + 5));
        assert!(
            cut.ends_with("\n[truncated: 45 more characters]"),
            "{cut:.20}"
        );
        assert!(cut.chars().count() <= MAX_RESULT_CHARS);
        assert_eq!(
            cut.chars().filter(|c| *c == 'é').count(),
            MAX_RESULT_CHARS - 40
        );
        assert_eq!(truncate(cut.clone()), cut, "cutting again changes nothing");
    }
}
