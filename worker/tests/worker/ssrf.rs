//! The network policy against real sockets: refused addresses never see a connection (a trap
//! listener counts them), redirects are re-checked, and allowed networks work end to end.
//!
//! Every address these tests send to is on this machine (127.0.0.0/8, ::1): a regression must
//! not send real packets out. The private, link-local and metadata ranges are judged by the
//! policy's own unit tests (`check_url`, and `screen` for what the resolver returns); here,
//! loopback listeners stand in for them (127.0.0.2 and 127.0.0.3 are refused like any of them).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, RawQuery};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::{any, get};
use serde_json::{Value, json};
use tokio::net::TcpListener;

use spool_shared::egress::{GuardedClients, NetworkPolicy};
use spool_worker::agent::tools::ToolOutput;
use spool_worker::agent::tools::http::{self, HttpTool};
use spool_worker::agent::tools::identity::Identity;

/// A listener that only counts the connections it accepts.
struct Trap {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
}

impl Trap {
    async fn bind(addr: &str) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&accepted);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                drop(stream);
            }
        });
        Ok(Self { addr, accepted })
    }

    fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Asserts no connection arrived, after giving a stray one time to be accepted.
    async fn assert_untouched(&self) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            self.accepted.load(Ordering::SeqCst),
            0,
            "the trap at {} was reached",
            self.addr
        );
    }

    /// Connects directly, to show the trap would have counted a connection.
    async fn assert_counts(&self) {
        let _stream = tokio::net::TcpStream::connect(self.addr)
            .await
            .expect("connect to trap");
        for _ in 0..100 {
            if self.accepted.load(Ordering::SeqCst) == 1 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!(
            "the trap at {} did not count a direct connection",
            self.addr
        );
    }
}

/// A `302 Found` to `location`.
fn found(location: String) -> impl IntoResponse {
    (StatusCode::FOUND, [(header::LOCATION, location)])
}

async fn serve(addr: &str, app: Router) -> SocketAddr {
    let listener = TcpListener::bind(addr).await.expect("bind tool server");
    let addr = listener.local_addr().expect("tool server address");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    addr
}

fn clients(policy: &Arc<NetworkPolicy>, timeout: Duration) -> GuardedClients {
    GuardedClients::new(policy, timeout).expect("clients build")
}

async fn call_with(
    clients: &GuardedClients,
    url: &str,
    method: &str,
    headers: &BTreeMap<String, String>,
    arguments: &Value,
) -> ToolOutput {
    let tool = HttpTool {
        url,
        method,
        headers,
    };
    let identity = Identity::new("acme", "alice", "wf", None);
    http::call(clients, &identity, &tool, arguments, "key-1").await
}

async fn post(clients: &GuardedClients, url: &str) -> ToolOutput {
    call_with(clients, url, "POST", &BTreeMap::new(), &json!({"x": 1})).await
}

fn assert_refused(output: &ToolOutput, url: &str) {
    assert!(output.is_error, "{url} was not refused: {output:?}");
    assert!(
        output.content.contains("refused"),
        "{url}: the reason does not say refused: {output:?}"
    );
}

#[tokio::test]
async fn addresses_outside_the_public_internet_are_refused_before_any_connection() {
    let trap = Trap::bind("127.0.0.1:0").await.expect("bind v4 trap");
    let port = trap.port();
    let policy = Arc::new(NetworkPolicy::strict());
    let clients = clients(&policy, Duration::from_secs(2));

    let mut urls = vec![
        format!("http://127.0.0.1:{port}/"),
        format!("http://[::ffff:127.0.0.1]:{port}/"),
        format!("http://2130706433:{port}/"),
        format!("http://0x7f000001:{port}/"),
        format!("http://0177.0.0.1:{port}/"),
        format!("http://127.1:{port}/"),
        format!("http://127.0.0.1.:{port}/"),
        // Linux delivers connections to 0.0.0.0 to the local host.
        format!("http://0.0.0.0:{port}/"),
        format!("http://localhost:{port}/"),
        format!("https://localhost:{port}/"),
        "file:///etc/passwd".to_owned(),
        format!("ftp://127.0.0.1:{port}/"),
    ];
    // Another loopback address stands in for the private and metadata ranges.
    let stand_in = Trap::bind("127.0.0.2:0")
        .await
        .expect("bind a stand-in trap");
    urls.push(format!(
        "http://127.0.0.2:{}/latest/meta-data/",
        stand_in.port()
    ));

    // A second trap on ::1 catches IPv6 loopback; hosts without IPv6 skip that case.
    let v6_trap = Trap::bind("[::1]:0").await.ok();
    if let Some(v6_trap) = &v6_trap {
        urls.push(format!("http://[::1]:{}/", v6_trap.port()));
        urls.push(format!("http://localhost:{}/", v6_trap.port()));
    }

    for url in &urls {
        let output = post(&clients, url).await;
        assert_refused(&output, url);
    }
    trap.assert_untouched().await;
    trap.assert_counts().await;
    stand_in.assert_untouched().await;
    stand_in.assert_counts().await;
    if let Some(v6_trap) = &v6_trap {
        v6_trap.assert_untouched().await;
        v6_trap.assert_counts().await;
    }
}

