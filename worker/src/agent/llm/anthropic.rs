//! The Anthropic Messages API (`POST {base_url}/messages`, streaming), spoken natively: text
//! and tool use, usage, stop reasons, and errors in the stream.
//!
//! Written here rather than taken from a crate: the Rust clients of this API are young and
//! each brings its own HTTP stack; ours needs only the request body and the stream's state
//! machine, and shares the HTTP, SSE, retry and error plumbing with the OpenAI client
//! ([`super::send`], [`super::sse_chunks`]).
//!
//! The conversation maps as the API wants it: system messages become `system`; tool results
//! become `tool_result` blocks of a user turn (consecutive turns of one role are merged, so a
//! step's results answer its `tool_use` blocks in one turn); an assistant's tool calls become
//! `tool_use` blocks with their arguments as `input`. Stop reasons map to the loop's finish
//! reasons (`max_tokens` is `length`, so the loop continues the answer; `refusal` is
//! `content_filter`). A stream that ends before `message_stop` is [`LlmError::Incomplete`]
//! (retried); an `error` event is a provider error with the status its type stands for
//! (`overloaded_error` 529, `rate_limit_error` 429: retried).

use std::collections::BTreeMap;
use std::time::Duration;

use futures::FutureExt as _;
use futures::future::BoxFuture;
use serde_json::{Value, json};

use spool_shared::run::Usage;

use super::{
    Assemble, ChatChunk, ChatMessage, ChatModel, ChatRequest, ChatResponse, ChatStream, Choice,
    FinishReason, LlmError, ToolCall,
};

/// The API version sent as `anthropic-version`.
pub const API_VERSION: &str = "2023-06-01";
/// The user turn put first when the conversation starts with an answer (the API wants the
/// user first).
const CONTINUING: &str = "(The conversation continues.)";
/// `max_tokens` when the agent sets no `limits.max_output_tokens` (the API requires one).
pub const DEFAULT_MAX_TOKENS: u32 = 4096;

/// A client for one Anthropic Messages endpoint.
#[derive(Clone)]
pub struct AnthropicClient(pub(crate) super::Endpoint);

impl AnthropicClient {
    /// A client for `base_url` (e.g. `https://api.anthropic.com/v1`); `idle_timeout` bounds the wait
    /// for each piece of a response, [`super::DEFAULT_CALL_TIMEOUT`] the whole call.
    pub fn new(
        base_url: &str,
        api_key: Option<String>,
        idle_timeout: Duration,
    ) -> anyhow::Result<Self> {
        let timeouts = super::Timeouts {
            idle: idle_timeout,
            call: super::DEFAULT_CALL_TIMEOUT,
        };
        Self::with_timeouts(base_url, api_key, timeouts)
    }

    /// A client for `base_url` whose calls are bounded by `timeouts`.
    pub fn with_timeouts(
        base_url: &str,
        api_key: Option<String>,
        timeouts: super::Timeouts,
    ) -> anyhow::Result<Self> {
        super::Endpoint::new(base_url, "messages", api_key, timeouts).map(Self)
    }
}

impl ChatModel for AnthropicClient {
    fn stream(&self, request: ChatRequest) -> BoxFuture<'_, Result<ChatStream, LlmError>> {
        async move {
            let mut call = self
                .0
                .http
                .post(&self.0.url)
                .header("anthropic-version", API_VERSION)
                .json(&body(&request));
            if let Some(key) = &self.0.api_key {
                call = call.header("x-api-key", key);
            }
            let bounds = self.0.timeouts.start();
            let response = super::send(call, &bounds).await?;
            Ok(super::sse_chunks(response, Assembler::default(), bounds))
        }
        .boxed()
    }

    fn system(&self) -> &'static str {
        "anthropic"
    }
}

