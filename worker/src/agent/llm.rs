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
//!
//! A provider is a party to distrust (a tenant's gateway, a proxy in front of one): its clients
//! follow no redirect (the key and the conversation would travel to wherever it points), every
//! call ends by a deadline ([`Bounds`]: a total time, and a longest silence between data events
//! that SSE comments do not reset), one event and one response are capped in bytes
//! ([`MAX_EVENT_BYTES`], [`MAX_RESPONSE_BYTES`]), and the provider's own text reaches a run's
//! error cut to [`PROVIDER_TEXT_CHARS`] characters, never a raw stream line.

pub mod anthropic;
pub mod demo;
pub mod openai;

use std::collections::VecDeque;
use std::pin::Pin;
use std::time::Duration;

use tokio::time::Instant;

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
    /// `Some(false)`: ask for at most one tool call (providers that take the flag).
    pub parallel_tool_calls: Option<bool>,
    /// Nucleus sampling (`top_p`).
    pub top_p: Option<f64>,
    /// How much a reasoning model reasons (`low`, `high`, ...; providers that take it).
    pub reasoning_effort: Option<String>,
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
    /// The model that answered, as the provider names it (`None`: it did not say).
    pub model: Option<String>,
    /// The provider's id of the response (`None`: it did not say).
    pub id: Option<String>,
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

    /// The provider, as the GenAI semantic conventions' `gen_ai.provider.name` names it.
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
    /// The provider sent something that is not its wire format (or more than it may).
    #[error("the model provider sent an invalid response: {0}")]
    Protocol(String),
    /// No provider can serve this model.
    #[error("{0}")]
    Unavailable(String),
    /// The provider sent no data event for this long (`SPOOL_LLM_TIMEOUT_SECS`).
    #[error("the model provider sent no data for {} s", .0.as_secs())]
    Idle(Duration),
    /// The call did not end within its deadline (`SPOOL_LLM_CALL_TIMEOUT_SECS`).
    #[error("the model call did not end within {} s", .0.as_secs())]
    Deadline(Duration),
}

impl LlmError {
    /// Whether the same request may succeed if retried.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Status { status, .. } => *status == 408 || *status == 429 || *status >= 500,
            Self::Transport(_) | Self::Incomplete | Self::Idle(_) => true,
            // A call that took its whole deadline would take it again.
            Self::Protocol(_) | Self::Unavailable(_) | Self::Deadline(_) => false,
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
            Self::Idle(_) => "idle_timeout",
            Self::Deadline(_) => "deadline",
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
    /// The bytes assembled so far (text, tool names and arguments): what the response holds
    /// in memory until it ends.
    fn assembled_bytes(&self) -> usize;
}

/// The most bytes one SSE event may take (its lines and their terminators up to the blank
/// line that ends it), a comment included: 1 MiB, far above any delta or tool call's arguments.
pub const MAX_EVENT_BYTES: usize = 1 << 20;

/// The most bytes one response may assemble (text, tool names and arguments): 8 MiB, about two
/// million tokens, far above any model's output.
pub const MAX_RESPONSE_BYTES: usize = 8 << 20;

/// How long a model call may take in all when the client is given no other deadline
/// (`SPOOL_LLM_CALL_TIMEOUT_SECS`'s default).
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(600);

/// The most characters of a provider's own text (an error's message) a run's error keeps.
pub const PROVIDER_TEXT_CHARS: usize = 500;

/// The most bytes of an error answer's body read to find its message.
const MAX_ERROR_BODY_BYTES: usize = 64 << 10;

/// How long a provider's call may take.
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    /// The longest silence: no byte before the answer's headers, no data event during its
    /// stream (`SPOOL_LLM_TIMEOUT_SECS`).
    pub idle: Duration,
    /// The whole call, from the request to the stream's end (`SPOOL_LLM_CALL_TIMEOUT_SECS`).
    pub call: Duration,
}

impl Timeouts {
    /// The deadlines of a call starting now.
    pub(crate) fn start(self) -> Bounds {
        let now = Instant::now();
        Bounds {
            deadline: now.checked_add(self.call).unwrap_or_else(far_future),
            timeouts: self,
        }
    }
}

/// The deadlines of one call.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bounds {
    /// When the whole call must have ended.
    deadline: Instant,
    timeouts: Timeouts,
}

impl Bounds {
    /// `work`, unless the call's deadline comes first.
    async fn within<T>(&self, work: impl Future<Output = T>) -> Result<T, LlmError> {
        tokio::time::timeout_at(self.deadline, work)
            .await
            .map_err(|_| LlmError::Deadline(self.timeouts.call))
    }
}

/// An instant no call reaches (a timeout too large to add to now).
fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86_400 * 365)
}

