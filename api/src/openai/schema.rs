//! The OpenAPI schemas of the OpenAI-compatible routes: what the handlers read and write,
//! described as OpenAI's API reference describes it, with Spool's differences in the field
//! docs. The handlers parse leniently (unknown parameters are ignored, see [`super`]); these
//! types only document.

#![allow(dead_code, reason = "documentation types: only their schemas are used")]

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use spool_shared::WorkflowId;

/// The 401 of every OpenAI-compatible route, for its OpenAPI `responses(...)`.
#[derive(utoipa::IntoResponses)]
#[response(
    status = 401,
    description = "`missing_token`, `invalid_token`, `token_expired`, `api_key_revoked`"
)]
pub struct OpenAiUnauthenticated(
    #[expect(dead_code, reason = "documents the body")] OpenAiErrorBody,
);

/// The 403 of every OpenAI-compatible route, for its OpenAPI `responses(...)`: the
/// operation's `security` names the permission.
#[derive(utoipa::IntoResponses)]
#[response(
    status = 403,
    description = "`forbidden` (`permission_error`): the token lacks the permission the \
                   operation's `security` names (`permission` says which)"
)]
pub struct OpenAiMissingPermission(
    #[expect(dead_code, reason = "documents the body")] OpenAiErrorBody,
);

/// What both creating routes (`/v1/responses`, `/v1/chat/completions`) refuse alike: the
/// enqueue's size, media type, input and quota errors.
#[derive(utoipa::IntoResponses)]
pub enum OpenAiEnqueueRefusals {
    /// Too large.
    #[response(status = 413, description = "`input_too_large`, `body_too_large`")]
    TooLarge(OpenAiErrorBody),
    /// Not JSON.
    #[response(status = 415, description = "`unsupported_media_type`")]
    MediaType(OpenAiErrorBody),
    /// Not valid.
    #[response(
        status = 422,
        description = "`invalid_body`, `invalid_input_text`, `idempotency_key_reused`"
    )]
    Invalid(OpenAiErrorBody),
    /// A quota.
    #[response(
        status = 429,
        description = "`rate_limited`, `concurrency_limited`, `budget_exceeded`; \
                       `too_many_streams` (`stream: true` while the caller holds \
                       `SPOOL_SSE_MAX_STREAMS_PER_USER` streams open on this server)",
        headers(("Retry-After" = u32, description = "Seconds to wait."))
    )]
    Quota(OpenAiErrorBody),
    /// The process holds as many streams as it may.
    #[response(
        status = 503,
        description = "`server_stream_capacity` (`stream: true` while this server holds \
                       `SPOOL_SSE_MAX_STREAMS` streams; nothing is created)",
        headers(("Retry-After" = u32, description = "Seconds to wait."))
    )]
    Busy(OpenAiErrorBody),
}

/// OpenAI's error body: `{"error": {"message", "type", "code", "param"}}`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct OpenAiErrorBody {
    /// The error.
    pub error: OpenAiError,
}

/// An error in OpenAI's shape (Spool's extra fields, such as `active_workflow_id`, beside).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct OpenAiError {
    /// Human text.
    pub message: String,
    /// `invalid_request_error`, `authentication_error`, `permission_error`,
    /// `not_found_error`, `rate_limit_error` or `server_error`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Spool's error code (`response_not_found`, `thread_busy`, `concurrency_limited`, ...).
    pub code: Option<String>,
    /// The parameter at fault, if one is.
    pub param: Option<String>,
}

/// The text of a message: a string, or text parts.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum MessageContent {
    /// The text.
    Text(String),
    /// Text parts, joined.
    Parts(Vec<TextPart>),
}

/// A text part of a message.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TextPart {
    /// `input_text`, `output_text` or `text`.
    #[serde(rename = "type")]
    #[schema(pattern = "^(input_text|output_text|text)$")]
    pub kind: String,
    /// The text.
    pub text: String,
}

/// Who wrote a message.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum InputRole {
    /// The user: the last user message is what the run answers.
    User,
    /// An earlier answer.
    Assistant,
    /// The system prompt (admin tokens only).
    System,
    /// The system prompt (admin tokens only).
    Developer,
}

/// A message of the input (`function_call_output` items answer a response's function calls;
/// `function_call` items resent are skipped; other item types are a 400 `unsupported_input`).
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct InputMessage {
    /// `message`, or absent.
    #[serde(rename = "type")]
    #[schema(pattern = "^message$")]
    pub kind: Option<String>,
    /// Who wrote it.
    pub role: InputRole,
    /// Its text.
    pub content: MessageContent,
}

