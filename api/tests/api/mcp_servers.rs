//! MCP servers as tool resources (DESIGN section 12): `transport`, `allowed_tools`, `auth`
//! (write-only secrets, kept only for the same destination), the probe on save and on
//! `POST /v1/tools/{id}/probe`, and runs that use all of it. Against the MCP reference test
//! server (`@modelcontextprotocol/server-everything`) in both of its HTTP transports, and a
//! small recording server where the test must see the headers.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse as _;
use axum::routing::post;
use reqwest::Method;
use serde_json::{Value, json};

use spool_tests::fake_llm::{self, FakeLlm};
use spool_tests::peers::McpEverything;
use spool_tests::{poll_until, token};

use crate::agents::admin;
use crate::common::{TestApp, app_with, ask, finished, worker_args};

/// How long a probe's result may take to appear (the probe's own bound).
const PROBE: Duration = Duration::from_secs(35);

impl TestApp {
    /// Creates an MCP tool as acme's admin; the 201 body.
    async fn create_mcp(&self, tool: &Value) -> Value {
        let (status, created) = self.post(&admin("acme"), "/v1/tools", tool).await;
        assert_eq!(status, StatusCode::CREATED, "{created}");
        created
    }

    /// The tool once its probe is done (`status` no longer `pending`).
    async fn probed(&self, id: &str) -> Value {
        poll_until("the probe's result", PROBE, || async {
            let (status, tool) = self.get(&admin("acme"), &format!("/v1/tools/{id}")).await;
            assert_eq!(status, StatusCode::OK, "{tool}");
            (tool["status"] != "pending").then_some(tool)
        })
        .await
    }
}

fn names(tool: &Value) -> Vec<String> {
    tool["discovered_tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| n.as_str().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn server_everything_probes_healthy_in_both_transports_with_its_tools() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    for (transport, name) in [("streamableHttp", "streamable_http"), ("sse", "sse")] {
        let server = McpEverything::start(transport)
            .await
            .expect("server-everything");
        let created = app
            .create_mcp(&json!({"type": "mcp", "name": format!("every_{name}"),
                "url": server.url, "transport": name, "allowed_tools": ["echo"]}))
            .await;
        // The create answers at once; the probe's result comes later.
        assert_eq!(created["status"], "pending", "{created}");
        assert!(created["last_probed_at"].is_null(), "{created}");
        assert_eq!(created["allowed_tools"], json!(["echo"]));
        let id = created["id"].as_str().expect("id");
        let tool = app.probed(id).await;
        assert_eq!(tool["status"], "healthy", "{transport}: {tool}");
        assert!(tool["error"].is_null(), "{tool}");
        assert!(tool["last_probed_at"].is_string(), "{tool}");
        let found = names(&tool);
        for expected in ["echo", "get-sum"] {
            assert!(
                found.iter().any(|n| n == expected),
                "{transport}: {found:?}"
            );
        }

        // Probed again on demand: 200 with the tool once done.
        let (status, again) = app
            .post(&admin("acme"), &format!("/v1/tools/{id}/probe"), &json!({}))
            .await;
        assert_eq!(status, StatusCode::OK, "{again}");
        assert_eq!(again["status"], "healthy", "{again}");
        assert!(again["last_probed_at"].as_str() >= tool["last_probed_at"].as_str());
    }
}

