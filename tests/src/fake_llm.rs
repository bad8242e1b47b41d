//! A fake OpenAI-compatible upstream: a real HTTP server on `127.0.0.1:0` that answers
//! `POST /v1/chat/completions` in the provider's streaming wire format (SSE `data:` chunks,
//! `[DONE]`), or with error statuses, as a test scripts it. It records every request body.

use std::sync::{Arc, Mutex, PoisonError};

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{Response, StatusCode};
use axum::routing::post;
use serde_json::{Value, json};

/// What the fake answers to one request.
#[derive(Clone, Debug)]
pub enum Reply {
    /// These `data:` payloads, then `[DONE]`.
    Stream(Vec<Value>),
    /// These payloads and no `[DONE]` (a stream cut short).
    Truncated(Vec<Value>),
    /// These payloads one at a time, this far apart, then `[DONE]` (a slow model, to crash
    /// a worker mid-answer).
    Paced(Vec<Value>, std::time::Duration),
    /// A recorded transcript, byte for byte.
    Raw(String),
    /// An error status with a JSON error body and an optional `Retry-After`.
    Status(u16, String, Option<String>),
}

type Handler = dyn Fn(&Value, usize) -> Reply + Send + Sync;

#[derive(Clone)]
struct Shared {
    handler: Arc<Handler>,
    requests: Arc<Mutex<Vec<Value>>>,
    credentials: Arc<Mutex<Vec<Option<String>>>>,
}

/// A running fake upstream.
pub struct FakeLlm {
    /// The base URL to configure (`http://127.0.0.1:PORT/v1`).
    pub base_url: String,
    requests: Arc<Mutex<Vec<Value>>>,
    credentials: Arc<Mutex<Vec<Option<String>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeLlm {
    /// Starts a fake whose answer to the n-th request (0-based) is `handler(body, n)`.
    pub async fn start(handler: impl Fn(&Value, usize) -> Reply + Send + Sync + 'static) -> Self {
        let shared = Shared {
            handler: Arc::new(handler),
            requests: Arc::default(),
            credentials: Arc::default(),
        };
        let requests = shared.requests.clone();
        let credentials = shared.credentials.clone();
        let app = axum::Router::new()
            .route("/v1/chat/completions", post(complete))
            // The Anthropic Messages API: the handler answers in its format (`anthropic_*`).
            .route("/v1/messages", post(complete))
            .with_state(shared);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let base_url = format!("http://{}/v1", listener.local_addr().expect("addr"));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            base_url,
            requests,
            credentials,
            task,
        }
    }

