//! The built-in tools (DESIGN section 12), offered when the operator enables them
//! (`SPOOL_BUILTIN_TOOLS`):
//! - `http_request` fetches a URL with a `GET` through the network policy (the client of
//!   [`GuardedClients::for_url`]; at most 5 redirects, each hop checked by the policy again),
//!   sending no identity and no credential, and answers the response's text cut at
//!   [`MAX_FETCH_CHARS`] characters, within [`FETCH_TIMEOUT`].
//! - `knowledge_search` asks the tenant's knowledge bases (`/v1/knowledge_bases`, read at each
//!   call, at most [`knowledge_bases::MAX_PER_TENANT`]) at once: each gets `POST {"query",
//!   "top_k"}` with its headers and the run's identity, and answers `{"chunks": [...]}`. The
//!   chunks are answered as one retrieval result (`{"chunks": [...]}`), which the step numbers
//!   for citations.
//!
//! What must stay true: a missing prerequisite (the tool disabled by the operator since the
//! agent was saved, no knowledge base, a knowledge base that fails) is a tool error the model
//! sees, never a failed run.

use std::time::Duration;

use reqwest::Url;
use serde_json::{Value, json};

use spool_shared::agent::Builtin;
use spool_shared::db::knowledge_bases;
use spool_shared::egress::GuardedClients;

use super::ToolOutput;
use super::http::{self, HttpTool};
use super::identity::Identity;

/// The most characters `http_request` answers.
pub const MAX_FETCH_CHARS: usize = 10_000;
/// The longest `http_request` waits for its response.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(30);
/// How many chunks each knowledge base returns when the model names no `top_k`.
const DEFAULT_TOP_K: u64 = 5;
/// The most chunks the model may ask each knowledge base for.
const MAX_TOP_K: u64 = 20;

/// What one built-in call needs from its run.
pub(crate) struct Context<'a> {
    pub(crate) db: &'a sqlx::PgPool,
    pub(crate) http: &'a GuardedClients,
    pub(crate) identity: &'a Identity,
    pub(crate) tenant: &'a str,
    pub(crate) idempotency_key: &'a str,
    /// Whether the operator enables the tool now.
    pub(crate) enabled: bool,
}

/// Executes one call of `tool`.
pub(crate) async fn call(cx: &Context<'_>, tool: Builtin, arguments: &Value) -> ToolOutput {
    if !cx.enabled {
        return ToolOutput::error(format!(
            "the built-in tool `{}` is not enabled on this server",
            tool.as_str()
        ));
    }
    match tool {
        Builtin::HttpRequest => fetch(cx.http, arguments).await,
        Builtin::KnowledgeSearch => search(cx, arguments).await,
    }
}

/// `http_request`: the text at `arguments.url`.
async fn fetch(clients: &GuardedClients, arguments: &Value) -> ToolOutput {
    let Some(url) = arguments.get("url").and_then(Value::as_str) else {
        return ToolOutput::error("`url` (a string) is required");
    };
    let url = match Url::parse(url) {
        Ok(url) if matches!(url.scheme(), "http" | "https") => url,
        Ok(_) => return ToolOutput::error("`url` must be an http or https URL"),
        Err(err) => return ToolOutput::error(format!("`url` is not a URL: {err}")),
    };
    let client = match clients.for_url(&url, false) {
        Ok(client) => client,
        Err(refused) => return ToolOutput::error(refused.to_string()),
    };
    let host = url.host_str().unwrap_or_default().to_owned();
    let request = async {
        let response = client.get(url).send().await?;
        let status = response.status();
        let text = http::read_capped(response).await?;
        Ok::<_, reqwest::Error>((status, text))
    };
    let (status, text) = match tokio::time::timeout(FETCH_TIMEOUT, request).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(err)) => return http::failure(err, &host),
        Err(_) => {
            return ToolOutput::error(format!(
                "{host} did not answer within {} s",
                FETCH_TIMEOUT.as_secs()
            ));
        }
    };
    let text = cut(text, MAX_FETCH_CHARS);
    if status.is_success() {
        ToolOutput::ok(if text.is_empty() {
            format!("HTTP {status} (empty body)")
        } else {
            text
        })
    } else {
        ToolOutput::error(format!("HTTP {status}: {text}"))
    }
}

/// `text` cut at `max` characters, with a marker saying so.
fn cut(text: String, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text,
        Some((at, _)) => format!("{}\n[cut at {max} characters]", &text[..at]),
    }
}

/// `knowledge_search`: the chunks the tenant's knowledge bases (or the one named) answer.
async fn search(cx: &Context<'_>, arguments: &Value) -> ToolOutput {
    let Some(query) = arguments
        .get("query")
        .and_then(Value::as_str)
        .filter(|q| !q.trim().is_empty())
    else {
        return ToolOutput::error("`query` (a non-empty string) is required");
    };
    let name = arguments.get("knowledge_base").and_then(Value::as_str);
    let top_k = arguments
        .get("top_k")
        .and_then(Value::as_u64)
        .unwrap_or(DEFAULT_TOP_K)
        .clamp(1, MAX_TOP_K);
    let bases = match knowledge_bases::for_search(cx.db, cx.tenant, name).await {
        Ok(bases) => bases,
        Err(err) => {
            tracing::warn!(error = %err, "knowledge bases could not be read");
            return ToolOutput::error("the knowledge bases cannot be read now; try again");
        }
    };
    if bases.is_empty() {
        return ToolOutput::error(match name {
            Some(name) => format!("there is no knowledge base named `{name}`"),
            None => "there are no knowledge bases to search".into(),
        });
    }
    let body = json!({"query": query, "top_k": top_k});
    let asks = bases.iter().map(|kb| {
        let body = &body;
        async move {
            let target = HttpTool {
                url: &kb.url,
                method: "POST",
                headers: &kb.headers.0,
            };
            let output = http::call(cx.http, cx.identity, &target, body, cx.idempotency_key).await;
            (kb, output)
        }
    });
    let mut chunks = Vec::new();
    let mut failures = Vec::new();
    for (kb, output) in futures::future::join_all(asks).await {
        if output.is_error {
            failures.push(format!("{}: {}", kb.name, cut(output.content, 300)));
            continue;
        }
        match serde_json::from_str::<Value>(&output.content) {
            Ok(Value::Object(mut answer)) => match answer.remove("chunks") {
                Some(Value::Array(found)) => {
                    chunks.extend(found.into_iter().take(top_k as usize).filter_map(|chunk| {
                        let Value::Object(mut chunk) = chunk else {
                            return None;
                        };
                        chunk.insert("knowledge_base".into(), kb.name.clone().into());
                        Some(Value::Object(chunk))
                    }));
                }
                _ => failures.push(format!("{}: the answer has no `chunks` array", kb.name)),
            },
            _ => failures.push(format!("{}: the answer is not a JSON object", kb.name)),
        }
    }
    if chunks.is_empty() && !failures.is_empty() {
        return ToolOutput::error(format!(
            "the knowledge bases failed: {}",
            failures.join("; ")
        ));
    }
    let mut result = json!({"chunks": chunks});
    if !failures.is_empty() {
        result["failed"] = json!(failures);
    }
    ToolOutput::ok(result.to_string())
}

#[cfg(test)]
mod tests {
    use super::cut;

    #[test]
    fn a_long_text_is_cut_at_a_character_with_a_marker() {
        assert_eq!(cut("abc".into(), 3), "abc");
        assert_eq!(cut("aé€😀x".into(), 4), "aé€😀\n[cut at 4 characters]");
    }
}
