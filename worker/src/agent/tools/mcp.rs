//! MCP tools: an agent's remote MCP servers, spoken to with `rmcp` over Streamable HTTP, or
//! over the legacy HTTP+SSE transport ([`sse`], a client of our own), authenticated by their
//! `auth` ([`auth`]: a bearer token, given or fetched with OAuth client credentials).
//!
//! At run start the worker opens one [`McpSession`] per configured server and lists its tools;
//! each is shown to the model as `{prefix}_{tool}`, read-only when the server annotates it with
//! `readOnlyHint: true`. A server that cannot be reached only loses its own tools: [`connect`]
//! returns an error for the caller to log and the run goes on without them.
//!
//! What must stay true:
//! - every HTTP request of a session (initialize, tool calls, the event stream, the final
//!   `DELETE`) goes through the caller's `reqwest::Client`, so its network policy applies, and
//!   carries the server's configured headers, its `auth` token (fetched again when it is about
//!   to expire) and the run's identity ([`super::identity`], a token minted per request);
//! - every `tools/call` carries `Idempotency-Key: {workflow_id}:{step}:{tool_call_id}`, as an
//!   HTTP tool's request does, so a server can recognise a call repeated after a crash. MCP has
//!   no per-request header, so the key travels in the call's `_meta` (under
//!   [`IDEMPOTENCY_META`]) and [`Keyed`], the transport's HTTP client, copies it into the
//!   header of that one POST;
//! - connecting and calling are bounded by the caller's timeout, whatever the server does;
//! - [`McpSession::call`] never fails the run: every failure becomes an error [`ToolOutput`].
//!
//! [`connect`]: McpSession::connect

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use anyhow::Context as _;
use futures::stream::BoxStream;
use reqwest::header::{HeaderName, HeaderValue};
use rmcp::ServiceExt as _;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig, ClientJsonRpcMessage,
    ClientRequest, ContentBlock, Implementation, JsonRpcMessage, MetaObject,
    PaginatedRequestParams, RequestMetaObject, Tool,
};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::sink_stream::SinkStreamTransport;
use rmcp::transport::streamable_http_client::{
    SseError, StreamableHttpClient, StreamableHttpClientTransportConfig, StreamableHttpError,
    StreamableHttpPostResponse,
};
use serde_json::Value;
use sse_stream::Sse;
use std::sync::Arc;

use super::ToolOutput;
use super::identity::Identity;
use spool_shared::agent::{McpAuth, McpTransport};
use spool_shared::egress::GuardedClients;

pub(crate) mod auth;
mod sse;

use auth::Credentials;

/// The `_meta` key of a tool call that carries its idempotency key.
pub const IDEMPOTENCY_META: &str = "io.spool/idempotency-key";

/// The most bytes one discovered tool may take (its name, description and input schema as
/// JSON); a larger one is dropped (and logged). With `SPOOL_MCP_MAX_TOOLS` per server, this
/// bounds what a run keeps (`runs.mcp_tools`) and sends the model on every step.
pub const MAX_TOOL_BYTES: usize = 64 * 1024;

/// How long [`McpSession::close`] waits for the server to acknowledge the session's end.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);

/// One MCP server an agent uses.
pub struct McpServer<'a> {
    /// Prepended, with `_`, to the server's tool names to make the names the model sees.
    pub prefix: &'a str,
    /// The server's Streamable HTTP endpoint, e.g. `https://mcp.example.com/mcp`.
    pub url: &'a str,
    /// Headers sent on every HTTP request to the server (typically credentials).
    pub headers: &'a BTreeMap<String, String>,
    /// The transport it speaks.
    pub transport: McpTransport,
    /// How its requests authenticate, if they do.
    pub auth: Option<&'a McpAuth>,
}