#[tokio::test]
async fn a_redirect_to_a_refused_address_is_not_followed() {
    let trap = Trap::bind("127.0.0.1:0").await.expect("bind trap");
    let port = trap.port();
    let metadata = Trap::bind("127.0.0.3:0")
        .await
        .expect("bind the stand-in trap");
    let meta = metadata.port();
    let app = Router::new()
        .route("/ok", any(|| async { "reached the allowed server" }))
        .route(
            "/literal",
            any(move || async move { found(format!("http://127.0.0.1:{port}/")) }),
        )
        .route(
            "/mapped",
            any(move || async move { found(format!("http://[::ffff:7f00:1]:{port}/")) }),
        )
        .route(
            "/decimal",
            any(move || async move { found(format!("http://2130706433:{port}/")) }),
        )
        .route(
            "/name",
            any(move || async move { found(format!("http://localhost:{port}/")) }),
        )
        .route(
            "/metadata",
            // 127.0.0.3 stands in for the metadata address: refused, and never reached.
            any(move || async move { found(format!("http://127.0.0.3:{meta}/latest/meta-data/")) }),
        )
        .route(
            "/file",
            any(|| async { found("file:///etc/passwd".to_owned()) }),
        );
    // Linux routes all of 127.0.0.0/8 to the loopback interface.
    let server = serve("127.0.0.2:0", app).await;
    let policy = Arc::new(NetworkPolicy::parse("127.0.0.2/32").expect("allow list parses"));
    let clients = clients(&policy, Duration::from_secs(2));

    let output = post(&clients, &format!("http://{server}/ok")).await;
    assert_eq!(output, ToolOutput::ok("reached the allowed server"));

    // reqwest cannot even express a `file:` redirect as a request, so it hands back the 302.
    let output = post(&clients, &format!("http://{server}/file")).await;
    assert!(output.is_error, "{output:?}");
    assert!(output.content.contains("was not followed"), "{output:?}");

    for path in ["literal", "mapped", "decimal", "name", "metadata"] {
        let url = format!("http://{server}/{path}");
        let output = post(&clients, &url).await;
        assert_refused(&output, &url);
    }
    trap.assert_untouched().await;
    trap.assert_counts().await;
    metadata.assert_untouched().await;
    metadata.assert_counts().await;
}

#[tokio::test]
async fn at_most_five_redirects_are_followed() {
    let app = Router::new().route(
        "/chain/{hops}",
        any(|Path(hops): Path<u32>| async move {
            match hops {
                0 => "arrived".into_response(),
                n => found(format!("/chain/{}", n - 1)).into_response(),
            }
        }),
    );
    let server = serve("127.0.0.1:0", app).await;
    let policy = Arc::new(NetworkPolicy::parse("127.0.0.1/32").expect("allow list parses"));
    let clients = clients(&policy, Duration::from_secs(2));

    let output = post(&clients, &format!("http://{server}/chain/5")).await;
    assert_eq!(output, ToolOutput::ok("arrived"));

    let output = post(&clients, &format!("http://{server}/chain/6")).await;
    assert!(output.is_error, "{output:?}");
    assert!(output.content.contains("redirects"), "{output:?}");
}