/// The request body in the Messages API's format.
pub fn body(request: &ChatRequest) -> Value {
    let (system, messages) = conversation(&request.messages);
    let mut body = json!({
        "model": request.model,
        "max_tokens": request.max_output_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
        "messages": messages,
        "stream": true,
    });
    if !system.is_empty() {
        body["system"] = json!(system.join("\n\n"));
    }
    if !request.tools.is_empty() {
        body["tools"] = request
            .tools
            .iter()
            .map(|t| json!({"name": t.name, "description": t.description, "input_schema": t.parameters}))
            .collect();
        body["tool_choice"] = match &request.tool_choice {
            Choice::Auto => json!({"type": "auto"}),
            Choice::Required => json!({"type": "any"}),
            Choice::None => json!({"type": "none"}),
            Choice::Tool(name) => json!({"type": "tool", "name": name}),
        };
    }
    if let Some(temperature) = request.temperature {
        // The API's range is 0 to 1; an agent's is 0 to 2.
        body["temperature"] = json!(temperature.clamp(0.0, 1.0));
    }
    if let Some(top_p) = request.top_p {
        body["top_p"] = json!(top_p);
    }
    // The Messages API has no reasoning effort (its extended thinking is a token budget whose
    // blocks must be sent back with every tool result): `reasoning_effort` is not sent.
    body
}

/// The conversation as the API wants it: the system messages' texts apart, and the turns
/// (consecutive blocks of one role merged into one turn, a user turn first).
fn conversation(messages: &[ChatMessage]) -> (Vec<&str>, Vec<Value>) {
    let mut system = Vec::new();
    let mut turns: Vec<(&str, Vec<Value>)> = Vec::new();
    let mut add = |role: &'static str, block: Value| match turns.last_mut() {
        Some((last, blocks)) if *last == role => blocks.push(block),
        _ => turns.push((role, vec![block])),
    };
    for message in messages {
        match message {
            ChatMessage::System { content } => system.push(content.as_str()),
            ChatMessage::User { content } => add("user", json!({"type": "text", "text": content})),
            ChatMessage::Assistant {
                content,
                tool_calls,
            } => {
                if let Some(text) = content.as_deref().filter(|t| !t.is_empty()) {
                    add("assistant", json!({"type": "text", "text": text}));
                }
                for call in tool_calls {
                    // The API wants an object; arguments that are not one are sent empty.
                    let input = serde_json::from_str::<Value>(&call.arguments)
                        .ok()
                        .filter(Value::is_object)
                        .unwrap_or_else(|| json!({}));
                    add(
                        "assistant",
                        json!({"type": "tool_use", "id": call.id, "name": call.name,
                               "input": input}),
                    );
                }
            }
            ChatMessage::Tool {
                tool_call_id,
                content,
            } => add(
                "user",
                json!({"type": "tool_result", "tool_use_id": tool_call_id, "content": content}),
            ),
        }
    }
    // The API wants the user first; a history cut by `history_depth` or a summary may start
    // with an answer.
    if turns.first().is_none_or(|(role, _)| *role == "assistant") {
        turns.insert(
            0,
            ("user", vec![json!({"type": "text", "text": CONTINUING})]),
        );
    }
    let messages = turns
        .into_iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect();
    (system, messages)
}

/// Assembles the Messages stream's events into text deltas and one final [`ChatResponse`].
#[derive(Debug, Default)]
pub struct Assembler {
    text: String,
    /// Tool-use blocks by their content-block index.
    calls: BTreeMap<u64, ToolCall>,
    stop_reason: Option<String>,
    usage: Usage,
    /// The answering model and the message's id, from `message_start`.
    model: Option<String>,
    id: Option<String>,
    done: bool,
}

impl Assemble for Assembler {
    fn feed(&mut self, data: &str) -> Result<Vec<ChatChunk>, LlmError> {
        Assembler::feed(self, data)
    }

    fn finished(&self) -> bool {
        self.done
    }

    fn fail(&mut self) {
        self.done = true;
    }

    fn assembled_bytes(&self) -> usize {
        self.text.len()
            + self
                .calls
                .values()
                .map(|c| c.id.len() + c.name.len() + c.arguments.len())
                .sum::<usize>()
    }
}

