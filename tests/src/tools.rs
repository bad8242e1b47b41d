//! A real local HTTP tool server for agent tests: it records every call (path, idempotency
//! key, JSON body, identity headers) and answers by path: `weather` (a forecast with citations),
//! `search` (a retrieval result: [`SEARCH_CHUNKS`], the query kept), `big` (60,000
//! characters), `nul` (text with a NUL character), `finish`, `create`, `list` (`ok`), `hang`
//! (never answers); and `GET /page` ([`PAGE_CHARS`] characters of text: a web page), counted in
//! [`Tools::pages`].

use std::sync::{Arc, Mutex};

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use serde_json::{Value, json};

/// The chunks the `search` path answers, in order: `(id, title, url, text)`.
pub const SEARCH_CHUNKS: [(&str, &str, &str, &str); 2] = [
    (
        "tides",
        "Tide tables",
        "https://docs.example/tides",
        "High tide is at 06:12.",
    ),
    (
        "harbour",
        "Harbour guide",
        "https://docs.example/harbour",
        "The harbour closes at dusk.",
    ),
];

fn search_chunks() -> Value {
    SEARCH_CHUNKS
        .iter()
        .map(|(id, title, url, text)| json!({"id": id, "title": title, "url": url, "text": text}))
        .collect()
}

/// How long the text `GET /page` answers is, in characters.
pub const PAGE_CHARS: usize = 15_000;

/// A tool server: records every request (path, idempotency key, body) and answers by path.
#[derive(Clone, Default)]
pub struct Tools {
    calls: Arc<Mutex<Vec<(String, String, Value)>>>,
    identities: Arc<Mutex<Vec<Identity>>>,
    pages: Arc<Mutex<Vec<Identity>>>,
}

/// The identity headers of one call: `X-Spool-Tenant`, `X-Spool-User`, `X-Spool-Identity`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Identity {
    /// `X-Spool-Tenant`.
    pub tenant: Option<String>,
    /// `X-Spool-User`.
    pub user: Option<String>,
    /// `X-Spool-Identity`.
    pub token: Option<String>,
}

impl Identity {
    /// The identity headers of a request.
    pub fn of(headers: &HeaderMap) -> Self {
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        Self {
            tenant: header("x-spool-tenant"),
            user: header("x-spool-user"),
            token: header("x-spool-identity"),
        }
    }
}

impl Tools {
    /// Starts the server on a loopback port; returns it and its base URL.
    pub async fn start() -> (Self, String) {
        let tools = Self::default();
        let record = |path: &'static str| {
            move |State(tools): State<Tools>, headers: HeaderMap, Json(body): Json<Value>| async move {
                let key = headers
                    .get("idempotency-key")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_owned();
                {
                    // Both under the calls' lock, so their orders match.
                    let mut calls = tools.calls.lock().expect("lock");
                    calls.push((path.to_owned(), key, body.clone()));
                    tools
                        .identities
                        .lock()
                        .expect("lock")
                        .push(Identity::of(&headers));
                }
                match path {
                    "weather" => json!({"forecast": format!("sunny in {}", body["city"].as_str().unwrap_or("?")),
                        "citations": [{"title": "Weather service", "url": "https://weather.example/paris", "snippet": "Sunny"}]}).to_string(),
                    "search" => json!({"query": body["query"], "chunks": search_chunks()}).to_string(),
                    "big" => "z".repeat(60_000),
                    "nul" => "zero\0byte".to_owned(),
                    "hang" => {
                        std::future::pending::<()>().await;
                        String::new()
                    }
                    _ => "ok".to_owned(),
                }
            }
        };
        let app = axum::Router::new()
            .route("/weather", post(record("weather")))
            .route("/search", post(record("search")))
            .route("/big", post(record("big")))
            .route("/nul", post(record("nul")))
            .route("/finish", post(record("finish")))
            .route("/hang", post(record("hang")))
            .route("/create", post(record("create")))
            .route("/list", post(record("list")))
            .route(
                "/page",
                axum::routing::get(
                    |State(tools): State<Tools>, headers: HeaderMap| async move {
                        tools
                            .pages
                            .lock()
                            .expect("lock")
                            .push(Identity::of(&headers));
                        format!("Harbour notes. {}", "y".repeat(PAGE_CHARS - 15))
                    },
                ),
            )
            .with_state(tools.clone());
        let base = crate::serve(app).await;
        (tools, base)
    }

    /// Every call so far: (path, idempotency key, body).
    pub fn calls(&self) -> Vec<(String, String, Value)> {
        self.calls.lock().expect("lock").clone()
    }

    /// The identity headers of every `GET /page` so far.
    pub fn pages(&self) -> Vec<Identity> {
        self.pages.lock().expect("lock").clone()
    }

    /// The identity headers of every call so far, in the order of [`Tools::calls`].
    pub fn identities(&self) -> Vec<Identity> {
        self.identities.lock().expect("lock").clone()
    }
}

/// An HTTP tool of an agent spec, named `name`, at `url`, taking `{city}`.
pub fn http_tool(name: &str, url: String) -> Value {
    json!({"type": "http", "name": name, "description": format!("the {name} tool"), "url": url,
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}})
}
