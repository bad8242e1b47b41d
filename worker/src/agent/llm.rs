//! Chat models: the seam between the agent loop and providers.
//!
//! A [`ChatModel`] takes a [`ChatRequest`] and streams [`ChatChunk`]s: text deltas as they
//! arrive, then one [`ChatChunk::Done`] with the assembled [`ChatResponse`] (text, tool calls
//! assembled by index, usage, finish reason). Three implementations: [`openai::OpenAiClient`]
//! (any OpenAI-compatible Chat Completions endpoint), [`anthropic::AnthropicClient`] (the
//! Anthropic Messages API) and [`demo::DemoModel`] (built in). The two remote clients share
//! the HTTP and SSE plumbing here ([`send`], [`sse_chunks`]) and differ in their wire formats
//! (an [`Assemble`] each).
//!
//! Errors are sorted once, here: [`LlmError::is_retryable`] says whether the same request may
//! succeed later (429, 5xx, timeouts, broken connections, a stream cut short).

pub mod anthropic;
pub mod demo;
pub mod openai;

use std::collections::VecDeque;
use std::pin::Pin;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{Stream, StreamExt as _};
use reqwest::header::{HeaderMap, RETRY_AFTER};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sse_stream::SseStream;

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

    /// Whether the provider refused the request because the prompt is longer than the model's
    /// context window (OpenAI: `context_length_exceeded`, "maximum context length"; Anthropic:
    /// "prompt is too long").
    pub fn is_context_overflow(&self) -> bool {
        let Self::Status {
            status: 400 | 413,
            message,
            ..
        } = self
        else {
            return false;
        };
        let message = message.to_lowercase();
        [
            "context_length_exceeded",
            "maximum context length",
            "context window",
            "prompt is too long",
        ]
        .iter()
        .any(|said| message.contains(said))
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

/// A provider's wire format, fed one SSE `data:` payload at a time.
pub(crate) trait Assemble: Send + 'static {
    /// The chunks `data` completes (text deltas; the end, assembled).
    fn feed(&mut self, data: &str) -> Result<Vec<ChatChunk>, LlmError>;
    /// Whether the stream has ended (its end marker, or an error).
    fn finished(&self) -> bool;
    /// Marks the stream ended by an error.
    fn fail(&mut self);
}

/// Where a remote provider's calls go: its HTTP client, the URL and the key.
#[derive(Clone)]
pub(crate) struct Endpoint {
    pub(crate) http: reqwest::Client,
    pub(crate) url: String,
    pub(crate) api_key: Option<String>,
}

impl Endpoint {
    /// `path` under `base_url`; `idle_timeout` bounds the wait for each piece of a response.
    pub(crate) fn new(
        base_url: &str,
        path: &str,
        api_key: Option<String>,
        idle_timeout: Duration,
    ) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .read_timeout(idle_timeout)
            .build()?;
        let url = format!("{}/{path}", base_url.trim_end_matches('/'));
        Ok(Self { http, url, api_key })
    }
}

/// Sends a provider request: the response if its status is a success, else the provider's
/// error (with its message and the wait it asked for).
pub(crate) async fn send(call: reqwest::RequestBuilder) -> Result<reqwest::Response, LlmError> {
    let response = call
        .send()
        .await
        // Never the URL: the message reaches the run's error, which end users read.
        .map_err(|e| LlmError::Transport(e.without_url().to_string()))?;
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let retry_after = retry_after(response.headers());
    let text = response.text().await.unwrap_or_default();
    Err(LlmError::Status {
        status: status.as_u16(),
        message: provider_message(&text),
        retry_after,
    })
}

/// The chunks of a streamed response, parsed by `sse-stream` (the parser `rmcp` uses too) and
/// assembled by `asm`. A stream that ends before the format's end marker is
/// [`LlmError::Incomplete`], never a short answer.
pub(crate) fn sse_chunks(response: reqwest::Response, asm: impl Assemble) -> ChatStream {
    let body = response
        .bytes_stream()
        .map(|chunk| chunk.map_err(reqwest::Error::without_url));
    let events = SseStream::from_bytes_stream(body);
    let state = (events, asm, VecDeque::new());
    let stream = futures::stream::unfold(state, |(mut events, mut asm, mut queue)| async move {
        loop {
            if let Some(chunk) = queue.pop_front() {
                return Some((Ok(chunk), (events, asm, queue)));
            }
            if asm.finished() {
                return None;
            }
            let failure = match events.next().await {
                Some(Ok(event)) => {
                    let Some(data) = event.data else { continue };
                    match asm.feed(&data) {
                        Ok(chunks) => {
                            queue.extend(chunks);
                            continue;
                        }
                        Err(err) => err,
                    }
                }
                Some(Err(err)) => LlmError::Transport(err.to_string()),
                None => LlmError::Incomplete,
            };
            asm.fail();
            return Some((Err(failure), (events, asm, queue)));
        }
    });
    stream.boxed()
}

/// The longest wait a provider's `Retry-After` may ask for: the attempt holds its lease and a
/// worker slot meanwhile.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// The wait a provider asks for (`retry-after-ms`, else `Retry-After` in seconds), at most
/// [`MAX_RETRY_AFTER`]; a value that is not a number is ignored.
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let header = |name| headers.get(name).and_then(|v| v.to_str().ok());
    let number = |name| {
        header(name)
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|n| !n.is_nan())
    };
    let secs = number("retry-after-ms")
        .map(|ms| ms / 1000.0)
        .or_else(|| number(RETRY_AFTER.as_str()))?;
    let secs = secs.clamp(0.0, MAX_RETRY_AFTER.as_secs_f64());
    Some(Duration::try_from_secs_f64(secs).unwrap_or(MAX_RETRY_AFTER))
}

pub(crate) fn provider_message(body: &str) -> String {
    serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| body.chars().take(500).collect())
}
