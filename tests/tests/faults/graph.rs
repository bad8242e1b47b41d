//! A worker killed (`kill -9`) in the middle of a graph agent's run: the next attempt resumes
//! at the node it was in, and the nodes completed before are not executed again (the fake
//! model counts its requests, the tool server its calls).

use std::time::Duration;

use serde_json::Value;

use spool_tests::fake_llm::{FakeLlm, paced_text, text};
use spool_tests::tools::Tools;
use spool_tests::{poll_until, run_row};

use crate::SERIAL;
use crate::stack::{Stack, TIMEOUT, workflow_id};

/// The documented retrieval graph with its search function pointed at `url`.
fn rag_agent(url: &str) -> Value {
    let mut spec: Value =
        serde_json::from_str(include_str!("../../../docs/examples/graph-rag.json"))
            .expect("the example is JSON");
    spec["graph_spec"]["tools"]["functions"][0]["url"] = serde_json::json!(url);
    spec
}

#[tokio::test]
async fn a_graph_killed_mid_node_resumes_there_without_repeating_completed_nodes() {
    let _turn = SERIAL.lock().await;
    // The rephrasing is quick; the answer is slow (40 deltas, 100 ms apart): killed during it.
    let fake = FakeLlm::start(|request, _| {
        let system = request["messages"][0]["content"].as_str().unwrap_or("");
        if system.contains("search query") {
            text("harbour hours", 1)
        } else {
            paced_text(&"dusk ".repeat(40), 40, Duration::from_millis(100))
        }
    })
    .await;
    let (tools, base) = Tools::start().await;
    let loopback = ("SPOOL_TOOLS_ALLOW_NETWORKS", "127.0.0.0/8");
    let stack = Stack::start_with(&spool_tests::redis_url(), &[loopback]).await;
    let settings = [loopback, ("SPOOL_LLM_BASE_URL", fake.base_url.as_str())];
    let mut a = stack.worker(&settings).await;
    let agent = stack
        .create_agent(&rag_agent(&format!("{base}/search")))
        .await;
    let accepted = stack.ask(&agent, "When does the harbour close?").await;
    // The answer node is streaming: rephrase and retrieve are saved.
    poll_until("the answer node to start", TIMEOUT, || async {
        (fake.requests().len() == 2).then_some(())
    })
    .await;
    poll_until("the answer node's text to stream", TIMEOUT, || async {
        stack
            .stored(&accepted["thread_id"])
            .await
            .iter()
            .any(|(_, e)| e["type"] == "text_delta" && e["data"]["block_id"] == "s3")
            .then_some(())
    })
    .await;
    a.kill9().await;
    let _b = stack.worker(&settings).await;
    let run = stack.wait_run(&accepted, "completed").await;
    assert_eq!(run.attempt, 2, "one crash, one takeover");

    let requests = fake.requests();
    let systems: Vec<&str> = requests
        .iter()
        .map(|r| r["messages"][0]["content"].as_str().unwrap_or(""))
        .collect();
    let rephrased = systems
        .iter()
        .filter(|s| s.contains("search query"))
        .count();
    assert_eq!(
        rephrased, 1,
        "the completed rephrase node ran once: {systems:?}"
    );
    assert_eq!(
        requests.len(),
        3,
        "the answer node, cut short, ran again: {systems:?}"
    );
    assert_eq!(tools.calls().len(), 1, "the completed retrieval ran once");
    let messages = stack.messages(&accepted).await;
    assert_eq!(messages.len(), 2, "exactly one assistant message");
    assert_eq!(messages[1].2, "dusk ".repeat(40));
    let steps: Vec<(i32, i32)> =
        sqlx::query_as("SELECT step, attempt FROM run_steps WHERE workflow_id = $1 ORDER BY step")
            .bind(workflow_id(&accepted))
            .fetch_all(&stack.db.pool)
            .await
            .expect("steps");
    assert_eq!(
        steps,
        [(1, 1), (2, 1), (3, 2), (4, 2)],
        "each node saved once"
    );
    let row = run_row(&stack.db.pool, workflow_id(&accepted))
        .await
        .expect("run");
    println!(
        "graph killed mid-node: {} model requests, attempt {}",
        requests.len(),
        row.attempt
    );
}
