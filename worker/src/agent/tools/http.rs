//! HTTP tools: one call is one HTTP request to the tenant's endpoint, arguments in, response text
//! out.
//!
//! The request carries an `Idempotency-Key` so an endpoint can recognise a call the worker
//! repeats after a crash. Every outcome is a [`ToolOutput`]: a refused address, a bad URL, a
//! timeout, a connection failure or a non-2xx status is an error the model sees, never a panic
//! or an `Err`, because a failing tool is not a failing run.
//!
//! What must stay true: the URL goes through the network policy before anything is sent (the
//! client comes from [`GuardedClients::for_url`], which checks it; the resolver alone cannot see
//! IP-literal hosts), and the response body read is capped at [`MAX_RESPONSE_BYTES`] however
//! large the answer.

use std::collections::BTreeMap;

use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, LOCATION};
use reqwest::{Method, Url};
use serde_json::Value;

use super::ToolOutput;
use super::identity::Identity;
use spool_shared::egress::{GuardedClients, Refused};

/// The most response body read from a tool; the rest is dropped and the text marked truncated.
pub const MAX_RESPONSE_BYTES: usize = 1024 * 1024;

/// The header carrying the call's idempotency key.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// Where and how to call one HTTP tool.
#[derive(Clone, Copy, Debug)]
pub struct HttpTool<'a> {
    /// The endpoint.
    pub url: &'a str,
    /// The HTTP method, case-insensitive (`POST` when empty).
    pub method: &'a str,
    /// Extra headers sent with every call (they cannot replace `Content-Type` or
    /// `Idempotency-Key`).
    pub headers: &'a BTreeMap<String, String>,
}

/// Calls the tool: sends `arguments` as a JSON body with `Content-Type: application/json`,
/// `Idempotency-Key: {idempotency_key}` and `identity`'s headers, plus the tool's headers; the response text (any content
/// type) becomes the result; a non-2xx status becomes `ToolOutput::error("HTTP {status}:
/// {body}")`; a refused address, a bad URL, a timeout or a connection error becomes a
/// `ToolOutput::error` with a clear reason (never a panic, never an Err).
///
/// A `GET` whose arguments are a flat JSON object (strings, numbers, booleans, nulls skipped)
/// sends them as query parameters instead of a body.
pub async fn call(
    clients: &GuardedClients,
    identity: &Identity,
    tool: &HttpTool<'_>,
    arguments: &Value,
    idempotency_key: &str,
) -> ToolOutput {
    let (request, host) = match request(clients, identity, tool, arguments, idempotency_key) {
        Ok(request) => request,
        Err(refused) => return refused,
    };
    let response = match request.send().await {
        Ok(response) => response,
        Err(err) => return failure(err, &host),
    };
    let status = response.status();
    // A redirect that comes back as the response was not followed (no usable Location); saying
    // where it pointed explains the error better than its usually empty body.
    let unfollowed = status
        .is_redirection()
        .then(|| {
            response
                .headers()
                .get(LOCATION)?
                .to_str()
                .ok()
                .map(str::to_owned)
        })
        .flatten();
    let text = match read_capped(response).await {
        Ok(text) => text,
        Err(err) => return failure(err, &host),
    };
    if status.is_success() {
        if text.is_empty() {
            // An empty result reads to a model like a lost one; say what happened.
            ToolOutput::ok(format!("HTTP {status} (empty body)"))
        } else {
            ToolOutput::ok(text)
        }
    } else {
        let mut message = format!("HTTP {status}: {text}");
        if let Some(location) = unfollowed {
            message.push_str(&format!("\n[redirect to {location} was not followed]"));
        }
        ToolOutput::error(message)
    }
}

/// The request of one call, and the host it goes to; an error output if the URL is refused or
/// the tool's method or headers are not valid.
fn request(
    clients: &GuardedClients,
    identity: &Identity,
    tool: &HttpTool<'_>,
    arguments: &Value,
    idempotency_key: &str,
) -> Result<(reqwest::RequestBuilder, String), ToolOutput> {
    let mut url = Url::parse(tool.url)
        .map_err(|err| ToolOutput::error(format!("invalid tool URL: {err}")))?;
    let client = clients
        .for_url(&url, !tool.headers.is_empty() || identity.signs())
        .map_err(|refused| ToolOutput::error(refused.to_string()))?;
    let host = url.host_str().unwrap_or_default().to_owned();
    let method = match tool.method.trim() {
        "" => Method::POST,
        method => Method::from_bytes(method.to_ascii_uppercase().as_bytes())
            .map_err(|_| ToolOutput::error(format!("invalid HTTP method `{method}`")))?,
    };
    let mut headers = HeaderMap::new();
    for (name, value) in tool.headers {
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| ToolOutput::error(format!("invalid tool header name `{name}`")))?;
        // The value may be a secret, so it stays out of the message.
        let value = HeaderValue::from_str(value)
            .map_err(|_| ToolOutput::error(format!("invalid value for tool header `{name}`")))?;
        headers.insert(name, value);
    }
    // Last, so no configured header can stand in for the run's identity.
    headers.extend(identity.headers(&url));
    let key = HeaderValue::from_str(idempotency_key)
        .map_err(|_| ToolOutput::error("invalid idempotency key for an HTTP header"))?;
    headers.insert(IDEMPOTENCY_KEY, key);
    let query = if method == Method::GET {
        flat_query(arguments)
    } else {
        None
    };
    let request = match query {
        Some(pairs) => {
            // An empty serializer would still leave a bare `?` on the URL.
            if !pairs.is_empty() {
                url.query_pairs_mut().extend_pairs(pairs);
            }
            client.request(method, url).headers(headers)
        }
        None => {
            let body = arguments.to_string();
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            client.request(method, url).headers(headers).body(body)
        }
    };
    Ok((request, host))
}

