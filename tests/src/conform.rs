//! Conformance with OpenAI's published OpenAPI document (DESIGN section 11): a recording proxy
//! on loopback between a test's clients (the official SDKs, or the test itself) and the API,
//! which keeps every answer of the OpenAI-compatible routes, and a check that validates each
//! object and each streaming event against the component schema the document names for it.
//!
//! The schemas are an extract of the document at a pinned commit,
//! `tests/fixtures/openai-openapi/components.json` (made by `extract.py` beside it: the schemas
//! the routes' objects name and everything they reference, unchanged).
//!
//! | route | answer | schema |
//! |---|---|---|
//! | `POST /v1/responses`, `GET /v1/responses/{id}`, `POST .../cancel` | JSON | `Response` |
//! | the same, `text/event-stream` | each event | the `ResponseStreamEvent` member whose `type` it is |
//! | `POST /v1/chat/completions` | JSON | `CreateChatCompletionResponse` |
//! | the same, streamed | each chunk (not `[DONE]`) | `CreateChatCompletionStreamResponse` (`ErrorResponse` for an `error` object) |
//! | `GET /v1/models` | JSON | `ListModelsResponse` |
//! | `GET /v1/models/{id}` | JSON | `Model` |
//! | `POST /v1/conversations`, `GET`/`POST /v1/conversations/{id}` | JSON | `ConversationResource` |
//! | `DELETE /v1/conversations/{id}` | JSON | `DeletedConversationResource` |
//! | `GET`/`POST /v1/conversations/{id}/items` | JSON | `ConversationItemList` |
//! | `GET /v1/conversations/{id}/items/{item}` | JSON | `ConversationItem` |
//! | any route, 4xx or 5xx | JSON | `ErrorResponse` |

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::StreamExt as _;
use serde_json::{Value, json};

/// The extract of OpenAI's document (see the module doc).
const COMPONENTS: &str = include_str!("../fixtures/openai-openapi/components.json");

/// One answer the proxy passed on.
#[derive(Debug, Clone)]
pub struct Exchange {
    /// The request's method.
    pub method: Method,
    /// The request's path (no query).
    pub path: String,
    /// The answer's status.
    pub status: StatusCode,
    /// Whether it was `text/event-stream`.
    pub streamed: bool,
    /// The body as far as the client read it.
    pub body: Vec<u8>,
}

type Log = Arc<Mutex<Vec<Arc<Mutex<Exchange>>>>>;

/// A recording proxy in front of the API (see the module doc).
pub struct Conformance {
    /// Its base URL (`http://127.0.0.1:port`): give it to clients in place of the API's.
    pub base: String,
    log: Log,
    server: tokio::task::JoinHandle<()>,
}

#[derive(Clone)]
struct Proxy {
    upstream: String,
    http: reqwest::Client,
    log: Log,
}

impl Conformance {
    /// A proxy to the API at `upstream`.
    pub async fn start(upstream: &str) -> Self {
        let log: Log = Arc::default();
        let proxy = Proxy {
            upstream: upstream.trim_end_matches('/').to_owned(),
            http: reqwest::Client::builder()
                .no_proxy()
                .build()
                .expect("an HTTP client"),
            log: log.clone(),
        };
        let app = axum::Router::new().fallback(forward).with_state(proxy);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let base = format!("http://{}", listener.local_addr().expect("its address"));
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { base, log, server }
    }

    /// What the proxy passed on so far.
    pub fn exchanges(&self) -> Vec<Exchange> {
        let log = self.log.lock().expect("the log");
        log.iter()
            .map(|exchange| exchange.lock().expect("an exchange").clone())
            .collect()
    }

    /// Validates everything the OpenAI-compatible routes answered; panics naming every
    /// violation. Returns how many objects were checked (so a test can assert it saw some).
    pub fn check(&self) -> usize {
        let schemas = Schemas::load();
        let mut checked = 0;
        let mut violations = Vec::new();
        for exchange in self.exchanges() {
            for (name, object) in objects(&exchange, &schemas, &mut violations) {
                checked += 1;
                for problem in schemas.validate(&name, &object) {
                    violations.push(format!(
                        "{} {} ({}): {name}: {problem}\n    {}",
                        exchange.method,
                        exchange.path,
                        exchange.status,
                        truncate(&object.to_string())
                    ));
                }
            }
        }
        assert!(
            violations.is_empty(),
            "{} of what the OpenAI-compatible routes sent does not conform to OpenAI's document:\n{}",
            violations.len(),
            violations.join("\n")
        );
        checked
    }
}

impl Drop for Conformance {
    fn drop(&mut self) {
        self.server.abort();
    }
}

