//! Graph agents (`kind: "graph"`): the documented examples are valid, and every problem of a
//! graph is refused by field path with nothing stored.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::agents::{admin, error_fields};
use crate::common::{TestApp, worker_args};

/// The documented examples (docs/examples), as the docs show them.
pub(crate) fn example(name: &str) -> Value {
    let text = match name {
        "rag" => include_str!("../../../docs/examples/graph-rag.json"),
        "human_input" => include_str!("../../../docs/examples/graph-human-input.json"),
        other => panic!("no example {other}"),
    };
    serde_json::from_str(text).expect("an example is JSON")
}

#[tokio::test]
async fn the_documented_graphs_are_valid_and_stored_as_posted() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let root = admin("acme");
    for name in ["rag", "human_input"] {
        let spec = example(name);
        let (status, report) = app.post(&root, "/v1/agents/validate", &spec).await;
        assert_eq!(
            (status, &report["valid"]),
            (StatusCode::OK, &json!(true)),
            "{name}: {report}"
        );
        let (status, agent) = app.post(&root, "/v1/agents", &spec).await;
        assert_eq!(status, StatusCode::CREATED, "{name}: {agent}");
        assert_eq!(agent["kind"], "graph");
        for part in ["entry", "nodes", "edges", "limits"] {
            assert_eq!(
                agent["graph_spec"][part], spec["graph_spec"][part],
                "{name}: {part}"
            );
        }
    }
    app.stop().await;
}