impl<'a> McpServer<'a> {
    /// The server an MCP tool names.
    pub fn of(spec: &'a spool_shared::agent::McpToolSpec) -> Self {
        Self {
            prefix: &spec.name,
            url: &spec.url,
            headers: &spec.headers,
            transport: spec.transport,
            auth: spec.auth.as_ref(),
        }
    }
}

/// A tool discovered on an MCP server, as the model will see it (kept with the run, so its
/// later attempts offer the same tools: see `ToolSet`).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct McpTool {
    /// The name shown to the model: `{prefix}_{remote_name}`.
    pub name: String,
    /// The tool's name on its server, as passed to [`McpSession::call`].
    pub remote_name: String,
    /// What the tool does, from the server (empty when it gives none).
    pub description: String,
    /// The tool's input JSON Schema.
    pub parameters: Value,
    /// Whether the server marked the tool read-only (`readOnlyHint: true`).
    pub read_only: bool,
}

/// An open session with one MCP server.
pub struct McpSession {
    service: RunningService<RoleClient, ClientConfig>,
    /// The server's URL, kept to scrub it from errors the model sees: it may carry a credential.
    url: String,
}

impl McpSession {
    /// Connects (initialize handshake) and lists the server's tools (following pagination, up
    /// to `max_tools`: further pages are not asked for, and tools past it or larger than
    /// [`MAX_TOOL_BYTES`] are dropped and logged), within `timeout`, through the guarded
    /// client for its URL: a URL the network policy refuses (an IP literal included) is never
    /// connected to.
    ///
    /// The error says which server and which step failed; the caller logs it and runs without
    /// this server's tools.
    pub async fn connect(
        server: &McpServer<'_>,
        clients: &GuardedClients,
        identity: &Identity,
        timeout: Duration,
        max_tools: usize,
    ) -> anyhow::Result<(Self, Vec<McpTool>)> {
        let prefix = server.prefix;
        let started = tokio::time::Instant::now();
        let (keyed, configured) = keyed(server, clients, identity)?;
        let service = tokio::time::timeout(timeout, initialize(server, keyed, configured))
            .await
            .map_err(|_| anyhow::anyhow!("MCP server {prefix}: initialize timed out"))??;
        // On failure from here on, dropping `service` cancels it and ends the session in the
        // background, which is all a server that cannot list its tools deserves.
        let remaining = timeout.saturating_sub(started.elapsed());
        let tools = tokio::time::timeout(remaining, list_tools(&service, prefix, max_tools))
            .await
            .map_err(|_| anyhow::anyhow!("MCP server {prefix}: listing tools timed out"))?
            .with_context(|| format!("MCP server {prefix}: listing tools failed"))?;
        let tools = tools
            .into_iter()
            .map(|tool| to_mcp_tool(prefix, tool))
            .filter(|tool| fits(prefix, tool))
            .collect();
        let session = Self {
            service,
            url: server.url.to_owned(),
        };
        Ok((session, tools))
    }

    /// Calls a tool by its remote name, within `timeout`; failures come back as an error output.
    ///
    /// `arguments` must be a JSON object. A transport error, a timeout, a protocol error or an
    /// `isError` result becomes [`ToolOutput::error`] with the reason. Text content parts are
    /// joined with `"\n"`; other parts are rendered as compact JSON.
    pub async fn call(
        &self,
        remote_name: &str,
        arguments: Value,
        idempotency_key: &str,
        timeout: Duration,
    ) -> ToolOutput {
        let Value::Object(arguments) = arguments else {
            return ToolOutput::error(format!(
                "the arguments of MCP tool {remote_name} must be a JSON object"
            ));
        };
        let mut meta = serde_json::Map::new();
        meta.insert(IDEMPOTENCY_META.into(), Value::from(idempotency_key));
        let mut params =
            CallToolRequestParams::new(remote_name.to_owned()).with_arguments(arguments);
        params.meta = Some(RequestMetaObject(MetaObject(meta)));
        // Dropping the call on timeout sends `notifications/cancelled`, so the server can stop.
        match tokio::time::timeout(timeout, self.service.call_tool(params)).await {
            Err(_) => ToolOutput::error(format!(
                "MCP tool {remote_name} timed out after {:.1} s",
                timeout.as_secs_f64()
            )),
            Ok(Err(error)) => ToolOutput::error(
                format!("MCP tool {remote_name} failed: {error}")
                    .replace(self.url.as_str(), "<mcp server>"),
            ),
            Ok(Ok(result)) => render(result),
        }
    }

