//! The legacy HTTP+SSE transport of MCP (protocol version 2024-11-05), for servers that still
//! speak it (`transport: "sse"`).
//!
//! Why by hand: the pinned `rmcp` (3.9) has no client for this transport. Its SSE client
//! (`transport-sse-client`) was removed when the protocol deprecated the transport; 3.9 ships
//! Streamable HTTP, child-process and generic I/O clients only, and no newer `rmcp` brings it
//! back. The transport is small, so this module is the client, handed to `rmcp` as a
//! sink-and-stream transport: the session, the handshake and every request above it are
//! `rmcp`'s, as with Streamable HTTP.
//!
//! The transport: `GET` the server's URL as an event stream; its first `endpoint` event names
//! (usually relative to that URL) where to `POST` the client's JSON-RPC messages; the server's
//! messages (answers included) arrive as `message` events on the stream, never in the POSTs'
//! answers (those are `202 Accepted`).
//!
//! What must stay true:
//! - every request goes through the guarded client the caller gives (the network policy), and
//!   carries the same headers as a Streamable HTTP session's (configured headers, identity,
//!   `auth`, and a `tools/call`'s `Idempotency-Key`): [`super::Keyed`] makes them;
//! - the endpoint must have the stream's origin: a server cannot make the session post its
//!   credentials to another host;
//! - the stream ends the session: when it closes, `rmcp` sees the transport end.

use std::collections::HashMap;
use std::pin::Pin;
use std::time::Duration;

use anyhow::Context as _;
use futures::stream::BoxStream;
use futures::{Sink, StreamExt as _};
use reqwest::Url;
use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use sse_stream::SseStream;

use super::Keyed;

/// How long the event stream may stay open: the session's life. The guarded client's own
/// timeout (one tool call's) would cut it.
const STREAM_LIFETIME: Duration = Duration::from_secs(24 * 3600);

/// The client's half: each message POSTed to the endpoint.
pub(super) type Outgoing = Pin<Box<dyn Sink<ClientJsonRpcMessage, Error = std::io::Error> + Send>>;
/// The server's half: the messages of the event stream.
pub(super) type Incoming = BoxStream<'static, ServerJsonRpcMessage>;

/// Opens the event stream at `url` and waits for its `endpoint` event (the caller bounds the
/// wait): the transport, ready for `rmcp`'s handshake.
pub(super) async fn open(
    keyed: Keyed,
    url: &str,
    configured: HashMap<HeaderName, HeaderValue>,
) -> anyhow::Result<(Outgoing, Incoming)> {
    let base = Url::parse(url).context("invalid URL")?;
    let headers = keyed
        .request_headers(url, None, &configured)
        .await
        .context("authenticating")?;
    let response = keyed
        .http
        .get(base.clone())
        .headers(headers)
        .header(reqwest::header::ACCEPT, "text/event-stream")
        .timeout(STREAM_LIFETIME)
        .send()
        .await
        .map_err(|err| anyhow::anyhow!("opening the event stream: {}", err.without_url()))?;
    let status = response.status();
    anyhow::ensure!(
        status.is_success(),
        "opening the event stream: the server answered {status}"
    );
    let mut events = SseStream::from_bytes_stream(response.bytes_stream());
    let endpoint = loop {
        let event = events
            .next()
            .await
            .context("the event stream ended before its `endpoint` event")?
            .map_err(|err| anyhow::anyhow!("reading the event stream: {err}"))?;
        if event.event.as_deref() == Some("endpoint") {
            let data = event.data.unwrap_or_default();
            let endpoint = base
                .join(data.trim())
                .context("the `endpoint` event names no valid URL")?;
            anyhow::ensure!(
                endpoint.origin() == base.origin(),
                "the `endpoint` event names another origin than the event stream's"
            );
            break endpoint;
        }
    };
    let incoming = futures::stream::unfold(events, |mut events| async move {
        loop {
            match events.next().await? {
                Ok(event) if matches!(event.event.as_deref(), None | Some("message")) => {
                    let Some(data) = event.data else { continue };
                    match serde_json::from_str::<ServerJsonRpcMessage>(&data) {
                        Ok(message) => return Some((message, events)),
                        Err(error) => {
                            tracing::debug!(%error, "an MCP server sent a message that is not JSON-RPC");
                        }
                    }
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::debug!(%error, "an MCP server's event stream failed");
                    return None;
                }
            }
        }
    })
    .boxed();
    let state = (keyed, endpoint, configured);
    let outgoing = futures::sink::unfold(
        state,
        |(keyed, endpoint, configured), message: ClientJsonRpcMessage| async move {
            post(&keyed, &endpoint, &configured, &message).await?;
            Ok::<_, std::io::Error>((keyed, endpoint, configured))
        },
    );
    Ok((Box::pin(outgoing), incoming))
}

/// POSTs one message to the endpoint; anything but a 2xx is an error.
async fn post(
    keyed: &Keyed,
    endpoint: &Url,
    configured: &HashMap<HeaderName, HeaderValue>,
    message: &ClientJsonRpcMessage,
) -> std::io::Result<()> {
    let headers = keyed
        .request_headers(endpoint.as_str(), Some(message), configured)
        .await?;
    let response = keyed
        .http
        .post(endpoint.clone())
        .headers(headers)
        .json(message)
        .send()
        .await
        .map_err(|err| std::io::Error::other(err.without_url()))?;
    let status = response.status();
    if status.is_success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "posting a message: the server answered {status}"
        )))
    }
}