/// `input`: the user's text, or a list of messages ending with a user message (the earlier
/// ones are stored as earlier turns of the thread).
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum ResponseInput {
    /// The user's text.
    Text(String),
    /// Messages.
    Items(Vec<InputMessage>),
}

/// `conversation`: a conversation id (`conv_...`) or a thread id, or `{id}`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum ConversationParam {
    /// `conv_...` (`POST /v1/conversations`), or a thread id (any UUID: created on first use).
    Id(String),
    /// The same, as an object.
    Object {
        /// `conv_...`, or a thread id.
        id: String,
    },
}

/// The body of `POST /v1/responses`. `text` (`{"format": ...}`) is the answer's form; `store`,
/// `user`, `prompt_cache_key`, `safety_identifier` and `stream_options` are accepted and change
/// nothing; other parameters are a 400 `unsupported_parameter` naming them unless their value
/// asks for nothing (null, or OpenAI's default).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct CreateResponseRequest {
    /// The agent: its id, its name (unique in the tenant), or `spool-default`.
    pub model: String,
    /// What the user says.
    pub input: ResponseInput,
    /// The system prompt of this run in place of the agent's (`admin` tokens only: 403
    /// `forbidden` otherwise).
    pub instructions: Option<String>,
    /// The thread to continue (not with `previous_response_id`).
    pub conversation: Option<ConversationParam>,
    /// Continue the thread of this response (not with `conversation`).
    pub previous_response_id: Option<WorkflowId>,
    /// Answer at once with the `queued` response (its run goes on in the background).
    pub background: Option<bool>,
    /// Answer with the response's events (`text/event-stream`).
    pub stream: Option<bool>,
    /// Stored with the user's message and shown on the response.
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<BTreeMap<String, Value>>,
    /// Functions the model may call (client tools of the run): a call ends the response
    /// (`completed`, with `function_call` items) while the run waits; `function_call_output`
    /// input items (with `previous_response_id`, or the whole conversation resent) answer it.
    /// Other tool types are a 400 `unsupported_parameter`.
    pub tools: Option<Vec<FunctionTool>>,
    /// `auto`, `none`, `required`, or `{"type": "function", "name"}`: for the response's first
    /// model call.
    #[schema(value_type = Option<Object>)]
    pub tool_choice: Option<Value>,
    /// `false`: at most one function call per model call.
    pub parallel_tool_calls: Option<bool>,
    /// Sampling temperature of the run's model calls, in place of the agent's.
    #[schema(minimum = 0.0, maximum = 2.0)]
    pub temperature: Option<f64>,
    /// Nucleus sampling of the run's model calls.
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub top_p: Option<f64>,
    /// Tokens each model call of the run may generate (at most the agent's
    /// `limits.max_output_tokens`).
    #[schema(minimum = 1, maximum = 1_000_000)]
    pub max_output_tokens: Option<u32>,
    /// `{"effort": "none"|"minimal"|"low"|"medium"|"high"|"xhigh"|"max"}`: sent to an
    /// OpenAI-style provider as `reasoning_effort` (the Anthropic Messages API has no such
    /// setting). `summary` is a 400 `unsupported_parameter`.
    #[schema(value_type = Option<Object>)]
    pub reasoning: Option<Value>,
}

/// A function the model may call, run by the client.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct FunctionTool {
    /// `function`.
    #[serde(rename = "type")]
    #[schema(pattern = "^function$")]
    pub kind: String,
    /// Its name (1 to 64 letters, digits, `_` or `-`; not one of the agent's own tools).
    pub name: String,
    /// What it does, for the model.
    pub description: Option<String>,
    /// JSON Schema of its arguments.
    #[schema(value_type = Option<Object>)]
    pub parameters: Option<Value>,
    /// Accepted (the provider's own strictness applies).
    pub strict: Option<bool>,
}

/// A Chat Completions function tool.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ChatFunctionTool {
    /// `function`.
    #[serde(rename = "type")]
    #[schema(pattern = "^function$")]
    pub kind: String,
    /// The function (`name`, `description`, `parameters`, `strict`).
    #[schema(value_type = Object)]
    pub function: Value,
}

/// A response's status (a paused run, waiting for client tools or an approval, is
/// `in_progress`).
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ResponseStatus {
    /// Waiting for a worker.
    Queued,
    /// Running, or paused.
    InProgress,
    /// Answered.
    Completed,
    /// Failed: see `error`.
    Failed,
    /// Cancelled.
    Cancelled,
}