impl Assembler {
    /// Feeds one event's `data:` payload (its `type` says which event it is); returns the
    /// chunks it completes. Unknown event and block types are skipped (the API adds them).
    pub fn feed(&mut self, data: &str) -> Result<Vec<ChatChunk>, LlmError> {
        let data = data.trim();
        if data.is_empty() {
            return Ok(Vec::new());
        }
        let event: Value = serde_json::from_str(data).map_err(|e| {
            // The data itself stays out of the error, which end users read.
            super::log_unreadable(data);
            LlmError::Protocol(format!("an event that is not JSON ({e})"))
        })?;
        let index = event["index"].as_u64().unwrap_or(0);
        match event["type"].as_str().unwrap_or_default() {
            "message_start" => {
                let message = &event["message"];
                let named = |key: &str| {
                    message[key]
                        .as_str()
                        .filter(|v| !v.is_empty())
                        .map(super::provider_text)
                };
                self.model = named("model");
                self.id = named("id");
                self.count(&message["usage"]);
            }
            "content_block_start" => {
                let block = &event["content_block"];
                match block["type"].as_str() {
                    Some("text") => return Ok(self.text(block["text"].as_str())),
                    Some("tool_use") => {
                        let call = ToolCall {
                            id: block["id"].as_str().unwrap_or_default().to_owned(),
                            name: block["name"].as_str().unwrap_or_default().to_owned(),
                            arguments: String::new(),
                        };
                        if call.name.is_empty() {
                            super::log_unreadable(data);
                            return Err(LlmError::Protocol("a tool_use without a name".into()));
                        }
                        self.calls.insert(index, call);
                    }
                    _ => {}
                }
            }
            "content_block_delta" => {
                let delta = &event["delta"];
                match delta["type"].as_str() {
                    Some("text_delta") => return Ok(self.text(delta["text"].as_str())),
                    Some("input_json_delta") => {
                        let call = self.calls.get_mut(&index).ok_or_else(|| {
                            super::log_unreadable(data);
                            LlmError::Protocol("arguments for no tool_use block".into())
                        })?;
                        call.arguments
                            .push_str(delta["partial_json"].as_str().unwrap_or_default());
                    }
                    _ => {}
                }
            }
            "message_delta" => {
                if let Some(reason) = event["delta"]["stop_reason"].as_str() {
                    self.stop_reason = Some(reason.to_owned());
                }
                self.count(&event["usage"]);
            }
            "message_stop" => return Ok(vec![self.finish()]),
            "error" => return Err(stream_error(&event["error"])),
            _ => {}
        }
        Ok(Vec::new())
    }

    /// Text, if any, as a delta.
    fn text(&mut self, text: Option<&str>) -> Vec<ChatChunk> {
        match text.filter(|t| !t.is_empty()) {
            Some(text) => {
                self.text.push_str(text);
                vec![ChatChunk::Text(text.to_owned())]
            }
            None => Vec::new(),
        }
    }

    /// Takes the usage an event reports: the prompt is every input token (cached or not);
    /// `output_tokens` is cumulative.
    fn count(&mut self, usage: &Value) {
        let input: u64 = [
            "input_tokens",
            "cache_creation_input_tokens",
            "cache_read_input_tokens",
        ]
        .iter()
        .filter_map(|key| usage[key].as_u64())
        .sum();
        if usage["input_tokens"].is_u64() {
            self.usage.input_tokens = input;
            self.usage.cached_input_tokens = usage["cache_read_input_tokens"].as_u64().unwrap_or(0);
            self.usage.cache_write_tokens =
                usage["cache_creation_input_tokens"].as_u64().unwrap_or(0);
        }
        if let Some(output) = usage["output_tokens"].as_u64() {
            self.usage.output_tokens = output;
        }
    }

