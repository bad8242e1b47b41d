//! The events of a run, as they are stored in the thread's Redis Stream and sent over SSE.
//!
//! Every event is an envelope, versioned (`v: 1`), that names its thread, workflow, message and
//! attempt; `type` says what happened and `data` carries the details:
//!
//! ```json
//! {"v":1,"type":"text_delta","thread_id":"…","workflow_id":"…","message_id":"…","attempt":1,
//!  "data":{"block_id":"s1","delta":"Hel"}}
//! ```
//!
//! [`Data`] is the one definition of every type's details: one struct per event type, written
//! by the worker (and by the API for a run it cancels), read by the gateway's translators, the
//! CLI and the tests through these types, and documented in the OpenAPI document from them
//! ([`schema`]). Nobody builds or reads an event's `data` as loose JSON.
//!
//! Text travels JSON-encoded, so no payload (newlines, `\r`, `id:`, `data:`) can forge an SSE
//! field or event.

pub mod schema;
pub mod transcript;

use std::fmt;

use chrono::{DateTime, Utc};
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, Visitor};
use serde::ser::{SerializeStruct as _, Serializer};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ids::{MessageId, ThreadId, WorkflowId};
use crate::run::{Citation, FailureCode, PendingCall, RunFailure, Usage};
use crate::status::{Role, RunStatus};

/// The envelope version.
pub const VERSION: u32 = 1;

/// The id of a text block: `s` and the number of the step whose model call wrote it (`s1`),
/// so a new attempt that redoes a step writes the same block again.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(transparent)]
#[schema(value_type = String, example = "s1")]
pub struct BlockId(pub String);

