//! An agent's MCP servers in the loop, against real rmcp servers on loopback whose tools a test
//! names: discovered tools with invalid or taken names are dropped and one lookup decides both
//! a call's approval and which server runs it; servers are discovered all at once within one
//! tool timeout; a later attempt offers what the first discovered without discovering again; a
//! graph's MCP servers are the ones its run was enqueued with.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::Router;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{Value, json};

use spool_shared::agent::{AgentSpec, ToolResource};
use spool_shared::db::steps::{self, SavedStep};
use spool_shared::db::{agents, runs, tools};
use spool_shared::ids::ToolId;
use spool_shared::status::RunStatus;
use spool_shared::{AgentId, WorkflowId};
use spool_tests::fake_llm::{self, FakeLlm, tool_results_in};

use crate::harness::Harness;

/// An MCP server offering tools of the given names; it records the calls it runs and counts
/// the `tools/list` requests it answers.
#[derive(Clone)]
struct Named {
    names: Vec<String>,
    calls: Arc<Mutex<Vec<String>>>,
    lists: Arc<AtomicUsize>,
}

impl ServerHandler for Named {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        self.lists.fetch_add(1, Ordering::SeqCst);
        let schema = match json!({"type": "object"}) {
            Value::Object(map) => map,
            _ => unreachable!("an object"),
        };
        let tools = self
            .names
            .iter()
            .map(|name| Tool::new(name.clone(), "A tool.", schema.clone()))
            .collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.to_string();
        self.calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(name.clone());
        let text = ContentBlock::text(format!("ran {name}"));
        Ok(CallToolResponse::Complete(CallToolResult::success(vec![
            text,
        ])))
    }
}

/// Serves a [`Named`] server at `/mcp` on loopback; its URL and the server (for its logs).
async fn named(names: &[&str]) -> (String, Named) {
    let server = Named {
        names: names.iter().map(|n| (*n).to_owned()).collect(),
        calls: Arc::default(),
        lists: Arc::default(),
    };
    let handler = server.clone();
    let mcp = StreamableHttpService::new(
        move || Ok(handler.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let base = spool_tests::serve(Router::new().nest_service("/mcp", mcp)).await;
    (format!("{base}/mcp"), server)
}

impl Named {
    fn calls(&self) -> Vec<String> {
        self.calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// The tool names the request offered.
fn offered(request: &Value) -> Vec<String> {
    request["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["function"]["name"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn a_discovered_name_that_is_invalid_or_taken_is_dropped_and_one_tool_is_approved_and_run() {
    // `gh` (no approval) and `gh_admin` (approval) both make `gh_admin_delete`: a spec saved
    // before prefixes that overlap were refused. The first to claim the name keeps it, and the
    // call runs on the server whose tool was classified (no approval), never on the other.
    let (gh, gh_server) = named(&["admin_delete", "bad name!", &"x".repeat(70)]).await;
    let (admin, admin_server) = named(&["delete", "purge"]).await;
    let fake = FakeLlm::start(|request, _| match tool_results_in(request) {
        0 => fake_llm::tool_calls(&[("call_1", "gh_admin_delete", "{}")]),
        _ => fake_llm::text("done", 1),
    })
    .await;
    let app = Harness::start(&fake).await;
    let spec: AgentSpec = serde_json::from_value(json!({"name": "overlap", "model": "gpt-4o-mini",
        "tools": [{"type": "mcp", "name": "gh", "url": gh},
                  {"type": "mcp", "name": "gh_admin", "url": admin, "requires_approval": true}]}))
    .expect("spec");
    assert!(!spec.validate().is_empty(), "refused at save today");
    let agent = agents::insert(&app.db.pool, AgentId::new(), "acme", &spec)
        .await
        .expect("insert");
    let (_, accepted) = app.ask(&agent.id.to_string(), "delete it").await;
    let run = app
        .run_until(&accepted, |s| {
            matches!(s, "completed" | "failed" | "awaiting_approval")
        })
        .await;
    assert_eq!(run["status"], "completed", "{run}");
    let first = fake.requests().first().cloned().expect("a model call");
    assert_eq!(
        offered(&first),
        ["gh_admin_delete", "gh_admin_purge"],
        "one tool per name; invalid names dropped"
    );
    assert_eq!(
        gh_server.calls(),
        ["admin_delete"],
        "run where it was classified"
    );
    assert!(
        admin_server.calls().is_empty(),
        "the other server never ran it"
    );
}

#[tokio::test]
async fn mcp_servers_are_discovered_at_once_within_one_tool_timeout() {
    // Three servers that accept and never answer: each takes the whole tool timeout.
    let mut urls = Vec::new();
    let mut held = Vec::new();
    for _ in 0..3 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        urls.push(format!(
            "http://{}/mcp",
            listener.local_addr().expect("addr")
        ));
        held.push(tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                open.push(socket);
            }
        }));
    }
    let fake = FakeLlm::start(|_, _| fake_llm::text("fine without them", 1)).await;
    let app = Harness::start_with(&fake.base_url, &["--tool-timeout-secs", "1"]).await;
    let tools: Vec<Value> = urls
        .iter()
        .enumerate()
        .map(|(i, url)| json!({"type": "mcp", "name": format!("s{i}"), "url": url}))
        .collect();
    let agent = app
        .create_agent(&json!({"name": "slow", "model": "gpt-4o-mini", "tools": tools}))
        .await;
    let started = Instant::now();
    let (_, accepted) = app.ask(&agent, "hi").await;
    let run = app.finished(&accepted).await;
    assert_eq!(run["status"], "completed", "{run}");
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(2_500),
        "three servers one after the other would take 3 s: {took:?}"
    );
    for task in held {
        task.abort();
    }
}

