//! An agent's MCP servers in the loop, against real rmcp servers on loopback whose tools a test
//! names: discovered tools with invalid or taken names are dropped and one lookup decides both
//! a call's approval and which server runs it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

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

use spool_shared::AgentId;
use spool_shared::agent::AgentSpec;
use spool_shared::db::agents;
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