    /// Every request body received so far.
    pub fn requests(&self) -> Vec<Value> {
        self.requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The credentials of every request so far, in order: its `Authorization` header, else
    /// its `x-api-key` (Anthropic's).
    pub fn credentials(&self) -> Vec<Option<String>> {
        self.credentials
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for FakeLlm {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn complete(
    State(shared): State<Shared>,
    headers: axum::http::HeaderMap,
    Json(body): Json<Value>,
) -> Response<Body> {
    let credential = headers
        .get("authorization")
        .or_else(|| headers.get("x-api-key"))
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    shared
        .credentials
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(credential);
    let n = {
        let mut requests = shared
            .requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        requests.push(body.clone());
        requests.len() - 1
    };
    let sse = |payloads: &[Value], done: bool| {
        let mut text: String = payloads.iter().map(|p| format!("data: {p}\n\n")).collect();
        if done {
            text.push_str("data: [DONE]\n\n");
        }
        text
    };
    let (status, content_type, text, retry_after) = match (shared.handler)(&body, n) {
        Reply::Paced(payloads, gap) => return paced(payloads, gap),
        Reply::Stream(p) => (200, "text/event-stream", sse(&p, true), None),
        Reply::Truncated(p) => (200, "text/event-stream", sse(&p, false), None),
        Reply::Raw(raw) => (200, "text/event-stream", raw, None),
        Reply::Status(status, message, retry_after) => (
            status,
            "application/json",
            json!({"error": {"message": message, "type": "fake_error"}}).to_string(),
            retry_after,
        ),
    };
    let mut response = Response::builder()
        .status(StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header("content-type", content_type);
    if let Some(retry_after) = retry_after {
        response = response.header("retry-after", retry_after);
    }
    response.body(Body::from(text)).unwrap_or_default()
}

/// A streamed response whose `data:` lines come `gap` apart.
fn paced(payloads: Vec<Value>, gap: std::time::Duration) -> Response<Body> {
    use futures::StreamExt as _;
    let lines = payloads
        .into_iter()
        .map(|p| format!("data: {p}\n\n"))
        .chain(std::iter::once("data: [DONE]\n\n".to_owned()));
    let body = futures::stream::iter(lines).then(move |line| async move {
        tokio::time::sleep(gap).await;
        Ok::<_, std::convert::Infallible>(bytes::Bytes::from(line))
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(body))
        .unwrap_or_default()
}

/// A text answer in `pieces` deltas sent `gap` apart.
pub fn paced_text(answer: &str, pieces: usize, gap: std::time::Duration) -> Reply {
    match text(answer, pieces) {
        Reply::Stream(payloads) => Reply::Paced(payloads, gap),
        other => other,
    }
}

fn chunk(delta: Value, finish_reason: Option<&str>) -> Value {
    json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": "fake",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]})
}

/// A text answer split into `pieces` deltas, with usage.
pub fn text(answer: &str, pieces: usize) -> Reply {
    text_with_finish(answer, pieces, "stop")
}

/// Anthropic Messages stream events, framed as the API frames them (`event: {type}`, then
/// `data:`), for [`Reply::Raw`].
pub fn anthropic_events(events: &[Value]) -> Reply {
    Reply::Raw(
        events
            .iter()
            .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap_or("")))
            .collect(),
    )
}

/// An Anthropic Messages text answer in `pieces` deltas.
pub fn anthropic_text(answer: &str, pieces: usize) -> Reply {
    let chars: Vec<char> = answer.chars().collect();
    let size = chars.len().div_ceil(pieces.max(1)).max(1);
    let mut events = vec![
        json!({"type": "message_start", "message": {"id": "msg_fake", "type": "message",
            "role": "assistant", "content": [], "model": "fake", "stop_reason": null,
            "usage": {"input_tokens": 9, "output_tokens": 1}}}),
        json!({"type": "content_block_start", "index": 0,
            "content_block": {"type": "text", "text": ""}}),
    ];
    for piece in chars.chunks(size) {
        let text: String = piece.iter().collect();
        events.push(json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": text}}));
    }
    events.extend([
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
            "usage": {"output_tokens": pieces}}),
        json!({"type": "message_stop"}),
    ]);
    anthropic_events(&events)
}

/// A text answer that ends with `finish_reason`.
pub fn text_with_finish(answer: &str, pieces: usize, finish_reason: &str) -> Reply {
    let chars: Vec<char> = answer.chars().collect();
    let size = chars.len().div_ceil(pieces.max(1)).max(1);
    let mut payloads = vec![chunk(json!({"role": "assistant", "content": ""}), None)];
    for piece in chars.chunks(size) {
        payloads.push(chunk(
            json!({"content": piece.iter().collect::<String>()}),
            None,
        ));
    }
    payloads.push(chunk(json!({}), Some(finish_reason)));
    payloads.push(
        json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0,
        "model": "fake", "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5,
        "total_tokens": 15}}),
    );
    Reply::Stream(payloads)
}

/// Tool calls `(id, name, arguments)`, each opened by a chunk with id and name and continued by
/// argument fragments of three characters, as the real API streams them.
pub fn tool_calls(calls: &[(&str, &str, &str)]) -> Reply {
    let mut payloads = vec![chunk(json!({"role": "assistant", "content": null}), None)];
    for (index, (id, name, arguments)) in calls.iter().enumerate() {
        payloads.push(chunk(
            json!({"tool_calls": [{"index": index, "id": id, "type": "function",
            "function": {"name": name, "arguments": ""}}]}),
            None,
        ));
        let chars: Vec<char> = arguments.chars().collect();
        for piece in chars.chunks(3) {
            payloads.push(chunk(
                json!({"tool_calls": [{"index": index,
                "function": {"arguments": piece.iter().collect::<String>()}}]}),
                None,
            ));
        }
    }
    payloads.push(chunk(json!({}), Some("tool_calls")));
    payloads.push(
        json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0,
        "model": "fake", "choices": [], "usage": {"prompt_tokens": 20, "completion_tokens": 7,
        "total_tokens": 27}}),
    );
    Reply::Stream(payloads)
}