#[tokio::test]
async fn configured_headers_are_never_redirected_to_another_origin() {
    // Another origin (another port) that echoes what reaches it, and counts it.
    let reached = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&reached);
    let elsewhere = serve(
        "127.0.0.1:0",
        Router::new().route(
            "/echo",
            any(move |method, headers, query, body| {
                counter.fetch_add(1, Ordering::SeqCst);
                echo(method, headers, query, body)
            }),
        ),
    )
    .await;
    let app = Router::new()
        .route("/echo", any(echo))
        .route("/here", any(|| async { found("/echo".to_owned()) }))
        .route(
            "/away",
            any(move || async move { found(format!("http://{elsewhere}/echo")) }),
        );
    let server = serve("127.0.0.1:0", app).await;
    let policy = Arc::new(NetworkPolicy::parse("127.0.0.1/32").expect("allow list parses"));
    let clients = GuardedClients::new(&policy, Duration::from_secs(2)).expect("clients build");
    let secret = BTreeMap::from([("X-Custom".to_owned(), "secret-key".to_owned())]);
    let none = BTreeMap::new();
    let call = |path: &'static str, headers: &'static str| {
        let headers = if headers.is_empty() { &none } else { &secret };
        let url = format!("http://{server}/{path}");
        let clients = &clients;
        async move { call_with(clients, &url, "POST", headers, &json!({})).await }
    };

    // On its own origin, a redirect is followed with the headers.
    let echo = echoed(&call("here", "secret").await);
    assert_eq!(echo["x_custom"], "secret-key");
    // Elsewhere, it is not followed at all.
    let output = call("away", "secret").await;
    assert!(output.is_error, "{output:?}");
    assert!(
        output.content.contains("was not followed") && !output.content.contains("secret-key"),
        "{output:?}"
    );
    assert_eq!(
        reached.load(Ordering::SeqCst),
        0,
        "the other origin saw the request"
    );
    // A tool without headers has nothing to leak: it follows the redirect.
    let echo = echoed(&call("away", "").await);
    assert_eq!(echo["x_custom"], Value::Null);
    assert_eq!(reached.load(Ordering::SeqCst), 1);
}

async fn echo(
    method: Method,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
    body: String,
) -> String {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned)
    };
    json!({
        "method": method.as_str(),
        "query": query,
        "body": body,
        "content_type": header("content-type"),
        "idempotency_key": header("idempotency-key"),
        "x_custom": header("x-custom"),
    })
    .to_string()
}

async fn tool_server() -> SocketAddr {
    let app = Router::new()
        .route("/echo", any(echo))
        .route(
            "/fail",
            any(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "boom") }),
        )
        .route(
            "/teapot",
            any(|| async {
                (
                    StatusCode::IM_A_TEAPOT,
                    [(header::CONTENT_TYPE, "text/html")],
                    "<p>short and stout</p>",
                )
            }),
        )
        .route("/empty", any(|| async { StatusCode::NO_CONTENT }))
        .route("/big", get(|| async { "x".repeat(2 * 1024 * 1024) }))
        .route(
            "/slow",
            any(|| async {
                tokio::time::sleep(Duration::from_secs(10)).await;
                "too late"
            }),
        );
    serve("127.0.0.1:0", app).await
}

fn echoed(output: &ToolOutput) -> Value {
    assert!(!output.is_error, "{output:?}");
    serde_json::from_str(&output.content).expect("echo answers JSON")
}