/// An output item: the answer's text, or a tool call the agent made (and ran, server-side).
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum OutputItem {
    /// Text.
    Message(OutputMessage),
    /// A tool call.
    FunctionCall(FunctionCallItem),
}

/// A `message` output item.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct OutputMessage {
    /// `message`.
    #[serde(rename = "type")]
    #[schema(pattern = "^message$")]
    pub kind: String,
    /// The item's id (the same in the stream and the stored response).
    pub id: String,
    /// `assistant`.
    pub role: String,
    /// `in_progress`, `completed`, or `incomplete` (text a crashed attempt showed and the
    /// next one did not repeat).
    pub status: String,
    /// One `output_text` part.
    pub content: Vec<OutputText>,
}

/// An `output_text` part.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct OutputText {
    /// `output_text`.
    #[serde(rename = "type")]
    #[schema(pattern = "^output_text$")]
    pub kind: String,
    /// The text.
    pub text: String,
    /// The sources the text cites (docs/agents.md, "Citations").
    pub annotations: Vec<UrlCitation>,
}

/// A `url_citation` annotation: a span of the text that cites a source.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct UrlCitation {
    /// `url_citation`.
    #[serde(rename = "type")]
    #[schema(pattern = "^url_citation$")]
    pub kind: String,
    /// The span's first character in the text.
    pub start_index: u64,
    /// The character after its last.
    pub end_index: u64,
    /// The source's address.
    pub url: String,
    /// Its title (its address when it has none).
    pub title: String,
}

/// A Chat Completions `url_citation` annotation.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ChatUrlCitation {
    /// `url_citation`.
    #[serde(rename = "type")]
    #[schema(pattern = "^url_citation$")]
    pub kind: String,
    /// The span and its source.
    pub url_citation: ChatUrlCitationSpan,
}

/// The span of a Chat Completions `url_citation` and its source.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ChatUrlCitationSpan {
    /// The span's first character in the message's content.
    pub start_index: u64,
    /// The character after its last.
    pub end_index: u64,
    /// The source's address.
    pub url: String,
    /// Its title (its address when it has none).
    pub title: String,
}

/// An empty object.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Empty {}

/// A `function_call` output item: a tool the agent called, run by Spool.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct FunctionCallItem {
    /// `function_call`.
    #[serde(rename = "type")]
    #[schema(pattern = "^function_call$")]
    pub kind: String,
    /// `fc_` and the call id.
    pub id: String,
    /// The call id.
    pub call_id: String,
    /// The tool.
    pub name: String,
    /// The arguments (JSON text).
    pub arguments: String,
    /// `in_progress`, `completed`, or `incomplete` (no result).
    pub status: String,
    /// The tool's result (a Spool addition; in stored responses).
    pub output: Option<String>,
}

/// Token usage.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ResponseUsage {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Of the prompt tokens, those the provider's cache served or stored.
    pub input_tokens_details: InputTokensDetails,
    /// Generated tokens.
    pub output_tokens: u64,
    /// Of the generated tokens, the model's reasoning.
    pub output_tokens_details: OutputTokensDetails,
    /// Their sum.
    pub total_tokens: u64,
}

/// `usage.input_tokens_details` (as the provider reported them; 0 when it did not).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct InputTokensDetails {
    /// Read from the provider's prompt cache.
    pub cached_tokens: u64,
    /// Written to the provider's prompt cache.
    pub cache_write_tokens: u64,
}

/// `usage.output_tokens_details` (as the provider reported them; 0 when it did not).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct OutputTokensDetails {
    /// Reasoning tokens.
    pub reasoning_tokens: u64,
}

/// Why a response failed.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ResponseError {
    /// OpenAI's code: `invalid_prompt` (the provider refused the request: `model_error`,
    /// `context_overflow`), else `server_error`.
    pub code: String,
    /// The run's failure code, then the details (`invalid_output: the answer does not
    /// validate ...`).
    pub message: String,
    /// The run's failure code (`model_unavailable`, `timeout`, `invalid_output`, ...).
    pub spool_code: String,
}

/// The conversation (thread) of a response.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ConversationRef {
    /// `conv_` and the thread id's hex (`/v1/conversations/{id}`).
    pub id: String,
}