/// The same streamed reply with `text` streamed first (a model that says something before its
/// tool calls).
pub fn with_text(reply: Reply, text: &str) -> Reply {
    match reply {
        Reply::Stream(mut payloads) => {
            payloads.insert(1, chunk(json!({"content": text}), None));
            Reply::Stream(payloads)
        }
        other => other,
    }
}

/// How many tool results the request's conversation already holds (the step a scripted
/// upstream is at).
pub fn tool_results_in(request: &Value) -> usize {
    request["messages"]
        .as_array()
        .map(|m| m.iter().filter(|m| m["role"] == "tool").count())
        .unwrap_or(0)
}

/// The content of the last tool result in the request's conversation, if any.
pub fn last_tool_result(request: &Value) -> Option<&str> {
    request["messages"]
        .as_array()?
        .iter()
        .rev()
        .find(|m| m["role"] == "tool")?["content"]
        .as_str()
}

/// An upstream that calls `get_weather(Paris)` first (call id `call_w`), then says what the
/// tool answered: `Tool said: {output}`.
pub fn weather_then_echo() -> impl Fn(&Value, usize) -> Reply + Send + Sync + 'static {
    |request, _| match tool_results_in(request) {
        0 => tool_calls(&[("call_w", "get_weather", r#"{"city": "Paris"}"#)]),
        _ => {
            let output = last_tool_result(request).unwrap_or("?").to_owned();
            text(&format!("Tool said: {output}"), 1)
        }
    }
}

/// A retrieval run, scripted: the model calls `search` first, then answers `answer` (which
/// cites the numbered chunks, or not).
pub fn search_then_answer(
    answer: &'static str,
) -> impl Fn(&Value, usize) -> Reply + Send + Sync + 'static {
    move |request, _| match tool_results_in(request) {
        0 => tool_calls(&[("call_s", "search", r#"{"query": "harbour"}"#)]),
        _ => text(answer, 3),
    }
}

/// Agents as tools, scripted: the lead ([`lead_spec`]) hands the question to its `research`
/// tool once and then answers `The researcher says: {the tool's result}`; the researcher
/// ([`researcher_spec`]) answers with `research()`.
pub fn lead_and_researcher(
    research: impl Fn() -> Reply + Send + Sync + 'static,
) -> impl Fn(&Value, usize) -> Reply + Send + Sync + 'static {
    move |request, _| {
        if request["messages"][0]["content"] == RESEARCHER_INSTRUCTIONS {
            return research();
        }
        match tool_results_in(request) {
            0 => tool_calls(&[(
                "call_r",
                "research",
                r#"{"input": "What is the capital of France?"}"#,
            )]),
            _ => {
                let result = last_tool_result(request).unwrap_or("?").to_owned();
                text(&format!("The researcher says: {result}"), 2)
            }
        }
    }
}

/// The researcher's instructions (its model calls start with them).
pub const RESEARCHER_INSTRUCTIONS: &str = "You research.";
/// The lead's instructions.
pub const LEAD_INSTRUCTIONS: &str = "You lead.";

/// The researcher agent of [`lead_and_researcher`].
pub fn researcher_spec() -> Value {
    json!({"name": "researcher", "model": "gpt-4o-mini", "instructions": RESEARCHER_INSTRUCTIONS})
}

/// The lead agent of [`lead_and_researcher`], whose `research` tool is the agent `researcher`.
pub fn lead_spec(researcher: &str) -> Value {
    json!({"name": "lead", "model": "gpt-4o-mini", "instructions": LEAD_INSTRUCTIONS,
        "tools": [{"type": "agent", "name": "research", "agent_id": researcher,
                   "description": "Finds facts."}]})
}