fn truncate(text: &str) -> String {
    if text.len() <= 600 {
        return text.to_owned();
    }
    let mut end = 600;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

const HOP: [&str; 4] = ["host", "connection", "transfer-encoding", "content-length"];

async fn forward(State(proxy): State<Proxy>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let Ok(body) = axum::body::to_bytes(body, 64 << 20).await else {
        return StatusCode::PAYLOAD_TOO_LARGE.into_response();
    };
    let path_and_query = parts
        .uri
        .path_and_query()
        .map_or("/", |pq| pq.as_str())
        .to_owned();
    let mut headers = HeaderMap::new();
    for (name, value) in &parts.headers {
        if !HOP.contains(&name.as_str()) {
            headers.append(name.clone(), value.clone());
        }
    }
    let upstream = proxy
        .http
        .request(
            parts.method.clone(),
            format!("{}{path_and_query}", proxy.upstream),
        )
        .headers(headers)
        .body(body)
        .send()
        .await;
    let upstream = match upstream {
        Ok(upstream) => upstream,
        Err(err) => return (StatusCode::BAD_GATEWAY, err.to_string()).into_response(),
    };
    let status = upstream.status();
    let streamed = upstream
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let exchange = Arc::new(Mutex::new(Exchange {
        method: parts.method,
        path: parts.uri.path().to_owned(),
        status,
        streamed,
        body: Vec::new(),
    }));
    proxy.log.lock().expect("the log").push(exchange.clone());
    let mut response = Response::builder().status(status);
    for (name, value) in upstream.headers() {
        if !HOP.contains(&name.as_str()) {
            response = response.header(name.clone(), value.clone());
        }
    }
    let body = upstream.bytes_stream().map(move |chunk| {
        if let Ok(bytes) = &chunk {
            exchange
                .lock()
                .expect("an exchange")
                .body
                .extend_from_slice(bytes);
        }
        chunk
    });
    response
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response())
}

/// The `data:` of each complete event of an SSE body (a last event the client did not read to
/// its end is left out).
pub fn sse_data(body: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(body).replace("\r\n", "\n");
    let mut events: Vec<&str> = text.split("\n\n").collect();
    // What follows the last blank line is an unfinished event.
    events.pop();
    events
        .into_iter()
        .filter_map(|event| {
            let data: Vec<&str> = event
                .lines()
                .filter_map(|line| line.strip_prefix("data:"))
                .map(|data| data.strip_prefix(' ').unwrap_or(data))
                .collect();
            (!data.is_empty()).then(|| data.join("\n"))
        })
        .collect()
}

/// The (schema, object) pairs an exchange holds (see the module doc's table).
fn objects(
    exchange: &Exchange,
    schemas: &Schemas,
    violations: &mut Vec<String>,
) -> Vec<(String, Value)> {
    let segments: Vec<&str> = exchange.path.trim_matches('/').split('/').collect();
    let openai = matches!(
        segments.as_slice(),
        ["v1", "responses" | "chat" | "models" | "conversations", ..]
    );
    if !openai {
        return Vec::new();
    }
    let mut out = Vec::new();
    let parse = |text: &str, violations: &mut Vec<String>| match serde_json::from_str::<Value>(text)
    {
        Ok(value) => Some(value),
        Err(err) => {
            violations.push(format!(
                "{} {}: not JSON ({err}): {}",
                exchange.method,
                exchange.path,
                truncate(text)
            ));
            None
        }
    };
    if !exchange.status.is_success() {
        if let Some(value) = parse(&String::from_utf8_lossy(&exchange.body), violations) {
            out.push(("ErrorResponse".to_owned(), value));
        }
        return out;
    }
    if exchange.streamed {
        for data in sse_data(&exchange.body) {
            if data == "[DONE]" {
                continue;
            }
            let Some(value) = parse(&data, violations) else {
                continue;
            };
            let name = match segments.as_slice() {
                ["v1", "responses", ..] => {
                    let kind = value["type"].as_str().unwrap_or_default();
                    match schemas.event(kind) {
                        Some(name) => name.to_owned(),
                        None => {
                            violations.push(format!(
                                "{} {}: the event type {kind:?} is not one OpenAI's document defines",
                                exchange.method, exchange.path
                            ));
                            continue;
                        }
                    }
                }
                _ if value.get("error").is_some() => "ErrorResponse".to_owned(),
                _ => "CreateChatCompletionStreamResponse".to_owned(),
            };
            out.push((name, value));
        }
        return out;
    }
    let name = match (exchange.method.as_str(), segments.as_slice()) {
        (_, ["v1", "responses", ..]) => "Response",
        (_, ["v1", "chat", "completions"]) => "CreateChatCompletionResponse",
        (_, ["v1", "models"]) => "ListModelsResponse",
        (_, ["v1", "models", _]) => "Model",
        ("DELETE", ["v1", "conversations", _]) => "DeletedConversationResource",
        (_, ["v1", "conversations"] | ["v1", "conversations", _]) => "ConversationResource",
        (_, ["v1", "conversations", _, "items"]) => "ConversationItemList",
        ("GET", ["v1", "conversations", _, "items", _]) => "ConversationItem",
        ("DELETE", ["v1", "conversations", _, "items", _]) => "ConversationResource",
        _ => return out,
    };
    if let Some(value) = parse(&String::from_utf8_lossy(&exchange.body), violations) {
        out.push((name.to_owned(), value));
    }
    out
}

