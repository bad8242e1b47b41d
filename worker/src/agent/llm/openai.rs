//! An OpenAI-compatible Chat Completions client (OpenAI, vLLM, Ollama, llama.cpp, LiteLLM, ...):
//! streaming over reqwest (the SSE plumbing is [`super::sse_chunks`]), chunks assembled by
//! [`Assembler`].
//!
//! Lenient where compatible servers differ: missing `index` fields, ids repeated on every
//! fragment, whole arguments in one fragment, `refusal` instead of `content`, usage in its own
//! chunk or absent, extra choices (`n > 1`: only choice 0 is used). Strict where silence would
//! hide a failure: a stream that ends without `[DONE]` is [`LlmError::Incomplete`], never a
//! short answer.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::FutureExt as _;
use futures::future::BoxFuture;
use serde_json::{Value, json};

use spool_shared::run::Usage;

use super::{
    ChatChunk, ChatMessage, ChatModel, ChatRequest, ChatResponse, ChatStream, Choice, FinishReason,
    LlmError, ToolCall,
};

/// A client for one OpenAI-compatible endpoint.
#[derive(Clone)]
pub struct OpenAiClient(pub(crate) super::Endpoint);

impl OpenAiClient {
    /// A client for `base_url` (e.g. `https://api.openai.com/v1`); `idle_timeout` bounds the wait
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
        super::Endpoint::new(base_url, "chat/completions", api_key, timeouts).map(Self)
    }
}

impl ChatModel for OpenAiClient {
    fn stream(&self, request: ChatRequest) -> BoxFuture<'_, Result<ChatStream, LlmError>> {
        async move {
            let mut call = self.0.http.post(&self.0.url).json(&body(&request));
            if let Some(key) = &self.0.api_key {
                call = call.bearer_auth(key);
            }
            let bounds = self.0.timeouts.start();
            let response = super::send(call, &bounds).await?;
            Ok(super::sse_chunks(response, Assembler::default(), bounds))
        }
        .boxed()
    }
}

/// The request body in the provider's wire format.
pub fn body(request: &ChatRequest) -> Value {
    let messages: Vec<Value> = request.messages.iter().map(wire_message).collect();
    let mut body = json!({
        "model": request.model,
        "messages": messages,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if !request.tools.is_empty() {
        body["tools"] = request
            .tools
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {
                "name": t.name, "description": t.description, "parameters": t.parameters}})
            })
            .collect();
        body["tool_choice"] = match &request.tool_choice {
            Choice::Auto => json!("auto"),
            Choice::Required => json!("required"),
            Choice::None => json!("none"),
            Choice::Tool(name) => json!({"type": "function", "function": {"name": name}}),
        };
        if let Some(parallel) = request.parallel_tool_calls {
            body["parallel_tool_calls"] = json!(parallel);
        }
    }
    if let Some(max_tokens) = request.max_output_tokens {
        body["max_tokens"] = json!(max_tokens);
    }
    if let Some(temperature) = request.temperature {
        body["temperature"] = json!(temperature);
    }
    if let Some(top_p) = request.top_p {
        body["top_p"] = json!(top_p);
    }
    if let Some(effort) = &request.reasoning_effort {
        body["reasoning_effort"] = json!(effort);
    }
    if let Some(format) = &request.response_format {
        let mut schema = json!({"name": format.name(), "schema": format.schema()});
        if let Some(strict) = format.strict() {
            schema["strict"] = json!(strict);
        }
        body["response_format"] = json!({"type": "json_schema", "json_schema": schema});
    }
    body
}

