//! The OpenAPI schemas of the native stream's events, one per event type: the envelope
//! `{v, type, thread_id, workflow_id, message_id, attempt, data}` with the `data` of its type.
//! Documentation only: the worker writes the events (`spool_shared::event`), the gateway relays
//! their JSON as stored; `api/tests/api/ai_sdk.rs` validates a run's stored events against
//! [`StreamEnvelope`].

#![allow(dead_code, reason = "documentation types: only their schemas are used")]

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;

use spool_shared::run::{Citation, PendingCall, Usage};
use spool_shared::status::RunStatus;
use spool_shared::{MessageId, ThreadId, WorkflowId};

/// `message_start` data.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct MessageStartData {
    /// `assistant`.
    pub role: String,
}

/// `text_start` and `text_end` data.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TextBlockData {
    /// The text block (`b` and the step's number).
    pub block_id: String,
}

/// `text_delta` data.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TextDeltaData {
    /// The text block.
    pub block_id: String,
    /// More of its text.
    pub delta: String,
}

/// `step` data: a tool call (`phase: call`) or its result (`phase: result`).
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum StepData {
    /// The call.
    Call(StepCallData),
    /// Its result.
    Result(StepResultData),
}

/// A `step` event's call.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct StepCallData {
    /// `call`.
    #[schema(pattern = "^call$")]
    pub phase: String,
    /// The step (model call) it belongs to.
    pub step: u32,
    /// The call's id.
    pub tool_call_id: String,
    /// The tool.
    pub tool_name: String,
    /// The arguments (JSON; a string if the model wrote something that is not JSON).
    pub arguments: Value,
}

/// A `step` event's result.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct StepResultData {
    /// `result`.
    #[schema(pattern = "^result$")]
    pub phase: String,
    /// The step it belongs to.
    pub step: u32,
    /// The call it answers.
    pub tool_call_id: String,
    /// The tool.
    pub tool_name: String,
    /// What the model sees.
    pub output: String,
    /// Whether the call failed.
    pub is_error: bool,
}

/// `citations` data.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct CitationsData {
    /// The sources the answer cites.
    pub citations: Vec<Citation>,
}

/// `heartbeat` data (nothing).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct HeartbeatData {}

/// `attempt_restarted` data.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct AttemptRestartedData {
    /// The new attempt.
    pub attempt: i32,
}

/// `requires_action` data.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct RequiresActionData {
    /// The client tool calls to answer, all at once.
    pub tool_calls: Vec<PendingCall>,
    /// When the run stops waiting and fails (`human_timeout`).
    pub expires_at: Option<DateTime<Utc>>,
}

/// `approval_requested` data.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ApprovalRequestedData {
    /// The call's id.
    pub tool_call_id: String,
    /// The tool.
    pub tool_name: String,
    /// The arguments.
    pub arguments: Value,
    /// When no decision counts as a denial.
    pub expires_at: Option<DateTime<Utc>>,
}

/// `error` data.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ErrorData {
    /// The failure code (see `FailureCode`).
    pub code: String,
    /// Human text.
    pub message: String,
    /// Whether trying again may help.
    pub retryable: bool,
}

/// `message_end` data.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct MessageEndData {
    /// The run's terminal status.
    pub status: RunStatus,
    /// Its token usage.
    pub usage: Usage,
}

/// `done` data.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct DoneData {
    /// The run's terminal status.
    pub status: RunStatus,
}

/// One envelope type per event type, each with the envelope's fields and its own `data`.
macro_rules! envelopes {
    ($($name:ident: $pattern:literal => $data:ty, $doc:literal;)*) => {
        $(
            #[doc = $doc]
            #[derive(Debug, Serialize, utoipa::ToSchema)]
            pub struct $name {
                /// The envelope's version (1).
                pub v: u32,
                /// The event type.
                #[serde(rename = "type")]
                #[schema(pattern = $pattern)]
                pub kind: String,
                /// The thread.
                pub thread_id: ThreadId,
                /// The run.
                pub workflow_id: WorkflowId,
                /// The assistant message.
                pub message_id: MessageId,
                /// The attempt that wrote it.
                pub attempt: i32,
                /// How deep its run is in a tree of agent calls: absent for the thread's own
                /// run, 1 for a run its agent tool call started, and so on.
                #[serde(skip_serializing_if = "Option::is_none")]
                pub depth: Option<u32>,
                /// The details of this type.
                pub data: $data,
            }
        )*

        /// The `data:` of a stored stream event: its envelope, typed by its `type`.
        #[derive(Debug, Serialize, utoipa::ToSchema)]
        #[serde(untagged)]
        pub enum StreamEnvelope {
            $(
                #[doc = $doc]
                $name($name),
            )*
        }
    };
}

envelopes! {
    MessageStartEvent: "^message_start$" => MessageStartData, "The assistant message begins.";
    TextStartEvent: "^text_start$" => TextBlockData, "A text block begins.";
    TextDeltaEvent: "^text_delta$" => TextDeltaData, "More text of a block.";
    TextEndEvent: "^text_end$" => TextBlockData, "A text block ends.";
    StepEvent: "^step$" => StepData, "A tool call, or its result.";
    CitationsEvent: "^citations$" => CitationsData, "The sources the answer cites.";
    HeartbeatEvent: "^heartbeat$" => HeartbeatData, "The run is alive.";
    AttemptRestartedEvent: "^attempt_restarted$" => AttemptRestartedData, "A new attempt resumes after a crash: drop what was shown since the last step result or message_start; the new attempt shows again what followed it.";
    RequiresActionEvent: "^requires_action$" => RequiresActionData, "The run waits for client tool outputs.";
    ApprovalRequestedEvent: "^approval_requested$" => ApprovalRequestedData, "A tool call waits for a person's approval.";
    ErrorEvent: "^error$" => ErrorData, "The run failed (or something went wrong).";
    MessageEndEvent: "^message_end$" => MessageEndData, "The assistant message ends.";
    DoneEvent: "^done$" => DoneData, "The run is over.";
}