    /// The end: everything assembled.
    fn finish(&mut self) -> ChatChunk {
        self.done = true;
        let mut tool_calls: Vec<ToolCall> = std::mem::take(&mut self.calls).into_values().collect();
        for call in &mut tool_calls {
            if call.arguments.trim().is_empty() {
                call.arguments = "{}".into();
            }
        }
        // Ids missing or repeated (an "Anthropic-compatible" proxy) get their own, as on the
        // OpenAI path: a client answers each call by its id.
        super::give_unique_ids(&mut tool_calls, "toolu_");
        let finish_reason = match self.stop_reason.take().as_deref() {
            Some("end_turn" | "stop_sequence" | "pause_turn") => FinishReason::Stop,
            Some("tool_use") => FinishReason::ToolCalls,
            Some("max_tokens") => FinishReason::Length,
            Some("refusal") => FinishReason::ContentFilter,
            Some(other) => FinishReason::Other(other.to_owned()),
            None if tool_calls.is_empty() => FinishReason::Stop,
            None => FinishReason::ToolCalls,
        };
        ChatChunk::Done(ChatResponse {
            text: std::mem::take(&mut self.text),
            tool_calls,
            finish_reason,
            usage: self.usage,
            model: self.model.take(),
            id: self.id.take(),
        })
    }
}

