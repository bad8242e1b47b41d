//! Chat models: the seam between the agent loop and providers.
//!
//! A [`ChatModel`] takes a [`ChatRequest`] and streams [`ChatChunk`]s: text deltas as they
//! arrive, then one [`ChatChunk::Done`] with the assembled [`ChatResponse`] (text, tool calls
//! assembled by index, usage, finish reason). Two implementations: [`openai::OpenAiClient`]
//! (any OpenAI-compatible Chat Completions endpoint) and [`demo::DemoModel`] (built in).
//!
//! Errors are sorted once, here: [`LlmError::is_retryable`] says whether the same request may
//! succeed later (429, 5xx, timeouts, broken connections, a stream cut short).

pub mod demo;
pub mod openai;

use std::pin::Pin;
use std::time::Duration;

use futures::Stream;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use spool_shared::db::steps::ToolCall;
use spool_shared::run::Usage;

/// One message of the conversation sent to the model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum ChatMessage {
    /// Instructions.
    System {
        /// The text.
        content: String,
    },
    /// The user.
    User {
        /// The text.
        content: String,
    },
    /// The model's earlier output.
    Assistant {
        /// Its text, if any.
        content: Option<String>,
        /// Its tool calls.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
    },
    /// A tool's result.
    Tool {
        /// The call it answers.
        tool_call_id: String,
        /// The result text.
        content: String,
    },
}

/// A tool offered to the model.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ToolDef {
    /// Its name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// JSON Schema of its arguments.
    pub parameters: Value,
}

/// Whether and which tool the model must call in this request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Choice {
    /// The model decides.
    Auto,
    /// Some tool.
    Required,
    /// No tool.
    None,
    /// This tool.
    Tool(String),
}

/// One model call.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatRequest {
    /// The model name.
    pub model: String,
    /// The conversation.
    pub messages: Vec<ChatMessage>,
    /// The tools offered (empty: none).
    pub tools: Vec<ToolDef>,
    /// The tool choice (ignored without tools).
    pub tool_choice: Choice,
    /// Sampling temperature.
    pub temperature: Option<f64>,
    /// Tokens the model may generate (`max_tokens`).
    pub max_output_tokens: Option<u32>,
    /// The form the answer must take (a JSON Schema), for providers that support it.
    pub response_format: Option<spool_shared::agent::ResponseFormat>,
}

impl ChatRequest {
    /// The names of the tools the model may call with this request: those offered, none if
    /// the choice is `none`.
    pub fn callable(&self) -> Vec<String> {
        if matches!(self.tool_choice, Choice::None) {
            return Vec::new();
        }
        self.tools.iter().map(|tool| tool.name.clone()).collect()
    }
}

/// Why the model stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// A natural end.
    Stop,
    /// It wants tools called.
    ToolCalls,
    /// It hit the output token limit.
    Length,
    /// The provider filtered the output.
    ContentFilter,
    /// Anything else the provider said.
    Other(String),
}

impl FinishReason {
    /// Parses the provider's `finish_reason`.
    pub fn parse(reason: &str) -> Self {
        match reason {
            "stop" | "end_turn" => Self::Stop,
            "tool_calls" | "function_call" => Self::ToolCalls,
            "length" | "max_tokens" => Self::Length,
            "content_filter" => Self::ContentFilter,
            other => Self::Other(other.to_owned()),
        }
    }

    /// The reason as the timeline shows it.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Stop => "stop",
            Self::ToolCalls => "tool_calls",
            Self::Length => "length",
            Self::ContentFilter => "content_filter",
            Self::Other(other) => other,
        }
    }
}

/// What one call produced, assembled.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatResponse {
    /// All text (content, or a refusal).
    pub text: String,
    /// Tool calls in index order.
    pub tool_calls: Vec<ToolCall>,
    /// Why it stopped.
    pub finish_reason: FinishReason,
    /// Token usage, if reported.
    pub usage: Usage,
}

/// A piece of a streaming response.
#[derive(Clone, Debug, PartialEq)]
pub enum ChatChunk {
    /// More text.
    Text(String),
    /// The end, with everything assembled.
    Done(ChatResponse),
}

/// A stream of chunks.
pub type ChatStream = Pin<Box<dyn Stream<Item = Result<ChatChunk, LlmError>> + Send>>;

/// A chat model.
pub trait ChatModel: Send + Sync {
    /// Starts a streaming call.
    fn stream(&self, request: ChatRequest) -> BoxFuture<'_, Result<ChatStream, LlmError>>;

    /// The provider, as the GenAI semantic conventions' `gen_ai.system` names it.
    fn system(&self) -> &'static str {
        // Every remote model speaks the OpenAI Chat Completions API.
        "openai"
    }
}

/// Why a model call failed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum LlmError {
    /// The provider answered with an error status.
    #[error("the model provider answered {status}: {message}")]
    Status {
        /// The HTTP status.
        status: u16,
        /// The provider's message.
        message: String,
        /// How long the provider asked us to wait.
        retry_after: Option<Duration>,
    },
    /// The connection failed or timed out.
    #[error("the model provider could not be reached: {0}")]
    Transport(String),
    /// The stream ended before `[DONE]`.
    #[error("the model's stream ended before it was complete")]
    Incomplete,
    /// The provider sent something that is not its wire format.
    #[error("the model provider sent an invalid response: {0}")]
    Protocol(String),
    /// No provider can serve this model.
    #[error("{0}")]
    Unavailable(String),
}

impl LlmError {
    /// Whether the same request may succeed if retried.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Status { status, .. } => *status == 408 || *status == 429 || *status >= 500,
            Self::Transport(_) | Self::Incomplete => true,
            Self::Protocol(_) | Self::Unavailable(_) => false,
        }
    }

    /// A short stable name of the failure, for the `error.type` span field.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Status { .. } => "status",
            Self::Transport(_) => "transport",
            Self::Incomplete => "incomplete",
            Self::Protocol(_) => "protocol",
            Self::Unavailable(_) => "unavailable",
        }
    }

    /// The wait the provider asked for, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}
