//! What a run records: its token usage, why it failed, what it waits for while paused, and the
//! parts of the assistant message it writes.
//!
//! The worker writes these and the API returns them; both go through these types, so the JSON
//! stored in `runs.error`, `runs.usage`, `runs.pending_action` and `messages.parts` has exactly
//! one definition. The failure codes are part of the API: they appear in the OpenAPI document.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::event::{ApprovalRequested, Data, InputRequested, RequiresAction};
use crate::pricing::Usd;

/// Token usage of one or more model calls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Usage {
    /// Tokens in the prompts (cached or not).
    pub input_tokens: u64,
    /// Tokens generated (reasoning included).
    pub output_tokens: u64,
    /// Of `input_tokens`, those the provider read from its prompt cache (as it reports them;
    /// absent when none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cached_input_tokens: u64,
    /// Of `input_tokens`, those the provider wrote to its prompt cache (absent when none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_write_tokens: u64,
    /// Of `output_tokens`, the model's reasoning (absent when none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub reasoning_tokens: u64,
    /// What these tokens cost in US dollars, at the prices of the provider that served each
    /// call (`prices`, `SPOOL_LLM_PRICES`); `null` when any of them was on a model with no
    /// price (unpriced: unknown, never 0), or was recorded before costs were.
    #[serde(default)]
    #[schema(value_type = Option<f64>)]
    pub cost_usd: Option<Usd>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Usage {
    /// Adds another call's usage to this one.
    ///
    /// The cost is the sum of both; unknown (`None`) when either side's is, except a side
    /// with no tokens, which costs nothing whatever it says.
    pub fn add(&mut self, other: Usage) {
        self.cost_usd = if other.is_empty() {
            self.cost_usd
        } else if self.is_empty() {
            other.cost_usd
        } else {
            match (self.cost_usd, other.cost_usd) {
                (Some(a), Some(b)) => Some(Usd(a.0 + b.0)),
                _ => None,
            }
        };
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cached_input_tokens += other.cached_input_tokens;
        self.cache_write_tokens += other.cache_write_tokens;
        self.reasoning_tokens += other.reasoning_tokens;
    }

    /// Whether no token was used.
    pub fn is_empty(&self) -> bool {
        self.input_tokens == 0 && self.output_tokens == 0
    }

    /// This usage at `price`, the price of the model that served it (`None`: unpriced, the
    /// cost is unknown).
    #[must_use]
    pub fn priced(mut self, price: Option<&crate::pricing::ModelPrice>) -> Self {
        self.cost_usd = price.map(|p| p.cost(&self));
        self
    }
}

/// Why a run failed: every code a failed run can carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FailureCode {
    /// The run's agent was deleted before the run started (only a run enqueued before runs
    /// stored their agent's spec: a later one executes the spec it was enqueued with).
    AgentNotFound,
    /// The model could not be reached, or kept failing after its retries (429, 5xx, timeouts),
    /// or no provider serves it.
    ModelUnavailable,
    /// The provider refused the request (a 4xx other than 408 and 429, or an invalid response).
    ModelError,
    /// An `on_run_start` hook blocked the run.
    BlockedByHook,
    /// A `pre_response` hook blocked the final answer (runs that ended before hooks' denials
    /// became answers: a denial now completes the run with `blocked: true` on its message).
    ResponseBlocked,
    /// The model called the same tool with the same arguments three times in a row.
    DoomLoop,
    /// The run kept crashing or hanging its workers (reclaimed more than `SPOOL_MAX_RECLAIMS`
    /// times after its lease expired).
    TooManyAttempts,
    /// The worker failed unexpectedly (a panic).
    InternalError,
    /// The run waited for client tool outputs longer than the agent allows
    /// (`limits.human_timeout_secs`, default 86400), or for the answer to a graph agent's
    /// `human_input` node (`graph_spec.limits.human_timeout_seconds`).
    HumanTimeout,
    /// The run took longer than `limits.timeout_secs`, counted from enqueue by the database
    /// clock (pauses and crashes included).
    Timeout,
    /// The model asked for more tool calls than `limits.max_tool_calls` allows in one run.
    MaxToolCallsExceeded,
    /// A daily token budget of the run's user or tenant (`SPOOL_QUOTA_*_DAILY_TOKENS`, or its
    /// agent's `governance`) was spent: the run stopped before its next model call.
    BudgetExceeded,
    /// The agent has a `response_format` and the final answer did not validate against its
    /// schema, even after one repair round.
    InvalidOutput,
    /// The prompt did not fit the model's context window even after the thread's oldest turns
    /// were summarised (3 times at most), or nothing was left to summarise.
    ContextOverflow,
    /// A graph agent's run executed `limits.max_steps` nodes without reaching an `end` node,
    /// or reached a node none of whose edges' conditions held.
    MaxStepsExceeded,
}

