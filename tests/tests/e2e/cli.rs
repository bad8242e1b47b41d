//! `spool-api openapi` prints the document `GET /openapi.json` serves.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::Value;
use spool_tests::Process;

use crate::stack::Stack;

#[tokio::test]
async fn spool_api_openapi_prints_the_served_document() {
    let mut printer = Process::spawn("spool-api", &["openapi"], &HashMap::new()).expect("spawn");
    let code = printer.wait(Duration::from_secs(20)).await;
    assert_eq!(code, Some(0), "{}", printer.output());
    let printed: Value = serde_json::from_str(&printer.output()).expect("the document, as JSON");
    assert_eq!(printed["openapi"], "3.1.0");
    let stack = Stack::start().await;
    let (status, served) = stack.get_json("/openapi.json").await;
    assert_eq!(status, reqwest::StatusCode::OK);
    assert_eq!(printed, served);
}

/// With spans exported (`OTEL_EXPORTER_OTLP_ENDPOINT`, here a loopback sink), a JSON log line
/// written inside a request carries the trace's id: the caller's, from its `traceparent`.
#[tokio::test]
async fn json_log_lines_carry_the_trace_id_of_the_request() {
    let sink = spool_tests::serve(axum::Router::new().fallback(|| async { "" })).await;
    let stack = Stack::start_with(
        &spool_tests::redis_url(),
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", sink.as_str())],
    )
    .await;
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let thread = uuid::Uuid::new_v4();
    let response = reqwest::Client::new()
        .post(format!("{}/v1/threads/{thread}/user_message", stack.base))
        .bearer_auth(spool_tests::token("alice", "acme"))
        .header("traceparent", format!("00-{trace}-00f067aa0ba902b7-01"))
        .json(&serde_json::json!({"input_text": "trace me"}))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), reqwest::StatusCode::ACCEPTED);
    let line = spool_tests::poll_until(
        "the enqueue's log line",
        Duration::from_secs(10),
        || async {
            stack
                .api_log()
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .find(|l| l["message"] == "run enqueued")
        },
    )
    .await;
    assert_eq!(line["trace_id"], trace, "{line}");
    assert!(
        line["span_id"].as_str().is_some_and(|s| s.len() == 16),
        "{line}"
    );
}