/// Where a remote provider's calls go: its HTTP client, the URL and the key.
#[derive(Clone)]
pub(crate) struct Endpoint {
    pub(crate) http: reqwest::Client,
    pub(crate) url: String,
    pub(crate) api_key: Option<String>,
    pub(crate) timeouts: Timeouts,
}

impl Endpoint {
    /// `path` under `base_url`, bounded by `timeouts`. The client follows no redirect: a
    /// provider's key (OpenAI's `Authorization`, Anthropic's `x-api-key`, which reqwest would
    /// keep across origins) and the conversation must never go anywhere else; a 3xx is an
    /// error the run reports.
    pub(crate) fn new(
        base_url: &str,
        path: &str,
        api_key: Option<String>,
        timeouts: Timeouts,
    ) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .read_timeout(timeouts.idle)
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        Ok(Self::with_client(http, base_url, path, api_key, timeouts))
    }

    /// The same with the HTTP client given: a tenant's provider gets one that enforces the
    /// network policy and follows no redirect.
    pub(crate) fn with_client(
        http: reqwest::Client,
        base_url: &str,
        path: &str,
        api_key: Option<String>,
        timeouts: Timeouts,
    ) -> Self {
        let url = format!("{}/{path}", base_url.trim_end_matches('/'));
        Self {
            http,
            url,
            api_key,
            timeouts,
        }
    }
}

/// Sends a provider request within `bounds`: the response if its status is a success, else
/// the provider's error (with its message, cut, and the wait it asked for).
pub(crate) async fn send(
    call: reqwest::RequestBuilder,
    bounds: &Bounds,
) -> Result<reqwest::Response, LlmError> {
    let response = bounds
        .within(call.send())
        .await?
        // Never the URL: the message reaches the run's error, which end users read.
        .map_err(|e| LlmError::Transport(e.without_url().to_string()))?;
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let retry_after = retry_after(response.headers());
    let body = bounds.within(error_body(response)).await?;
    Err(LlmError::Status {
        status: status.as_u16(),
        message: provider_message(&body),
        retry_after,
    })
}

/// The start of an error answer's body: at most [`MAX_ERROR_BODY_BYTES`] (a provider's error
/// is a short JSON object; nothing more is needed to find its message).
async fn error_body(response: reqwest::Response) -> String {
    let mut body = Vec::new();
    let mut chunks = response.bytes_stream();
    while let Some(Ok(chunk)) = chunks.next().await {
        body.extend_from_slice(&chunk);
        if body.len() >= MAX_ERROR_BODY_BYTES {
            body.truncate(MAX_ERROR_BODY_BYTES);
            break;
        }
    }
    String::from_utf8_lossy(&body).into_owned()
}

/// Why a response's bytes were refused before they reached the SSE parser.
#[derive(Debug, thiserror::Error)]
enum BodyError {
    /// The connection failed.
    #[error("{0}")]
    Transport(reqwest::Error),
    /// One event went past [`MAX_EVENT_BYTES`].
    #[error("an event of the stream is larger than {MAX_EVENT_BYTES} bytes")]
    EventTooLarge,
}

/// Counts the bytes of the SSE event being read (its lines since the last blank line), so
/// that the parser, which buffers an event until it ends, never holds more than
/// [`MAX_EVENT_BYTES`].
#[derive(Debug, Default)]
struct EventBytes {
    /// Bytes of the current event, its line terminators left out.
    current: usize,
    /// Whether the last byte ended a line (so another terminator ends the event).
    at_line_start: bool,
    /// Whether the last byte was a `\r` (a `\n` after it ends the same line).
    after_cr: bool,
}

impl EventBytes {
    fn count(&mut self, chunk: &[u8]) -> Result<(), BodyError> {
        for &byte in chunk {
            let after_cr = std::mem::replace(&mut self.after_cr, byte == b'\r');
            match byte {
                b'\n' if after_cr => {}
                b'\n' | b'\r' => {
                    if self.at_line_start {
                        self.current = 0;
                    }
                    self.at_line_start = true;
                }
                _ => {
                    self.at_line_start = false;
                    self.current += 1;
                    if self.current > MAX_EVENT_BYTES {
                        return Err(BodyError::EventTooLarge);
                    }
                }
            }
        }
        Ok(())
    }
}

