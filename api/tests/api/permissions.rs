//! Permissions (DESIGN section 13, docs/security.md): every operation of the OpenAPI document
//! names the permission it needs, and the router does what the document says: a token that
//! holds every other permission is refused with 403 `forbidden` naming it, a token with only
//! that one gets past the check, and `admin` gets past every one. Tokens without a permissions
//! claim keep what they could do before; `runs:read:tenant` reads the tenant's threads but
//! changes none; other tenants' and users' ids stay 404 whatever the caller holds.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use uuid::Uuid;

use spool_tests::{JWT_SECRET, token, token_with, token_with_permissions};

use crate::common::{TestApp, worker_args};

/// Every permission a token can list, `admin` aside.
const PERMISSIONS: [&str; 9] = [
    "agents:read",
    "agents:write",
    "tools:write",
    "providers:write",
    "runs:create",
    "runs:read:tenant",
    "webhooks:admin",
    "usage:read",
    "api_keys:admin",
];

/// A body the operation parses, so that what answers is the handler, not the JSON extractor.
fn body(method: &str, path: &str) -> Option<Value> {
    let body = match (method, path) {
        ("POST", "/v1/threads") => json!({}),
        ("POST", "/v1/threads/{thread_id}/user_message") => json!({"input_text": "hi"}),
        ("PATCH", "/v1/threads/{thread_id}") => json!({"title": "t"}),
        ("POST", "/v1/workflows/{workflow_id}/cancel") => json!({}),
        ("POST", "/v1/workflows/{workflow_id}/input") => json!({"text": "yes"}),
        ("POST", "/v1/workflows/{workflow_id}/tool_outputs") => json!({"tool_outputs": []}),
        ("POST", "/v1/workflows/{workflow_id}/approvals/{tool_call_id}") => {
            json!({"approved": true})
        }
        ("POST" | "PUT", "/v1/agents" | "/v1/agents/{agent_id}" | "/v1/agents/validate") => {
            json!({"name": "a", "instructions": "Be brief.", "model": "demo"})
        }
        ("PATCH", "/v1/agents/{agent_id}") => json!({"instructions": "Be brief."}),
        ("POST" | "PUT", "/v1/tools" | "/v1/tools/{tool_id}") => {
            json!({"type": "client", "name": "lookup"})
        }
        ("PATCH", "/v1/tools/{tool_id}") => json!({"enabled": false}),
        ("POST", "/v1/knowledge_bases") => {
            json!({"name": "kb", "url": "http://127.0.0.1:9/search"})
        }
        ("POST", "/v1/providers") => json!({"name": "p", "kind": "openai",
            "base_url": "https://llm.example.com/v1", "api_key": "k"}),
        ("PATCH", "/v1/providers/{provider_id}") => json!({"default_model": "m"}),
        ("POST", "/v1/webhooks") => {
            json!({"url": "http://127.0.0.1:9/hook", "events": ["run.completed"]})
        }
        ("POST", "/v1/responses") => {
            json!({"model": "no-such-agent", "input": "hi", "background": true})
        }
        ("POST", "/v1/chat/completions") => {
            json!({"model": "no-such-agent", "messages": [{"role": "user", "content": "hi"}]})
        }
        ("POST", "/v1/api_keys") => json!({"name": "k", "permissions": ["api_keys:admin"]}),
        ("POST", "/v1/conversations") => json!({}),
        ("POST", "/v1/conversations/{conversation_id}") => json!({"metadata": {}}),
        ("POST", "/v1/conversations/{conversation_id}/items") => json!({"items": []}),
        _ => return None,
    };
    Some(body)
}

/// A concrete path: every `{param}` replaced by a fresh UUID.
fn concrete(template: &str) -> String {
    let mut path = String::new();
    let mut rest = template;
    while let Some(start) = rest.find('{') {
        let end = rest[start..].find('}').expect("closing brace") + start;
        path.push_str(&rest[..start]);
        path.push_str(&Uuid::new_v4().to_string());
        rest = &rest[end + 1..];
    }
    path.push_str(rest);
    path
}

/// Each `/v1` operation of the document with the permissions it accepts (any one of them), as
/// its `bearer` security requirements name them.
fn documented(document: &Value) -> Vec<(String, String, Vec<String>)> {
    let mut operations = Vec::new();
    for (path, item) in document["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("path item") {
            let Some(security) = op["security"].as_array() else {
                continue;
            };
            let accepted: Vec<String> = security
                .iter()
                .filter_map(|requirement| requirement["bearer"].as_array())
                .flatten()
                .map(|p| p.as_str().expect("a permission name").to_owned())
                .collect();
            operations.push((method.to_uppercase(), path.clone(), accepted));
        }
    }
    operations
}

impl TestApp {
    async fn call(&self, token: &str, method: &str, path: &str) -> (StatusCode, Value) {
        let mut request = self
            .http
            .request(
                Method::from_bytes(method.as_bytes()).expect("method"),
                self.url(&concrete(path)),
            )
            .bearer_auth(token);
        if let Some(body) = body(method, path) {
            request = request.json(&body);
        }
        let response = request.send().await.expect("request");
        let status = response.status();
        (status, response.json().await.unwrap_or(Value::Null))
    }
}

