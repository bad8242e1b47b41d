//! The chat page at `/` in Chromium (`tests/peers/page_test.mjs`, playwright-core driving
//! Debian's `chromium`): a reply streams through a dropped network and a worker killed with
//! `kill -9`, another through a reload, a third is cancelled, and a refused token shows the
//! sign-in form; who is signed in is shown, and a link's token replaces a session's only when
//! the user agrees.

use std::process::Stdio;

use serde_json::Value;
use spool_tests::token;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};

use crate::stack::{Stack, TIMEOUT, demo_reply};

/// 40 deltas, 100 ms apart: long enough to interrupt.
const SLOW: [(&str, &str); 2] = [("SPOOL_DEMO_TOKENS", "40"), ("SPOOL_DEMO_DELAY_MS", "100")];

#[tokio::test]
async fn the_page_streams_resumes_reloads_and_cancels_in_chromium() {
    let dir = spool_tests::peers::node_peers().expect("npm peers");
    assert!(
        std::path::Path::new("/usr/bin/chromium").exists()
            || std::env::var_os("CHROMIUM").is_some(),
        "the page's test needs Chromium: apt-get install chromium (or set CHROMIUM)"
    );
    let stack = Stack::start().await;
    let mut a = stack.worker(&SLOW).await;
    let proxy = spool_tests::servers::CutProxy::start(stack.base.trim_start_matches("http://"))
        .await
        .expect("proxy");
    let screenshot = std::env::temp_dir().join(format!("spool-page-{}.png", uuid::Uuid::new_v4()));
    let mut browser = tokio::process::Command::new("node")
        .arg(dir.join("page_test.mjs"))
        .arg(format!("http://{}", proxy.addr))
        .arg(token("alice", "acme"))
        .arg(&screenshot)
        // Signed right, expired an hour ago (past the verifier's leeway).
        .env(
            "EXPIRED_TOKEN",
            spool_tests::token_with("alice", "acme", false, -3600, spool_tests::JWT_SECRET),
        )
        .current_dir(&dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node");
    // The page's console and the script's errors, shown only if the test fails.
    let mut errors = browser.stderr.take().expect("stderr");
    let log = tokio::spawn(async move {
        let mut log = String::new();
        let _ = tokio::io::AsyncReadExt::read_to_string(&mut errors, &mut log).await;
        log
    });
    let mut lines = BufReader::new(browser.stdout.take().expect("stdout")).lines();
    let line = tokio::time::timeout(TIMEOUT * 2, lines.next_line())
        .await
        .expect("the page to stream")
        .expect("read");
    let Some(line) = line else {
        panic!(
            "the page test ended early:\n{}",
            log.await.unwrap_or_default()
        );
    };
    assert_eq!(line, "STREAMING");
    // The network drops and the worker dies mid-answer.
    proxy.cut();
    a.kill9().await;
    let _b = stack.worker(&SLOW).await;
    let mut stdin = browser.stdin.take().expect("stdin");
    stdin.write_all(b"go\n").await.expect("write");
    let line = tokio::time::timeout(TIMEOUT * 4, lines.next_line())
        .await
        .expect("the page test to finish")
        .expect("read");
    let Some(line) = line else {
        panic!(
            "the page test ended early:\n{}",
            log.await.unwrap_or_default()
        );
    };
    let shown: Value = serde_json::from_str(&line).expect("json");
    assert!(browser.wait().await.expect("wait").success(), "{shown}");

    assert_eq!(
        shown["first"],
        demo_reply("hello page", 40).as_str(),
        "{shown}"
    );
    assert_eq!(
        shown["second"],
        demo_reply("survive a reload", 40).as_str(),
        "{shown}"
    );
    let full = demo_reply("cancel me", 40).len();
    let cancelled = shown["cancelled"].as_u64().expect("cancelled");
    assert!(cancelled > 0 && (cancelled as usize) < full, "{shown}");
    assert_eq!(shown["textareas"], 1);
    assert_eq!(shown["threads"], 1, "the thread is listed");
    assert_eq!(shown["signInShown"], true);
    assert_eq!(shown["expiredSignInShown"], true);
    assert_eq!(shown["errors"], serde_json::json!([]), "no script errors");
    // Streams opened with stream tokens (DESIGN section 13), never the long-lived token.
    assert!(shown["streamUrls"].as_u64() >= Some(3), "{shown}");
    assert_eq!(shown["longTokenInStreamUrls"], 0, "{shown}");
    assert!(std::fs::metadata(&screenshot).is_ok_and(|m| m.len() > 0));
    let thread = shown["threadInUrl"].clone();
    let stored = stack.stored(&thread).await;
    assert!(
        stored.iter().any(|(_, e)| e["type"] == "attempt_restarted"),
        "the worker was killed mid-answer"
    );
    println!("screenshot: {}", screenshot.display());
}

/// Through the page in Chromium: a client tool answered in its form, then a call approved with
/// its button; the reply completes and shows both tool steps.
#[tokio::test]
async fn the_page_answers_a_client_tool_and_an_approval_in_chromium() {
    use spool_tests::fake_llm::{self, FakeLlm, tool_results_in};

    let dir = spool_tests::peers::node_peers().expect("npm peers");
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
    weather["requires_approval"] = serde_json::json!(true);
    let agent = stack
        .create_agent(&serde_json::json!({"name": "asker", "model": "gpt-4o-mini",
            "tools": [{"type": "client", "name": "read_file"}, weather]}))
        .await;
    let alice = token("alice", "acme");
    let (status, thread) = stack
        .post(
            &alice,
            "/v1/threads",
            &serde_json::json!({"agent_id": agent}),
        )
        .await;
    assert_eq!(status, 201);
    let output = tokio::time::timeout(
        TIMEOUT * 3,
        tokio::process::Command::new("node")
            .arg(dir.join("page_test.mjs"))
            .args(["--actions", &stack.base, &alice])
            .arg(thread["id"].as_str().expect("id"))
            .current_dir(&dir)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the page test to finish")
    .expect("node");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let shown: Value = serde_json::from_slice(&output.stdout).expect("json");
    assert_eq!(shown["tools"], 2, "{shown}");
    assert!(
        shown["text"]
            .as_str()
            .is_some_and(|t| t.ends_with("All done.")),
        "{shown}"
    );
    assert_eq!(tools.calls().len(), 1, "the approved call ran once");
    let (_, steps) = stack
        .get_with(
            &alice,
            &format!(
                "/v1/threads/{}/messages",
                thread["id"].as_str().expect("id")
            ),
        )
        .await;
    let parts = steps["messages"][1]["parts"].to_string();
    assert!(
        parts.contains("the notes"),
        "the client's output reached the run: {parts}"
    );
}

/// Who is signed in is shown, and a link with another token (login CSRF: someone else's
/// account) replaces a session's token only when the user agrees (review B-L2).
#[tokio::test]
async fn the_page_shows_who_is_signed_in_and_asks_before_a_link_replaces_the_session() {
    let dir = spool_tests::peers::node_peers().expect("npm peers");
    let stack = Stack::start().await;
    let output = tokio::time::timeout(
        TIMEOUT * 2,
        tokio::process::Command::new("node")
            .arg(dir.join("page_test.mjs"))
            .args(["--who", &stack.base])
            .arg(token("alice", "acme"))
            .arg(token("mallory", "evil"))
            .current_dir(&dir)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the page test to finish")
    .expect("node");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let shown: Value = serde_json::from_slice(&output.stdout).expect("json");
    let says = |key: &str, text: &str| shown[key].as_str().is_some_and(|s| s.contains(text));
    assert!(says("first", "alice") && says("first", "acme"), "{shown}");
    assert!(
        says("declined", "alice"),
        "declining keeps the session: {shown}"
    );
    assert!(says("fragmentDeclined", "alice"), "{shown}");
    assert!(
        says("accepted", "mallory") && says("accepted", "evil"),
        "{shown}"
    );
    let questions = shown["questions"].as_array().expect("questions");
    assert_eq!(
        questions.len(),
        3,
        "asked each time a session existed: {shown}"
    );
    assert!(
        questions.iter().all(|q| {
            let q = q.as_str().unwrap_or_default();
            q.contains("mallory") && q.contains("alice")
        }),
        "{shown}"
    );
    assert_eq!(shown["errors"], serde_json::json!([]), "no script errors");
}

/// The agent picker: the tenant's agents to choose from, the chosen one's tools (inline and
/// referenced, a disabled one marked so) shown with their kind and health, and the message sent
/// to the chosen agent.
#[tokio::test]
async fn the_page_picks_an_agent_and_shows_its_tools_and_their_health_in_chromium() {
    use spool_tests::fake_llm::{self, FakeLlm};

    let dir = spool_tests::peers::node_peers().expect("npm peers");
    let fake = FakeLlm::start(|_, _| fake_llm::text("Picked.", 2)).await;
    let stack = Stack::start_with(
        &spool_tests::redis_url(),
        &[("SPOOL_TOOLS_ALLOW_NETWORKS", "127.0.0.0/8")],
    )
    .await;
    let _worker = stack
        .worker(&[
            ("SPOOL_LLM_BASE_URL", fake.base_url.as_str()),
            ("SPOOL_TOOLS_ALLOW_NETWORKS", "127.0.0.0/8"),
        ])
        .await;
    let admin = spool_tests::token_with("root", "acme", true, 3600, spool_tests::JWT_SECRET);
    // An MCP server nobody listens for: its probe finds it unhealthy.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr");
    let (status, dead) = stack
        .post(
            &admin,
            "/v1/tools",
            &serde_json::json!({"type": "mcp", "name": "dead", "url": format!("http://{closed}/mcp")}),
        )
        .await;
    assert_eq!(status, 201, "{dead}");
    let dead_path = format!("/v1/tools/{}", dead["id"].as_str().expect("id"));
    let probed = spool_tests::poll_until("the MCP server's probe", TIMEOUT, || async {
        let (_, tool) = stack.get_with(&admin, &dead_path).await;
        (tool["status"] != "pending").then_some(tool)
    })
    .await;
    assert_eq!(probed["status"], "unhealthy", "{probed}");
    let mut tool_ids = vec![dead["id"].clone()];
    for (name, enabled) in [("lookup", true), ("retired", false)] {
        let (status, tool) = stack
            .post(
                &admin,
                "/v1/tools",
                &serde_json::json!({"type": "client", "name": name, "enabled": enabled}),
            )
            .await;
        assert_eq!(status, 201, "{tool}");
        tool_ids.push(tool["id"].clone());
    }
    stack
        .create_agent(&serde_json::json!({"name": "other", "model": "demo"}))
        .await;
    let picked = stack
        .create_agent(
            &serde_json::json!({"name": "picked", "model": "gpt-4o-mini",
            "instructions": "You were picked.",
            "tools": [{"type": "client", "name": "read_file"}], "tool_ids": tool_ids}),
        )
        .await;
    let alice = token("alice", "acme");
    let output = tokio::time::timeout(
        TIMEOUT * 2,
        tokio::process::Command::new("node")
            .arg(dir.join("page_test.mjs"))
            .args(["--agents", &stack.base, &alice, "picked"])
            .current_dir(&dir)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the page test to finish")
    .expect("node");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let shown: Value = serde_json::from_slice(&output.stdout).expect("json");
    assert_eq!(shown["errors"], serde_json::json!([]), "{shown}");
    let options: Vec<&str> = shown["options"]
        .as_array()
        .expect("options")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        options.contains(&"picked") && options.contains(&"other"),
        "{shown}"
    );
    let badges: Vec<(String, String)> = shown["badges"]
        .as_array()
        .expect("badges")
        .iter()
        .map(|b| {
            (
                b["text"].as_str().unwrap_or_default().to_owned(),
                b["health"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        badges,
        [
            ("read_file · client".to_owned(), "enabled".to_owned()),
            ("dead · mcp · unhealthy".to_owned(), "unhealthy".to_owned()),
            ("lookup · client".to_owned(), "enabled".to_owned()),
            (
                "retired · client · disabled".to_owned(),
                "disabled".to_owned()
            ),
        ],
        "{shown}"
    );
    assert_eq!(shown["text"], "Picked.", "{shown}");
    // The message went to the picked agent: its instructions reached the model.
    let requests = fake.requests();
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert_eq!(requests[0]["messages"][0]["content"], "You were picked.");
    let _ = picked;
}
