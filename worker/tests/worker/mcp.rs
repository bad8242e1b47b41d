//! MCP tools against a real rmcp server over Streamable HTTP on a local port: discovery,
//! namespaced calls, configured headers on every request, dead and hanging servers.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, JsonObject,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{Value, json};
use tokio::net::TcpListener;

use spool_shared::egress::{GuardedClients, NetworkPolicy};
use spool_worker::agent::tools::ToolOutput;
use spool_worker::agent::tools::identity::{Identity, IdentitySigner};
use spool_worker::agent::tools::mcp::{McpServer, McpSession, McpTool};

const TIMEOUT: Duration = Duration::from_secs(30);

/// A calculator: `add` (read-only) and `shout` on the first page of `tools/list`, `slow` (which
/// takes a minute) on the second, so discovery has to follow pagination.
#[derive(Clone)]
struct Calculator;

fn schema(value: Value) -> JsonObject {
    match value {
        Value::Object(map) => map,
        other => panic!("not a schema object: {other}"),
    }
}

fn add_tool() -> Tool {
    Tool::new(
        "add",
        "Adds two numbers.",
        schema(json!({
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"]
        })),
    )
    .with_annotations(ToolAnnotations::new().read_only(true))
}

fn shout_tool() -> Tool {
    Tool::new(
        "shout",
        "Upper-cases text, with a picture.",
        schema(json!({
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"]
        })),
    )
}

fn slow_tool() -> Tool {
    Tool::new("slow", "Takes a minute.", schema(json!({"type": "object"})))
        .with_annotations(ToolAnnotations::new().read_only(false))
}

impl ServerHandler for Calculator {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let cursor = request.and_then(|params| params.cursor);
        Ok(match cursor.as_deref() {
            None => ListToolsResult {
                next_cursor: Some("page-2".into()),
                ..ListToolsResult::with_all_items(vec![add_tool(), shout_tool()])
            },
            Some("page-2") => ListToolsResult::with_all_items(vec![slow_tool()]),
            Some(other) => {
                return Err(ErrorData::invalid_params(
                    format!("bad cursor {other}"),
                    None,
                ));
            }
        })
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = request.arguments.unwrap_or_default();
        let result = match request.name.as_ref() {
            "add" => {
                let number = |key: &str| {
                    args.get(key).and_then(Value::as_f64).ok_or_else(|| {
                        ErrorData::invalid_params(format!("{key} must be a number"), None)
                    })
                };
                let sum = number("a")? + number("b")?;
                CallToolResult::success(vec![ContentBlock::text(sum.to_string())])
            }
            "shout" => match args.get("text").and_then(Value::as_str) {
                Some(text) => CallToolResult::success(vec![
                    ContentBlock::text(text.to_uppercase()),
                    ContentBlock::image("aGk=", "image/png"),
                ]),
                None => CallToolResult::error(vec![ContentBlock::text("text is required")]),
            },
            "slow" => {
                tokio::time::sleep(Duration::from_secs(60)).await;
                CallToolResult::success(vec![ContentBlock::text("finally")])
            }
            other => {
                return Err(ErrorData::invalid_params(
                    format!("no tool named {other}"),
                    None,
                ));
            }
        };
        Ok(CallToolResponse::Complete(result))
    }
}

/// Each request's method, `X-Api-Key`, `Idempotency-Key` and `X-Spool-Identity`.
type Seen = Arc<Mutex<Vec<(String, Option<String>, Option<String>, Option<String>)>>>;

/// Serves `router` on 127.0.0.1 and returns its base URL.
async fn serve(router: Router) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(async move {
        axum::serve(listener, router).await.expect("serve");
    });
    format!("http://{addr}")
}

