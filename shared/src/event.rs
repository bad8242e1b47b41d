//! The events of a run, as they are stored in the thread's Redis Stream and sent over SSE.
//!
//! Every event is an envelope, versioned (`v: 1`), that names its thread, workflow, message and
//! attempt; `type` says what happened and `data` carries the details:
//!
//! ```json
//! {"v":1,"type":"text_delta","thread_id":"…","workflow_id":"…","message_id":"…","attempt":1,
//!  "data":{"block_id":"b0","delta":"Hel"}}
//! ```
//!
//! Text travels JSON-encoded, so no payload (newlines, `\r`, `id:`, `data:`) can forge an SSE
//! field or event.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::ids::{MessageId, ThreadId, WorkflowId};
use crate::run::{RunFailure, Usage};
use crate::status::RunStatus;

/// The envelope version.
pub const VERSION: u32 = 1;

/// What happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventType {
    /// The assistant message begins.
    MessageStart,
    /// A text block begins.
    TextStart,
    /// More text of a block.
    TextDelta,
    /// A text block ends.
    TextEnd,
    /// A tool call (`phase: call`) or its result (`phase: result`).
    Step,
    /// Sources the answer cites.
    Citations,
    /// The run is alive (its lease was renewed).
    Heartbeat,
    /// A new attempt resumes after a crash: drop what was shown since the last step result or
    /// `message_start`.
    AttemptRestarted,
    /// The run waits for client tool outputs.
    RequiresAction,
    /// A tool call waits for a person's approval.
    ApprovalRequested,
    /// Something went wrong (`code`, `message`, `retryable`).
    Error,
    /// The assistant message ends (`status`, `usage`).
    MessageEnd,
    /// The run is over; nothing more follows for this message.
    Done,
}

impl EventType {
    /// The name on the wire (`event:` field, `type` field, stream entry field `t`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MessageStart => "message_start",
            Self::TextStart => "text_start",
            Self::TextDelta => "text_delta",
            Self::TextEnd => "text_end",
            Self::Step => "step",
            Self::Citations => "citations",
            Self::Heartbeat => "heartbeat",
            Self::AttemptRestarted => "attempt_restarted",
            Self::RequiresAction => "requires_action",
            Self::ApprovalRequested => "approval_requested",
            Self::Error => "error",
            Self::MessageEnd => "message_end",
            Self::Done => "done",
        }
    }
}

/// One event of a run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Envelope version ([`VERSION`]).
    pub v: u32,
    /// What happened.
    #[serde(rename = "type")]
    pub kind: EventType,
    /// The thread.
    pub thread_id: ThreadId,
    /// The run.
    pub workflow_id: WorkflowId,
    /// The assistant message.
    pub message_id: MessageId,
    /// The attempt that produced it.
    pub attempt: i32,
    /// How deep its run is in a tree of agent calls: absent (0) for the thread's own run, 1
    /// for a run an agent tool call of it started, and so on.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub depth: u32,
    /// The details; their shape depends on `type`.
    pub data: Value,
}

#[expect(
    clippy::trivially_copy_pass_by_ref,
    reason = "serde's skip_serializing_if"
)]
fn is_zero(depth: &u32) -> bool {
    *depth == 0
}

/// Where an event belongs: everything but the type and data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Origin {
    /// The thread.
    pub thread_id: ThreadId,
    /// The run.
    pub workflow_id: WorkflowId,
    /// The assistant message.
    pub message_id: MessageId,
    /// The attempt.
    pub attempt: i32,
    /// The run's depth in a tree of agent calls.
    pub depth: u32,
}

impl Origin {
    /// An event of this origin.
    pub fn event(&self, kind: EventType, data: Value) -> Event {
        Event {
            v: VERSION,
            kind,
            thread_id: self.thread_id,
            workflow_id: self.workflow_id,
            message_id: self.message_id,
            attempt: self.attempt,
            depth: self.depth,
            data,
        }
    }
}

/// The events that end the message of a run that ended with `status`, in order: the error (of
/// a failed run), `message_end` with the status and usage, and `done`. A worker publishes them
/// once it has written the run's end; the API, for a run it cancelled while no worker held it.
pub fn end_of_message(
    status: RunStatus,
    usage: Usage,
    error: Option<&RunFailure>,
) -> Vec<(EventType, Value)> {
    let mut events = Vec::with_capacity(3);
    if let Some(error) = error {
        let data = json!({"code": error.code, "message": error.message, "retryable": false});
        events.push((EventType::Error, data));
    }
    events.push((
        EventType::MessageEnd,
        json!({"status": status, "usage": usage}),
    ));
    events.push((EventType::Done, json!({"status": status})));
    events
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_envelope_has_the_contract_s_shape_and_escapes_text() -> serde_json::Result<()> {
        let origin = Origin {
            thread_id: ThreadId::new(),
            workflow_id: WorkflowId::new(),
            message_id: MessageId::new(),
            attempt: 2,
            depth: 0,
        };
        let event = origin.event(
            EventType::TextDelta,
            serde_json::json!({"block_id": "b0", "delta": "a\r\nid: 9\n\ndata: x"}),
        );
        let json = serde_json::to_string(&event)?;
        assert!(!json.contains('\n') && !json.contains('\r'), "{json}");
        let value: Value = serde_json::from_str(&json)?;
        assert_eq!(value["v"], 1);
        assert_eq!(value["type"], "text_delta");
        assert_eq!(value["attempt"], 2);
        assert_eq!(value["data"]["delta"], "a\r\nid: 9\n\ndata: x");
        assert_eq!(serde_json::from_str::<Event>(&json)?, event);
        Ok(())
    }
}