impl FailureCode {
    /// Every code, in the order the documentation lists them.
    pub const ALL: [Self; 15] = [
        Self::AgentNotFound,
        Self::ModelUnavailable,
        Self::ModelError,
        Self::BlockedByHook,
        Self::ResponseBlocked,
        Self::DoomLoop,
        Self::TooManyAttempts,
        Self::InternalError,
        Self::HumanTimeout,
        Self::Timeout,
        Self::MaxToolCallsExceeded,
        Self::BudgetExceeded,
        Self::InvalidOutput,
        Self::ContextOverflow,
        Self::MaxStepsExceeded,
    ];

    /// The code as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AgentNotFound => "agent_not_found",
            Self::ModelUnavailable => "model_unavailable",
            Self::ModelError => "model_error",
            Self::BlockedByHook => "blocked_by_hook",
            Self::ResponseBlocked => "response_blocked",
            Self::DoomLoop => "doom_loop",
            Self::TooManyAttempts => "too_many_attempts",
            Self::InternalError => "internal_error",
            Self::HumanTimeout => "human_timeout",
            Self::Timeout => "timeout",
            Self::MaxToolCallsExceeded => "max_tool_calls_exceeded",
            Self::BudgetExceeded => "budget_exceeded",
            Self::InvalidOutput => "invalid_output",
            Self::ContextOverflow => "context_overflow",
            Self::MaxStepsExceeded => "max_steps_exceeded",
        }
    }

    /// Whether a client may retry later with a chance of success: the model was unavailable,
    /// the run ran out of time or of attempts, or a budget was spent (it refills). Every other
    /// failure would happen again.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            Self::ModelUnavailable | Self::Timeout | Self::TooManyAttempts | Self::BudgetExceeded
        )
    }
}

/// A failed run's error: a code and a message for people.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RunFailure {
    /// What went wrong, as a stable code.
    pub code: FailureCode,
    /// The details, for people.
    pub message: String,
}

impl RunFailure {
    /// A failure with `code`.
    pub fn new(code: FailureCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

/// One call a paused run waits on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PendingCall {
    /// The call's id (answer it with this id).
    pub tool_call_id: String,
    /// The tool the model called.
    pub tool_name: String,
    /// The arguments (JSON; a string if the model wrote something that is not JSON).
    #[schema(value_type = Object)]
    pub arguments: Value,
}

/// A child run a waiting run waits for: the run an agent tool call started.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AgentCall {
    /// The call that started it.
    pub tool_call_id: String,
    /// The agent tool the model called.
    pub tool_name: String,
    /// The child run (`GET /v1/workflows/{id}`).
    pub workflow_id: crate::ids::WorkflowId,
}

/// What a paused run waits for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum PendingAction {
    /// `requires_action`: the outputs of these client tool calls
    /// (`POST .../tool_outputs`).
    SubmitToolOutputs {
        /// The calls to answer, all at once.
        tool_calls: Vec<PendingCall>,
        /// When the run stops waiting and fails (`human_timeout`).
        #[serde(default)]
        expires_at: Option<DateTime<Utc>>,
    },
    /// `awaiting_approval`: a person's decision on this call (`POST .../approvals/{id}`).
    Approval {
        /// The call's id.
        tool_call_id: String,
        /// The tool the model called.
        tool_name: String,
        /// The arguments.
        #[schema(value_type = Object)]
        arguments: Value,
        /// When no decision counts as a denial.
        #[serde(default)]
        expires_at: Option<DateTime<Utc>>,
    },
    /// `requires_action`: a graph agent's `human_input` node waits for the user's answer
    /// (`POST .../input`).
    HumanInput {
        /// The node.
        node: String,
        /// The rendered question.
        prompt: String,
        /// When the run stops waiting and fails (`human_timeout`).
        #[serde(default)]
        expires_at: Option<DateTime<Utc>>,
    },
    /// `waiting`: the agent runs these calls started; the run goes on once all have ended.
    AgentRuns {
        /// The child runs.
        runs: Vec<AgentCall>,
    },
}