/// Starts the calculator at `/mcp`; returns its URL and the headers log.
async fn start_calculator() -> (String, Seen) {
    let mcp = StreamableHttpService::new(
        || Ok(Calculator),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let seen = Seen::default();
    let log = seen.clone();
    let router = Router::new()
        .nest_service("/mcp", mcp)
        .layer(middleware::from_fn(move |request: Request, next: Next| {
            let log = log.clone();
            async move {
                let entry = logged(&request);
                log.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(entry);
                next.run(request).await
            }
        }));
    (format!("{}/mcp", serve(router).await), seen)
}

/// What [`Seen`] records of a request.
fn logged(request: &Request) -> (String, Option<String>, Option<String>, Option<String>) {
    let header = |name: &str| {
        request
            .headers()
            .get(name)
            .map(|value| value.to_str().unwrap_or("<not utf-8>").to_owned())
    };
    (
        request.method().to_string(),
        header("x-api-key"),
        header("idempotency-key"),
        header("x-spool-identity"),
    )
}

fn api_key() -> BTreeMap<String, String> {
    BTreeMap::from([("X-Api-Key".to_owned(), "sesame".to_owned())])
}

async fn connect(url: &str, timeout: Duration) -> anyhow::Result<(McpSession, Vec<McpTool>)> {
    connect_keeping(url, timeout, 128).await
}

/// [`connect`], keeping at most `max_tools` of the server's tools.
async fn connect_keeping(
    url: &str,
    timeout: Duration,
    max_tools: usize,
) -> anyhow::Result<(McpSession, Vec<McpTool>)> {
    let headers = api_key();
    let server = McpServer {
        prefix: "calc",
        url,
        headers: &headers,
        transport: spool_shared::agent::McpTransport::StreamableHttp,
        auth: None,
    };
    // Through the guarded clients, allowed to reach the loopback servers of these tests.
    let policy = Arc::new(NetworkPolicy::parse("127.0.0.1/32").expect("allow list parses"));
    let clients = GuardedClients::new(&policy, timeout).expect("clients build");
    McpSession::connect(&server, &clients, &identity(), timeout, max_tools).await
}

/// Alice of acme in run `wf`, signed with the identity key of the default settings.
fn identity() -> Identity {
    let keys = spool_shared::config::IdentityArgs::default()
        .identity_keys()
        .expect("identity keys");
    let signer = IdentitySigner::new(keys);
    Identity::new("acme", "alice", "wf", Some(Arc::new(signer)))
}

#[tokio::test]
async fn discovery_lists_namespaced_tools_with_their_schemas_and_read_only_flags_and_every_request_carries_the_configured_header()
 {
    let (url, seen) = start_calculator().await;
    let (session, tools) = connect(&url, TIMEOUT).await.expect("connect");

    let expected: Vec<McpTool> = [
        (add_tool(), true),
        (shout_tool(), false),
        (slow_tool(), false),
    ]
    .into_iter()
    .map(|(tool, read_only)| McpTool {
        name: format!("calc_{}", tool.name),
        remote_name: tool.name.to_string(),
        description: tool.description.as_deref().unwrap_or_default().to_owned(),
        parameters: Value::Object((*tool.input_schema).clone()),
        read_only,
    })
    .collect();
    assert_eq!(tools, expected);
    assert_eq!(tools[0].parameters["required"], json!(["a", "b"]));

    // A call after discovery and the closing DELETE must carry the header too.
    let output = session
        .call("add", json!({"a": 1, "b": 2}), "wf:3:call_add", TIMEOUT)
        .await;
    assert_eq!(output, ToolOutput::ok("3"));
    session.close().await;

    let seen = seen.lock().unwrap_or_else(PoisonError::into_inner).clone();
    let posts = seen.iter().filter(|(method, ..)| method == "POST").count();
    // initialize, notifications/initialized, two tools/list pages, one tools/call.
    assert!(posts >= 5, "too few POSTs: {seen:?}");
    assert!(
        seen.iter().any(|(method, ..)| method == "DELETE"),
        "no DELETE: {seen:?}"
    );
    // The call, and only the call, carries its idempotency key.
    let keyed: Vec<&Option<String>> = seen
        .iter()
        .map(|(_, _, key, _)| key)
        .filter(|k| k.is_some())
        .collect();
    assert_eq!(keyed, [&Some("wf:3:call_add".to_owned())], "{seen:?}");
    // Every request carries the configured header and a token minted for this server.
    let origin = reqwest::Url::parse(&url)
        .expect("url")
        .origin()
        .ascii_serialization();
    for (method, key, _, token) in &seen {
        assert_eq!(
            key.as_deref(),
            Some("sesame"),
            "{method} without the header: {seen:?}"
        );
        let token = token
            .as_deref()
            .unwrap_or_else(|| panic!("{method} without a token"));
        let claims = spool_tests::verify_identity(token, &origin, &spool_tests::identity_jwks(&[]))
            .expect("a valid token");
        assert_eq!(
            (claims["sub"].as_str(), claims["tenant"].as_str()),
            (Some("alice"), Some("acme"))
        );
    }
}

/// Issue 37: what a run keeps of a server's tools (`runs.mcp_tools`, sent to the model on every
/// step) is bounded by `SPOOL_MCP_MAX_TOOLS`: the first tools in the server's order, and no
/// page past the limit is asked for.
#[tokio::test]
async fn discovery_keeps_at_most_the_configured_number_of_tools_and_asks_for_no_page_past_it() {
    let (url, seen) = start_calculator().await;
    let posts = || {
        seen.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|(method, ..)| method == "POST")
            .count()
    };
    let (all, every) = connect_keeping(&url, TIMEOUT, 3).await.expect("connect");
    all.close().await;
    let listed_all = posts();
    assert_eq!(every.len(), 3, "exactly the limit: all three");

    let (session, tools) = connect_keeping(&url, TIMEOUT, 2).await.expect("connect");
    session.close().await;
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["calc_add", "calc_shout"], "the first two, in order");
    assert_eq!(
        posts() - listed_all,
        listed_all - 1,
        "one tools/list page fewer than when all were listed"
    );

    let (session, tools) = connect_keeping(&url, TIMEOUT, 1).await.expect("connect");
    session.close().await;
    assert_eq!(tools.len(), 1);
    assert_eq!(tools[0].name, "calc_add");
}