/// The response's text, read up to [`MAX_RESPONSE_BYTES`] and marked where it was cut.
pub(super) async fn read_capped(mut response: reqwest::Response) -> reqwest::Result<String> {
    let mut body = Vec::new();
    let mut truncated = false;
    while let Some(chunk) = response.chunk().await? {
        body.extend_from_slice(&chunk);
        if body.len() > MAX_RESPONSE_BYTES {
            body.truncate(char_boundary(&body, MAX_RESPONSE_BYTES));
            truncated = true;
            break;
        }
    }
    let mut text = String::from_utf8_lossy(&body).into_owned();
    if truncated {
        text.push_str("\n[response truncated at 1 MiB]");
    }
    Ok(text)
}

/// The arguments as query pairs, when they are a flat JSON object.
fn flat_query(arguments: &Value) -> Option<Vec<(String, String)>> {
    let object = arguments.as_object()?;
    let mut pairs = Vec::with_capacity(object.len());
    for (name, value) in object {
        let value = match value {
            Value::String(text) => text.clone(),
            Value::Number(number) => number.to_string(),
            Value::Bool(flag) => flag.to_string(),
            Value::Null => continue,
            Value::Array(_) | Value::Object(_) => return None,
        };
        pairs.push((name.clone(), value));
    }
    Some(pairs)
}

/// The largest cut at or below `limit` that does not split a UTF-8 sequence (for valid UTF-8).
fn char_boundary(bytes: &[u8], limit: usize) -> usize {
    let mut cut = limit.min(bytes.len());
    // A UTF-8 sequence is at most 4 bytes, so at most 3 continuation bytes precede a boundary.
    for _ in 0..3 {
        match bytes.get(cut) {
            Some(byte) if byte & 0xC0 == 0x80 => cut -= 1,
            _ => break,
        }
    }
    cut
}

/// The tool output for a request that failed before a complete response arrived.
pub(super) fn failure(err: reqwest::Error, host: &str) -> ToolOutput {
    // The URL may carry credentials in its query, so it stays out of the message.
    let err = err.without_url();
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&err);
    while let Some(current) = source {
        if let Some(refused) = current.downcast_ref::<Refused>() {
            return ToolOutput::error(refused.to_string());
        }
        source = current.source();
    }
    let chain = error_chain(&err);
    if err.is_timeout() {
        ToolOutput::error(format!("request to {host} timed out: {chain}"))
    } else if err.is_connect() {
        ToolOutput::error(format!("could not connect to {host}: {chain}"))
    } else {
        ToolOutput::error(format!("request to {host} failed: {chain}"))
    }
}

/// The error and its sources as one line, skipping sources that repeat their parent's text.
fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(current) = source {
        let message = current.to_string();
        if !text.contains(&message) {
            text.push_str(": ");
            text.push_str(&message);
        }
        source = current.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_objects_become_query_pairs() {
        let pairs = flat_query(&serde_json::json!({"q": "rust", "n": 3, "exact": true, "x": null}))
            .expect("flat");
        assert_eq!(
            pairs,
            [("exact", "true"), ("n", "3"), ("q", "rust")]
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
        );
        assert!(flat_query(&serde_json::json!({"q": ["a"]})).is_none());
        assert!(flat_query(&serde_json::json!({"q": {"a": 1}})).is_none());
        assert!(flat_query(&serde_json::json!("text")).is_none());
    }

    #[test]
    fn truncation_does_not_split_a_character() {
        let text = "aé€😀".as_bytes();
        assert_eq!(char_boundary(text, 2), 1);
        assert_eq!(char_boundary(text, 3), 3);
        assert_eq!(char_boundary(text, 4), 3);
        assert_eq!(char_boundary(text, 7), 6);
        assert_eq!(char_boundary(text, 8), 6);
        assert_eq!(char_boundary(text, 100), text.len());
    }
}