#[tokio::test]
async fn a_later_attempt_offers_what_the_first_discovered_and_connects_only_to_call() {
    // Step 1 asks the client; once it answers, step 2 calls the MCP tool.
    let (url, server) = named(&["add"]).await;
    // How many times the server had listed its tools when the resumed attempt asked the model.
    let at_resume = Arc::new(AtomicUsize::new(usize::MAX));
    let (lists, seen) = (server.lists.clone(), at_resume.clone());
    let fake = FakeLlm::start(move |request, _| match tool_results_in(request) {
        0 => fake_llm::tool_calls(&[("call_ask", "ask_user", "{}")]),
        1 => {
            seen.store(lists.load(Ordering::SeqCst), Ordering::SeqCst);
            fake_llm::tool_calls(&[("call_add", "calc_add", "{}")])
        }
        _ => fake_llm::text("done", 1),
    })
    .await;
    let app = Harness::start(&fake).await;
    let agent = app
        .create_agent(&json!({"name": "paused", "model": "gpt-4o-mini",
            "tools": [{"type": "mcp", "name": "calc", "url": url},
                      {"type": "client", "name": "ask_user"}]}))
        .await;
    let (_, accepted) = app.ask(&agent, "add").await;
    let paused = app.run_until(&accepted, |s| s == "requires_action").await;
    assert_eq!(paused["status"], "requires_action", "{paused}");
    assert_eq!(server.lists.load(Ordering::SeqCst), 1, "discovered once");
    let id: WorkflowId = serde_json::from_value(accepted["workflow_id"].clone()).expect("id");
    let kept = runs::mcp_tools(&app.db.pool, id).await.expect("read");
    assert_eq!(
        kept.as_ref().and_then(|k| k["calc"][0]["name"].as_str()),
        Some("calc_add"),
        "{kept:?}"
    );

    // The client answers (as the API would); the next attempt goes on from the kept tools.
    let mut tx = app.db.pool.begin().await.expect("begin");
    let step = steps::last_for_update(&mut *tx, id)
        .await
        .expect("step")
        .expect("a saved step");
    let mut data: SavedStep = step.data.0;
    data.answer_client(vec![("call_ask".to_owned(), "4".to_owned())])
        .expect("answer");
    steps::replace(&mut *tx, id, step.step, &data)
        .await
        .expect("replace");
    let resumed = runs::resume(&mut *tx, id, RunStatus::RequiresAction, None)
        .await
        .expect("resume");
    assert!(resumed.is_some());
    tx.commit().await.expect("commit");

    let run = app.finished(&accepted).await;
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(
        at_resume.load(Ordering::SeqCst),
        1,
        "the resumed attempt offered the kept tools without discovering them again"
    );
    assert_eq!(server.calls(), ["add"], "the call reached the server");
    assert_eq!(
        server.lists.load(Ordering::SeqCst),
        2,
        "one more list only as the session opened for the call"
    );
    let requests = fake.requests();
    assert_eq!(
        offered(&requests[0]),
        offered(&requests[1]),
        "the same tools"
    );
}

/// A graph's MCP servers are snapshot at enqueue, as an agent's referenced tools are: a change
/// of the tool resource after the run was enqueued (here its URL moves to another server, then
/// it is disabled) does not reach the run, which calls the server it was enqueued with.
#[tokio::test]
async fn a_graph_run_calls_its_mcp_server_as_it_was_when_enqueued() {
    let (before, enqueued_with) = named(&["add"]).await;
    let (after, changed_to) = named(&["add"]).await;
    let fake = FakeLlm::start(|_, _| fake_llm::text("unused", 1)).await;
    let app = Harness::start(&fake).await;
    let server = |url: &str, enabled: bool| ToolResource {
        tool: serde_json::from_value(json!({"type": "mcp", "name": "calc", "url": url}))
            .expect("an MCP tool"),
        enabled,
    };
    let tool = ToolId::new();
    tools::insert(&app.db.pool, tool, "acme", &server(&before, true))
        .await
        .expect("insert the tool");
    let spec: AgentSpec = serde_json::from_value(json!({
        "name": "adder", "kind": "graph", "model": "gpt-4o-mini",
        "graph_spec": {"spec_version": "1", "entry": "call",
            "tools": {"mcp_servers": [tool]},
            "nodes": {
                "call": {"type": "tool", "tool_ref": {"source": "mcp", "server_id": tool, "name": "add"},
                         "args_template": {}, "output_key": "sum"},
                "end": {"type": "end", "output_template": "{{sum}}"}},
            "edges": [{"from": "call", "to": "end"}]}}))
    .expect("a graph agent");
    let agent = agents::insert(&app.db.pool, AgentId::new(), "acme", &spec)
        .await
        .expect("insert the agent");
    let (_, accepted) = app.ask(&agent.id.to_string(), "add").await;
    tools::update(&app.db.pool, tool, "acme", &server(&after, true))
        .await
        .expect("move the tool")
        .expect("the tool");
    tools::update(&app.db.pool, tool, "acme", &server(&after, false))
        .await
        .expect("disable the tool")
        .expect("the tool");

    let run = app
        .run_until(&accepted, |s| s != "queued" && s != "running")
        .await;
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(
        enqueued_with.calls(),
        ["add"],
        "the server the run was enqueued with"
    );
    assert!(changed_to.calls().is_empty(), "{:?}", changed_to.calls());
}