impl BlockId {
    /// The block of step `step`'s text.
    pub fn of_step(step: u32) -> Self {
        Self(format!("s{step}"))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for BlockId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// `message_start`: the assistant message begins.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = MessageStartData)]
pub struct MessageStart {
    /// Always `assistant`.
    pub role: Role,
    /// The model that answers, when the worker knows it (absent for a run that ends before its
    /// agent runs: cancelled while queued, its agent deleted, too many attempts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

impl MessageStart {
    /// The start of an assistant message, answered by `model` if known.
    pub fn new(model: Option<String>) -> Self {
        Self {
            role: Role::Assistant,
            model,
        }
    }
}

/// `text_start`: a text block begins.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = TextStartData)]
pub struct TextStart {
    /// The block.
    pub block_id: BlockId,
}

/// `text_delta`: more text of a block.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = TextDeltaData)]
pub struct TextDelta {
    /// The block.
    pub block_id: BlockId,
    /// More of its text.
    pub delta: String,
}

/// `text_end`: a text block ends.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = TextEndData)]
pub struct TextEnd {
    /// The block.
    pub block_id: BlockId,
}

/// `step`: a tool call (`phase: call`) or its result (`phase: result`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "phase", rename_all = "snake_case")]
#[schema(as = StepData)]
pub enum Step {
    /// The model called a tool.
    Call(StepCall),
    /// The call's result.
    Result(StepResult),
}

/// A `step` event's call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = StepCallData)]
pub struct StepCall {
    /// The step (model call) it belongs to.
    pub step: u32,
    /// The call's id.
    pub tool_call_id: String,
    /// The tool.
    pub tool_name: String,
    /// The arguments (JSON; a string if the model wrote something that is not JSON).
    #[schema(value_type = Object)]
    pub arguments: Value,
}

impl StepCall {
    /// The arguments as the JSON text a client shows (a string as it is, none as nothing).
    pub fn arguments_text(&self) -> String {
        match &self.arguments {
            Value::String(text) => text.clone(),
            Value::Null => String::new(),
            other => other.to_string(),
        }
    }
}

/// A `step` event's result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = StepResultData)]
pub struct StepResult {
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

/// `step_start`: a step begins; its model call follows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = StepStartData)]
pub struct StepStart {
    /// The step (the same numbers as `step` events).
    pub step: u32,
    /// The model asked.
    pub model: String,
}

/// `step_end`: a step is over and saved (after its tool results, if it called tools). A
/// restarted attempt does not repeat the `step_end` of a step saved before it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = StepEndData)]
pub struct StepEnd {
    /// The step.
    pub step: u32,
    /// The tokens of its model call (continuations and repairs included).
    pub usage: Usage,
    /// Why its model call ended: `stop`, `tool_calls`, `length`, `content_filter`, or what
    /// else the provider said.
    pub finish_reason: String,
}

/// `citations`: the sources the answer cites.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = CitationsData)]
pub struct Citations {
    /// The sources.
    pub citations: Vec<Citation>,
}

/// `heartbeat`: the run is alive (its lease was renewed); no details.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = HeartbeatData)]
pub struct Heartbeat {}

/// `attempt_restarted`: a new attempt resumes after a crash; a client drops what it showed
/// since the last `step` result or `message_start`, and the new attempt shows again what
/// followed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = AttemptRestartedData)]
pub struct AttemptRestarted {
    /// The new attempt.
    pub attempt: i32,
}

/// `requires_action`: the run waits for the outputs of client tool calls.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = RequiresActionData)]
pub struct RequiresAction {
    /// The calls to answer, all at once (`POST /v1/workflows/{id}/tool_outputs`).
    pub tool_calls: Vec<PendingCall>,
    /// When the run stops waiting and fails (`human_timeout`).
    pub expires_at: Option<DateTime<Utc>>,
}

/// `approval_requested`: a tool call waits for a person's decision.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = ApprovalRequestedData)]
pub struct ApprovalRequested {
    /// The call's id (`POST /v1/workflows/{id}/approvals/{tool_call_id}`).
    pub tool_call_id: String,
    /// The tool.
    pub tool_name: String,
    /// The arguments.
    #[schema(value_type = Object)]
    pub arguments: Value,
    /// When no decision counts as a denial.
    pub expires_at: Option<DateTime<Utc>>,
}

/// `input_requested`: a graph agent's `human_input` node waits for the user's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = InputRequestedData)]
pub struct InputRequested {
    /// The node.
    pub node: String,
    /// The question (answer it with `POST /v1/workflows/{id}/input {text}`).
    pub prompt: String,
    /// When the run stops waiting and fails (`human_timeout`).
    pub expires_at: Option<DateTime<Utc>>,
}

/// `error`: the run failed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = ErrorData)]
pub struct Failure {
    /// The failure code.
    pub code: FailureCode,
    /// Human text.
    pub message: String,
    /// Whether trying again later may help.
    pub retryable: bool,
}

/// `message_end`: the assistant message ends.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = MessageEndData)]
pub struct MessageEnd {
    /// The run's terminal status.
    pub status: RunStatus,
    /// Its token usage.
    pub usage: Usage,
    /// Whether a `pre_response` hook replaced the answer (absent: it did not).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub blocked: bool,
    /// The validated structured answer, for an agent with a `response_format`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub output: Option<Value>,
}

/// `done`: the run is over; nothing more follows for this message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(as = DoneData)]
pub struct Done {
    /// The run's terminal status.
    pub status: RunStatus,
}

/// Declares [`EventType`] and [`Data`] from one list, so a type's name, its details and its
/// schema cannot drift apart.
macro_rules! events {
    ($($(#[doc = $doc:literal])* $variant:ident($payload:ty) = $name:literal;)*) => {
        /// What happened.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum EventType {
            $($(#[doc = $doc])* #[serde(rename = $name)] $variant,)*
        }

        impl EventType {
            /// Every event type, in the order of the documentation.
            pub const ALL: &'static [Self] = &[$(Self::$variant,)*];

            /// The name on the wire (`event:` field, `type` field, the stream entry's type).
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $name,)*
                }
            }
        }

        /// What happened, with its details: one variant per event type. Serialized, it is the
        /// envelope's `data` (the type is the envelope's `type`).
        #[derive(Clone, Debug, PartialEq)]
        pub enum Data {
            $($(#[doc = $doc])* $variant($payload),)*
        }

        impl Data {
            /// The event's type.
            pub fn kind(&self) -> EventType {
                match self {
                    $(Self::$variant(_) => EventType::$variant,)*
                }
            }
        }

        impl Serialize for Data {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                match self {
                    $(Self::$variant(data) => data.serialize(serializer),)*
                }
            }
        }

        impl<'de> DeserializeSeed<'de> for EventType {
            type Value = Data;

            fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Data, D::Error> {
                Ok(match self {
                    $(Self::$variant => Data::$variant(<$payload>::deserialize(deserializer)?),)*
                })
            }
        }

        $(
            impl From<$payload> for Data {
                fn from(data: $payload) -> Self {
                    Self::$variant(data)
                }
            }
        )*

        impl schema::Payloads for EventType {
            fn payload_schema(self) -> (String, utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>) {
                use utoipa::{PartialSchema as _, ToSchema as _};
                match self {
                    $(Self::$variant => (<$payload>::name().into_owned(), <$payload>::schema()),)*
                }
            }

            fn payload_schemas(
                schemas: &mut Vec<(String, utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>)>,
            ) {
                use utoipa::ToSchema as _;
                $(<$payload>::schemas(schemas);)*
            }

            fn description(self) -> &'static str {
                match self {
                    $(Self::$variant => concat!($($doc, "\n",)*).trim_ascii(),)*
                }
            }
        }
    };
}

events! {
    /// The assistant message begins.
    MessageStart(MessageStart) = "message_start";
    /// A text block begins.
    TextStart(TextStart) = "text_start";
    /// More text of a block.
    TextDelta(TextDelta) = "text_delta";
    /// A text block ends.
    TextEnd(TextEnd) = "text_end";
    /// A step begins (`step`, `model`), before its model call.
    StepStart(StepStart) = "step_start";
    /// A tool call (`phase: call`) or its result (`phase: result`).
    Step(Step) = "step";
    /// A step is over and saved (`step`, `usage`, `finish_reason`).
    StepEnd(StepEnd) = "step_end";
    /// Sources the answer cites.
    Citations(Citations) = "citations";
    /// The run is alive (its lease was renewed).
    Heartbeat(Heartbeat) = "heartbeat";
    /// A new attempt resumes after a crash: drop what was shown since the last step result or
    /// `message_start`; the new attempt shows again what followed it.
    AttemptRestarted(AttemptRestarted) = "attempt_restarted";
    /// The run waits for client tool outputs.
    RequiresAction(RequiresAction) = "requires_action";
    /// A tool call waits for a person's approval.
    ApprovalRequested(ApprovalRequested) = "approval_requested";
    /// A graph agent's `human_input` node waits for the user's answer (`node`, `prompt`,
    /// `expires_at`).
    InputRequested(InputRequested) = "input_requested";
    /// The run failed (`code`, `message`, `retryable`).
    Error(Failure) = "error";
    /// The assistant message ends (`status`, `usage`).
    MessageEnd(MessageEnd) = "message_end";
    /// The run is over; nothing more follows for this message.
    Done(Done) = "done";
}

impl From<StepCall> for Data {
    fn from(call: StepCall) -> Self {
        Self::Step(Step::Call(call))
    }
}

impl From<StepResult> for Data {
    fn from(result: StepResult) -> Self {
        Self::Step(Step::Result(result))
    }
}

/// One event of a run.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// Envelope version ([`VERSION`]).
    pub v: u32,
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
    pub depth: u32,
    /// What happened, and its details.
    pub data: Data,
}

impl Event {
    /// What happened.
    pub fn kind(&self) -> EventType {
        self.data.kind()
    }
}

impl Serialize for Event {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let fields = if self.depth == 0 { 7 } else { 8 };
        let mut envelope = serializer.serialize_struct("Event", fields)?;
        envelope.serialize_field("v", &self.v)?;
        envelope.serialize_field("type", &self.kind())?;
        envelope.serialize_field("thread_id", &self.thread_id)?;
        envelope.serialize_field("workflow_id", &self.workflow_id)?;
        envelope.serialize_field("message_id", &self.message_id)?;
        envelope.serialize_field("attempt", &self.attempt)?;
        if self.depth != 0 {
            envelope.serialize_field("depth", &self.depth)?;
        } else {
            envelope.skip_field("depth")?;
        }
        envelope.serialize_field("data", &self.data)?;
        envelope.end()
    }
}

impl<'de> Deserialize<'de> for Event {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        const FIELDS: &[&str] = &[
            "v",
            "type",
            "thread_id",
            "workflow_id",
            "message_id",
            "attempt",
            "depth",
            "data",
        ];
        deserializer.deserialize_struct("Event", FIELDS, EnvelopeVisitor)
    }
}

/// An envelope's keys.
#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "snake_case")]
enum Field {
    V,
    Type,
    ThreadId,
    WorkflowId,
    MessageId,
    Attempt,
    Depth,
    Data,
    #[serde(other)]
    Other,
}

/// Reads an envelope; `data` is read straight into its type when `type` came first (as this
/// module writes it), and through a JSON value otherwise.
struct EnvelopeVisitor;

impl<'de> Visitor<'de> for EnvelopeVisitor {
    type Value = Event;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an event envelope")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Event, A::Error> {
        let mut v = None;
        let mut kind: Option<EventType> = None;
        let (mut thread_id, mut workflow_id, mut message_id) = (None, None, None);
        let mut attempt = None;
        let mut depth = 0;
        let mut data: Option<Data> = None;
        let mut early: Option<Value> = None;
        while let Some(field) = map.next_key::<Field>()? {
            match field {
                Field::V => v = Some(map.next_value()?),
                Field::Type => kind = Some(map.next_value()?),
                Field::ThreadId => thread_id = Some(map.next_value()?),
                Field::WorkflowId => workflow_id = Some(map.next_value()?),
                Field::MessageId => message_id = Some(map.next_value()?),
                Field::Attempt => attempt = Some(map.next_value()?),
                Field::Depth => depth = map.next_value()?,
                Field::Data => match kind {
                    Some(kind) => data = Some(map.next_value_seed(kind)?),
                    None => early = Some(map.next_value()?),
                },
                Field::Other => {
                    map.next_value::<de::IgnoredAny>()?;
                }
            }
        }
        let kind = kind.ok_or_else(|| de::Error::missing_field("type"))?;
        let data = match (data, early) {
            (Some(data), _) => data,
            (None, Some(value)) => kind.deserialize(value).map_err(de::Error::custom)?,
            (None, None) => return Err(de::Error::missing_field("data")),
        };
        Ok(Event {
            v: v.ok_or_else(|| de::Error::missing_field("v"))?,
            thread_id: thread_id.ok_or_else(|| de::Error::missing_field("thread_id"))?,
            workflow_id: workflow_id.ok_or_else(|| de::Error::missing_field("workflow_id"))?,
            message_id: message_id.ok_or_else(|| de::Error::missing_field("message_id"))?,
            attempt: attempt.ok_or_else(|| de::Error::missing_field("attempt"))?,
            depth,
            data,
        })
    }
}

