//! `@spool/ai-sdk` (`clients/typescript`) through the AI SDK's own `Chat`, the state machine
//! `useChat` wraps (`clients/typescript/test/e2e.mjs`): a worker killed mid-answer while the
//! transport's connection drops and resumes; the history loaded as `UIMessage`s; a client tool
//! answered in `onToolCall` and a call approved (and one denied) with `addToolApprovalResponse`.

use std::process::Stdio;

use serde_json::{Value, json};
use spool_tests::fake_llm::{self, FakeLlm, tool_results_in};
use spool_tests::token;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};

use crate::stack::{Stack, TIMEOUT, demo_reply};

/// 40 deltas, 100 ms apart: long enough to interrupt.
const SLOW: [(&str, &str); 2] = [("SPOOL_DEMO_TOKENS", "40"), ("SPOOL_DEMO_DELAY_MS", "100")];

fn client(args: &[&str]) -> tokio::process::Command {
    let dir = spool_tests::peers::typescript_client().expect("the package, built");
    let mut command = tokio::process::Command::new("node");
    command
        .arg(dir.join("test/e2e.mjs"))
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

/// Reads the client's next stdout line within the test's deadline.
async fn line(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    what: &str,
) -> String {
    tokio::time::timeout(TIMEOUT * 2, lines.next_line())
        .await
        .unwrap_or_else(|_| panic!("{what}: timed out"))
        .expect("read")
        .unwrap_or_else(|| panic!("{what}: the client exited"))
}

#[tokio::test]
async fn the_transport_shows_the_stored_answer_across_a_crash_and_a_dropped_connection() {
    let stack = Stack::start().await;
    let alice = token("alice", "acme");
    let thread = uuid::Uuid::new_v4().to_string();
    let mut a = stack.worker(&SLOW).await;
    let mut child = client(&["crash", &stack.base, &alice, &thread])
        .spawn()
        .expect("node");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut stdin = child.stdin.take().expect("stdin");
    let streaming = line(&mut lines, "the answer to stream").await;
    assert_eq!(streaming, "STREAMING");
    // Mid-answer: the worker dies, another takes the run over; then the client's connection
    // drops, and the transport resumes.
    a.kill9().await;
    let _b = stack.worker(&SLOW).await;
    stdin.write_all(b"go\n").await.expect("write");
    let result = line(&mut lines, "the chat to finish").await;
    let output = child.wait_with_output().await.expect("wait");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let shown: Value = serde_json::from_str(&result).expect("json");

    assert_eq!(
        shown["text"],
        demo_reply("nested resume", 40).as_str(),
        "{shown}"
    );
    assert_eq!(shown["second"]["text"], demo_reply("again", 40).as_str());
    let stored = stack.stored(&json!(thread)).await;
    assert!(
        stored.iter().any(|(_, e)| e["type"] == "attempt_restarted"),
        "the crash happened under the stream"
    );
    let (_, page) = stack
        .get_with(&alice, &format!("/v1/threads/{thread}/messages"))
        .await;
    assert_eq!(shown["id"], page["messages"][1]["id"]);
    assert_eq!(shown["second"]["id"], page["messages"][3]["id"]);
    assert_eq!(shown["historyRoles"], json!(["user", "assistant"]));
    // The first stream, the one resumed after the drop (with its cursor), the chat reopened
    // on the history (204), and the second message's (after the first one's end).
    let streams = shown["streams"].as_array().expect("streams");
    assert!(streams.len() >= 4, "{shown}");
    assert!(streams[0]["lastEventId"].is_null());
    assert!(streams[1]["lastEventId"].is_string(), "{shown}");
    assert!(streams.iter().any(|s| s["status"] == 204), "{shown}");
    let done_of_first = stored
        .iter()
        .find(|(_, e)| e["type"] == "done" && e["message_id"] == shown["id"])
        .map(|(id, _)| id.clone())
        .expect("done");
    assert_eq!(
        streams.last().map(|s| s["lastEventId"].clone()),
        Some(json!(done_of_first)),
        "the second message is followed from the first one's end"
    );
    assert_eq!(shown["longTokenStreams"], 0, "streams use stream tokens");
}

/// The asker agent: the client tool `read_file` (call `c1`), then `get_weather` (`c2`), which
/// needs approval, then "All done."; returns the stack, its tool server and the agent.
async fn asker() -> (Stack, spool_tests::tools::Tools, FakeLlm, String) {
    let fake = FakeLlm::start(|request, _| match tool_results_in(request) {
        0 => fake_llm::tool_calls(&[("c1", "read_file", r#"{"path": "/notes"}"#)]),
        1 => fake_llm::tool_calls(&[("c2", "get_weather", r#"{"city": "Paris"}"#)]),
        _ => fake_llm::text("All done.", 3),
    })
    .await;
    let (tools, tools_base) = spool_tests::tools::Tools::start().await;
    let stack = Stack::start().await;
    let mut weather = spool_tests::tools::http_tool("get_weather", format!("{tools_base}/weather"));
    weather["requires_approval"] = json!(true);
    let agent = stack
        .create_agent(&json!({"name": "asker", "model": "gpt-4o-mini",
            "tools": [{"type": "client", "name": "read_file"}, weather]}))
        .await;
    (stack, tools, fake, agent)
}

async fn run_tools(stack: &Stack, agent: &str, scenario: &str) -> (String, Value) {
    let alice = token("alice", "acme");
    let (status, thread) = stack
        .post(&alice, "/v1/threads", &json!({"agent_id": agent}))
        .await;
    assert_eq!(status, 201);
    let thread = thread["id"].as_str().expect("id").to_owned();
    let output = tokio::time::timeout(
        TIMEOUT * 2,
        client(&[scenario, &stack.base, &alice, &thread]).output(),
    )
    .await
    .expect("the client to finish")
    .expect("node");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    (
        thread,
        serde_json::from_slice(&output.stdout).expect("json"),
    )
}

#[tokio::test]
async fn the_transport_answers_a_client_tool_and_an_approval_through_the_sdks_own_flows() {
    let (stack, tools, fake, agent) = asker().await;
    let _worker = stack
        .worker(&[
            ("SPOOL_LLM_BASE_URL", fake.base_url.as_str()),
            ("SPOOL_TOOLS_ALLOW_NETWORKS", "127.0.0.0/8"),
        ])
        .await;
    let alice = token("alice", "acme");

    let (thread, shown) = run_tools(&stack, &agent, "approve").await;
    assert_eq!(shown["text"], "All done.", "{shown}");
    assert_eq!(
        shown["toolCalls"],
        json!(["read_file"]),
        "onToolCall saw the client tool only"
    );
    assert_eq!(
        shown["tools"]["tool-read_file"]["state"],
        "output-available"
    );
    assert_eq!(
        shown["tools"]["tool-get_weather"]["state"],
        "output-available"
    );
    assert!(
        shown["tools"]["tool-get_weather"]["output"]
            .as_str()
            .is_some_and(|o| o.contains("sunny")),
        "{shown}"
    );
    assert_eq!(shown["messages"], 2, "one user message, one answer");
    assert_eq!(
        shown["historyTools"],
        json!([
            ["tool-read_file", "output-available"],
            ["tool-get_weather", "output-available"]
        ])
    );
    assert_eq!(shown["longTokenStreams"], 0);
    assert_eq!(tools.calls().len(), 1, "the approved call ran once");
    let (_, page) = stack
        .get_with(&alice, &format!("/v1/threads/{thread}/messages"))
        .await;
    assert!(
        page["messages"][1]["parts"]
            .to_string()
            .contains("the notes"),
        "the client's output reached the run"
    );

    let (_, denied) = run_tools(&stack, &agent, "deny").await;
    assert_eq!(denied["text"], "All done.", "{denied}");
    assert_eq!(
        denied["tools"]["tool-get_weather"]["state"],
        "output-denied"
    );
    assert_eq!(tools.calls().len(), 1, "the denied call never ran");
}