#[tokio::test]
async fn an_allowed_network_works_end_to_end() {
    let server = tool_server().await;
    let policy = Arc::new(NetworkPolicy::parse("127.0.0.1/32").expect("allow list parses"));
    let clients = clients(&policy, Duration::from_millis(500));
    let headers = BTreeMap::from([("X-Custom".to_owned(), "custom-value".to_owned())]);
    let arguments = json!({"city": "Paris", "days": 3});

    let url = format!("http://{server}/echo");
    let output = call_with(&clients, &url, "POST", &headers, &arguments).await;
    assert!(output.content.contains("key-1") && output.content.contains("custom-value"));
    let echo = echoed(&output);
    assert_eq!(echo["method"], "POST");
    assert_eq!(echo["content_type"], "application/json");
    assert_eq!(echo["idempotency_key"], "key-1");
    assert_eq!(echo["x_custom"], "custom-value");
    let body: Value =
        serde_json::from_str(echo["body"].as_str().expect("body")).expect("JSON body");
    assert_eq!(body, arguments);

    // An empty method means POST; the method is case-insensitive.
    let output = call_with(&clients, &url, "", &headers, &arguments).await;
    assert_eq!(echoed(&output)["method"], "POST");
    let output = call_with(&clients, &url, "put", &headers, &arguments).await;
    assert_eq!(echoed(&output)["method"], "PUT");

    // A GET sends flat arguments as the query, and nested ones as a JSON body.
    let output = call_with(&clients, &url, "GET", &headers, &arguments).await;
    let echo = echoed(&output);
    assert_eq!(echo["query"], "city=Paris&days=3");
    assert_eq!(echo["body"], "");
    assert_eq!(echo["idempotency_key"], "key-1");
    let output = call_with(&clients, &url, "GET", &headers, &json!({})).await;
    assert_eq!(echoed(&output)["query"], Value::Null);
    let nested = json!({"filter": {"city": "Paris"}});
    let output = call_with(&clients, &url, "GET", &headers, &nested).await;
    let echo = echoed(&output);
    assert_eq!(echo["query"], Value::Null);
    assert_eq!(echo["body"], nested.to_string());

    // A host name is checked after resolution: localhost keeps its permitted 127.0.0.1.
    let by_name = format!("http://localhost:{}/echo", server.port());
    let output = call_with(&clients, &by_name, "POST", &headers, &arguments).await;
    assert_eq!(echoed(&output)["idempotency_key"], "key-1");

    let output = post(&clients, &format!("http://{server}/fail")).await;
    assert!(output.is_error, "{output:?}");
    assert_eq!(output.content, "HTTP 500 Internal Server Error: boom");

    let output = post(&clients, &format!("http://{server}/teapot")).await;
    assert!(output.is_error, "{output:?}");
    assert!(output.content.starts_with("HTTP 418"), "{output:?}");
    assert!(
        output.content.contains("<p>short and stout</p>"),
        "{output:?}"
    );

    let output = post(&clients, &format!("http://{server}/empty")).await;
    assert!(!output.is_error, "{output:?}");
    assert!(output.content.contains("204"), "{output:?}");

    let output = call_with(
        &clients,
        &format!("http://{server}/big"),
        "GET",
        &headers,
        &json!({}),
    )
    .await;
    assert!(!output.is_error, "{output:?}");
    assert!(output.content.starts_with("xxxx"), "{output:?}");
    assert!(output.content.ends_with("[response truncated at 1 MiB]"));
    assert!(output.content.len() <= http::MAX_RESPONSE_BYTES + 64);
    assert!(output.content.len() >= http::MAX_RESPONSE_BYTES);

    let started = std::time::Instant::now();
    let output = post(&clients, &format!("http://{server}/slow")).await;
    assert!(output.is_error, "{output:?}");
    assert!(output.content.contains("timed out"), "{output:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the timeout did not apply"
    );
}

#[tokio::test]
async fn bad_urls_and_dead_servers_become_error_outputs() {
    let policy = Arc::new(NetworkPolicy::parse("127.0.0.1/32").expect("allow list parses"));
    let clients = clients(&policy, Duration::from_secs(2));

    let output = post(&clients, "not a url").await;
    assert!(
        output.is_error && output.content.contains("invalid tool URL"),
        "{output:?}"
    );

    let dead = {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        listener.local_addr().expect("address")
    };
    let output = post(&clients, &format!("http://{dead}/")).await;
    assert!(output.is_error, "{output:?}");
    assert!(output.content.contains("could not connect"), "{output:?}");

    let headers = BTreeMap::from([("bad header".to_owned(), "x".to_owned())]);
    let url = format!("http://{dead}/");
    let output = call_with(&clients, &url, "POST", &headers, &json!({})).await;
    assert!(
        output.is_error && output.content.contains("header"),
        "{output:?}"
    );

    let output = call_with(&clients, &url, "NOT A METHOD", &BTreeMap::new(), &json!({})).await;
    assert!(
        output.is_error && output.content.contains("method"),
        "{output:?}"
    );
}