/// Where an event belongs: everything but its data.
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
    /// The origin of the events `run`'s attempt `attempt` writes.
    pub fn of(run: &crate::db::runs::Run, attempt: i32) -> Self {
        Self {
            thread_id: run.thread_id,
            workflow_id: run.id,
            message_id: run.assistant_message_id,
            attempt,
            depth: u32::try_from(run.depth).unwrap_or(0),
        }
    }

    /// An event of this origin.
    pub fn event(&self, data: impl Into<Data>) -> Event {
        Event {
            v: VERSION,
            thread_id: self.thread_id,
            workflow_id: self.workflow_id,
            message_id: self.message_id,
            attempt: self.attempt,
            depth: self.depth,
            data: data.into(),
        }
    }
}

/// The events that end the message of a run that ended as `end` says, in order: the error (of
/// a failed run), `message_end`, and `done`. A worker publishes them once it has written the
/// run's end; the API, for a run it cancelled while no worker held it.
pub fn end_of_message(end: MessageEnd, error: Option<&RunFailure>) -> Vec<Data> {
    let mut events = Vec::with_capacity(3);
    if let Some(error) = error {
        events.push(Data::Error(Failure {
            code: error.code,
            message: error.message.clone(),
            retryable: error.code.is_retryable(),
        }));
    }
    let status = end.status;
    events.push(Data::MessageEnd(end));
    events.push(Data::Done(Done { status }));
    events
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin() -> Origin {
        Origin {
            thread_id: ThreadId::new(),
            workflow_id: WorkflowId::new(),
            message_id: MessageId::new(),
            attempt: 2,
            depth: 0,
        }
    }

    #[test]
    fn the_envelope_has_the_contract_s_shape_and_escapes_text() -> serde_json::Result<()> {
        let event = origin().event(TextDelta {
            block_id: BlockId::of_step(1),
            delta: "a\r\nid: 9\n\ndata: x".into(),
        });
        let json = serde_json::to_string(&event)?;
        assert!(!json.contains('\n') && !json.contains('\r'), "{json}");
        assert!(json.starts_with(r#"{"v":1,"type":"text_delta","#), "{json}");
        let value: Value = serde_json::from_str(&json)?;
        assert_eq!(value["v"], 1);
        assert_eq!(value["type"], "text_delta");
        assert_eq!(value["attempt"], 2);
        assert_eq!(value["data"]["block_id"], "s1");
        assert_eq!(value["data"]["delta"], "a\r\nid: 9\n\ndata: x");
        assert!(value.get("depth").is_none(), "depth 0 is left out");
        assert_eq!(serde_json::from_str::<Event>(&json)?, event);
        Ok(())
    }

    #[test]
    fn every_type_reads_back_as_written_whatever_the_key_order() -> serde_json::Result<()> {
        let mut origin = origin();
        origin.depth = 2;
        let call = StepCall {
            step: 1,
            tool_call_id: "c1".into(),
            tool_name: "read".into(),
            arguments: serde_json::json!({"path": "/a"}),
        };
        let events: Vec<Data> = vec![
            MessageStart::new(Some("gpt".into())).into(),
            MessageStart::new(None).into(),
            TextStart {
                block_id: BlockId::of_step(1),
            }
            .into(),
            call.into(),
            StepResult {
                step: 1,
                tool_call_id: "c1".into(),
                tool_name: "read".into(),
                output: "x".into(),
                is_error: false,
            }
            .into(),
            StepStart {
                step: 1,
                model: "gpt".into(),
            }
            .into(),
            StepEnd {
                step: 1,
                usage: Usage::default(),
                finish_reason: "tool_calls".into(),
            }
            .into(),
            Heartbeat {}.into(),
            Done {
                status: RunStatus::Completed,
            }
            .into(),
        ];
        for data in events {
            let event = origin.event(data);
            let json = serde_json::to_string(&event)?;
            assert_eq!(serde_json::from_str::<Event>(&json)?, event, "{json}");
            // `data` before `type` (another writer's order) reads the same.
            let mut value: serde_json::Map<String, Value> = serde_json::from_str(&json)?;
            let data = value.remove("data").unwrap_or_default();
            let rest = serde_json::to_string(&value)?;
            let reordered = format!(r#"{{"data":{data},{}"#, &rest[1..]);
            assert!(reordered.starts_with(r#"{"data""#), "{reordered}");
            assert_eq!(serde_json::from_str::<Event>(&reordered)?, event);
        }
        Ok(())
    }

    #[test]
    fn a_heartbeat_is_an_empty_object_and_message_start_leaves_out_an_unknown_model()
    -> serde_json::Result<()> {
        assert_eq!(serde_json::to_string(&Data::from(Heartbeat {}))?, "{}");
        let start = serde_json::to_value(Data::from(MessageStart::new(None)))?;
        assert_eq!(start, serde_json::json!({"role": "assistant"}));
        let end = serde_json::to_value(Data::from(MessageEnd {
            status: RunStatus::Completed,
            usage: Usage::default(),
            blocked: false,
            output: None,
        }))?;
        assert_eq!(end["status"], "completed");
        assert!(end.get("blocked").is_none() && end.get("output").is_none());
        Ok(())
    }

    #[test]
    fn an_unknown_type_or_a_data_of_the_wrong_shape_is_refused() {
        let origin = origin();
        let good = serde_json::to_value(origin.event(Done {
            status: RunStatus::Failed,
        }))
        .expect("json");
        let mut unknown = good.clone();
        unknown["type"] = "no_such_event".into();
        assert!(serde_json::from_value::<Event>(unknown).is_err());
        let mut wrong = good;
        wrong["data"] = serde_json::json!({"status": 3});
        assert!(serde_json::from_value::<Event>(wrong).is_err());
    }

    #[test]
    fn a_failed_run_ends_with_its_error_then_message_end_then_done() {
        let error = RunFailure::new(FailureCode::Timeout, "too slow");
        let end = MessageEnd {
            status: RunStatus::Failed,
            usage: Usage::default(),
            blocked: false,
            output: None,
        };
        let kinds: Vec<EventType> = end_of_message(end, Some(&error))
            .iter()
            .map(Data::kind)
            .collect();
        assert_eq!(
            kinds,
            [EventType::Error, EventType::MessageEnd, EventType::Done]
        );
    }

    #[test]
    fn an_error_is_retryable_exactly_for_the_retryable_codes() {
        for code in FailureCode::ALL {
            let error = RunFailure::new(code, "x");
            let end = MessageEnd {
                status: RunStatus::Failed,
                usage: Usage::default(),
                blocked: false,
                output: None,
            };
            let Some(Data::Error(failure)) = end_of_message(end, Some(&error)).into_iter().next()
            else {
                panic!("no error event");
            };
            let expected = matches!(
                code,
                FailureCode::ModelUnavailable
                    | FailureCode::Timeout
                    | FailureCode::TooManyAttempts
                    | FailureCode::BudgetExceeded
            );
            assert_eq!(failure.retryable, expected, "{code:?}");
        }
    }
}