#[tokio::test]
async fn every_route_refuses_a_token_without_its_documented_permission_and_admin_passes_all() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let document = app.openapi_document().await;
    let known: Vec<&str> = document["components"]["schemas"]["Permission"]["enum"]
        .as_array()
        .expect("the Permission schema lists the names")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let operations = documented(&document);
    assert!(operations.len() > 30, "{operations:?}");
    let admin = token_with("root", "acme", true, 3600, JWT_SECRET);
    let admin_listed = token_with_permissions("root2", "acme", &["admin"]);
    for (method, path, accepted) in &operations {
        let operation = format!("{method} {path}");
        assert!(!accepted.is_empty(), "{operation} names no permission");
        for permission in accepted {
            assert!(
                known.contains(&permission.as_str()),
                "{operation}: {permission}"
            );
        }
        // Every permission but the ones the operation accepts.
        let others: Vec<&str> = PERMISSIONS
            .iter()
            .copied()
            .filter(|p| !accepted.iter().any(|a| a == p))
            .collect();
        let lacking = token_with_permissions("carol", "acme", &others);
        let (status, body) = app.call(&lacking, method, path).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{operation}: {body}");
        assert_eq!(body["error"]["code"], "forbidden", "{operation}: {body}");
        assert_eq!(
            body["error"]["permission"],
            json!(accepted[0]),
            "{operation}"
        );
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(&format!("`{}`", accepted[0])),
            "{operation}: {message}"
        );

        // Each accepted permission alone, and admin (the claim or in the list), get past it.
        let mut holders: Vec<String> = accepted
            .iter()
            .map(|p| token_with_permissions("dave", "acme", &[p.as_str()]))
            .collect();
        holders.extend([admin.clone(), admin_listed.clone()]);
        for holder in &holders {
            let (status, body) = app.call(holder, method, path).await;
            assert!(
                status != StatusCode::FORBIDDEN && status != StatusCode::UNAUTHORIZED,
                "{operation}: {status} {body}"
            );
        }
    }
    app.stop().await;
}

#[tokio::test]
async fn a_token_without_a_permissions_claim_reads_agents_and_runs_its_own_threads_only() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let alice = token("alice", "acme");
    let thread = Uuid::new_v4();
    let (status, body) = app.send_message(&alice, thread, "hi").await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let (status, _) = app.get(&alice, &format!("/v1/threads/{thread}")).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = app.get(&alice, "/v1/agents").await;
    assert_eq!(status, StatusCode::OK);
    for (method, path, permission) in [
        ("POST", "/v1/agents", "agents:write"),
        ("GET", "/v1/webhooks", "webhooks:admin"),
        ("GET", "/v1/usage", "usage:read"),
        ("GET", "/v1/api_keys", "api_keys:admin"),
    ] {
        let (status, body) = app.call(&alice, method, path).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {body}");
        assert_eq!(body["error"]["permission"], permission, "{path}");
    }
    // A claim, even an empty one, replaces the defaults.
    let nothing = token_with_permissions("alice", "acme", &[]);
    let (status, body) = app.get(&nothing, &format!("/v1/threads/{thread}")).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["permission"], "runs:create");
    app.stop().await;
}

#[tokio::test]
async fn runs_read_tenant_reads_the_tenant_s_threads_but_changes_none_and_other_tenants_stay_404() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let thread = Uuid::new_v4();
    let (status, _) = app
        .send_message(&token("alice", "acme"), thread, "hi")
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let path = format!("/v1/threads/{thread}");

    let auditor = token_with_permissions("audit", "acme", &["runs:read:tenant"]);
    let (status, read) = app.get(&auditor, &path).await;
    assert_eq!(status, StatusCode::OK, "{read}");
    let (status, list) = app.get(&auditor, "/v1/threads").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["data"][0]["id"], json!(thread.to_string()));
    let (status, _) = app.get(&auditor, &format!("{path}/messages")).await;
    assert_eq!(status, StatusCode::OK);
    // Reading is not writing: without `runs:create` a rename is refused by permission, and with
    // it the rename reaches only the caller's own threads (alice's stays 404 to it).
    let (status, body) = app
        .send(Method::PATCH, &auditor, &path, Some(&json!({"title": "x"})))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["permission"], "runs:create");
    let both = token_with_permissions("audit", "acme", &["runs:read:tenant", "runs:create"]);
    for method in [Method::PATCH, Method::DELETE] {
        let body = (method == Method::PATCH).then(|| json!({"title": "x"}));
        let (status, _) = app.send(method.clone(), &both, &path, body.as_ref()).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method}");
    }
    let (status, thread_now) = app.get(&token("alice", "acme"), &path).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        thread_now["title"],
        Value::Null,
        "alice's thread is unchanged"
    );

    // Another tenant's reader, and an admin of another tenant: 404, never 403.
    for other in [
        token_with_permissions("audit", "globex", &["runs:read:tenant"]),
        token_with("root", "globex", true, 3600, JWT_SECRET),
    ] {
        let (status, body) = app.get(&other, &path).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
        let (status, list) = app.get(&other, "/v1/threads").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(list["data"], json!([]));
    }
    app.stop().await;
}
