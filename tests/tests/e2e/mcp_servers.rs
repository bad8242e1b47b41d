//! MCP servers' secrets (DESIGN section 12, issue 41): a bearer token, an OAuth client secret
//! and a header value never appear in a response, an error message or the API's log, nor a
//! credential in a URL in an error or the log, even when the servers fail and echo them back.

use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use serde_json::{Value, json};

use spool_tests::{JWT_SECRET, poll_until, token_with};

use crate::stack::{Stack, TIMEOUT};

const BEARER: &str = "bearer-e2e-3131";
const CLIENT_SECRET: &str = "client-secret-e2e-5150";
const URL_SECRET: &str = "url-secret-e2e-7272";

/// An MCP endpoint that refuses every request, echoing its `Authorization` back, and a token
/// endpoint that refuses every client, echoing its form back.
async fn echoing_server() -> String {
    let app = axum::Router::new()
        .route(
            "/mcp",
            post(|headers: HeaderMap| async move {
                let auth = headers
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_owned();
                (StatusCode::UNAUTHORIZED, format!("bad credentials: {auth}"))
            }),
        )
        .route(
            "/token",
            post(|headers: HeaderMap, body: String| async move {
                let auth = headers
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_owned();
                (
                    StatusCode::UNAUTHORIZED,
                    axum::Json(json!({"error": "invalid_client",
                        "error_description": format!("{auth} {body} {CLIENT_SECRET}")})),
                )
            }),
        );
    spool_tests::serve(app).await
}

#[tokio::test]
async fn mcp_secrets_never_appear_in_a_response_an_error_or_the_api_s_log() {
    let stack = Stack::start_with(
        &spool_tests::redis_url(),
        &[("SPOOL_TOOLS_ALLOW_NETWORKS", "127.0.0.1/32")],
    )
    .await;
    let root = token_with("root", "acme", true, 3600, JWT_SECRET);
    let base = echoing_server().await;
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port");
    let tools = [
        json!({"type": "mcp", "name": "bearer", "url": format!("{base}/mcp"),
            "auth": {"type": "bearer", "token": BEARER}}),
        json!({"type": "mcp", "name": "oauth", "url": format!("{base}/mcp"),
            "auth": {"type": "oauth_client_credentials", "token_url": format!("{base}/token"),
                     "client_id": "e2e", "client_secret": CLIENT_SECRET}}),
        json!({"type": "mcp", "name": "dead", "url": format!("http://{dead}/mcp?key={URL_SECRET}"),
            "headers": {"X-Key": BEARER}}),
    ];
    let mut shown: Vec<Value> = Vec::new();
    let mut ids = Vec::new();
    for tool in &tools {
        let (status, created) = stack.post(&root, "/v1/tools", tool).await;
        assert_eq!(status, StatusCode::CREATED, "{created}");
        ids.push(created["id"].as_str().expect("id").to_owned());
        shown.push(created);
    }
    for id in &ids {
        let tool = poll_until("the probe's result", TIMEOUT, || async {
            let (_, tool) = stack.get_with(&root, &format!("/v1/tools/{id}")).await;
            (tool["status"] != "pending").then_some(tool)
        })
        .await;
        assert_eq!(tool["status"], "unhealthy", "{tool}");
        assert!(tool["error"].is_string(), "{tool}");
        shown.push(tool);
        let (status, probed) = stack
            .post(&root, &format!("/v1/tools/{id}/probe"), &json!({}))
            .await;
        assert_eq!(status, StatusCode::OK, "{probed}");
        shown.push(probed);
    }
    // A refused write's error names the field, never the value.
    let (status, refused) = stack
        .post(
            &root,
            "/v1/tools",
            &json!({"type": "mcp", "name": "bad", "url": "http://169.254.169.254/mcp",
                "auth": {"type": "bearer", "token": BEARER}}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    shown.push(refused);
    let (_, list) = stack.get_with(&root, "/v1/tools").await;
    shown.push(list);

    let log = poll_until("the API to log the probes", TIMEOUT, || async {
        let log = stack.api_log();
        (log.matches("MCP server probed").count() >= 6).then_some(log)
    })
    .await;
    for secret in [BEARER, CLIENT_SECRET, URL_SECRET] {
        for body in &shown {
            // The URL is the tool's own (shown as written); its errors never repeat it.
            let text = if secret == URL_SECRET {
                let items = body["data"].as_array().cloned().unwrap_or_default();
                let errors: Vec<String> = items.iter().map(|t| t["error"].to_string()).collect();
                format!("{} {}", body["error"], errors.join(" "))
            } else {
                body.to_string()
            };
            assert!(!text.contains(secret), "{secret} shown: {body}");
        }
        assert!(
            !log.contains(secret),
            "{secret} is in the API's log:\n{log}"
        );
    }
}
