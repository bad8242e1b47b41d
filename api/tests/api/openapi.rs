//! `GET /openapi.json` documents exactly the routes the router serves: every documented
//! operation is routed (no 404 `route_not_found`, no 405), every method the document does not
//! list on a documented path is a 405, no path the sources route by hand goes undocumented, and the
//! operations are exactly the expected list below (add a route: add it here and document it).

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use uuid::Uuid;

use spool_shared::run::FailureCode;
use spool_tests::fake_llm::{self, FakeLlm, Reply, tool_results_in};
use spool_tests::{JWT_SECRET, poll_until, token, token_with};

use crate::common::{TestApp, app_with, ask, finished, worker_args};

/// Every operation of the API, as `METHOD path`.
const EXPECTED: &[&str] = &[
    "GET /",
    "GET /.well-known/jwks.json",
    "GET /app.css",
    "GET /app.js",
    "GET /healthz",
    "GET /metrics",
    "GET /openapi.json",
    "GET /readyz",
    "POST /v1/chat/completions",
    "GET /v1/models",
    "GET /v1/models/{model}",
    "POST /v1/conversations",
    "GET /v1/conversations/{conversation_id}",
    "POST /v1/conversations/{conversation_id}",
    "DELETE /v1/conversations/{conversation_id}",
    "GET /v1/conversations/{conversation_id}/items",
    "POST /v1/conversations/{conversation_id}/items",
    "GET /v1/conversations/{conversation_id}/items/{item_id}",
    "DELETE /v1/conversations/{conversation_id}/items/{item_id}",
    "POST /v1/responses",
    "GET /v1/responses/{response_id}",
    "POST /v1/responses/{response_id}/cancel",
    "GET /v1/agents",
    "POST /v1/agents",
    "POST /v1/agents/validate",
    "PATCH /v1/agents/{agent_id}",
    "GET /v1/api_keys",
    "POST /v1/api_keys",
    "DELETE /v1/api_keys/{api_key_id}",
    "DELETE /v1/agents/{agent_id}",
    "GET /v1/agents/{agent_id}",
    "PUT /v1/agents/{agent_id}",
    "GET /v1/tools",
    "POST /v1/tools",
    "DELETE /v1/tools/{tool_id}",
    "GET /v1/tools/{tool_id}",
    "PATCH /v1/tools/{tool_id}",
    "PUT /v1/tools/{tool_id}",
    "POST /v1/knowledge_bases",
    "GET /v1/knowledge_bases",
    "GET /v1/knowledge_bases/{knowledge_base_id}",
    "DELETE /v1/knowledge_bases/{knowledge_base_id}",
    "GET /v1/providers",
    "POST /v1/providers",
    "DELETE /v1/providers/{provider_id}",
    "GET /v1/providers/{provider_id}",
    "PATCH /v1/providers/{provider_id}",
    "POST /v1/tools/{tool_id}/probe",
    "GET /v1/threads",
    "POST /v1/threads",
    "DELETE /v1/threads/{thread_id}",
    "GET /v1/threads/{thread_id}",
    "PATCH /v1/threads/{thread_id}",
    "GET /v1/threads/{thread_id}/messages",
    "GET /v1/threads/{thread_id}/stream",
    "POST /v1/public/agents/{agent_id}/sessions",
    "POST /v1/threads/{thread_id}/stream_token",
    "POST /v1/threads/{thread_id}/user_message",
    "GET /v1/usage",
    "GET /v1/webhooks",
    "POST /v1/webhooks",
    "DELETE /v1/webhooks/{webhook_id}",
    "GET /v1/webhooks/{webhook_id}/deliveries",
    "GET /v1/webhooks/{webhook_id}",
    "POST /v1/webhooks/{webhook_id}/rotate-secret",
    "GET /v1/workflows",
    "GET /v1/workflows/{workflow_id}",
    "GET /v1/workflows/{workflow_id}/steps",
    "POST /v1/workflows/{workflow_id}/approvals/{tool_call_id}",
    "POST /v1/workflows/{workflow_id}/cancel",
    "POST /v1/workflows/{workflow_id}/tool_outputs",
    "POST /v1/workflows/{workflow_id}/input",
];