/// A response: a run, with its stored answer once it has ended.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ResponseObject {
    /// The run's `workflow_id`.
    pub id: WorkflowId,
    /// `response`.
    pub object: String,
    /// When it was created (Unix seconds).
    pub created_at: i64,
    /// When it ended (Unix seconds).
    pub completed_at: Option<i64>,
    /// Where it is.
    pub status: ResponseStatus,
    /// The agent (its id, or `spool-default`).
    pub model: String,
    /// The answer (once the run has ended; empty before).
    pub output: Vec<OutputItem>,
    /// Token usage (once the run has ended).
    pub usage: Option<ResponseUsage>,
    /// Why it failed.
    pub error: Option<ResponseError>,
    /// The thread.
    pub conversation: ConversationRef,
    /// The metadata of the request.
    #[schema(value_type = Object)]
    pub metadata: Value,
    /// Whether it was created with `background: true` (a run made through Spool's own API:
    /// `true`).
    pub background: bool,
    /// The request's `instructions`.
    pub instructions: Option<String>,
    /// The request's `previous_response_id`.
    pub previous_response_id: Option<String>,
    /// The request's `text` (default `{"format": {"type": "text"}}`).
    #[schema(value_type = Object)]
    pub text: Value,
    /// The request's `tools` (default `[]`).
    #[schema(value_type = Vec<Object>)]
    pub tools: Vec<Value>,
    /// The request's `tool_choice` (default `auto`; a string or an object).
    #[schema(value_type = Value)]
    pub tool_choice: Value,
    /// The request's `parallel_tool_calls` (default `true`).
    pub parallel_tool_calls: bool,
    /// The request's `temperature`.
    pub temperature: Option<f64>,
    /// The request's `top_p`.
    pub top_p: Option<f64>,
    /// The request's `max_output_tokens`.
    pub max_output_tokens: Option<u64>,
    /// The request's `reasoning`.
    #[schema(value_type = Option<Object>)]
    pub reasoning: Option<Value>,
    /// The request's `store` (default `true`).
    pub store: bool,
    /// The request's `user`, `safety_identifier`, `prompt_cache_key`.
    pub user: Option<String>,
}

/// One Server-Sent Event of a response stream (`event:` is its `type`, `data:` this object).
/// Events are numbered from 0 by `sequence_number`, the same on every reconnect and after any
/// crash: resume with `GET /v1/responses/{id}?stream=true&starting_after=N`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ResponseStreamEvent {
    /// `response.created`, `response.in_progress`, `response.output_item.added`,
    /// `response.content_part.added`, `response.output_text.delta`,
    /// `response.output_text.done`, `response.content_part.done`,
    /// `response.function_call_arguments.delta`, `response.function_call_arguments.done`,
    /// `response.output_item.done`, `response.completed`, `response.failed` (also for a
    /// cancelled response, whose `status` says so), or `error` (`stream_expired`: the events are no longer
    /// retained; `stream_reset`: some were lost; the stored response is over REST).
    #[serde(rename = "type")]
    pub kind: String,
    /// The event's number in the response.
    pub sequence_number: u64,
    /// The response (lifecycle events).
    pub response: Option<ResponseObject>,
    /// The item (`output_item` events).
    pub item: Option<OutputItem>,
    /// The item's place in `output`.
    pub output_index: Option<u64>,
    /// The item's id.
    pub item_id: Option<String>,
    /// Always 0.
    pub content_index: Option<u64>,
    /// More text or arguments.
    pub delta: Option<String>,
    /// The item's text (`response.output_text.done`).
    pub text: Option<String>,
    /// The call's arguments (`response.function_call_arguments.done`).
    pub arguments: Option<String>,
    /// An `error` event's code.
    pub code: Option<String>,
    /// An `error` event's text.
    pub message: Option<String>,
}

/// Who wrote a chat message.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ChatMessage {
    /// `user`, `assistant`, `system`, `developer` (the last two: admin tokens only) or
    /// `tool` (a function's output: trailing `tool` messages answer the calls a completion
    /// ended with).
    #[schema(pattern = "^(user|assistant|system|developer|tool)$")]
    pub role: String,
    /// Its text (null for an assistant message that only calls functions).
    pub content: Option<MessageContent>,
    /// The call a `tool` message answers.
    pub tool_call_id: Option<String>,
}

/// `stream_options`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct StreamOptions {
    /// Send a last chunk with `usage`.
    pub include_usage: Option<bool>,
}