/// Rewrites OpenAPI 3.0's `nullable: true`, which the document still uses in places (a chat
/// chunk's `finish_reason` and `logprobs`, which OpenAI sends as `null`) and JSON Schema does not
/// know, as `anyOf: [the schema, null]`.
fn nullable(node: &mut Value) {
    match node {
        Value::Object(map) => {
            for value in map.values_mut() {
                nullable(value);
            }
            if map.remove("nullable") == Some(Value::Bool(true)) {
                let schema = Value::Object(std::mem::take(map));
                map.insert("anyOf".into(), json!([schema, {"type": "null"}]));
            }
        }
        Value::Array(items) => items.iter_mut().for_each(nullable),
        _ => {}
    }
}

/// The extract's schemas, with a validator per schema name.
struct Schemas {
    document: Value,
    /// A `ResponseStreamEvent` member per event `type`.
    events: HashMap<String, String>,
    validators: Mutex<HashMap<String, Arc<jsonschema::Validator>>>,
}

impl Schemas {
    fn load() -> Self {
        let extract: Value = serde_json::from_str(COMPONENTS).expect("components.json");
        let mut components = extract["components"].clone();
        nullable(&mut components);
        let document = json!({"components": components});
        let schemas = &document["components"]["schemas"];
        let mut events = HashMap::new();
        for member in schemas["ResponseStreamEvent"]["anyOf"]
            .as_array()
            .expect("ResponseStreamEvent is an anyOf")
        {
            let name = member["$ref"]
                .as_str()
                .and_then(|r| r.strip_prefix("#/components/schemas/"))
                .expect("a member is a $ref");
            for kind in schemas[name]["properties"]["type"]["enum"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
            {
                events.insert(kind.to_owned(), name.to_owned());
            }
        }
        Self {
            document,
            events,
            validators: Mutex::default(),
        }
    }

    /// The schema of the event `kind`, if the document defines it.
    fn event(&self, kind: &str) -> Option<&str> {
        self.events.get(kind).map(String::as_str)
    }

    /// What is wrong with `object` as a `name` (nothing: empty).
    fn validate(&self, name: &str, object: &Value) -> Vec<String> {
        let validator = {
            let mut validators = self.validators.lock().expect("validators");
            validators
                .entry(name.to_owned())
                .or_insert_with(|| {
                    let mut schema = self.document.clone();
                    schema["$ref"] = json!(format!("#/components/schemas/{name}"));
                    Arc::new(
                        jsonschema::draft202012::new(&schema)
                            .unwrap_or_else(|err| panic!("the schema {name}: {err}")),
                    )
                })
                .clone()
        };
        validator
            .iter_errors(object)
            .map(|error| format!("at {:?}: {error}", error.instance_path().as_str()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_extract_names_a_schema_for_every_event_type() {
        let schemas = Schemas::load();
        assert_eq!(
            schemas.event("response.completed"),
            Some("ResponseCompletedEvent")
        );
        assert_eq!(schemas.event("response.cancelled"), None);
    }

    #[test]
    fn a_usage_without_the_required_details_is_refused() {
        let schemas = Schemas::load();
        let usage = json!({"input_tokens": 1, "output_tokens": 1, "total_tokens": 2,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0}});
        assert!(!schemas.validate("ResponseUsage", &usage).is_empty());
        let mut complete = usage.clone();
        complete["input_tokens_details"]["cache_write_tokens"] = json!(0);
        assert_eq!(
            schemas.validate("ResponseUsage", &complete),
            Vec::<String>::new()
        );
    }

    #[test]
    fn nullable_accepts_null_as_openai_sends_it() {
        let schemas = Schemas::load();
        let chunk = json!({"id": "c", "object": "chat.completion.chunk", "created": 0,
            "model": "m", "choices": [{"index": 0, "delta": {"content": "hi"},
            "finish_reason": null, "logprobs": null}]});
        assert_eq!(
            schemas.validate("CreateChatCompletionStreamResponse", &chunk),
            Vec::<String>::new()
        );
        let mut wrong = chunk.clone();
        wrong["choices"][0]["finish_reason"] = json!("maybe");
        assert!(
            !schemas
                .validate("CreateChatCompletionStreamResponse", &wrong)
                .is_empty()
        );
    }

    #[test]
    fn an_unfinished_last_event_is_left_out() {
        let body = b"event: a\ndata: {\"x\":1}\n\ndata: [DONE]\n\ndata: {\"y\"";
        assert_eq!(sse_data(body), ["{\"x\":1}", "[DONE]"]);
    }
}