const METHODS: [&str; 5] = ["GET", "POST", "PUT", "DELETE", "PATCH"];

/// The documented operations, as `METHOD path`.
fn operations(document: &Value) -> BTreeSet<String> {
    let paths = document["paths"].as_object().expect("paths");
    paths
        .iter()
        .flat_map(|(path, item)| {
            METHODS
                .iter()
                .filter(|m| item.get(m.to_lowercase()).is_some())
                .map(move |m| format!("{m} {path}"))
        })
        .collect()
}

/// Every path literal given to a plain `.route(` in the API's sources.
fn routed_paths() -> BTreeSet<String> {
    fn visit(dir: &Path, paths: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).expect("read_dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                visit(&path, paths);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let source = std::fs::read_to_string(&path).expect("read");
                for (at, _) in source.match_indices(".route(") {
                    let rest = source[at + ".route(".len()..].trim_start();
                    if let Some(literal) = rest.strip_prefix('"') {
                        let end = literal.find('"').expect("closing quote");
                        paths.insert(literal[..end].to_owned());
                    }
                }
            }
        }
    }
    let mut paths = BTreeSet::new();
    visit(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut paths,
    );
    paths
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

#[tokio::test]
async fn the_document_lists_exactly_the_routes_the_router_serves() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let response = app
        .http
        .get(app.url("/openapi.json"))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), StatusCode::OK, "no auth needed");
    let document: Value = response.json().await.expect("the document is JSON");
    assert!(
        document["openapi"]
            .as_str()
            .is_some_and(|v| v.starts_with("3.")),
        "{}",
        document["openapi"]
    );
    let bearer = &document["components"]["securitySchemes"]["bearer"];
    assert_eq!(bearer["type"], "http");
    assert_eq!(bearer["scheme"], "bearer");
    assert_eq!(bearer["bearerFormat"], "JWT");

    // Exactly the expected operations, and every routed path is documented.
    let documented = operations(&document);
    let expected: BTreeSet<String> = EXPECTED.iter().map(|&s| s.to_owned()).collect();
    assert_eq!(documented, expected, "document vs. expected operations");
    let documented_paths: BTreeSet<String> = document["paths"]
        .as_object()
        .expect("paths")
        .keys()
        .cloned()
        .collect();
    // Handlers are routed through `utoipa_axum::routes!`, which documents them as it routes
    // them; a plain `.route("…")` in the sources would serve a path the document may miss.
    let undocumented: BTreeSet<String> = routed_paths()
        .difference(&documented_paths)
        .cloned()
        .collect();
    assert!(
        undocumented.is_empty(),
        "routed, not documented: {undocumented:?}"
    );

    // Every /v1 operation needs the bearer token (the stream also takes `access_token`), and
    // each of its requirements names a permission (tests/api/permissions.rs checks that the
    // router asks for exactly those).
    for operation in &documented {
        let (method, path) = operation.split_once(' ').expect("METHOD path");
        let op = &document["paths"][path][method.to_lowercase()];
        let security = op["security"].as_array().cloned().unwrap_or_default();
        if path.starts_with("/v1/") && !path.starts_with("/v1/public/") {
            assert!(
                security.iter().any(|r| r.get("bearer").is_some()),
                "{operation}"
            );
            for requirement in &security {
                let scheme = requirement.as_object().expect("a requirement");
                assert!(
                    scheme
                        .values()
                        .all(|p| p.as_array().is_some_and(|p| p.len() == 1)),
                    "{operation}: each requirement names one permission: {requirement}"
                );
            }
        } else {
            assert!(security.is_empty(), "{operation} needs no auth");
        }
        // Every error answer is documented with the one error body (OpenAI's on its routes).
        let openai = [
            "/v1/responses",
            "/v1/chat/",
            "/v1/models",
            "/v1/conversations",
        ]
        .iter()
        .any(|prefix| path.starts_with(prefix));
        let body = if openai {
            "#/components/schemas/OpenAiErrorBody"
        } else {
            "#/components/schemas/ErrorBody"
        };
        for (status, response) in op["responses"].as_object().expect("responses") {
            if status.as_str() >= "400" {
                assert_eq!(
                    response.pointer("/content/application~1json/schema/$ref"),
                    Some(&json!(body)),
                    "{operation} {status}"
                );
            }
        }
    }
    let stream = &document["paths"]["/v1/threads/{thread_id}/stream"]["get"];
    assert!(
        stream["parameters"]
            .as_array()
            .expect("parameters")
            .iter()
            .any(|p| p["name"] == "access_token" && p["in"] == "query")
    );

    // Every documented operation is routed; every other method on its path is a 405.
    let admin = token_with("ops", "acme", true, 3600, JWT_SECRET);
    let mut routed = BTreeSet::new();
    for path in &documented_paths {
        for method in METHODS {
            let operation = format!("{method} {path}");
            let mut request = app
                .http
                .request(
                    Method::from_bytes(method.as_bytes()).expect("method"),
                    app.url(&concrete(path)),
                )
                .bearer_auth(&admin);
            if method == "POST" || method == "PUT" {
                request = request.json(&json!({}));
            }
            let response = request.send().await.expect("request");
            let status = response.status();
            let body: Value = response.json().await.unwrap_or(Value::Null);
            let is_routed = status != StatusCode::METHOD_NOT_ALLOWED
                && !(status == StatusCode::NOT_FOUND && body["error"]["code"] == "route_not_found");
            assert_eq!(
                is_routed,
                documented.contains(&operation),
                "{operation}: {status} {body}"
            );
            if is_routed {
                routed.insert(operation);
            }
        }
    }
    assert_eq!(routed, documented);

    // The schemas no value could satisfy (a closed `allOf` part) are merged.
    let schemas = &document["components"]["schemas"];
    for name in [
        "AgentResponse",
        "ErrorBody",
        "ThreadResponse",
        "WorkflowResponse",
    ] {
        assert_eq!(schemas[name]["type"], "object", "{name}");
    }
    for variant in schemas["ToolSpec"]["oneOf"].as_array().expect("oneOf") {
        assert_eq!(variant["type"], "object");
        assert!(variant["properties"]["type"].is_object());
    }
    app.stop().await;
}