    /// Ends the session politely (best effort).
    ///
    /// Waits a short, fixed time for the server to acknowledge; an unresponsive server is left
    /// to expire the session itself.
    pub async fn close(self) {
        let mut service = self.service;
        if let Err(error) = service.close_with_timeout(CLOSE_TIMEOUT).await {
            tracing::debug!(%error, "MCP session task failed while closing");
        }
    }
}

/// The HTTP side of a session with `server`: the guarded client for its URL (refused if the
/// network policy refuses it) with the run's identity and the server's credentials, the
/// server's configured headers.
fn keyed(
    server: &McpServer<'_>,
    clients: &GuardedClients,
    identity: &Identity,
) -> anyhow::Result<(Keyed, HashMap<HeaderName, HeaderValue>)> {
    let prefix = server.prefix;
    let url = reqwest::Url::parse(server.url)
        .with_context(|| format!("MCP server {prefix}: invalid URL"))?;
    let credentials = !server.headers.is_empty() || identity.signs() || server.auth.is_some();
    let http = clients
        .for_url(&url, credentials)
        .with_context(|| format!("MCP server {prefix}"))?
        .clone();
    let configured = header_map(server.headers)
        .with_context(|| format!("MCP server {prefix}: invalid configured header"))?;
    let auth = server
        .auth
        .map(|auth| Credentials::new(auth, clients))
        .transpose()
        .with_context(|| format!("MCP server {prefix}: auth"))?
        .map(Arc::new);
    let keyed = Keyed {
        http,
        identity: identity.clone(),
        auth,
    };
    Ok((keyed, configured))
}

/// The initialize handshake with `server` over its transport; the error says which step
/// failed.
async fn initialize(
    server: &McpServer<'_>,
    keyed: Keyed,
    configured: HashMap<HeaderName, HeaderValue>,
) -> anyhow::Result<RunningService<RoleClient, ClientConfig>> {
    let prefix = server.prefix;
    let client = ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("spool", env!("CARGO_PKG_VERSION")),
    );
    // The token first, so a refused credential says so rather than "initialize failed".
    if let Some(auth) = &keyed.auth {
        auth.token()
            .await
            .with_context(|| format!("MCP server {prefix}: authentication failed"))?;
    }
    match server.transport {
        McpTransport::StreamableHttp => {
            let config = StreamableHttpClientTransportConfig::with_uri(server.url)
                .custom_headers(configured);
            let transport = StreamableHttpClientTransport::with_client(keyed, config);
            client
                .serve(transport)
                .await
                .with_context(|| format!("MCP server {prefix}: initialize failed"))
        }
        McpTransport::Sse => {
            let (outgoing, incoming) = sse::open(keyed, server.url, configured)
                .await
                .with_context(|| format!("MCP server {prefix}: SSE transport"))?;
            client
                .serve(SinkStreamTransport::new(outgoing, incoming))
                .await
                .with_context(|| format!("MCP server {prefix}: initialize failed"))
        }
    }
}

/// Whether a discovered tool is within [`MAX_TOOL_BYTES`] (its name, description and input
/// schema as JSON); one that is not is logged, to be dropped.
fn fits(prefix: &str, tool: &McpTool) -> bool {
    let bytes = tool.name.len()
        + tool.description.len()
        + serde_json::to_string(&tool.parameters).map_or(usize::MAX, |s| s.len());
    let fits = bytes <= MAX_TOOL_BYTES;
    if !fits {
        let name: String = tool.name.chars().take(100).collect();
        tracing::warn!(mcp.server = %prefix, tool.name = %name, bytes,
            "an MCP server's tool is dropped: it is larger than {MAX_TOOL_BYTES} bytes");
    }
    fits
}

