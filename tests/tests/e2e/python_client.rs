//! The Python client (`clients/python`, installed with `pip install` as a user would) through
//! its own pytest tests against this stack: routes, typed answers and errors; the stream helper
//! across a worker killed mid-answer (the test kills it) and a dropped connection; a client tool
//! and an approval answered between streams.

use std::process::Stdio;

use serde_json::json;
use spool_tests::fake_llm::{self, FakeLlm, tool_results_in};
use spool_tests::token;

use crate::stack::{Stack, TIMEOUT, demo_reply};

/// 40 deltas, 100 ms apart: long enough to interrupt.
const SLOW: [(&str, &str); 2] = [("SPOOL_DEMO_TOKENS", "40"), ("SPOOL_DEMO_DELAY_MS", "100")];

/// `pytest FILES` in `clients/python` with Spool's address, alice's and her admin's tokens and
/// `vars`.
fn pytest(stack: &Stack, files: &[&str], vars: &[(&str, String)]) -> tokio::process::Command {
    let (root, python) = spool_tests::peers::python_client().expect("the client, installed");
    let mut command = tokio::process::Command::new(python);
    command
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .args(files)
        .current_dir(root)
        .env("SPOOL_URL", &stack.base)
        .env("SPOOL_TOKEN", token("alice", "acme"))
        .env(
            "SPOOL_ADMIN_TOKEN",
            spool_tests::token_with("root", "acme", true, 3600, spool_tests::JWT_SECRET),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (name, value) in vars {
        command.env(name, value);
    }
    command
}

fn passed(output: &std::process::Output) {
    assert!(
        output.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test]
async fn the_python_client_follows_a_reply_across_a_crash_and_a_dropped_connection() {
    let stack = Stack::start().await;
    let mut a = stack.worker(&SLOW).await;
    let child = pytest(
        &stack,
        &["tests/test_basics.py", "tests/test_stream.py"],
        &[
            ("SPOOL_WORKER_PID", a.pid.to_string()),
            ("SPOOL_EXPECTED_REPLY", demo_reply("nested resume", 40)),
            ("SPOOL_EXPECTED_DEMO", demo_reply("hello", 40)),
        ],
    )
    .spawn()
    .expect("pytest");
    // The stream test kills the worker mid-answer; another one takes the run over.
    let waited = std::time::Instant::now();
    let code = a.wait(TIMEOUT * 4).await;
    assert!(
        code.is_none() && waited.elapsed() < TIMEOUT * 4,
        "the test killed the worker (a signal gives no exit code)"
    );
    let _b = stack.worker(&SLOW).await;
    let output = tokio::time::timeout(TIMEOUT * 2, child.wait_with_output())
        .await
        .expect("pytest to finish")
        .expect("pytest");
    passed(&output);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("5 passed"), "{stdout}");
}

#[tokio::test]
async fn the_python_client_answers_a_client_tool_an_approval_and_a_graph_s_human_input() {
    let fake = FakeLlm::start(|request, _| match tool_results_in(request) {
        0 => fake_llm::tool_calls(&[("c1", "read_file", r#"{"path": "/notes"}"#)]),
        1 => fake_llm::tool_calls(&[("c2", "get_weather", r#"{"city": "Paris"}"#)]),
        _ => fake_llm::text("All done.", 3),
    })
    .await;
    let (tools, tools_base) = spool_tests::tools::Tools::start().await;
    let stack = Stack::start().await;
    let _worker = stack
        .worker(&[
            ("SPOOL_LLM_BASE_URL", fake.base_url.as_str()),
            ("SPOOL_TOOLS_ALLOW_NETWORKS", "127.0.0.0/8"),
        ])
        .await;
    let mut weather = spool_tests::tools::http_tool("get_weather", format!("{tools_base}/weather"));
    weather["requires_approval"] = json!(true);
    let agent = stack
        .create_agent(&json!({"name": "asker", "model": "gpt-4o-mini",
            "tools": [{"type": "client", "name": "read_file"}, weather]}))
        .await;
    let graph = stack
        .create_agent(&json!({"name": "asks-back", "kind": "graph", "graph_spec": {
            "spec_version": "1", "entry": "ask",
            "nodes": {
                "ask": {"type": "human_input", "prompt_template": "Which colour?", "output_key": "answer"},
                "end": {"type": "end", "output_template": "You said: {{answer}}"}},
            "edges": [{"from": "ask", "to": "end"}]}}))
        .await;
    let output = tokio::time::timeout(
        TIMEOUT * 2,
        pytest(
            &stack,
            &["tests/test_pauses.py"],
            &[("SPOOL_AGENT_ID", agent), ("SPOOL_GRAPH_AGENT_ID", graph)],
        )
        .output(),
    )
    .await
    .expect("pytest to finish")
    .expect("pytest");
    passed(&output);
    assert!(String::from_utf8_lossy(&output.stdout).contains("2 passed"));
    assert_eq!(tools.calls().len(), 1, "the approved call ran once");
}