/// `spool chat` with stdin not a terminal: each line is a message, each reply goes to stdout
/// once and whole, through a dropped connection (a proxy cuts it) and a worker killed with
/// `kill -9` mid-answer; exit 0 at end of input.
#[tokio::test]
async fn spool_chat_prints_each_reply_once_through_a_dropped_connection_and_a_crash() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    let slow = [("SPOOL_DEMO_TOKENS", "40"), ("SPOOL_DEMO_DELAY_MS", "100")];
    let stack = Stack::start().await;
    let mut a = stack.worker(&slow).await;
    let proxy = spool_tests::servers::CutProxy::start(stack.base.trim_start_matches("http://"))
        .await
        .expect("proxy");
    let thread = uuid::Uuid::new_v4().to_string();
    let mut chat = tokio::process::Command::new(spool_tests::process::binary("spool"))
        .args(["chat", &thread])
        .env_clear()
        .env("SPOOL_URL", format!("http://{}", proxy.addr))
        .env("SPOOL_TOKEN", spool_tests::token("alice", "acme"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spool chat");
    let mut stdin = chat.stdin.take().expect("stdin");
    let mut stdout = chat.stdout.take().expect("stdout");
    stdin.write_all(b"first question\n").await.expect("write");
    let mut seen = Vec::new();
    let mut buffer = [0u8; 256];
    while seen.len() < 40 {
        let n = tokio::time::timeout(Duration::from_secs(30), stdout.read(&mut buffer))
            .await
            .expect("the reply to stream")
            .expect("read");
        assert!(n > 0, "spool chat ended early");
        seen.extend_from_slice(&buffer[..n]);
    }
    proxy.cut();
    a.kill9().await;
    let _b = stack.worker(&slow).await;
    stdin.write_all(b"and a second\n").await.expect("write");
    drop(stdin);
    let status = tokio::time::timeout(Duration::from_secs(60), chat.wait())
        .await
        .expect("spool chat to end")
        .expect("wait");
    stdout.read_to_end(&mut seen).await.expect("read");
    let mut stderr = String::new();
    chat.stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .await
        .expect("stderr");
    assert!(status.success(), "{stderr}");
    let expected = format!(
        "{}\n{}\n",
        crate::stack::demo_reply("first question", 40),
        crate::stack::demo_reply("and a second", 40)
    );
    assert_eq!(String::from_utf8_lossy(&seen), expected, "stderr: {stderr}");
    assert!(
        stderr.contains("resuming"),
        "the connection was cut: {stderr}"
    );
    let thread_value = Value::String(thread);
    let stored = stack.stored(&thread_value).await;
    assert!(
        stored.iter().any(|(_, e)| e["type"] == "attempt_restarted"),
        "the worker was killed mid-answer"
    );
}

/// The CLI's misuse: no token, or a server it cannot reach: one line on stderr, exit 2; a
/// server's refusal: its code, exit 1.
#[tokio::test]
async fn spool_reports_misuse_in_one_line() {
    let run = |vars: Vec<(&'static str, String)>| async move {
        let output = tokio::process::Command::new(spool_tests::process::binary("spool"))
            .args(["threads", "list"])
            .env_clear()
            .envs(vars)
            .output()
            .await
            .expect("spool");
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let closed = spool_tests::servers::free_port();
    let (code, stderr) = run(vec![
        ("SPOOL_URL", format!("http://127.0.0.1:{closed}")),
        ("SPOOL_TOKEN", "x".into()),
    ])
    .await;
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("cannot reach"), "{stderr}");
    let (code, stderr) = run(vec![]).await;
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("SPOOL_TOKEN"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let stack = Stack::start().await;
    let (code, stderr) = run(vec![
        ("SPOOL_URL", stack.base.clone()),
        ("SPOOL_TOKEN", "not-a-token".into()),
    ])
    .await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("401 invalid_token"), "{stderr}");
}

/// `spool ARGS` against `stack` with `token`: exit code, stdout, stderr.
async fn spool(stack: &Stack, token: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let output = tokio::process::Command::new(spool_tests::process::binary("spool"))
        .args(args)
        .env_clear()
        .env("SPOOL_URL", &stack.base)
        .env("SPOOL_TOKEN", token)
        .output()
        .await
        .expect("spool");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// What `spool ARGS` printed, as JSON, after checking it exited 0.
async fn spool_json(stack: &Stack, token: &str, args: &[&str]) -> Value {
    let (code, stdout, stderr) = spool(stack, token, args).await;
    assert_eq!(code, Some(0), "spool {args:?}: {stderr}");
    serde_json::from_str(&stdout).unwrap_or_else(|err| panic!("spool {args:?}: {err}: {stdout}"))
}

#[tokio::test]
async fn spool_lists_and_shows_threads_and_runs_and_manages_agents() {
    let stack = Stack::start().await;
    let _worker = stack.worker(&[]).await;
    let alice = spool_tests::token("alice", "acme");
    let accepted = stack.enqueue(&alice, "hello there").await;
    stack.wait_run(&accepted, "completed").await;
    let thread = accepted["thread_id"].as_str().expect("thread").to_owned();
    let run = accepted["workflow_id"].as_str().expect("run").to_owned();

    let threads = spool_json(&stack, &alice, &["threads", "list"]).await;
    assert_eq!(threads["data"][0]["id"], thread.as_str(), "{threads}");
    let shown = spool_json(&stack, &alice, &["threads", "show", &thread]).await;
    assert_eq!(shown["id"], thread.as_str(), "{shown}");
    let roles: Vec<&str> = shown["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter_map(|m| m["role"].as_str())
        .collect();
    assert_eq!(roles, ["user", "assistant"], "{shown}");
    let runs = spool_json(&stack, &alice, &["runs", "list", "--thread", &thread]).await;
    assert_eq!(runs["data"][0]["workflow_id"], run.as_str(), "{runs}");
    assert_eq!(runs["data"].as_array().map(Vec::len), Some(1), "{runs}");
    let shown = spool_json(&stack, &alice, &["runs", "show", &run]).await;
    assert_eq!(shown["status"], "completed", "{shown}");
    // Another user's run is a 404, in one line, exit 1.
    let bob = spool_tests::token("bob", "acme");
    let (code, _, stderr) = spool(&stack, &bob, &["runs", "show", &run]).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("404"), "{stderr}");

    // Agents, with an admin's token: apply creates, apply with the id replaces, delete.
    let admin = spool_tests::token_with("root", "acme", true, 3600, spool_tests::JWT_SECRET);
    let dir = std::env::temp_dir().join(format!("spool-cli-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("agent.json");
    std::fs::write(&file, r#"{"name": "from-cli", "model": "demo"}"#).expect("write");
    let file = file.to_str().expect("path");
    let created = spool_json(&stack, &admin, &["agents", "apply", "-f", file]).await;
    let id = created["id"].as_str().expect("id").to_owned();
    assert_eq!(created["name"], "from-cli");
    let listed = spool_json(&stack, &admin, &["agents", "list"]).await;
    assert!(
        listed["agents"]
            .as_array()
            .is_some_and(|agents| agents.iter().any(|a| a["id"] == id.as_str())),
        "{listed}"
    );
    std::fs::write(
        dir.join("agent.json"),
        format!(r#"{{"id": "{id}", "name": "renamed", "model": "demo"}}"#),
    )
    .expect("write");
    let replaced = spool_json(&stack, &admin, &["agents", "apply", "-f", file]).await;
    assert_eq!(replaced["id"], id.as_str(), "{replaced}");
    let got = spool_json(&stack, &admin, &["agents", "get", &id]).await;
    assert_eq!(got["name"], "renamed", "{got}");
    let (code, _, stderr) = spool(&stack, &admin, &["agents", "delete", &id]).await;
    assert_eq!(code, Some(0), "{stderr}");
    let (code, _, stderr) = spool(&stack, &admin, &["agents", "get", &id]).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("404"), "{stderr}");
    // A file that is not JSON: one line, nothing sent.
    std::fs::write(dir.join("agent.json"), "name: yaml?").expect("write");
    let (code, _, stderr) = spool(&stack, &admin, &["agents", "apply", "-f", file]).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test]
async fn spool_validates_agents_and_applies_a_patch() {
    let stack = Stack::start().await;
    let admin = spool_tests::token_with("root", "acme", true, 3600, spool_tests::JWT_SECRET);
    let dir = std::env::temp_dir().join(format!("spool-cli-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("agent.json");
    let file = path.to_str().expect("path");
    // The documented graph validates; a broken one prints every problem and exits 1.
    std::fs::write(&path, include_str!("../../../docs/examples/graph-rag.json")).expect("write");
    let report = spool_json(&stack, &admin, &["agents", "validate", "-f", file]).await;
    assert_eq!(report["valid"], true, "{report}");
    std::fs::write(
        &path,
        r#"{"name": "g", "kind": "graph", "graph_spec": {"spec_version": "1", "entry": "a",
            "nodes": {"a": {"type": "end", "output_template": "{{ghost}}"}}}}"#,
    )
    .expect("write");
    let (code, stdout, stderr) = spool(&stack, &admin, &["agents", "validate", "-f", file]).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stdout.contains("graph_spec.nodes.a.output_template"),
        "{stdout}"
    );
    assert_eq!(stack_agents(&stack).await, 0, "nothing stored");

    // apply --patch changes only the fields the file has; --dry-run stores nothing.
    std::fs::write(&path, r#"{"name": "p", "model": "demo", "max_steps": 7}"#).expect("write");
    let created = spool_json(&stack, &admin, &["agents", "apply", "-f", file]).await;
    let id = created["id"].as_str().expect("id").to_owned();
    std::fs::write(
        &path,
        format!(r#"{{"id": "{id}", "instructions": "Be brief."}}"#),
    )
    .expect("write");
    let report = spool_json(
        &stack,
        &admin,
        &["agents", "apply", "-f", file, "--patch", "--dry-run"],
    )
    .await;
    assert_eq!(report["valid"], true, "{report}");
    let patched = spool_json(&stack, &admin, &["agents", "apply", "-f", file, "--patch"]).await;
    assert_eq!(
        (&patched["instructions"], &patched["max_steps"]),
        (&serde_json::json!("Be brief."), &serde_json::json!(7)),
        "{patched}"
    );
    // An invalid write names each problem on stderr.
    std::fs::write(&path, format!(r#"{{"id": "{id}", "max_steps": 0}}"#)).expect("write");
    let (code, _, stderr) =
        spool(&stack, &admin, &["agents", "apply", "-f", file, "--patch"]).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("max_steps: must be between"), "{stderr}");
    std::fs::remove_dir_all(&dir).ok();
}

/// How many agents the stack's database holds.
async fn stack_agents(stack: &Stack) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM agents")
        .fetch_one(&stack.db.pool)
        .await
        .expect("count")
}

/// `spool chat ARGS` against `stack` as `token`, sent `line` and then the end of input (it exits
/// once that reply is done); its stderr is read apart.
async fn chat_once(
    stack: &Stack,
    token: &str,
    args: &[&str],
    line: &str,
) -> (tokio::process::Child, tokio::process::ChildStderr) {
    use tokio::io::AsyncWriteExt as _;

    let mut chat = tokio::process::Command::new(spool_tests::process::binary("spool"))
        .arg("chat")
        .args(args)
        .env_clear()
        .env("SPOOL_URL", &stack.base)
        .env("SPOOL_TOKEN", token)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spool chat");
    let mut stdin = chat.stdin.take().expect("stdin");
    stdin
        .write_all(format!("{line}\n").as_bytes())
        .await
        .expect("write");
    drop(stdin);
    let stderr = chat.stderr.take().expect("stderr");
    (chat, stderr)
}

/// Reads `stderr` until what it said satisfies `done`; returns it.
async fn said_until(
    stderr: &mut tokio::process::ChildStderr,
    done: impl Fn(&str) -> bool,
) -> String {
    use tokio::io::AsyncReadExt as _;

    let mut said = Vec::new();
    let mut buffer = [0u8; 256];
    while !done(&String::from_utf8_lossy(&said)) {
        let n = tokio::time::timeout(Duration::from_secs(20), stderr.read(&mut buffer))
            .await
            .expect("the chat to say it")
            .expect("read");
        assert!(n > 0, "{}", String::from_utf8_lossy(&said));
        said.extend_from_slice(&buffer[..n]);
    }
    String::from_utf8_lossy(&said).into_owned()
}

/// What the chat printed, after checking it ended by itself with exit 0.
async fn reply(chat: tokio::process::Child) -> String {
    let output = tokio::time::timeout(Duration::from_secs(30), chat.wait_with_output())
        .await
        .expect("the chat to end")
        .expect("output");
    assert_eq!(output.status.code(), Some(0));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test]
async fn spool_chat_says_a_run_is_queued_until_a_worker_takes_it() {
    let stack = Stack::start().await;
    let alice = spool_tests::token("alice", "acme");
    let (chat, mut stderr) = chat_once(&stack, &alice, &[], "anyone there?").await;
    // No worker yet: the run stays queued, and the chat says so.
    said_until(&mut stderr, |said| said.contains("(queued)")).await;
    let _worker = stack.worker(&[]).await;
    assert!(!reply(chat).await.trim().is_empty(), "the reply is printed");
}

#[tokio::test]
async fn spool_chat_says_where_to_answer_a_paused_run_and_prints_the_reply_once_answered() {
    use spool_tests::fake_llm::{self, FakeLlm, tool_results_in};

    let fake = FakeLlm::start(|request, _| match tool_results_in(request) {
        0 => fake_llm::tool_calls(&[("c1", "read_file", r#"{"path": "notes.txt"}"#)]),
        _ => fake_llm::text("Your notes say hello.", 2),
    })
    .await;
    let stack = Stack::start().await;
    let _worker = stack
        .worker(&[("SPOOL_LLM_BASE_URL", fake.base_url.as_str())])
        .await;
    let agent = stack
        .create_agent(
            &serde_json::json!({"name": "reader", "model": "gpt-4o-mini",
            "tools": [{"type": "client", "name": "read_file"}]}),
        )
        .await;
    let alice = spool_tests::token("alice", "acme");
    let (chat, mut stderr) = chat_once(&stack, &alice, &["--agent", &agent], "read my notes").await;
    let paused = "(paused: the run waits for client tool outputs: POST /v1/workflows/";
    // The whole line: the route, then `)`.
    let said = said_until(&mut stderr, |said| {
        said.find(paused)
            .is_some_and(|at| said[at..].contains("tool_outputs)"))
    })
    .await;
    // The route it names answers the run.
    let route = said[said.find("POST ").expect("route") + 5..]
        .split(')')
        .next()
        .expect("route")
        .to_owned();
    let (status, body) = stack
        .post(
            &alice,
            &route,
            &serde_json::json!({"tool_outputs": [{"tool_call_id": "c1", "output": "hello"}]}),
        )
        .await;
    assert_eq!(status, reqwest::StatusCode::ACCEPTED, "{route}: {body}");
    let reply = reply(chat).await;
    assert_eq!(reply.matches("Your notes say hello.").count(), 1, "{reply}");
}

/// Review B-M7: a model's text (steered by a prompt injection in a fetched page, say) reaches
/// the terminal without escape sequences: no clipboard write (OSC 52), no screen rewrite (CSI).
#[tokio::test]
async fn spool_chat_prints_no_escape_sequence_a_model_writes() {
    use spool_tests::fake_llm::{self, FakeLlm};

    let hostile = "Done.\u{1b}]52;c;cm0gLXJmIH4=\u{7} \u{1b}[2J\u{1b}[1;1HAll clear.";
    let fake = FakeLlm::start(move |_, _| fake_llm::text(hostile, 3)).await;
    let stack = Stack::start().await;
    let _worker = stack
        .worker(&[("SPOOL_LLM_BASE_URL", fake.base_url.as_str())])
        .await;
    let alice = spool_tests::token("alice", "acme");
    let (chat, _stderr) = chat_once(&stack, &alice, &[], "summarise that page").await;
    let reply = reply(chat).await;
    assert!(reply.contains("Done."), "{reply:?}");
    assert!(reply.contains("All clear."), "{reply:?}");
    assert!(
        !reply
            .chars()
            .any(|c| c.is_control() && c != '\n' && c != '\t'),
        "{reply:?}"
    );
}

/// `spool-api probe URL`, the image's health check (no shell in it): 0 on the API's `/readyz`,
/// 1 on a 404 and on a closed port.
#[tokio::test]
async fn spool_api_probe_exits_0_only_on_a_2xx_answer() {
    let stack = Stack::start().await;
    for (path, expected) in [("/readyz", 0), ("/no-such-page", 1)] {
        let url = format!("{}{path}", stack.base);
        let mut probe =
            Process::spawn("spool-api", &["probe", &url], &HashMap::new()).expect("spawn");
        let code = probe.wait(Duration::from_secs(20)).await;
        assert_eq!(code, Some(expected), "{url}: {}", probe.output());
    }
    drop(stack);
    let mut probe = Process::spawn(
        "spool-api",
        &["probe", "--timeout-secs", "2", "http://127.0.0.1:1/readyz"],
        &HashMap::new(),
    )
    .expect("spawn");
    assert_eq!(
        probe.wait(Duration::from_secs(20)).await,
        Some(1),
        "{}",
        probe.output()
    );
}