/// Validates `instance` against the document's component schema `name`.
pub(crate) fn check(document: &Value, name: &str, instance: &Value) {
    let schema = json!({"$ref": format!("#/components/schemas/{name}"),
        "components": document["components"]});
    let validator = jsonschema::validator_for(&schema).expect("a valid schema");
    let errors: Vec<String> = validator
        .iter_errors(instance)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{name}: {errors:?}\n{instance}");
}

#[tokio::test]
async fn failed_paused_and_completed_runs_match_their_documented_schemas() {
    let fake = FakeLlm::start(|request, _| {
        if request["model"] == "broken" {
            return Reply::Status(400, "no such model".into(), None);
        }
        match tool_results_in(request) {
            0 => fake_llm::tool_calls(&[("c1", "read", r#"{"path": "/a"}"#)]),
            _ => fake_llm::text("Read it.", 2),
        }
    })
    .await;
    let app = app_with(&fake).await;
    let document: Value = app.openapi_document().await;
    let codes = &document["components"]["schemas"]["FailureCode"]["enum"];
    for code in FailureCode::ALL {
        assert!(
            codes
                .as_array()
                .is_some_and(|c| c.contains(&json!(code.as_str()))),
            "{} is documented: {codes}",
            code.as_str()
        );
    }
    let alice = token("alice", "acme");
    let broken = app
        .create_agent("acme", &json!({"name": "broken", "model": "broken"}))
        .await;
    let (_, accepted) = ask(&app, &broken, "hi").await;
    let failed = finished(&app, &accepted).await;
    assert_eq!(failed["error"]["code"], "model_error");
    check(&document, "WorkflowResponse", &failed);

    let reader = app
        .create_agent(
            "acme",
            &json!({"name": "reader", "model": "gpt-4o-mini",
            "tools": [{"type": "client", "name": "read"}]}),
        )
        .await;
    let (thread, accepted) = ask(&app, &reader, "read /a").await;
    let workflow = accepted["workflow_id"].as_str().expect("id");
    let paused = app
        .wait_for_status(&alice, workflow, "requires_action")
        .await;
    assert_eq!(paused["pending_action"]["type"], "submit_tool_outputs");
    check(&document, "WorkflowResponse", &paused);
    let (status, _) = app
        .post(
            &alice,
            &format!("/v1/workflows/{workflow}/tool_outputs"),
            &json!({"tool_outputs": [{"tool_call_id": "c1", "output": "contents"}]}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let completed = finished(&app, &accepted).await;
    assert_eq!(completed["status"], "completed");
    check(&document, "WorkflowResponse", &completed);
    let (_, page) = app
        .get(&alice, &format!("/v1/threads/{thread}/messages"))
        .await;
    assert_eq!(page["messages"][1]["parts"][0]["type"], "tool_call");
    check(&document, "MessagesResponse", &page);

    // The control plane's answers: the timeline of the paused-then-completed run, the lists, a
    // thread after a PATCH, a webhook and its deliveries.
    let (_, steps) = app
        .get(&alice, &format!("/v1/workflows/{workflow}/steps"))
        .await;
    assert_eq!(
        steps["steps"][0]["tool_calls"][0]["decision"]["by"],
        "client"
    );
    check(&document, "StepsResponse", &steps);
    let (_, runs) = app.get(&alice, "/v1/workflows?limit=1").await;
    assert!(runs["next_cursor"].is_string());
    check(&document, "WorkflowList", &runs);
    let (_, threads) = app.get(&alice, "/v1/threads").await;
    check(&document, "ThreadList", &threads);
    let (_, patched) = app
        .send(
            Method::PATCH,
            &alice,
            &format!("/v1/threads/{thread}"),
            Some(&json!({"title": "Reading"})),
        )
        .await;
    check(&document, "ThreadResponse", &patched);
    let admin = crate::agents::admin("acme");
    let (_, hook) = app
        .post(
            &admin,
            "/v1/webhooks",
            &json!({"url": "http://127.0.0.1:9/hook", "events": ["run.failed"]}),
        )
        .await;
    check(&document, "WebhookResponse", &hook);
    let (_, hooks) = app.get(&admin, "/v1/webhooks").await;
    check(&document, "WebhookList", &hooks);
    let (_, failed) = ask(&app, &broken, "fail again").await;
    finished(&app, &failed).await;
    let deliveries = format!(
        "/v1/webhooks/{}/deliveries",
        hook["id"].as_str().expect("id")
    );
    let page = poll_until("a try of the delivery", Duration::from_secs(20), || async {
        let (_, page) = app.get(&admin, &deliveries).await;
        (page["data"][0]["attempts"]
            .as_array()
            .is_some_and(|a| !a.is_empty()))
        .then_some(page)
    })
    .await;
    check(&document, "DeliveryList", &page);
    app.stop().await;
}

/// `openapi.json` at the repository root is what clients generate from and what reviewers
/// diff: it must be the document the code serves, byte for byte (as `spool-api openapi`
/// prints it). A change to a route or a schema that does not update the file fails here.
#[test]
fn the_committed_openapi_json_is_the_document_the_code_serves() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../openapi.json");
    let generated = format!(
        "{}\n",
        spool_api::openapi::document()
            .to_pretty_json()
            .expect("the document serializes")
    );
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != generated {
        let line = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .map_or_else(
                || committed.lines().count().min(generated.lines().count()) + 1,
                |i| i + 1,
            );
        panic!(
            "openapi.json differs from the document the code serves (first difference at line \
             {line}). Regenerate it from the repository root with\n\n    \
             cargo run -q -p spool-api -- openapi > openapi.json\n\nand commit it."
        );
    }
}