fn wire_message(message: &ChatMessage) -> Value {
    match message {
        ChatMessage::System { content } => json!({"role": "system", "content": content}),
        ChatMessage::User { content } => json!({"role": "user", "content": content}),
        ChatMessage::Assistant {
            content,
            tool_calls,
        } => {
            let mut m = json!({"role": "assistant", "content": content});
            if !tool_calls.is_empty() {
                m["tool_calls"] = tool_calls
                    .iter()
                    .map(|c| {
                        json!({"id": c.id, "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments}})
                    })
                    .collect();
            }
            m
        }
        ChatMessage::Tool {
            tool_call_id,
            content,
        } => {
            json!({"role": "tool", "tool_call_id": tool_call_id, "content": content})
        }
    }
}

/// Assembles streamed chunks into text deltas and one final [`ChatResponse`].
#[derive(Debug, Default)]
pub struct Assembler {
    text: String,
    calls: BTreeMap<u64, ToolCall>,
    finish_reason: Option<FinishReason>,
    usage: Usage,
    /// The answering model and the response's id, from the first chunk that names them.
    model: Option<String>,
    id: Option<String>,
    done: bool,
}

impl super::Assemble for Assembler {
    fn finished(&self) -> bool {
        self.done
    }

    fn fail(&mut self) {
        self.done = true;
    }

    fn feed(&mut self, data: &str) -> Result<Vec<ChatChunk>, LlmError> {
        Assembler::feed(self, data)
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
    /// Feeds one SSE `data:` payload; returns the chunks it completes.
    ///
    /// The wire format's state machine in one piece (done, errors, usage, text and refusal
    /// deltas, tool-call fragments by index, finish reasons), read against the recorded
    /// transcripts its tests replay; the end's response, the usage and a tool call's fragment
    /// are read by the helpers below.
    pub fn feed(&mut self, data: &str) -> Result<Vec<ChatChunk>, LlmError> {
        let data = data.trim();
        if data == "[DONE]" {
            return Ok(vec![ChatChunk::Done(self.finish())]);
        }
        if data.is_empty() {
            return Ok(Vec::new());
        }
        let chunk: Value = serde_json::from_str(data).map_err(|e| {
            // The data itself stays out of the error, which end users read.
            super::log_unreadable(data);
            LlmError::Protocol(format!("a chunk that is not JSON ({e})"))
        })?;
        if let Some(error) = chunk.get("error").filter(|e| !e.is_null()) {
            let message =
                super::provider_text(error["message"].as_str().unwrap_or("error in stream"));
            return Err(LlmError::Status {
                status: 500,
                message,
                retry_after: None,
            });
        }
        let named = |key: &str| {
            chunk[key]
                .as_str()
                .filter(|v| !v.is_empty())
                .map(super::provider_text)
        };
        if self.model.is_none() {
            self.model = named("model");
        }
        if self.id.is_none() {
            self.id = named("id");
        }
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            self.usage = usage_of(usage);
        }
        let mut out = Vec::new();
        let choices = chunk["choices"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        for choice in choices
            .iter()
            .filter(|c| c["index"].as_u64().unwrap_or(0) == 0)
        {
            let delta = &choice["delta"];
            for key in ["content", "refusal"] {
                if let Some(text) = delta[key].as_str().filter(|t| !t.is_empty()) {
                    self.text.push_str(text);
                    out.push(ChatChunk::Text(text.to_owned()));
                }
            }
            for (position, call) in delta["tool_calls"]
                .as_array()
                .into_iter()
                .flatten()
                .enumerate()
            {
                self.add_call_fragment(position, call);
            }
            if let Some(reason) = choice["finish_reason"].as_str() {
                self.finish_reason = Some(FinishReason::parse(reason));
            }
        }
        Ok(out)
    }

    /// The stream's end (`[DONE]`): the assembled response, its tool calls in index order with
    /// unique ids, and `tool_calls` as the finish reason when none came but calls did.
    fn finish(&mut self) -> ChatResponse {
        self.done = true;
        let mut tool_calls: Vec<ToolCall> = std::mem::take(&mut self.calls).into_values().collect();
        super::give_unique_ids(&mut tool_calls, "call_");
        let finish_reason = self
            .finish_reason
            .take()
            .unwrap_or(if tool_calls.is_empty() {
                FinishReason::Stop
            } else {
                FinishReason::ToolCalls
            });
        ChatResponse {
            text: std::mem::take(&mut self.text),
            tool_calls,
            finish_reason,
            usage: self.usage,
            model: self.model.take(),
            id: self.id.take(),
        }
    }

    /// One fragment of a tool call (the `position`th of its delta): the call it continues is
    /// the one with its `index`; the id and name arrive once, the arguments in pieces.
    fn add_call_fragment(&mut self, position: usize, call: &Value) {
        let index = call["index"].as_u64().unwrap_or(position as u64);
        let entry = self.calls.entry(index).or_insert_with(|| ToolCall {
            id: String::new(),
            name: String::new(),
            arguments: String::new(),
        });
        if let Some(id) = call["id"].as_str().filter(|id| !id.is_empty()) {
            entry.id = id.to_owned();
        }
        if let Some(name) = call["function"]["name"].as_str().filter(|n| !n.is_empty()) {
            entry.name = name.to_owned();
        }
        if let Some(arguments) = call["function"]["arguments"].as_str() {
            entry.arguments.push_str(arguments);
        }
    }
}

/// A chunk's `usage` object as the loop counts it (its cost is priced by the loop, which
/// knows the provider's prices).
fn usage_of(usage: &Value) -> Usage {
    Usage {
        input_tokens: usage["prompt_tokens"].as_u64().unwrap_or(0),
        output_tokens: usage["completion_tokens"].as_u64().unwrap_or(0),
        cached_input_tokens: usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0),
        cache_write_tokens: 0,
        reasoning_tokens: usage["completion_tokens_details"]["reasoning_tokens"]
            .as_u64()
            .unwrap_or(0),
        cost_usd: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::llm::{MAX_RETRY_AFTER, retry_after};
    use reqwest::header::HeaderMap;

    fn feed_all(transcript: &str) -> (Vec<String>, ChatResponse) {
        let mut asm = Assembler::default();
        let mut deltas = Vec::new();
        for line in transcript.lines() {
            let Some(data) = line.strip_prefix("data:") else {
                continue;
            };
            for chunk in asm.feed(data).expect("valid chunk") {
                match chunk {
                    ChatChunk::Text(t) => deltas.push(t),
                    ChatChunk::Done(response) => return (deltas, response),
                }
            }
        }
        panic!("no [DONE]");
    }

    #[test]
    fn fragments_without_index_and_with_repeated_ids_assemble() {
        let transcript = r#"data: {"choices":[{"delta":{"tool_calls":[{"id":"c1","function":{"name":"f","arguments":"{\"a\""}}]}}]}
data: {"choices":[{"delta":{"tool_calls":[{"id":"c1","function":{"arguments":":1}"}}]},"finish_reason":"tool_calls"}]}
data: [DONE]"#;
        let (deltas, response) = feed_all(transcript);
        assert!(deltas.is_empty());
        assert_eq!(
            response.tool_calls,
            [ToolCall {
                id: "c1".into(),
                name: "f".into(),
                arguments: "{\"a\":1}".into()
            }]
        );
        assert_eq!(response.finish_reason, FinishReason::ToolCalls);
    }

    #[test]
    fn cached_and_reasoning_tokens_are_passed_through() {
        let transcript = r#"data: {"choices":[{"delta":{"content":"hi"},"finish_reason":"stop"}]}
data: {"choices":[],"usage":{"prompt_tokens":40,"completion_tokens":12,"total_tokens":52,"prompt_tokens_details":{"cached_tokens":32},"completion_tokens_details":{"reasoning_tokens":8}}}
data: [DONE]"#;
        let (_, response) = feed_all(transcript);
        let usage = response.usage;
        assert_eq!(
            (
                usage.input_tokens,
                usage.output_tokens,
                usage.cached_input_tokens,
                usage.reasoning_tokens
            ),
            (40, 12, 32, 8)
        );
    }

    #[test]
    fn an_error_chunk_is_an_error() {
        let mut asm = Assembler::default();
        assert!(asm.feed(r#"{"error":{"message":"overloaded"}}"#).is_err());
        assert!(asm.feed("not json").is_err());
    }

    #[test]
    fn the_request_body_has_the_wire_shape() {
        let request = ChatRequest {
            model: "m".into(),
            messages: vec![
                ChatMessage::System {
                    content: "s".into(),
                },
                ChatMessage::Assistant {
                    content: None,
                    tool_calls: vec![ToolCall {
                        id: "1".into(),
                        name: "f".into(),
                        arguments: "{}".into(),
                    }],
                },
                ChatMessage::Tool {
                    tool_call_id: "1".into(),
                    content: "r".into(),
                },
            ],
            tools: vec![super::super::ToolDef {
                name: "f".into(),
                description: "d".into(),
                parameters: json!({"type": "object"}),
            }],
            tool_choice: Choice::Tool("f".into()),
            temperature: Some(0.5),
            max_output_tokens: Some(64),
            response_format: Some(spool_shared::agent::ResponseFormat::JsonSchema {
                name: Some("city".into()),
                schema: json!({"type": "object"}),
                strict: Some(true),
            }),
            parallel_tool_calls: Some(false),
            top_p: Some(0.9),
            reasoning_effort: Some("low".into()),
        };
        let body = body(&request);
        assert_eq!(body["parallel_tool_calls"], false);
        assert_eq!(body["stream"], true);
        assert_eq!(
            body["messages"][1]["tool_calls"][0]["function"]["name"],
            "f"
        );
        assert_eq!(body["messages"][2]["role"], "tool");
        assert_eq!(body["tool_choice"]["function"]["name"], "f");
        assert_eq!(body["tools"][0]["type"], "function");
        assert_eq!(body["temperature"], 0.5);
        assert_eq!(body["max_tokens"], 64);
        assert_eq!(
            (body["top_p"].clone(), body["reasoning_effort"].clone()),
            (json!(0.9), json!("low"))
        );
        assert_eq!(
            body["response_format"],
            json!({"type": "json_schema",
                   "json_schema": {"name": "city", "schema": {"type": "object"}, "strict": true}})
        );
    }

    #[test]
    fn retry_after_is_bounded_and_ignores_what_is_not_a_number() {
        let wait = |name: &str, value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(
                reqwest::header::HeaderName::from_bytes(name.as_bytes()).expect("name"),
                value.parse().expect("value"),
            );
            retry_after(&headers)
        };
        assert_eq!(wait("retry-after", "2"), Some(Duration::from_secs(2)));
        assert_eq!(
            wait("retry-after-ms", "1500"),
            Some(Duration::from_millis(1500))
        );
        for huge in ["1e30", "99999999", "inf"] {
            assert_eq!(wait("retry-after", huge), Some(MAX_RETRY_AFTER), "{huge}");
            assert_eq!(
                wait("retry-after-ms", huge),
                Some(MAX_RETRY_AFTER),
                "{huge}"
            );
        }
        assert_eq!(wait("retry-after-ms", "-5"), Some(Duration::ZERO));
        assert_eq!(wait("retry-after", "NaN"), None);
        assert_eq!(wait("retry-after-ms", "nan"), None);
        assert_eq!(wait("retry-after", "Wed, 21 Oct 2026 07:28:00 GMT"), None);
    }

    #[test]
    fn calls_without_ids_or_with_repeated_ids_get_their_own() {
        let transcript = r#"data: {"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"name":"a","arguments":"{}"}}]}}]}
data: {"choices":[{"delta":{"tool_calls":[{"index":1,"id":"same","function":{"name":"b","arguments":"{}"}}]}}]}
data: {"choices":[{"delta":{"tool_calls":[{"index":2,"id":"same","function":{"name":"c","arguments":"{}"}}]}}]}
data: {"choices":[{"delta":{"tool_calls":[{"index":3,"id":"","function":{"name":"d","arguments":"{}"}}]},"finish_reason":"tool_calls"}]}
data: [DONE]"#;
        let (_, response) = feed_all(transcript);
        let ids: Vec<&str> = response.tool_calls.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids.len(), 4);
        assert_eq!(ids[1], "same", "the first holder keeps its id");
        assert!(ids.iter().all(|id| !id.is_empty()), "{ids:?}");
        let unique: std::collections::HashSet<&&str> = ids.iter().collect();
        assert_eq!(unique.len(), 4, "{ids:?}");
    }

    #[test]
    fn provider_text_in_errors_is_cut_and_raw_data_never_shown() {
        let long = "y".repeat(5_000);
        let mut asm = Assembler::default();
        let err = asm
            .feed(&json!({"error": {"message": long}}).to_string())
            .expect_err("an error chunk")
            .to_string();
        assert!(err.chars().count() < 600, "{} chars", err.chars().count());
        let secret = "sk-live-SECRET";
        let err = Assembler::default()
            .feed(&format!("{{\"choices\": [{secret}"))
            .expect_err("not JSON")
            .to_string();
        assert!(!err.contains(secret), "{err}");
        let body = json!({"error": {"message": long}}).to_string();
        let message = crate::agent::llm::provider_message(&body);
        assert!(
            message.chars().count() <= 501,
            "{}",
            message.chars().count()
        );
    }
}