/// The chunks of a streamed response, parsed by `sse-stream` (the parser `rmcp` uses too) and
/// assembled by `asm`, within `bounds`: the call's deadline, and the longest wait for a data
/// event (comments and other events without data do not count as data). A stream that ends
/// before the format's end marker is [`LlmError::Incomplete`], never a short answer; one whose
/// event or assembled response is too large is a [`LlmError::Protocol`] error.
pub(crate) fn sse_chunks(
    response: reqwest::Response,
    asm: impl Assemble,
    bounds: Bounds,
) -> ChatStream {
    let mut event = EventBytes {
        at_line_start: true,
        ..EventBytes::default()
    };
    let body = response.bytes_stream().map(move |chunk| {
        let chunk = chunk.map_err(|e| BodyError::Transport(e.without_url()))?;
        event.count(&chunk)?;
        Ok::<_, BodyError>(chunk)
    });
    let events = SseStream::from_bytes_stream(body);
    let state = (events, asm, VecDeque::new(), Instant::now());
    let stream = futures::stream::unfold(
        state,
        move |(mut events, mut asm, mut queue, mut last_data)| async move {
            loop {
                if let Some(chunk) = queue.pop_front() {
                    return Some((Ok(chunk), (events, asm, queue, last_data)));
                }
                if asm.finished() {
                    return None;
                }
                let failure = match next_event(&mut events, &bounds, last_data).await {
                    Ok(Some(Ok(event))) => {
                        let Some(data) = event.data else { continue };
                        last_data = Instant::now();
                        match asm.feed(&data) {
                            Ok(_) if asm.assembled_bytes() > MAX_RESPONSE_BYTES => {
                                LlmError::Protocol(format!(
                                    "the response is larger than {MAX_RESPONSE_BYTES} bytes"
                                ))
                            }
                            Ok(chunks) => {
                                queue.extend(chunks);
                                continue;
                            }
                            Err(err) => err,
                        }
                    }
                    Ok(Some(Err(err))) => body_failure(&err),
                    Ok(None) => LlmError::Incomplete,
                    Err(timeout) => timeout,
                };
                asm.fail();
                return Some((Err(failure), (events, asm, queue, last_data)));
            }
        },
    );
    stream.boxed()
}

/// The next SSE event, unless the call's deadline or the idle timeout (counted from the last
/// data event) comes first.
async fn next_event<S>(
    events: &mut S,
    bounds: &Bounds,
    last_data: Instant,
) -> Result<Option<S::Item>, LlmError>
where
    S: Stream + Unpin,
{
    let idle_until = last_data
        .checked_add(bounds.timeouts.idle)
        .unwrap_or_else(far_future);
    if idle_until < bounds.deadline {
        tokio::time::timeout_at(idle_until, events.next())
            .await
            .map_err(|_| LlmError::Idle(bounds.timeouts.idle))
    } else {
        bounds.within(events.next()).await
    }
}

/// The error a failed read of the stream stands for.
fn body_failure(err: &sse_stream::Error) -> LlmError {
    let body = std::error::Error::source(err).and_then(|e| e.downcast_ref::<BodyError>());
    match body {
        Some(BodyError::EventTooLarge) => LlmError::Protocol(BodyError::EventTooLarge.to_string()),
        Some(BodyError::Transport(err)) => LlmError::Transport(err.to_string()),
        // The parser's own complaints name no content (an invalid line, bad UTF-8).
        None => LlmError::Protocol(err.to_string()),
    }
}

/// A provider's text cut to [`PROVIDER_TEXT_CHARS`] characters (marked when cut): gateways put
/// deployment names, upstream URLs and whole payloads in their errors, which reach end users.
pub(crate) fn provider_text(text: &str) -> String {
    match text.char_indices().nth(PROVIDER_TEXT_CHARS) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

/// Data a provider sent that is not its wire format, logged cut (the operator may need it) but
/// never put in the run's error, which end users and webhooks read.
pub(crate) fn log_unreadable(data: &str) {
    tracing::warn!(data = %provider_text(data), "the model provider sent data that does not parse");
}

/// Gives every call without an id, or with the id of an earlier call, an id of its own
/// (`{prefix}` and a random suffix). Some "compatible" servers omit or repeat ids; results are
/// matched to calls, clients answer them and idempotency keys are made from ids, so two calls
/// must never share one.
pub(crate) fn give_unique_ids(calls: &mut [ToolCall], prefix: &str) {
    let mut seen = std::collections::HashSet::new();
    for call in calls {
        if call.id.is_empty() || !seen.insert(call.id.clone()) {
            call.id = format!("{prefix}{}", uuid::Uuid::new_v4().simple());
            seen.insert(call.id.clone());
        }
    }
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

/// The message of a provider's error answer (its JSON `error.message`, else the body), cut to
/// [`PROVIDER_TEXT_CHARS`] characters.
pub(crate) fn provider_message(body: &str) -> String {
    let parsed = serde_json::from_str::<Value>(body).ok();
    let message = parsed.as_ref().and_then(|v| v["error"]["message"].as_str());
    provider_text(message.unwrap_or(body))
}