#[tokio::test]
async fn every_problem_of_a_graph_is_refused_by_field_path() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let root = admin("acme");
    let (status, client_tool) = app
        .post(
            &root,
            "/v1/tools",
            &json!({"type": "client", "name": "picker"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{client_tool}");
    let not_mcp = client_tool["id"].as_str().expect("id");
    let missing = uuid::Uuid::new_v4().to_string();
    let spec = json!({"name": "broken", "kind": "graph", "graph_spec": {
        "spec_version": "1",
        "entry": "start",
        "nodes": {
            "start": {"type": "llm", "system_prompt": "S", "input_template": "{{input}} {{ghost}}",
                      "output_key": "a", "tools": [{"source": "mcp", "server_id": missing, "name": "x"}]},
            "call": {"type": "tool", "tool_ref": {"source": "function", "name": "nope"},
                     "args_template": {"q": "{{a}}"}, "output_key": "b"},
            "route": {"type": "router"},
            "island": {"type": "end", "output_template": "{{b}}"},
            "end": {"type": "end", "output_template": "{{b}}"}
        },
        "edges": [{"from": "start", "to": "call"}, {"from": "call", "to": "start"},
                  {"from": "call", "to": "end"}, {"from": "call", "to": "elsewhere"}],
        "tools": {"mcp_servers": [missing, not_mcp], "builtin": ["teleport"],
                  "mcp_snapshot": [{"id": not_mcp, "tool": {"type": "mcp", "name": "m", "url": "http://127.0.0.1:1/mcp"}}]},
        "limits": {"timeout_seconds": 1, "human_timeout_seconds": 10, "max_tool_calls": 501}
    }});
    let expected = [
        "graph_spec.tools.mcp_servers[0]",
        "graph_spec.tools.mcp_servers[1]",
        "graph_spec.tools.builtin[0]",
        "graph_spec.tools.mcp_snapshot",
        "graph_spec.nodes.start.input_template",
        "graph_spec.nodes.call.tool_ref",
        "graph_spec.nodes.route.type",
        "graph_spec.nodes.island",
        "graph_spec.edges[3].to",
        "graph_spec.limits.max_tool_calls",
        "graph_spec.limits.timeout_seconds",
        "graph_spec.limits.human_timeout_seconds",
        "graph_spec.limits.max_steps",
    ];
    let (status, report) = app.post(&root, "/v1/agents/validate", &spec).await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(report["valid"], false);
    let reported = error_fields(&report["errors"]);
    for field in expected {
        assert!(
            reported.contains(&field.to_owned()),
            "{field} not in {reported:?}"
        );
    }
    for path in ["/v1/agents", "/v1/agents?dry_run=true"] {
        let (status, body) = app.post(&root, path, &spec).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert_eq!(body["error"]["code"], "invalid_agent");
        assert_eq!(
            error_fields(&body["error"]["errors"]),
            reported,
            "the same errors"
        );
    }
    assert_eq!(app.db.count("agents").await, 0);

    // The kind and the graph go together.
    let (_, report) = app
        .post(
            &root,
            "/v1/agents/validate",
            &json!({"name": "g", "kind": "graph"}),
        )
        .await;
    assert_eq!(error_fields(&report["errors"]), ["graph_spec"], "{report}");
    let mut loop_with_graph = example("rag");
    loop_with_graph["kind"] = json!("loop");
    loop_with_graph["model"] = json!("demo");
    let (_, report) = app
        .post(&root, "/v1/agents/validate", &loop_with_graph)
        .await;
    assert_eq!(error_fields(&report["errors"]), ["graph_spec"], "{report}");
    app.stop().await;
}

#[tokio::test]
async fn a_graph_s_function_headers_are_write_only_and_a_patch_replaces_the_graph_whole() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let root = admin("acme");
    let mut spec = example("rag");
    spec["graph_spec"]["tools"]["functions"][0]["headers"] = json!({"X-Key": "sesame"});
    let (status, agent) = app.post(&root, "/v1/agents", &spec).await;
    assert_eq!(status, StatusCode::CREATED, "{agent}");
    assert!(!agent.to_string().contains("sesame"), "{agent}");
    let id = agent["id"].as_str().expect("id");
    let path = format!("/v1/agents/{id}");

    // The graph as read, with one node changed, written back: the secret stays.
    let mut graph = agent["graph_spec"].clone();
    graph["nodes"]["answer"]["temperature"] = json!(0.5);
    let (status, patched) = app
        .send(
            reqwest::Method::PATCH,
            &root,
            &path,
            Some(&json!({"graph_spec": graph})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{patched}");
    assert_eq!(patched["graph_spec"]["nodes"]["answer"]["temperature"], 0.5);
    let stored: (Value,) = sqlx::query_as("SELECT spec FROM agents")
        .fetch_one(&app.db.pool)
        .await
        .expect("stored");
    assert_eq!(
        stored.0["graph_spec"]["tools"]["functions"][0]["headers"]["X-Key"],
        "sesame"
    );
    // An invalid graph is refused by path and changes nothing.
    let mut broken = agent["graph_spec"].clone();
    broken["edges"][0]["to"] = json!("nowhere");
    let (status, body) = app
        .send(
            reqwest::Method::PATCH,
            &root,
            &path,
            Some(&json!({"graph_spec": broken})),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        error_fields(&body["error"]["errors"]).contains(&"graph_spec.edges[0].to".to_owned()),
        "{body}"
    );
    let (status, body) = app
        .send(
            reqwest::Method::PATCH,
            &root,
            &path,
            Some(&json!({"kind": "loop", "model": "demo"})),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(error_fields(&body["error"]["errors"]), ["kind"]);
    app.stop().await;
}

/// A model that drafts `APPROVE: refund 20 EUR` for every request.
async fn drafter() -> spool_tests::fake_llm::FakeLlm {
    spool_tests::fake_llm::FakeLlm::start(|_, _| {
        spool_tests::fake_llm::text("APPROVE: refund 20 EUR", 2)
    })
    .await
}

/// An app with one worker on `fake`, the documented human-input graph as an agent, and a run
/// of it paused on its `review` node: the app, the thread, the 202 body and the paused run.
async fn paused_for_review(
    fake: &spool_tests::fake_llm::FakeLlm,
) -> (TestApp, uuid::Uuid, Value, Value) {
    let args = crate::common::worker_args_with(1, 0, &["--llm-base-url", &fake.base_url]);
    let app = TestApp::start(1, args).await;
    let agent = app.create_agent("acme", &example("human_input")).await;
    let (thread, accepted) = crate::common::ask(&app, &agent, "Refund order 42 please").await;
    let paused = app.wait_run(&accepted, |s| s == "requires_action").await;
    (app, thread, accepted, paused)
}

#[tokio::test]
async fn a_human_input_node_pauses_the_run_until_the_user_answers() {
    let fake = drafter().await;
    let (app, thread, accepted, paused) = paused_for_review(&fake).await;
    let alice = spool_tests::token("alice", "acme");
    let action = &paused["pending_action"];
    assert_eq!(action["type"], "human_input", "{paused}");
    assert_eq!(action["node"], "review");
    assert!(
        action["prompt"]
            .as_str()
            .is_some_and(|p| p.contains("APPROVE: refund 20 EUR")),
        "the prompt is rendered: {action}"
    );
    assert!(action["expires_at"].is_string());
    let kinds: Vec<String> = app
        .stored(thread)
        .await
        .into_iter()
        .map(|(_, k)| k)
        .collect();
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("input_requested"),
        "{kinds:?}"
    );
    // The model request of the llm node: its system prompt and the rendered input, no history.
    let requests = fake.requests();
    assert_eq!(requests.len(), 1);
    let messages = requests[0]["messages"].as_array().expect("messages");
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert_eq!(messages[1]["content"], "Refund order 42 please");

    let workflow = accepted["workflow_id"].as_str().expect("id");
    let path = format!("/v1/workflows/{workflow}/input");
    let (status, body) = app
        .post(
            &spool_tests::token("mallory", "acme"),
            &path,
            &json!({"text": "ok"}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "another user's run: {body}");
    let (status, run) = app
        .post(&alice, &path, &json!({"text": "ok, send it"}))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{run}");
    // The run as the answer's transaction left it, whether or not a worker took it since.
    assert_eq!(run["status"], "queued", "{run}");
    let run = crate::common::finished(&app, &accepted).await;
    assert_eq!(run["status"], "completed", "{run}");
    let (_, messages) = app
        .get(&alice, &format!("/v1/threads/{thread}/messages"))
        .await;
    let answer = &messages["messages"][1];
    assert_eq!(
        answer["content"], "APPROVE: refund 20 EUR",
        "the `ok` edge: {answer}"
    );
    assert_eq!(answer["output"], "APPROVE: refund 20 EUR", "{answer}");
    assert_eq!(fake.requests().len(), 1, "the draft was not made again");

    let (status, body) = app.post(&alice, &path, &json!({"text": "again"})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "not_waiting_for_input");
    app.stop().await;
}

#[tokio::test]
async fn an_answer_takes_the_edge_its_text_meets_and_a_run_not_waiting_for_input_is_a_409() {
    let fake = drafter().await;
    let (app, _, accepted, _) = paused_for_review(&fake).await;
    let alice = spool_tests::token("alice", "acme");
    let workflow = accepted["workflow_id"].as_str().expect("id");
    let path = format!("/v1/workflows/{workflow}/input");
    let (status, body) = app.post(&alice, &path, &json!({"text": 3})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let (status, _) = app
        .post(
            &alice,
            &path,
            &json!({"text": "REJECT: the order was used"}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let run = crate::common::finished(&app, &accepted).await;
    assert_eq!(run["status"], "completed", "{run}");
    let events = app
        .stored(
            accepted["thread_id"]
                .as_str()
                .expect("thread")
                .parse()
                .expect("uuid"),
        )
        .await;
    let steps = events.iter().filter(|(_, k)| k == "step_end").count();
    assert_eq!(steps, 3, "draft, review, send_review: {events:?}");

    // A loop agent's run, done: not waiting for input.
    let demo = app
        .create_agent("acme", &json!({"name": "plain", "model": "demo"}))
        .await;
    let (_, other) = crate::common::ask(&app, &demo, "hi").await;
    crate::common::finished(&app, &other).await;
    let other_path = format!(
        "/v1/workflows/{}/input",
        other["workflow_id"].as_str().expect("id")
    );
    let (status, body) = app.post(&alice, &other_path, &json!({"text": "x"})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "not_waiting_for_input");
    assert_eq!(body["error"]["status"], "completed");
    app.stop().await;
}

#[tokio::test]
async fn a_human_input_nobody_answers_fails_the_run_with_human_timeout() {
    let fake = drafter().await;
    let (app, thread, accepted, _) = paused_for_review(&fake).await;
    // The shortest wait a graph allows is a minute: the deadline is moved instead of waited for.
    sqlx::query("UPDATE runs SET pause_expires_at = now() - interval '1 second'")
        .execute(&app.db.pool)
        .await
        .expect("update");
    let run = crate::common::finished(&app, &accepted).await;
    assert_eq!(run["status"], "failed", "{run}");
    assert_eq!(run["error"]["code"], "human_timeout", "{run}");
    let kinds: Vec<String> = app
        .stored(thread)
        .await
        .into_iter()
        .map(|(_, k)| k)
        .collect();
    assert!(
        kinds.ends_with(&["error".into(), "message_end".into(), "done".into()]),
        "{kinds:?}"
    );
    app.stop().await;
}

/// A graph's MCP server (`tools.mcp_servers`) is a reference like `tool_ids`: deleting the tool
/// is refused while the graph names it, and allowed once the graph no longer does.
#[tokio::test]
async fn a_tool_a_graph_names_among_its_mcp_servers_is_not_deleted() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let root = admin("acme");
    let (status, server) = app
        .post(
            &root,
            "/v1/tools",
            &json!({"type": "mcp", "name": "docs", "url": "http://127.0.0.1:9/mcp"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{server}");
    let id = server["id"].as_str().expect("id").to_owned();
    let graph = |servers: Value| {
        json!({"name": "reader", "kind": "graph", "graph_spec": {
            "spec_version": "1", "entry": "done",
            "nodes": {"done": {"type": "end", "output_template": "{{input}}"}},
            "edges": [], "tools": {"mcp_servers": servers}}})
    };
    let (status, agent) = app.post(&root, "/v1/agents", &graph(json!([id]))).await;
    assert_eq!(status, StatusCode::CREATED, "{agent}");
    let agent_id = agent["id"].as_str().expect("id").to_owned();

    let path = format!("/v1/tools/{id}");
    let (status, refused) = app.send(reqwest::Method::DELETE, &root, &path, None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    assert_eq!(refused["error"]["code"], "tool_in_use");
    assert!(refused.to_string().contains(&agent_id), "{refused}");

    let (status, _) = app
        .send(
            reqwest::Method::PUT,
            &root,
            &format!("/v1/agents/{agent_id}"),
            Some(&graph(json!([]))),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = app.send(reqwest::Method::DELETE, &root, &path, None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    app.stop().await;
}
