//! The Next.js example (`examples/nextjs`: `useChat` over `@spool/ai-sdk`) built with `next
//! build`, served by `next start` against a real API and worker with a fake model, and used in
//! Chromium (`tests/peers/nextjs_test.mjs`): an answer streams and survives a reload, a client
//! tool is answered by the browser and a call is approved there, and the history comes back.

use std::process::Stdio;

use serde_json::{Value, json};
use spool_tests::fake_llm::{self, FakeLlm, tool_results_in};
use spool_tests::{poll_until, token};

use crate::stack::{Stack, TIMEOUT};

/// The slow answer: 24 pieces, 150 ms apart (long enough to reload mid-answer).
const SLOW_ANSWER: &str = "This answer streams slowly, piece by piece, and survives a reload.";

/// The text of the last user message of a request to the model.
fn last_user_text(request: &Value) -> String {
    request["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .rev()
        .find(|m| m["role"] == "user")
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned()
}

/// A free loopback port (bound, then released for `next start`).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

#[tokio::test]
async fn the_nextjs_example_streams_resumes_and_answers_a_client_tool_and_an_approval() {
    assert!(
        std::path::Path::new("/usr/bin/chromium").exists()
            || std::env::var_os("CHROMIUM").is_some(),
        "the example's test needs Chromium: apt-get install chromium (or set CHROMIUM)"
    );
    let peers = spool_tests::peers::node_peers().expect("npm peers");
    let app_dir = tokio::task::spawn_blocking(spool_tests::peers::nextjs_example)
        .await
        .expect("join")
        .expect("the example, installed and built");

    let fake = FakeLlm::start(|request, _| {
        if last_user_text(request).contains("slow") {
            return fake_llm::paced_text(SLOW_ANSWER, 24, std::time::Duration::from_millis(150));
        }
        match tool_results_in(request) {
            0 => fake_llm::tool_calls(&[("c1", "get_location", "{}")]),
            1 => fake_llm::tool_calls(&[("c2", "get_weather", r#"{"city": "Paris"}"#)]),
            _ => fake_llm::text("All done.", 3),
        }
    })
    .await;
    let (tools, tools_base) = spool_tests::tools::Tools::start().await;
    let port = free_port();
    let origin = format!("http://127.0.0.1:{port}");
    let stack = Stack::start_with(
        &spool_tests::redis_url(),
        &[("SPOOL_CORS_ORIGINS", origin.as_str())],
    )
    .await;
    let _worker = stack
        .worker(&[
            ("SPOOL_LLM_BASE_URL", fake.base_url.as_str()),
            ("SPOOL_TOOLS_ALLOW_NETWORKS", "127.0.0.0/8"),
        ])
        .await;
    let mut weather = spool_tests::tools::http_tool("get_weather", format!("{tools_base}/weather"));
    weather["requires_approval"] = json!(true);
    let agent = stack
        .create_agent(&json!({"name": "example", "model": "gpt-4o-mini",
            "tools": [{"type": "client", "name": "get_location"}, weather]}))
        .await;

    // `next start`, as the example's README runs it.
    let port_text = port.to_string();
    let mut next = tokio::process::Command::new("node")
        .args([
            "node_modules/next/dist/bin/next",
            "start",
            "-H",
            "127.0.0.1",
            "-p",
            &port_text,
        ])
        .current_dir(&app_dir)
        .env("NEXT_TELEMETRY_DISABLED", "1")
        .env("SPOOL_URL", &stack.base)
        .env("SPOOL_JWT_SECRET", spool_tests::JWT_SECRET)
        .env("SPOOL_AGENT_ID", &agent)
        .env("SPOOL_EXAMPLE_USER", "alice")
        .env("SPOOL_EXAMPLE_TENANT", "acme")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("next start");
    let http = reqwest::Client::new();
    poll_until("next start to answer", TIMEOUT, || async {
        let response = http.get(format!("{origin}/api/spool")).send().await.ok()?;
        response.status().is_success().then_some(())
    })
    .await;

    let output = tokio::time::timeout(
        TIMEOUT * 4,
        tokio::process::Command::new("node")
            .arg(peers.join("nextjs_test.mjs"))
            .arg(&origin)
            .current_dir(&peers)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the browser script to finish")
    .expect("node");
    let _ = next.kill().await;
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let shown: Value = serde_json::from_slice(&output.stdout).expect("json");
    assert_eq!(shown["errors"], json!([]), "{shown}");
    assert_eq!(shown["sameThread"], true, "a reload keeps the thread");
    // The reload came mid-answer: the page had part of it, then showed all of it once.
    let before = shown["beforeReload"].as_str().expect("text");
    assert!(
        !before.is_empty() && before.len() < SLOW_ANSWER.len(),
        "{shown}"
    );
    let after = &shown["afterReload"];
    assert_eq!(after.as_array().map(Vec::len), Some(2), "{shown}");
    assert_eq!(after[1]["text"], SLOW_ANSWER, "{shown}");

    let tools_turn = &shown["afterTools"][3];
    assert_eq!(tools_turn["text"], "All done.", "{shown}");
    assert_eq!(
        tools_turn["tools"],
        json!([
            ["get_location", "output-available"],
            ["get_weather", "output-available"]
        ]),
        "{shown}"
    );
    assert_eq!(tools.calls().len(), 1, "the approved call ran once");

    // The history after a reload: the same four messages, as Spool stores them.
    let history = &shown["history"];
    assert_eq!(history.as_array().map(Vec::len), Some(4), "{shown}");
    assert_eq!(history[1]["text"], SLOW_ANSWER);
    assert_eq!(history[3]["text"], "All done.");
    let thread = shown["thread"].as_str().expect("thread");
    let (_, page) = stack
        .get_with(
            &token("alice", "acme"),
            &format!("/v1/threads/{thread}/messages"),
        )
        .await;
    let stored = page["messages"].as_array().expect("messages");
    assert_eq!(stored.len(), 4, "{page}");
    // The client tool's output came from the browser.
    assert!(
        stored[3]["parts"].to_string().contains("the browser"),
        "{page}"
    );
}