#[tokio::test]
async fn a_run_calls_server_everything_s_allowed_tool_in_both_transports() {
    // The model calls `everything_echo` when it has no tool result yet, then answers.
    let fake = FakeLlm::start(|request, _| {
        if fake_llm::tool_results_in(request) == 0 {
            fake_llm::tool_calls(&[("c1", "everything_echo", r#"{"message": "hello mcp"}"#)])
        } else {
            fake_llm::text("done", 1)
        }
    })
    .await;
    let app = app_with(&fake).await;
    let mut tool: Option<String> = None;
    let mut agent = String::new();
    for transport in ["streamableHttp", "sse"] {
        let server = McpEverything::start(transport)
            .await
            .expect("server-everything");
        let kind = if transport == "sse" {
            "sse"
        } else {
            "streamable_http"
        };
        let spec = json!({"type": "mcp", "name": "everything", "url": server.url,
            "transport": kind, "allowed_tools": ["echo"]});
        match &tool {
            None => {
                let created = app.create_mcp(&spec).await;
                let id = created["id"].as_str().expect("id").to_owned();
                agent = app
                    .create_agent(
                        "acme",
                        &json!({"name": "echoer", "model": "gpt-4o-mini", "tool_ids": [id]}),
                    )
                    .await;
                tool = Some(id);
            }
            // The second round moves the server: the agent's next run uses the tool as it is.
            Some(id) => {
                let (status, body) = app
                    .send(
                        Method::PATCH,
                        &admin("acme"),
                        &format!("/v1/tools/{id}"),
                        Some(&json!({"url": server.url, "transport": kind})),
                    )
                    .await;
                assert_eq!(status, StatusCode::OK, "{body}");
                assert_eq!(body["transport"], "sse", "{body}");
            }
        }
        let before = fake.requests().len();
        let (_, accepted) = ask(&app, &agent, "echo it").await;
        let completed = finished(&app, &accepted).await;
        assert_eq!(completed["status"], "completed", "{transport}: {completed}");
        let requests = fake.requests();
        let requests = &requests[before..];
        assert_eq!(requests.len(), 2, "{transport}");
        // Only the allowed tool is offered, whatever else the server lists.
        let offered: Vec<&str> = requests[0]["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["function"]["name"].as_str())
            .collect();
        assert_eq!(offered, ["everything_echo"], "{transport}");
        assert_eq!(
            fake_llm::last_tool_result(&requests[1]),
            Some("Echo: hello mcp"),
            "{transport}"
        );
    }
}

#[tokio::test]
async fn a_failing_probe_never_blocks_the_save_and_a_refused_url_is_a_422() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let root = admin("acme");
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port");
    let created = app
        .create_mcp(&json!({"type": "mcp", "name": "dead",
            "url": format!("http://{dead}/mcp?key=url-secret-1234")}))
        .await;
    let id = created["id"].as_str().expect("id");
    let tool = app.probed(id).await;
    assert_eq!(tool["status"], "unhealthy", "{tool}");
    let error = tool["error"].as_str().expect("an error");
    assert!(!error.contains("url-secret-1234"), "{error}");
    assert_eq!(tool["discovered_tools"], json!([]));

    // An address the policy refuses outright: refused at save, by field.
    let (status, body) = app
        .post(
            &root,
            "/v1/tools",
            &json!({"type": "mcp", "name": "meta", "url": "http://169.254.169.254/mcp",
                "auth": {"type": "oauth_client_credentials", "token_url": "http://10.1.2.3/token",
                         "client_id": "c", "client_secret": "s"}}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["code"], "url_not_allowed", "{body}");
    let fields: Vec<&str> = body["error"]["errors"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["field"].as_str())
        .collect();
    assert_eq!(fields, ["url", "auth.token_url"], "{body}");

    // Bad `allowed_tools` and `auth`: every problem by field.
    let (status, body) = app
        .post(
            &root,
            "/v1/tools",
            &json!({"type": "mcp", "name": "bad", "url": "https://mcp.example.com/mcp",
                "transport": "sse", "allowed_tools": ["echo", "", "echo"],
                "auth": {"type": "oauth_client_credentials", "token_url": "ftp://x",
                         "client_id": "", "client_secret": "s"}}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let fields: Vec<&str> = body["error"]["errors"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["field"].as_str())
        .collect();
    for field in [
        "allowed_tools[1]",
        "allowed_tools[2]",
        "auth.token_url",
        "auth.client_id",
    ] {
        assert!(fields.contains(&field), "{field}: {body}");
    }
    let (status, body) = app
        .post(
            &root,
            "/v1/tools",
            &json!({"type": "mcp", "name": "odd", "url": "https://mcp.example.com/mcp",
                "transport": "websocket"}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");

    // Only MCP servers are probed.
    let (status, client) = app
        .post(
            &root,
            "/v1/tools",
            &json!({"type": "client", "name": "pick"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(client.get("status").is_none(), "{client}");
    let (status, body) = app
        .post(
            &root,
            &format!("/v1/tools/{}/probe", client["id"].as_str().expect("id")),
            &json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["code"], "not_an_mcp_server");
    // Probing needs `tools:write`.
    let (status, _) = app
        .post(
            &token("alice", "acme"),
            &format!("/v1/tools/{id}/probe"),
            &json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

/// What the recording MCP server and token endpoint saw.
#[derive(Default)]
struct Seen {
    /// The `Authorization` header of every MCP request.
    mcp: Vec<String>,
    /// The `Authorization` header and body of every token request.
    token: Vec<(String, String)>,
}

type Shared = Arc<Mutex<Seen>>;

/// A minimal Streamable HTTP MCP server (JSON answers, no sessions) with one tool, `ping`,
/// that records each request's `Authorization`; and an OAuth token endpoint (`/token`) that
/// issues `issued-N` tokens living `lifetime` seconds.
async fn recording_server(lifetime: u64) -> (Shared, String) {
    let seen: Shared = Arc::default();
    let mcp = {
        let seen = seen.clone();
        move |headers: HeaderMap, body: axum::Json<Value>| {
            let seen = seen.clone();
            async move {
                let auth = headers
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_owned();
                seen.lock().expect("lock").mcp.push(auth);
                let id = body["id"].clone();
                let result = match body["method"].as_str() {
                    Some("initialize") => json!({"protocolVersion": "2025-03-26",
                        "capabilities": {"tools": {}},
                        "serverInfo": {"name": "recording", "version": "1"}}),
                    Some("tools/list") => json!({"tools": [{"name": "ping",
                        "inputSchema": {"type": "object"}}]}),
                    Some("tools/call") => json!({"content": [{"type": "text", "text": "pong"}]}),
                    _ => return StatusCode::ACCEPTED.into_response(),
                };
                axum::Json(json!({"jsonrpc": "2.0", "id": id, "result": result})).into_response()
            }
        }
    };
    let issue = {
        let seen = seen.clone();
        move |headers: HeaderMap, body: String| {
            let seen = seen.clone();
            async move {
                let auth = headers
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_owned();
                let n = {
                    let mut seen = seen.lock().expect("lock");
                    seen.token.push((auth, body));
                    seen.token.len()
                };
                axum::Json(json!({"access_token": format!("issued-{n}"),
                    "token_type": "Bearer", "expires_in": lifetime}))
            }
        }
    };
    let app = axum::Router::new()
        .route(
            "/mcp",
            post(mcp).get(|| async { StatusCode::METHOD_NOT_ALLOWED }),
        )
        .route("/token", post(issue));
    (seen, spool_tests::serve(app).await)
}

#[tokio::test]
async fn auth_secrets_are_write_only_sent_as_bearer_tokens_and_kept_only_for_their_destination() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let root = admin("acme");
    let (seen, base) = recording_server(3600).await;
    let bearer = "bearer-secret-7788";

    // A bearer token: sent on every request, never shown.
    let created = app
        .create_mcp(
            &json!({"type": "mcp", "name": "rec", "url": format!("{base}/mcp"),
            "auth": {"type": "bearer", "token": bearer}}),
        )
        .await;
    assert_eq!(
        created["auth"],
        json!({"type": "bearer", "token": "<redacted>"})
    );
    let id = created["id"].as_str().expect("id").to_owned();
    let tool = app.probed(&id).await;
    assert_eq!(tool["status"], "healthy", "{tool}");
    assert_eq!(names(&tool), ["ping"]);
    {
        let seen = seen.lock().expect("lock");
        assert!(!seen.mcp.is_empty());
        assert!(
            seen.mcp.iter().all(|a| *a == format!("Bearer {bearer}")),
            "{:?}",
            seen.mcp
        );
    }
    let mut shown = vec![created.clone(), tool.clone()];

    // Written back as read (status fields left out): kept. An omitted token too.
    let mut written = tool.clone();
    for read_only in [
        "id",
        "created_at",
        "updated_at",
        "status",
        "last_probed_at",
        "error",
        "discovered_tools",
    ] {
        written.as_object_mut().expect("object").remove(read_only);
    }
    let (status, put) = app
        .send(
            Method::PUT,
            &root,
            &format!("/v1/tools/{id}"),
            Some(&written),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{put}");
    assert_eq!(put["status"], "pending", "a change probes again");
    shown.push(put);
    written["auth"] = json!({"type": "bearer"});
    let (status, put) = app
        .send(
            Method::PUT,
            &root,
            &format!("/v1/tools/{id}"),
            Some(&written),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{put}");
    let tool = app.probed(&id).await;
    assert_eq!(tool["status"], "healthy", "{tool}");
    assert_eq!(
        seen.lock().expect("lock").mcp.last().map(String::as_str),
        Some(format!("Bearer {bearer}").as_str()),
        "the kept token is the one sent"
    );

    // Pointed elsewhere (another port: another origin), the secret must be sent again.
    let (_, other) = recording_server(3600).await;
    let (status, body) = app
        .send(
            Method::PATCH,
            &root,
            &format!("/v1/tools/{id}"),
            Some(&json!({"url": format!("{other}/mcp")})),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["code"], "secret_needs_reentry", "{body}");
    assert_eq!(body["error"]["errors"][0]["field"], "auth.token", "{body}");
    shown.push(body);

    // OAuth client credentials: a token fetched (HTTP Basic), cached, sent as the bearer.
    let client_secret = "client-secret-9911";
    let created = app
        .create_mcp(
            &json!({"type": "mcp", "name": "oauth", "url": format!("{base}/mcp"),
            "auth": {"type": "oauth_client_credentials", "token_url": format!("{base}/token"),
                     "client_id": "spool-test-cache", "client_secret": client_secret,
                     "scope": "tools"}}),
        )
        .await;
    assert_eq!(created["auth"]["client_secret"], "<redacted>");
    assert_eq!(created["auth"]["client_id"], "spool-test-cache");
    let oauth = created["id"].as_str().expect("id").to_owned();
    let tool = app.probed(&oauth).await;
    assert_eq!(tool["status"], "healthy", "{tool}");
    let (status, again) = app
        .post(&root, &format!("/v1/tools/{oauth}/probe"), &json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["status"], "healthy", "{again}");
    {
        let seen = seen.lock().expect("lock");
        assert_eq!(seen.token.len(), 1, "one token, cached: {:?}", seen.token);
        let (basic, body) = &seen.token[0];
        let expected = base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            format!("spool-test-cache:{client_secret}"),
        );
        assert_eq!(*basic, format!("Basic {expected}"));
        assert!(body.contains("grant_type=client_credentials"), "{body}");
        assert!(body.contains("scope=tools"), "{body}");
        assert_eq!(seen.mcp.last().map(String::as_str), Some("Bearer issued-1"));
    }
    shown.extend([created, tool, again]);
    // Another token endpoint origin: the client secret must be sent again.
    let (status, body) = app
        .send(
            Method::PATCH,
            &root,
            &format!("/v1/tools/{oauth}"),
            Some(&json!({"auth": {"token_url": format!("{other}/token")}})),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["code"], "secret_needs_reentry", "{body}");
    assert_eq!(body["error"]["errors"][0]["field"], "auth.client_secret");
    shown.push(body);
    let (_, list) = app.get(&root, "/v1/tools").await;
    shown.push(list);

    for body in &shown {
        let text = body.to_string();
        for secret in [bearer, client_secret] {
            assert!(!text.contains(secret), "{secret} shown: {text}");
        }
    }
}

#[tokio::test]
async fn an_expiring_oauth_token_is_fetched_again() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let root = admin("acme");
    // Tokens that live 1 s: stale at once (they are renewed 30 s before they expire).
    let (seen, base) = recording_server(1).await;
    let created = app
        .create_mcp(
            &json!({"type": "mcp", "name": "short", "url": format!("{base}/mcp"),
            "auth": {"type": "oauth_client_credentials", "token_url": format!("{base}/token"),
                     "client_id": "spool-test-expiry", "client_secret": "expiring-secret"}}),
        )
        .await;
    let id = created["id"].as_str().expect("id");
    assert_eq!(app.probed(id).await["status"], "healthy");
    let fetched = seen.lock().expect("lock").token.len();
    let (status, again) = app
        .post(&root, &format!("/v1/tools/{id}/probe"), &json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["status"], "healthy", "{again}");
    let seen = seen.lock().expect("lock");
    assert!(seen.token.len() > fetched, "{:?}", seen.token);
    // The renewed tokens are the ones the requests then carry.
    let renewed = seen.mcp.iter().any(|a| {
        a.strip_prefix("Bearer issued-")
            .and_then(|n| n.parse::<usize>().ok())
            .is_some_and(|n| n > fetched)
    });
    assert!(renewed, "{:?}", seen.mcp);
}
