//! `?format=ai-sdk` read by the AI SDK's own parsers (`tests/peers/ai_sdk_stream.mjs`): a worker
//! killed mid-answer while the client's connection drops and resumes with `Last-Event-ID`; the
//! message the SDK assembles is the stored one, without text twice.

use std::process::Stdio;

use serde_json::Value;
use spool_tests::token;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};

use crate::stack::{Stack, TIMEOUT, demo_reply};

/// 40 deltas, 100 ms apart: long enough to interrupt.
const SLOW: [(&str, &str); 2] = [("SPOOL_DEMO_TOKENS", "40"), ("SPOOL_DEMO_DELAY_MS", "100")];

fn node(args: &[&str]) -> tokio::process::Command {
    let dir = spool_tests::peers::node_peers().expect("npm peers");
    let mut command = tokio::process::Command::new("node");
    command
        .arg(dir.join("ai_sdk_stream.mjs"))
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true);
    command
}

#[tokio::test]
async fn the_ai_sdk_assembles_the_stored_answer_across_a_crash_and_a_dropped_connection() {
    let stack = Stack::start().await;
    let alice = token("alice", "acme");
    let thread = uuid::Uuid::new_v4().to_string();

    let mut a = stack.worker(&SLOW).await;
    // The client loads the AI SDK first (seconds on a busy machine), then the run starts.
    let mut client = node(&[&stack.base, &alice, &thread, "5"])
        .spawn()
        .expect("node");
    let mut lines = BufReader::new(client.stdout.take().expect("stdout")).lines();
    let ready = tokio::time::timeout(TIMEOUT, lines.next_line())
        .await
        .expect("the client to load")
        .expect("read");
    assert_eq!(ready.as_deref(), Some("READY"));
    let mut stdin = client.stdin.take().expect("stdin");
    let (status, accepted) = stack
        .post(
            &alice,
            &format!("/v1/threads/{thread}/user_message"),
            &serde_json::json!({"input_text": "nested resume"}),
        )
        .await;
    assert_eq!(status, 202);
    stack.wait_streaming(&accepted).await;
    stdin.write_all(b"streaming\n").await.expect("write");
    let cut = tokio::time::timeout(TIMEOUT, lines.next_line())
        .await
        .expect("the client to cut")
        .expect("read")
        .expect("a line");
    assert!(cut.starts_with("CUT "), "{cut}");
    a.kill9().await;
    let _b = stack.worker(&SLOW).await;
    stdin.write_all(b"go\n").await.expect("write");
    let result = tokio::time::timeout(TIMEOUT, lines.next_line())
        .await
        .expect("the client to finish")
        .expect("read")
        .expect("a line");
    let message: Value = serde_json::from_str(&result).expect("json");
    assert!(client.wait().await.expect("wait").success());

    let reply = demo_reply("nested resume", 40);
    assert_eq!(message["text"], reply.as_str(), "{message}");
    assert_eq!(
        message["superseded"], 0,
        "the demo repeats itself: nothing to hide"
    );
    assert_eq!(message["id"], accepted["message_id"]);
    let chunks: Vec<&str> = message["chunks"]
        .as_array()
        .expect("chunks")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(chunks.first(), Some(&"start"));
    assert_eq!(chunks.last(), Some(&"finish"));
    assert_eq!(chunks.iter().filter(|c| **c == "start").count(), 1);
    let stored = stack.stored(&accepted["thread_id"]).await;
    assert!(
        stored.iter().any(|(_, e)| e["type"] == "attempt_restarted"),
        "the crash happened under the stream"
    );

    // Nothing streams any more: 204, what `useChat({resume: true})` expects.
    let output = node(&[&stack.base, &alice, &thread])
        .output()
        .await
        .expect("node");
    let idle: Value = serde_json::from_slice(&output.stdout).expect("json");
    assert_eq!(idle["status"], 204, "{idle}");
}