impl PendingAction {
    /// The same action, waiting until `deadline`.
    #[must_use]
    pub fn until(mut self, deadline: DateTime<Utc>) -> Self {
        match &mut self {
            Self::SubmitToolOutputs { expires_at, .. }
            | Self::Approval { expires_at, .. }
            | Self::HumanInput { expires_at, .. } => {
                *expires_at = Some(deadline);
            }
            Self::AgentRuns { .. } => {}
        }
        self
    }

    /// The stream event that tells a client what the run waits for, and until when: what the
    /// worker publishes when the run pauses, and what the gateway sends if that was lost.
    /// `None` for a wait on agent runs: the client needs to do nothing, and the children's
    /// own events follow.
    pub fn event(&self) -> Option<Data> {
        Some(match self {
            Self::AgentRuns { .. } => return None,
            Self::Approval {
                tool_call_id,
                tool_name,
                arguments,
                expires_at,
            } => ApprovalRequested {
                tool_call_id: tool_call_id.clone(),
                tool_name: tool_name.clone(),
                arguments: arguments.clone(),
                expires_at: *expires_at,
            }
            .into(),
            Self::SubmitToolOutputs {
                tool_calls,
                expires_at,
            } => RequiresAction {
                tool_calls: tool_calls.clone(),
                expires_at: *expires_at,
            }
            .into(),
            Self::HumanInput {
                node,
                prompt,
                expires_at,
            } => InputRequested {
                node: node.clone(),
                prompt: prompt.clone(),
                expires_at: *expires_at,
            }
            .into(),
        })
    }
}

/// A source the answer cites: a chunk of a retrieval result whose marker (`[n]` or
/// `[^chunk_id]`) the answer holds (DESIGN section 9, [`crate::citation`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Citation {
    /// Its number among the answer's citations, from 1, in order of first appearance.
    #[serde(default)]
    pub index: u32,
    /// The chunk's id, if its result gave one.
    #[serde(default)]
    pub chunk_id: Option<String>,
    /// Its title.
    #[schema(value_type = Option<String>)]
    pub title: Value,
    /// Its address.
    #[schema(value_type = Option<String>)]
    pub url: Value,
    /// The start of the chunk's text.
    #[schema(value_type = Option<String>)]
    pub snippet: Value,
    /// Where the answer cites it: one span per marker, in characters of the stored text.
    #[serde(default)]
    pub spans: Vec<Span>,
}

/// A part of a text, in characters (Unicode scalar values): `start` included, `end` not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Span {
    /// The first character.
    pub start: usize,
    /// The character after the last.
    pub end: usize,
}

/// One part of an assistant message: its text blocks, tool steps and citations, in order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum MessagePart {
    /// A block of text.
    Text {
        /// The text.
        text: String,
    },
    /// A tool call the model made.
    ToolCall {
        /// The step (model call) it belongs to.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        step: Option<u32>,
        /// The call's id.
        tool_call_id: String,
        /// The tool.
        name: String,
        /// The arguments, as the JSON text the model wrote.
        arguments: String,
    },
    /// A tool call's result.
    ToolResult {
        /// The step (model call) it belongs to.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        step: Option<u32>,
        /// The call it answers.
        tool_call_id: String,
        /// The tool.
        name: String,
        /// The result the model saw.
        output: String,
        /// Whether the call failed.
        is_error: bool,
    },
    /// The sources the answer cites.
    Citations {
        /// The sources.
        citations: Vec<Citation>,
    },
}