#[tokio::test]
async fn a_namespaced_call_returns_the_tool_text_and_renders_other_parts_as_json() {
    let (url, _seen) = start_calculator().await;
    let (session, tools) = connect(&url, TIMEOUT).await.expect("connect");
    let shout = tools
        .iter()
        .find(|tool| tool.name == "calc_shout")
        .expect("calc_shout");

    let output = session
        .call(&shout.remote_name, json!({"text": "hello"}), "key", TIMEOUT)
        .await;

    assert!(!output.is_error, "{output:?}");
    let (text, picture) = output.content.split_once('\n').expect("two parts");
    assert_eq!(text, "HELLO");
    let picture: Value = serde_json::from_str(picture).expect("the image part is JSON");
    assert_eq!(picture["type"], "image");
    assert_eq!(picture["data"], "aGk=");
    assert_eq!(picture["mimeType"], "image/png");
    assert!(
        !picture.to_string().contains(' '),
        "not compact: {}",
        output.content
    );
    session.close().await;
}

#[tokio::test]
async fn bad_arguments_an_unknown_tool_or_an_is_error_result_come_back_as_error_outputs() {
    let (url, _seen) = start_calculator().await;
    let (session, _tools) = connect(&url, TIMEOUT).await.expect("connect");

    let wrong_type = session
        .call("add", json!({"a": "one", "b": 2}), "key", TIMEOUT)
        .await;
    assert!(wrong_type.is_error, "{wrong_type:?}");
    assert!(
        wrong_type.content.contains("a must be a number"),
        "{wrong_type:?}"
    );

    let unknown = session
        .call("divide", json!({"a": 1, "b": 2}), "key", TIMEOUT)
        .await;
    assert!(unknown.is_error, "{unknown:?}");
    assert!(
        unknown.content.contains("no tool named divide"),
        "{unknown:?}"
    );

    let tool_error = session.call("shout", json!({}), "key", TIMEOUT).await;
    assert_eq!(tool_error, ToolOutput::error("text is required"));

    let not_an_object = session.call("add", json!([1, 2]), "key", TIMEOUT).await;
    assert!(not_an_object.is_error, "{not_an_object:?}");
    assert!(
        not_an_object.content.contains("JSON object"),
        "{not_an_object:?}"
    );

    // The session survives all of the above.
    let fine = session
        .call("add", json!({"a": 2, "b": 2.5}), "key", TIMEOUT)
        .await;
    assert_eq!(fine, ToolOutput::ok("4.5"));
    session.close().await;
}