/// The session's HTTP client: reqwest's, plus the run's identity headers on every request (a
/// token minted for each), the `auth` bearer token (fetched again before it expires) and the
/// `Idempotency-Key` header on a `tools/call` POST whose `_meta` carries one. Everything else
/// is passed through unchanged.
#[derive(Clone)]
struct Keyed {
    http: reqwest::Client,
    identity: Identity,
    auth: Option<Arc<Credentials>>,
}

impl Keyed {
    /// The bearer token of `auth`, if there is one and the request sets none itself.
    async fn bearer(
        &self,
        given: Option<String>,
    ) -> Result<Option<String>, StreamableHttpError<reqwest::Error>> {
        match (&self.auth, given) {
            (_, Some(given)) => Ok(Some(given)),
            (None, None) => Ok(None),
            (Some(auth), None) => auth.token().await.map(Some).map_err(|err| {
                StreamableHttpError::Io(std::io::Error::other(format!(
                    "authentication failed: {err:#}"
                )))
            }),
        }
    }

    /// Every header of a request of the SSE transport to `uri`: the configured ones, the
    /// identity's, the bearer token's and (for a `tools/call`) the idempotency key.
    async fn request_headers(
        &self,
        uri: &str,
        message: Option<&ClientJsonRpcMessage>,
        configured: &HashMap<HeaderName, HeaderValue>,
    ) -> std::io::Result<reqwest::header::HeaderMap> {
        let headers = match message {
            Some(message) => self.with_key(uri, message, configured.clone()),
            None => self.identified(uri, configured.clone()),
        };
        let mut map: reqwest::header::HeaderMap = headers.into_iter().collect();
        if let Some(auth) = &self.auth {
            let token = auth
                .token()
                .await
                .map_err(|err| std::io::Error::other(format!("authentication failed: {err:#}")))?;
            let value = HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| std::io::Error::other("the bearer token is not a valid header"))?;
            map.insert(reqwest::header::AUTHORIZATION, value);
        }
        Ok(map)
    }

    /// `headers` with the identity's for `uri` (replacing any configured header of their names).
    fn identified(
        &self,
        uri: &str,
        mut headers: HashMap<HeaderName, HeaderValue>,
    ) -> HashMap<HeaderName, HeaderValue> {
        headers.extend(self.identity.header_pairs(uri));
        headers
    }

    fn with_key(
        &self,
        uri: &str,
        message: &ClientJsonRpcMessage,
        headers: HashMap<HeaderName, HeaderValue>,
    ) -> HashMap<HeaderName, HeaderValue> {
        let mut headers = self.identified(uri, headers);
        if let JsonRpcMessage::Request(request) = message
            && let ClientRequest::CallToolRequest(call) = &request.request
            && let Some(key) = call
                .params
                .meta
                .as_ref()
                .and_then(|meta| meta.0.0.get(IDEMPOTENCY_META))
                .and_then(Value::as_str)
            && let Ok(value) = HeaderValue::from_str(key)
        {
            headers.insert(HeaderName::from_static("idempotency-key"), value);
        }
        headers
    }
}

type PostResult = Result<StreamableHttpPostResponse, StreamableHttpError<reqwest::Error>>;
type StreamResult =
    Result<BoxStream<'static, Result<Sse, SseError>>, StreamableHttpError<reqwest::Error>>;