/// An `error` event as the status its type stands for (so overloads and rate limits are
/// retried like their HTTP answers).
fn stream_error(error: &Value) -> LlmError {
    let status = match error["type"].as_str().unwrap_or_default() {
        "overloaded_error" => 529,
        "rate_limit_error" => 429,
        "invalid_request_error" => 400,
        "authentication_error" => 401,
        "permission_error" => 403,
        "not_found_error" => 404,
        "request_too_large" => 413,
        _ => 500,
    };
    LlmError::Status {
        status,
        message: super::provider_text(error["message"].as_str().unwrap_or("error in stream")),
        retry_after: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::llm::ToolDef;

    fn feed_all(events: &[Value]) -> Result<(Vec<String>, ChatResponse), LlmError> {
        let mut asm = Assembler::default();
        let mut deltas = Vec::new();
        for event in events {
            for chunk in asm.feed(&event.to_string())? {
                match chunk {
                    ChatChunk::Text(t) => deltas.push(t),
                    ChatChunk::Done(response) => return Ok((deltas, response)),
                }
            }
        }
        Err(LlmError::Incomplete)
    }

    #[test]
    fn the_conversation_maps_to_system_turns_tool_use_and_tool_results() {
        let request = ChatRequest {
            model: "claude-sonnet-4-5".into(),
            messages: vec![
                ChatMessage::System {
                    content: "Be brief.".into(),
                },
                ChatMessage::User {
                    content: "weather?".into(),
                },
                ChatMessage::Assistant {
                    content: Some("Looking.".into()),
                    tool_calls: vec![
                        ToolCall {
                            id: "t1".into(),
                            name: "get".into(),
                            arguments: r#"{"city":"Oslo"}"#.into(),
                        },
                        ToolCall {
                            id: "t2".into(),
                            name: "get".into(),
                            arguments: "not json".into(),
                        },
                    ],
                },
                ChatMessage::Tool {
                    tool_call_id: "t1".into(),
                    content: "sunny".into(),
                },
                ChatMessage::Tool {
                    tool_call_id: "t2".into(),
                    content: "rain".into(),
                },
            ],
            tools: vec![ToolDef {
                name: "get".into(),
                description: "d".into(),
                parameters: json!({"type": "object"}),
            }],
            tool_choice: Choice::Required,
            temperature: Some(1.5),
            max_output_tokens: None,
            response_format: None,
            parallel_tool_calls: None,
            top_p: None,
            reasoning_effort: None,
        };
        let body = body(&request);
        assert_eq!(body["system"], "Be brief.");
        assert_eq!(body["max_tokens"], DEFAULT_MAX_TOKENS);
        assert_eq!(body["temperature"], 1.0);
        assert_eq!(body["tool_choice"], json!({"type": "any"}));
        assert_eq!(body["tools"][0]["input_schema"], json!({"type": "object"}));
        let messages = body["messages"].as_array().expect("messages");
        assert_eq!(
            messages.len(),
            3,
            "user, assistant, one user turn of results"
        );
        assert_eq!(messages[1]["content"][1]["input"], json!({"city": "Oslo"}));
        assert_eq!(messages[1]["content"][2]["input"], json!({}));
        assert_eq!(messages[2]["role"], "user");
        assert_eq!(messages[2]["content"][1]["tool_use_id"], "t2");

        let mut answered_first = request.clone();
        answered_first.messages.drain(..2);
        let body = super::body(&answered_first);
        assert_eq!(body["messages"][0]["role"], "user", "the user first");
        assert_eq!(body["messages"][1]["role"], "assistant");
    }

    #[test]
    fn max_tokens_is_length_and_stream_errors_keep_their_retryability() {
        let events = [
            json!({"type": "message_start", "message": {"usage": {"input_tokens": 5, "cache_read_input_tokens": 2, "output_tokens": 1}}}),
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "cut"}}),
            json!({"type": "message_delta", "delta": {"stop_reason": "max_tokens"}, "usage": {"output_tokens": 9}}),
            json!({"type": "message_stop"}),
        ];
        let (_, response) = feed_all(&events).expect("parses");
        assert_eq!(response.finish_reason, FinishReason::Length);
        assert_eq!(
            (response.usage.input_tokens, response.usage.output_tokens),
            (7, 9)
        );
        assert_eq!(
            response.usage.cached_input_tokens, 2,
            "cache reads passed through"
        );

        let overloaded = [
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
        ];
        let err = feed_all(&overloaded).expect_err("an error event");
        assert!(err.is_retryable(), "{err}");
        assert!(err.to_string().contains("Overloaded"));
        let invalid = [
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}),
        ];
        assert!(!feed_all(&invalid).expect_err("an error").is_retryable());

        let orphan = [
            json!({"type": "content_block_delta", "index": 3, "delta": {"type": "input_json_delta", "partial_json": "{"}}),
        ];
        assert!(matches!(feed_all(&orphan), Err(LlmError::Protocol(_))));
        assert!(matches!(
            Assembler::default().feed("{not json"),
            Err(LlmError::Protocol(_))
        ));
    }

    #[test]
    fn tool_use_ids_missing_or_repeated_get_their_own() {
        let block = |index: u64, id: &str| {
            json!({"type": "content_block_start", "index": index,
                   "content_block": {"type": "tool_use", "id": id, "name": "get", "input": {}}})
        };
        let events = [
            block(0, "toolu_same"),
            block(1, "toolu_same"),
            block(2, ""),
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}}),
            json!({"type": "message_stop"}),
        ];
        let (_, response) = feed_all(&events).expect("parses");
        let ids: Vec<&str> = response.tool_calls.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids[0], "toolu_same", "the first holder keeps its id");
        let unique: std::collections::HashSet<&&str> = ids.iter().collect();
        assert_eq!(unique.len(), 3, "{ids:?}");
        assert!(ids.iter().all(|id| id.starts_with("toolu_")), "{ids:?}");
    }

    #[test]
    fn provider_text_in_errors_is_cut_and_raw_data_never_shown() {
        let long = "x".repeat(5_000);
        let events = [json!({"type": "error", "error": {"type": "api_error", "message": long}})];
        let err = feed_all(&events).expect_err("an error event").to_string();
        assert!(err.chars().count() < 600, "{} chars", err.chars().count());
        let secret = "sk-live-SECRET";
        for data in [
            format!("{{not json {secret}"),
            json!({"type": "content_block_start", "index": 0,
                   "content_block": {"type": "tool_use", "id": secret, "name": ""}})
            .to_string(),
            json!({"type": "content_block_delta", "index": 7,
                   "delta": {"type": "input_json_delta", "partial_json": secret}})
            .to_string(),
        ] {
            let err = Assembler::default()
                .feed(&data)
                .expect_err("refused")
                .to_string();
            assert!(!err.contains(secret), "{err}");
        }
    }
}