/// The body of `POST /v1/chat/completions`. `response_format` is the answer's form; `user`,
/// `store`, `prompt_cache_key` and `safety_identifier` are accepted and change nothing; other
/// parameters (`stop`, `seed`, `logprobs`, ...) are a 400 `unsupported_parameter` naming them
/// unless their value asks for nothing (null, or OpenAI's default).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ChatCompletionRequest {
    /// The agent: its id, its name, or `spool-default`.
    pub model: String,
    /// The conversation, ending with a user message.
    pub messages: Vec<ChatMessage>,
    /// Answer with `chat.completion.chunk`s, then `[DONE]`.
    pub stream: Option<bool>,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// `thread_id` (a UUID): run on that thread, which keeps the conversation (only the last
    /// message is sent to it); else a new thread seeded with the messages.
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<BTreeMap<String, Value>>,
    /// 1 (other values: 400 `unsupported_n`).
    #[schema(minimum = 1, maximum = 1)]
    pub n: Option<u32>,
    /// Functions the model may call (client tools of the run): a call ends the completion
    /// (`finish_reason: "tool_calls"`) while the run waits; `tool` messages answer it.
    pub tools: Option<Vec<ChatFunctionTool>>,
    /// `auto`, `none`, `required`, or `{"type": "function", "function": {"name"}}`.
    #[schema(value_type = Option<Object>)]
    pub tool_choice: Option<Value>,
    /// `false`: at most one function call per model call.
    pub parallel_tool_calls: Option<bool>,
    /// Sampling temperature of the run's model calls, in place of the agent's.
    #[schema(minimum = 0.0, maximum = 2.0)]
    pub temperature: Option<f64>,
    /// Nucleus sampling of the run's model calls.
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub top_p: Option<f64>,
    /// Tokens each model call may generate (at most the agent's `limits.max_output_tokens`).
    #[schema(minimum = 1, maximum = 1_000_000)]
    pub max_completion_tokens: Option<u32>,
    /// The older name of `max_completion_tokens` (which wins when both are given).
    #[schema(minimum = 1, maximum = 1_000_000)]
    pub max_tokens: Option<u32>,
    /// `none`, `minimal`, `low`, `medium`, `high`, `xhigh` or `max`: sent to an OpenAI-style
    /// provider (the Anthropic Messages API has no such setting).
    pub reasoning_effort: Option<String>,
}

/// The assistant's message of a completion.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct AssistantMessage {
    /// `assistant`.
    pub role: String,
    /// The answer's text (null when it only calls functions).
    pub content: Option<String>,
    /// The function calls it ends with (`finish_reason: "tool_calls"`).
    #[schema(value_type = Option<Vec<Object>>)]
    pub tool_calls: Option<Vec<Value>>,
    /// The sources the answer cites (docs/agents.md, "Citations").
    pub annotations: Option<Vec<ChatUrlCitation>>,
}

/// A choice of a completion (there is one).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ChatChoice {
    /// 0.
    pub index: u32,
    /// The answer.
    pub message: AssistantMessage,
    /// `stop`, or `tool_calls` (the run waits for the functions' outputs).
    pub finish_reason: String,
}

/// Token usage of a completion.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ChatUsage {
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Generated tokens.
    pub completion_tokens: u64,
    /// Their sum.
    pub total_tokens: u64,
}

/// A chat completion: the agent's answer (its tool calls ran server-side).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ChatCompletion {
    /// `chatcmpl-` and the run's id.
    pub id: String,
    /// `chat.completion`.
    pub object: String,
    /// Unix seconds.
    pub created: i64,
    /// The agent.
    pub model: String,
    /// One choice.
    pub choices: Vec<ChatChoice>,
    /// Token usage.
    pub usage: ChatUsage,
}

/// One `data:` line of a streamed completion (the last one is `[DONE]`).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ChatCompletionChunk {
    /// `chatcmpl-` and the run's id.
    pub id: String,
    /// `chat.completion.chunk`.
    pub object: String,
    /// Unix seconds.
    pub created: i64,
    /// The agent.
    pub model: String,
    /// `[{index, delta: {role?, content?}, finish_reason}]` (empty in the usage chunk).
    pub choices: Vec<Empty>,
    /// The usage chunk's usage.
    pub usage: Option<ChatUsage>,
}

/// A model: an agent the caller may use.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Model {
    /// The agent's id, or `spool-default`.
    pub id: String,
    /// `model`.
    pub object: String,
    /// When the agent was created (Unix seconds).
    pub created: i64,
    /// The tenant (`spool` for the default).
    pub owned_by: String,
    /// The agent's name.
    pub name: String,
}

/// The models.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ModelList {
    /// `list`.
    pub object: String,
    /// The default agent first, then the tenant's active agents.
    pub data: Vec<Model>,
}