impl StreamableHttpClient for Keyed {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> PostResult {
        let headers = self.with_key(&uri, &message, custom_headers);
        let auth_header = self.bearer(auth_header).await?;
        (self.http)
            .post_message(uri, message, session_id, auth_header, headers)
            .await
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> PostResult {
        let headers = self.with_key(&uri, &message, custom_headers);
        let auth_header = self.bearer(auth_header).await?;
        (self.http)
            .post_message_with_max_sse_event_size(
                uri,
                message,
                session_id,
                auth_header,
                headers,
                max_sse_event_size,
            )
            .await
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<reqwest::Error>> {
        let headers = self.identified(&uri, custom_headers);
        let auth_header = self.bearer(auth_header).await?;
        (self.http)
            .delete_session(uri, session_id, auth_header, headers)
            .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> StreamResult {
        let headers = self.identified(&uri, custom_headers);
        let auth_header = self.bearer(auth_header).await?;
        (self.http)
            .get_stream(uri, session_id, last_event_id, auth_header, headers)
            .await
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> StreamResult {
        let headers = self.identified(&uri, custom_headers);
        let auth_header = self.bearer(auth_header).await?;
        (self.http)
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                headers,
                max_sse_event_size,
            )
            .await
    }
}

/// Converts the configured headers, naming (never showing) the one that is invalid.
fn header_map(
    headers: &BTreeMap<String, String>,
) -> anyhow::Result<HashMap<HeaderName, HeaderValue>> {
    headers
        .iter()
        .map(|(name, value)| {
            let header = HeaderName::from_bytes(name.as_bytes())
                .with_context(|| format!("invalid header name {name:?}"))?;
            // The value is likely a secret: it stays out of the error.
            let value = HeaderValue::from_str(value)
                .with_context(|| format!("invalid value for header {name:?}"))?;
            Ok((header, value))
        })
        .collect()
}

/// The server's tools, page by page, until it has no more or `max` are listed: a server that
/// offers more (or pages without end) gets no more requests, and the rest are logged as
/// dropped.
async fn list_tools(
    service: &RunningService<RoleClient, ClientConfig>,
    prefix: &str,
    max: usize,
) -> Result<Vec<Tool>, rmcp::ServiceError> {
    let mut tools = Vec::new();
    let mut cursor = None;
    loop {
        let mut params = PaginatedRequestParams::default();
        params.cursor = cursor;
        let page = service.list_tools(Some(params)).await?;
        tools.extend(page.tools);
        cursor = page.next_cursor;
        if tools.len() > max || (tools.len() == max && cursor.is_some()) {
            tracing::warn!(mcp.server = %prefix, max,
                "an MCP server offers more tools than SPOOL_MCP_MAX_TOOLS; the rest are dropped");
            tools.truncate(max);
            return Ok(tools);
        }
        if cursor.is_none() {
            return Ok(tools);
        }
    }
}

fn to_mcp_tool(prefix: &str, tool: Tool) -> McpTool {
    let read_only = tool
        .annotations
        .as_ref()
        .and_then(|a| a.read_only_hint)
        .unwrap_or(false);
    let description = tool
        .description
        .map(|d| d.into_owned())
        .or(tool.title)
        .unwrap_or_default();
    McpTool {
        name: format!("{prefix}_{}", tool.name),
        remote_name: tool.name.into_owned(),
        description,
        parameters: Value::Object((*tool.input_schema).clone()),
        read_only,
    }
}

fn render(result: CallToolResult) -> ToolOutput {
    let mut parts: Vec<String> = result
        .content
        .iter()
        .map(|part| match part {
            ContentBlock::Text(text) => text.text.clone(),
            other => serde_json::to_string(other).unwrap_or_default(),
        })
        .collect();
    // A server may answer with structured content only; the model must still see the result.
    if parts.is_empty()
        && let Some(structured) = &result.structured_content
    {
        parts.push(structured.to_string());
    }
    let content = parts.join("\n");
    if result.is_error == Some(true) {
        if content.is_empty() {
            return ToolOutput::error("the MCP tool failed without saying why");
        }
        return ToolOutput::error(content);
    }
    ToolOutput::ok(content)
}
