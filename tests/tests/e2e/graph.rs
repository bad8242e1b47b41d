//! A graph agent end to end: the documented example (rephrase, retrieve with an HTTP tool,
//! answer, end) on real processes, with the fake model and a loopback stand-in for the
//! retrieval service.

use serde_json::{Value, json};

use spool_tests::fake_llm::{FakeLlm, text};
use spool_tests::tools::Tools;

use crate::stack::{Stack, workflow_id};

/// The documented retrieval graph (docs/examples/graph-rag.json) with its search function
/// pointed at `url`.
pub(crate) fn rag_agent(url: &str) -> Value {
    let mut spec: Value =
        serde_json::from_str(include_str!("../../../docs/examples/graph-rag.json"))
            .expect("the example is JSON");
    spec["graph_spec"]["tools"]["functions"][0]["url"] = json!(url);
    spec
}

/// A model for the retrieval graph: the rephrasing node's request (its system prompt says
/// "search query") gets `harbour hours`, the answering node's the answer.
pub(crate) fn rag_model(request: &Value) -> spool_tests::fake_llm::Reply {
    let system = request["messages"][0]["content"].as_str().unwrap_or("");
    if system.contains("search query") {
        text("harbour hours", 1)
    } else {
        text("The harbour closes at dusk.", 3)
    }
}

#[tokio::test]
async fn the_documented_graph_rephrases_retrieves_and_answers() {
    let fake = FakeLlm::start(|request, _| rag_model(request)).await;
    let (tools, base) = Tools::start().await;
    let loopback = ("SPOOL_TOOLS_ALLOW_NETWORKS", "127.0.0.0/8");
    let stack = Stack::start_with(&spool_tests::redis_url(), &[loopback]).await;
    let _worker = stack
        .worker(&[loopback, ("SPOOL_LLM_BASE_URL", fake.base_url.as_str())])
        .await;
    let agent = stack
        .create_agent(&rag_agent(&format!("{base}/search")))
        .await;
    let accepted = stack.ask(&agent, "When does the harbour close?").await;
    stack.wait_run(&accepted, "completed").await;

    let messages = stack.messages(&accepted).await;
    assert_eq!(
        messages[1].2, "The harbour closes at dusk.",
        "the end node's output"
    );

    // Two model calls, each the node's system prompt and its rendered input, no history.
    let requests = fake.requests();
    assert_eq!(requests.len(), 2, "{requests:?}");
    let user = |i: usize| {
        requests[i]["messages"][1]["content"]
            .as_str()
            .unwrap_or("")
            .to_owned()
    };
    assert_eq!(user(0), "When does the harbour close?");
    assert!(
        user(1).starts_with("Question: When does the harbour close?"),
        "{}",
        user(1)
    );
    assert!(
        user(1).contains("Tide tables"),
        "the documents rendered as JSON: {}",
        user(1)
    );
    assert_eq!(requests[1]["temperature"], 0.2);

    // One tool call with the rendered arguments, keyed by node and execution.
    let calls = tools.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].2, json!({"query": "harbour hours"}));
    assert_eq!(calls[0].1, format!("{}:retrieve:1", workflow_id(&accepted)));

    // A step per node, the tool node's as `step` events, the output on message_end.
    let events = stack.stored(&accepted["thread_id"]).await;
    let kinds: Vec<&str> = events
        .iter()
        .filter_map(|(_, e)| e["type"].as_str())
        .filter(|k| *k != "heartbeat")
        .collect();
    let count = |kind: &str| kinds.iter().filter(|k| **k == kind).count();
    assert_eq!(
        (count("step_start"), count("step_end")),
        (4, 4),
        "{kinds:?}"
    );
    assert_eq!(count("step"), 2, "the tool call and its result: {kinds:?}");
    let end = events
        .iter()
        .find(|(_, e)| e["type"] == "message_end")
        .expect("message_end");
    assert_eq!(end.1["data"]["output"], "The harbour closes at dusk.");
    assert_eq!(kinds.last(), Some(&"done"));
}