#[tokio::test]
async fn a_port_with_nothing_listening_makes_connect_fail_fast() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    drop(listener);

    let started = Instant::now();
    let result = connect(&format!("http://{addr}/mcp"), TIMEOUT).await;

    let error = result.err().expect("connect to a closed port must fail");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    assert!(format!("{error:#}").contains("calc"), "{error:#}");
}

#[tokio::test]
async fn a_server_answering_500_makes_connect_fail_fast() {
    let router = Router::new().fallback(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "down") });
    let url = format!("{}/mcp", serve(router).await);

    let started = Instant::now();
    let result = connect(&url, TIMEOUT).await;

    let error = result.err().expect("connect to a failing server must fail");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    assert!(format!("{error:#}").contains("initialize"), "{error:#}");
}

#[tokio::test]
async fn a_call_that_outlasts_the_timeout_returns_an_error_output_at_about_the_timeout() {
    let (url, _seen) = start_calculator().await;
    let (session, _tools) = connect(&url, TIMEOUT).await.expect("connect");
    let timeout = Duration::from_millis(500);

    let started = Instant::now();
    let output = session.call("slow", json!({}), "key", timeout).await;
    let took = started.elapsed();

    assert!(output.is_error, "{output:?}");
    assert!(output.content.contains("timed out"), "{output:?}");
    assert!(
        took >= timeout && took < timeout + Duration::from_secs(2),
        "took {took:?}"
    );
    // The session is still usable once the slow call is abandoned.
    let fine = session
        .call("add", json!({"a": 1, "b": 1}), "key", TIMEOUT)
        .await;
    assert_eq!(fine, ToolOutput::ok("2"));
    session.close().await;
}

#[tokio::test]
async fn a_server_that_never_answers_makes_connect_fail_at_the_timeout() {
    let router = Router::new().fallback(|| async {
        tokio::time::sleep(Duration::from_secs(60)).await;
        "too late"
    });
    let url = format!("{}/mcp", serve(router).await);
    let timeout = Duration::from_millis(500);

    let started = Instant::now();
    let result = connect(&url, timeout).await;
    let took = started.elapsed();

    let error = result.err().expect("connect to a silent server must fail");
    assert!(format!("{error:#}").contains("timed out"), "{error:#}");
    assert!(
        took >= timeout && took < timeout + Duration::from_secs(2),
        "took {took:?}"
    );
}

#[tokio::test]
async fn an_mcp_server_the_network_policy_refuses_is_never_connected_to() {
    // A real MCP server on loopback, and a listener that only counts connections.
    let (url, seen) = start_calculator().await;
    let trap = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let trap_addr = trap.local_addr().expect("addr");
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = trap.accept().await {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            drop(stream);
        }
    });
    let strict = Arc::new(NetworkPolicy::strict());
    let clients = GuardedClients::new(&strict, Duration::from_secs(2)).expect("clients build");
    let headers = api_key();
    let port = trap_addr.port();
    // IP literals in every spelling hyper would connect to without asking the resolver.
    let refused_urls = [
        format!("http://127.0.0.1:{port}/mcp"),
        format!("http://2130706433:{port}/mcp"),
        format!("http://[::ffff:127.0.0.1]:{port}/mcp"),
        url.clone(),
    ];
    for refused in &refused_urls {
        let server = McpServer {
            prefix: "calc",
            url: refused,
            headers: &headers,
            transport: spool_shared::agent::McpTransport::StreamableHttp,
            auth: None,
        };
        let err = McpSession::connect(&server, &clients, &identity(), Duration::from_secs(2), 128)
            .await
            .err()
            .unwrap_or_else(|| panic!("{refused} was connected to"));
        assert!(format!("{err:#}").contains("refused"), "{refused}: {err:#}");
    }
    // Give a stray connection time to be counted, then show the trap counts connections.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 0);
    assert!(
        seen.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty(),
        "the MCP server saw a request"
    );
    let _probe = tokio::net::TcpStream::connect(trap_addr)
        .await
        .expect("connect");
    spool_tests::poll_until("the trap to count", Duration::from_secs(2), || async {
        (accepted.load(std::sync::atomic::Ordering::SeqCst) == 1).then_some(())
    })
    .await;
}
