//! Built-in tools (`http_request`, `knowledge_search`) and the knowledge bases they search
//! (DESIGN section 12): knowledge bases managed per tenant with write-only headers; built-in
//! tools refused at save unless the operator enables them (`SPOOL_BUILTIN_TOOLS`); a run whose
//! model calls both, against a local retrieval endpoint and a local page, cites the chunks and
//! sees the page cut at 10,000 characters.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use spool_tests::fake_llm::{FakeLlm, text, tool_calls, tool_results_in};
use spool_tests::tools::{SEARCH_CHUNKS, Tools};

use crate::agents::admin;
use crate::common::{TestApp, ask, finished, worker_args, worker_args_with};

#[tokio::test]
async fn knowledge_bases_are_created_listed_read_and_deleted_per_tenant_with_secret_headers() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let root = admin("acme");
    let body = json!({"name": "docs", "url": "http://127.0.0.1:9/search",
        "headers": {"authorization": "Bearer kb-s3cret"}});
    let (status, created) = app.post(&root, "/v1/knowledge_bases", &body).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["headers"]["authorization"], "<redacted>");
    assert!(!created.to_string().contains("kb-s3cret"));
    let id = created["id"].as_str().expect("id").to_owned();

    let (status, again) = app.post(&root, "/v1/knowledge_bases", &body).await;
    assert_eq!(
        (status, &again["error"]["code"]),
        (StatusCode::CONFLICT, &json!("name_taken"))
    );

    let (status, list) = app.get(&root, "/v1/knowledge_bases").await;
    assert_eq!(status, StatusCode::OK, "{list}");
    assert_eq!(list["data"].as_array().map(Vec::len), Some(1), "{list}");
    assert_eq!(list["data"][0]["id"], created["id"]);
    assert!(!list.to_string().contains("kb-s3cret"));
    let (status, read) = app.get(&root, &format!("/v1/knowledge_bases/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(read, created);

    // Every problem by field; nothing stored.
    let (status, invalid) = app
        .post(
            &root,
            "/v1/knowledge_bases",
            &json!({"name": "bad name", "url": "ftp://files.example/x",
                "headers": {"bad header": "x"}}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{invalid}");
    assert_eq!(invalid["error"]["code"], "invalid_knowledge_base");
    let fields: Vec<&str> = invalid["error"]["errors"]
        .as_array()
        .expect("errors")
        .iter()
        .filter_map(|e| e["field"].as_str())
        .collect();
    assert_eq!(fields, ["name", "url", "headers.bad header"], "{invalid}");
    // An address the network policy refuses (a private one outside the allowed loopback).
    let (status, refused) = app
        .post(
            &root,
            "/v1/knowledge_bases",
            &json!({"name": "internal", "url": "http://10.1.2.3/search"}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
    assert_eq!(refused["error"]["code"], "url_not_allowed");
    assert_eq!(refused["error"]["errors"][0]["field"], "url");

    // Reading needs agents:read, writing tools:write; another tenant sees nothing.
    let user = spool_tests::token("alice", "acme");
    let (status, _) = app.post(&user, "/v1/knowledge_bases", &body).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let other = admin("globex");
    let (status, _) = app.get(&other, &format!("/v1/knowledge_bases/{id}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, theirs) = app.get(&other, "/v1/knowledge_bases").await;
    assert_eq!(theirs["data"], json!([]));
    let (status, _) = app
        .send(
            Method::DELETE,
            &other,
            &format!("/v1/knowledge_bases/{id}"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let (status, _) = app
        .send(
            Method::DELETE,
            &root,
            &format!("/v1/knowledge_bases/{id}"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, gone) = app.get(&root, &format!("/v1/knowledge_bases/{id}")).await;
    assert_eq!(
        (status, &gone["error"]["code"]),
        (StatusCode::NOT_FOUND, &json!("knowledge_base_not_found"))
    );
}

#[tokio::test]
async fn a_built_in_tool_the_operator_does_not_enable_is_refused_at_save() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let root = admin("acme");
    let (status, agent) = app
        .post(
            &root,
            "/v1/agents",
            &json!({"name": "a", "model": "demo",
                "tools": [{"type": "builtin", "name": "http_request"}]}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{agent}");
    assert_eq!(agent["error"]["code"], "invalid_agent");
    assert_eq!(agent["error"]["errors"][0]["field"], "tools[0].name");
    assert!(
        agent["error"]["errors"][0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("SPOOL_BUILTIN_TOOLS")),
        "{agent}"
    );
    // A graph's built-in tools too.
    let (status, graph) = app
        .post(
            &root,
            "/v1/agents",
            &json!({"name": "g", "kind": "graph", "graph_spec": {"spec_version": "1",
                "entry": "done", "nodes": {"done": {"type": "end", "output_template": "ok"}},
                "edges": [], "tools": {"builtin": ["http_request"]}}}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{graph}");
    assert_eq!(
        graph["error"]["errors"][0]["field"], "graph_spec.tools.builtin[0]",
        "{graph}"
    );
    let (status, tool) = app
        .post(
            &root,
            "/v1/tools",
            &json!({"type": "builtin", "name": "knowledge_search"}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{tool}");
    assert_eq!(tool["error"]["errors"][0]["field"], "name");
    // A name that is no built-in tool is a bad body.
    let (status, unknown) = app
        .post(
            &root,
            "/v1/tools",
            &json!({"type": "builtin", "name": "shell"}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{unknown}");
}

/// The answer: it cites the second chunk (the harbour guide).
const ANSWER: &str = "The harbour closes at dusk [2].";

#[tokio::test]
async fn built_in_tools_search_the_tenants_knowledge_bases_and_fetch_pages() {
    let (tools, base) = Tools::start().await;
    let page = format!("{base}/page");
    let fake = FakeLlm::start(move |request, _| match tool_results_in(request) {
        0 => tool_calls(&[
            ("call_k", "knowledge_search", r#"{"query": "harbour"}"#),
            ("call_h", "http_request", &json!({"url": page}).to_string()),
        ]),
        _ => text(ANSWER, 2),
    })
    .await;
    let app = TestApp::start(
        1,
        worker_args_with(
            1,
            0,
            &[
                "--llm-base-url",
                &fake.base_url,
                "--tools-allow-networks",
                "127.0.0.1/32",
                "--builtin-tools",
                "knowledge_search, http_request",
            ],
        ),
    )
    .await;
    let root = admin("acme");
    let (status, kb) = app
        .post(
            &root,
            "/v1/knowledge_bases",
            &json!({"name": "harbour", "url": format!("{base}/search"),
                "headers": {"x-kb-key": "kb-s3cret"}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{kb}");
    // Another tenant's knowledge base is never asked.
    let (status, _) = app
        .post(
            &admin("globex"),
            "/v1/knowledge_bases",
            &json!({"name": "theirs", "url": format!("{base}/weather")}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let agent = app
        .create_agent(
            "acme",
            &json!({"name": "librarian", "model": "gpt-4o-mini",
                "tools": [{"type": "builtin", "name": "knowledge_search"},
                          {"type": "builtin", "name": "http_request"}]}),
        )
        .await;
    let (thread, accepted) = ask(&app, &agent, "When does the harbour close?").await;
    let run = finished(&app, &accepted).await;
    assert_eq!(run["status"], "completed", "{run}");

    // The knowledge base was asked once, with its header and the query; the page fetched once,
    // with no identity.
    let calls = tools.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].0, "search");
    assert_eq!(calls[0].2, json!({"query": "harbour", "top_k": 5}));
    let pages = tools.pages();
    assert_eq!(pages.len(), 1);
    assert_eq!(pages[0].tenant, None, "http_request sends no identity");

    // What the model saw: the chunks numbered, the page cut at 10,000 characters.
    let requests = fake.requests();
    let results: Vec<&str> = requests[1]["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["role"] == "tool")
        .filter_map(|m| m["content"].as_str())
        .collect();
    assert_eq!(results.len(), 2, "{results:?}");
    assert!(results[0].contains("[2] Harbour guide"), "{}", results[0]);
    assert!(
        results[1].starts_with("Harbour notes."),
        "{}",
        &results[1][..40]
    );
    assert!(
        results[1].ends_with("[cut at 10000 characters]"),
        "{}",
        &results[1][results[1].len() - 60..]
    );
    assert!(results[1].chars().count() < 10_100);

    // The answer cites the harbour guide.
    let (status, messages) = app
        .get(
            &spool_tests::token("alice", "acme"),
            &format!("/v1/threads/{thread}/messages"),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{messages}");
    let text = messages.to_string();
    assert!(text.contains(SEARCH_CHUNKS[1].2), "{messages}");
    assert!(!text.contains("kb-s3cret"));
}

#[tokio::test]
async fn a_search_without_knowledge_bases_is_a_tool_error_not_a_failed_run() {
    let fake = FakeLlm::start(|request, _| match tool_results_in(request) {
        0 => tool_calls(&[("call_k", "knowledge_search", r#"{"query": "x"}"#)]),
        _ => text("Nothing found.", 1),
    })
    .await;
    let app = TestApp::start(
        1,
        worker_args_with(
            1,
            0,
            &[
                "--llm-base-url",
                &fake.base_url,
                "--builtin-tools",
                "knowledge_search",
            ],
        ),
    )
    .await;
    let agent = app
        .create_agent(
            "acme",
            &json!({"name": "a", "model": "gpt-4o-mini",
                "tools": [{"type": "builtin", "name": "knowledge_search"}]}),
        )
        .await;
    let (_, accepted) = ask(&app, &agent, "Search").await;
    let run = finished(&app, &accepted).await;
    assert_eq!(run["status"], "completed", "{run}");
    let requests = fake.requests();
    let result: Vec<Value> = requests[1]["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["role"] == "tool")
        .cloned()
        .collect();
    assert!(
        result[0]["content"]
            .as_str()
            .is_some_and(|c| c.contains("no knowledge bases")),
        "{result:?}"
    );
}
