//! The OpenAI-compatible routes (docs/clients.md): the official Python and Node SDKs as clients,
//! unchanged; and a worker killed mid-response while a client resumes with `starting_after`.

use serde_json::{Value, json};
use spool_tests::sse::SseReader;
use spool_tests::{token, token_with};

use spool_tests::conform::Conformance;
use spool_tests::fake_llm::{self, FakeLlm, Reply};

use crate::stack::{Stack, TIMEOUT, demo_reply};

/// The stack, with its clients going through a [`Conformance`] proxy (check it at the end).
pub(crate) async fn conforming(stack: &mut Stack) -> Conformance {
    let conform = Conformance::start(&stack.base).await;
    stack.base = conform.base.clone();
    conform
}

/// 40 deltas, 100 ms apart: long enough to interrupt.
const SLOW: [(&str, &str); 2] = [("SPOOL_DEMO_TOKENS", "40"), ("SPOOL_DEMO_DELAY_MS", "100")];

#[tokio::test]
async fn the_official_python_sdk_works_unchanged() {
    let python = spool_tests::peers::python().expect("the openai SDK (pip)");
    let mut stack = Stack::start_with(
        &spool_tests::redis_url(),
        &[("SPOOL_QUOTA_USER_CONCURRENT_RUNS", "2")],
    )
    .await;
    let conform = conforming(&mut stack).await;
    let _worker = stack.worker(&[("SPOOL_DEMO_DELAY_MS", "50")]).await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/peers/openai_sdk.py");
    let mut command = tokio::process::Command::new(python);
    command.arg(script).env("BOB_TOKEN", token("bob", "acme"));
    run_sdk_script(&stack, command).await;
    assert!(conform.check() > 100, "the SDK's answers were checked");
}

/// Runs an SDK script against the stack (`SPOOL_URL`, alice's `TOKEN`, the demo `REPLY` to
/// expect) and checks that it says `all passed`.
async fn run_sdk_script(stack: &Stack, mut command: tokio::process::Command) {
    let output = command
        .env("SPOOL_URL", &stack.base)
        .env("TOKEN", token("alice", "acme"))
        .env("REPLY", demo_reply("resume me", 32))
        .output()
        .await
        .expect("the SDK script");
    let stdout = String::from_utf8_lossy(&output.stdout);
    println!("{stdout}");
    assert!(
        output.status.success() && stdout.contains("all passed"),
        "the SDK script failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test]
async fn the_official_node_sdk_works_unchanged() {
    let dir = spool_tests::peers::node_peers().expect("npm peers");
    let mut stack = Stack::start().await;
    let conform = conforming(&mut stack).await;
    let _worker = stack.worker(&[("SPOOL_DEMO_DELAY_MS", "50")]).await;
    let mut command = tokio::process::Command::new("node");
    command.arg(dir.join("openai_sdk.mjs")).current_dir(&dir);
    run_sdk_script(&stack, command).await;
    assert!(conform.check() > 10, "the SDK's answers were checked");
}

/// The thread a conversation id (`conv_` and the thread id's hex) names.
fn thread_of(conversation: &Value) -> spool_shared::ThreadId {
    let id = conversation.as_str().expect("a conversation id");
    let hex = id.strip_prefix("conv_").expect("conv_...");
    spool_shared::ThreadId(uuid::Uuid::parse_str(hex).expect("a thread id"))
}

/// `(sequence_number, type, delta)` of each frame.
fn summary(frames: &[Value]) -> Vec<(u64, String, String)> {
    frames
        .iter()
        .map(|e| {
            (
                e["sequence_number"].as_u64().unwrap_or(u64::MAX),
                e["type"].as_str().unwrap_or_default().to_owned(),
                e["delta"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

async fn read_all(stack: &Stack, token: &str, path: &str) -> Vec<Value> {
    let response = stack
        .http
        .get(format!("{}{path}", stack.base))
        .bearer_auth(token)
        .send()
        .await
        .expect("stream");
    assert_eq!(response.status(), 200);
    let mut reader = SseReader::new(response);
    let frames = reader.collect(TIMEOUT).await;
    assert!(reader.closed, "the stream did not end");
    frames.iter().map(spool_tests::sse::Frame::json).collect()
}

fn text(events: &[Value]) -> String {
    events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .filter_map(|e| e["delta"].as_str())
        .collect()
}

#[tokio::test]
async fn a_worker_killed_mid_response_does_not_make_a_resuming_client_show_text_twice() {
    let mut stack = Stack::start().await;
    let conform = conforming(&mut stack).await;
    let mut a = stack.worker(&SLOW).await;
    let alice = token("alice", "acme");
    let response = stack
        .http
        .post(format!("{}/v1/responses", stack.base))
        .bearer_auth(&alice)
        .json(
            &json!({"model": "spool-default", "input": "survive", "background": true,
            "stream": true}),
        )
        .send()
        .await
        .expect("create");
    assert_eq!(response.status(), 200);
    let mut reader = SseReader::new(response);
    let mut first = Vec::new();
    while text(&first).split(' ').count() < 6 {
        let frame = reader
            .next(TIMEOUT)
            .await
            .expect("an event before the crash");
        first.push(frame.json());
    }
    drop(reader);
    let id = first[0]["response"]["id"]
        .as_str()
        .expect("response id")
        .to_owned();
    let thread = json!(thread_of(&first[0]["response"]["conversation"]["id"]).to_string());
    a.kill9().await;
    let _b = stack.worker(&SLOW).await;

    let last = first
        .last()
        .and_then(|e| e["sequence_number"].as_u64())
        .expect("seq");
    let resumed = read_all(
        &stack,
        &alice,
        &format!("/v1/responses/{id}?stream=true&starting_after={last}"),
    )
    .await;
    let numbers: Vec<u64> = resumed
        .iter()
        .filter_map(|e| e["sequence_number"].as_u64())
        .collect();
    assert_eq!(
        numbers,
        (last + 1..last + 1 + resumed.len() as u64).collect::<Vec<_>>(),
        "every event after the cursor, once, in order"
    );
    assert_eq!(
        resumed.last().map(|e| e["type"].clone()),
        Some(json!("response.completed"))
    );
    let stored = stack
        .http
        .get(format!("{}/v1/responses/{id}", stack.base))
        .bearer_auth(&alice)
        .send()
        .await
        .expect("get")
        .json::<Value>()
        .await
        .expect("json");
    let stored_text = stored["output"][0]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert_eq!(stored_text, demo_reply("survive", 40));
    assert_eq!(
        format!("{}{}", text(&first), text(&resumed)),
        stored_text,
        "the client shows the stored answer, no text twice"
    );
    // The crash did happen under this response: a second attempt restarted it.
    let events = stack.stored(&thread).await;
    assert!(
        events.iter().any(|(_, e)| e["type"] == "attempt_restarted"),
        "no attempt_restarted: the worker finished before it was killed"
    );
    // Sequence numbers are the thread stream's, not a process's: a replay from the start
    // gives the very same events.
    let replay = read_all(&stack, &alice, &format!("/v1/responses/{id}?stream=true")).await;
    let seen: Vec<Value> = first.into_iter().chain(resumed).collect();
    assert_eq!(summary(&replay), summary(&seen));
    // Someone else's response does not exist for them.
    let mallory = token_with("mallory", "evil", false, 3600, spool_tests::JWT_SECRET);
    let foreign = stack
        .http
        .get(format!("{}/v1/responses/{id}?stream=true", stack.base))
        .bearer_auth(&mallory)
        .send()
        .await
        .expect("get");
    assert_eq!(foreign.status(), 404);
    let body: Value = foreign.json().await.expect("json");
    assert_eq!(body["error"]["type"], "not_found_error");
    conform.check();
}

#[tokio::test]
async fn a_response_whose_events_redis_no_longer_holds_answers_with_an_error_event() {
    let mut stack = Stack::start().await;
    let conform = conforming(&mut stack).await;
    let _worker = stack.worker(&[("SPOOL_DEMO_DELAY_MS", "0")]).await;
    let alice = token("alice", "acme");
    let (status, response) = stack
        .post(
            &alice,
            "/v1/responses",
            &json!({"model": "spool-default", "input": "hi"}),
        )
        .await;
    assert_eq!(
        (status.as_u16(), response["status"].clone()),
        (200, json!("completed"))
    );
    let thread = thread_of(&response["conversation"]["id"]);
    let keys = spool_shared::stream::StreamKeys::new(stack.prefix.clone());
    let mut conn = spool_shared::redis_conn::connect(&stack.redis_url).expect("redis");
    let id = response["id"].as_str().expect("id");
    // Trimmed from the front (its start gone, its end kept), as `SPOOL_STREAM_MAXLEN`-style
    // trimming or a partial loss leaves it.
    let _: () = redis::cmd("XTRIM")
        .arg(keys.events(thread))
        .arg("MAXLEN")
        .arg(2)
        .query_async(&mut conn)
        .await
        .expect("XTRIM");
    let events = read_all(&stack, &alice, &format!("/v1/responses/{id}?stream=true")).await;
    // Not a replay from the middle: the events are said to be gone, and nothing else is sent.
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(
        (events[0]["type"].clone(), events[0]["code"].clone()),
        (json!("error"), json!("stream_expired"))
    );
    let _: () = redis::cmd("DEL")
        .arg(keys.events(thread))
        .query_async(&mut conn)
        .await
        .expect("DEL");
    let events = read_all(&stack, &alice, &format!("/v1/responses/{id}?stream=true")).await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(
        (events[0]["type"].clone(), events[0]["code"].clone()),
        (json!("error"), json!("stream_expired"))
    );
    // The stored response is still there over REST.
    let (status, _) = (
        stack
            .http
            .get(format!("{}/v1/responses/{id}", stack.base))
            .bearer_auth(&alice)
            .send()
            .await
            .expect("get")
            .status(),
        (),
    );
    assert_eq!(status, 200);
    conform.check();
}

#[tokio::test]
async fn a_starting_after_beyond_the_end_of_a_running_response_follows_it_live_from_there() {
    let mut stack = Stack::start().await;
    let conform = conforming(&mut stack).await;
    let _worker = stack
        .worker(&[("SPOOL_DEMO_TOKENS", "80"), ("SPOOL_DEMO_DELAY_MS", "100")])
        .await;
    let alice = token("alice", "acme");
    let (status, queued) = stack
        .post(
            &alice,
            "/v1/responses",
            &json!({"model": "spool-default", "input": "take your time", "background": true}),
        )
        .await;
    assert_eq!(status, 200, "{queued}");
    let id = queued["id"].as_str().expect("id").to_owned();
    // A client reads some of its text, then drops the connection.
    let response = stack
        .http
        .get(format!("{}/v1/responses/{id}?stream=true", stack.base))
        .bearer_auth(&alice)
        .send()
        .await
        .expect("stream");
    let mut reader = SseReader::new(response);
    let mut early = Vec::new();
    while text(&early).len() < 20 {
        let frame = reader.next(TIMEOUT).await.expect("an event");
        early.push(frame.json());
    }
    drop(reader);
    // It comes back asking from far beyond the end: it is followed live from there.
    let later = read_all(
        &stack,
        &alice,
        &format!("/v1/responses/{id}?stream=true&starting_after=1000000"),
    )
    .await;
    // (Had it ended before the request, there would be nothing after the end to send.)
    let types: Vec<&str> = later.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(types.last(), Some(&"response.completed"), "{types:?}");
    assert!(!types.contains(&"response.created"), "no replay: {types:?}");
    let first = later[0]["sequence_number"].as_u64().expect("numbered");
    let seen = early
        .iter()
        .filter_map(|e| e["sequence_number"].as_u64())
        .max()
        .expect("early events");
    assert!(first > seen, "live from the end: {first} after {seen}");
    // What it got is the tail of the stored text.
    let (_, stored) = stack.get_with(&alice, &format!("/v1/responses/{id}")).await;
    let whole = stored["output"][0]["content"][0]["text"]
        .as_str()
        .expect("stored text")
        .to_owned();
    assert!(
        whole.ends_with(&text(&later)),
        "{whole:?} / {:?}",
        text(&later)
    );
    conform.check();
}

/// The fake upstream of the structured-output test: `{"city": "Paris", "temperature_c": 21}`
/// when the request asks for JSON (reporting 32 cached prompt tokens and 8 reasoning tokens),
/// prose when it does not, or when a user message says "never" (its repair round included).
fn weather_upstream(request: &Value, _: usize) -> Reply {
    let messages = request["messages"].as_array().cloned().unwrap_or_default();
    let never = messages
        .iter()
        .any(|m| m["role"] == "user" && m["content"].as_str().is_some_and(|c| c.contains("never")));
    if never || request.get("response_format").is_none() {
        return fake_llm::text("Sunny, mostly.", 2);
    }
    let Reply::Stream(mut payloads) =
        fake_llm::text(r#"{"city": "Paris", "temperature_c": 21}"#, 3)
    else {
        unreachable!("text is a stream")
    };
    if let Some(last) = payloads.last_mut() {
        last["usage"] = json!({"prompt_tokens": 40, "completion_tokens": 12, "total_tokens": 52,
            "prompt_tokens_details": {"cached_tokens": 32},
            "completion_tokens_details": {"reasoning_tokens": 8}});
    }
    Reply::Stream(payloads)
}

#[tokio::test]
async fn structured_outputs_parse_through_the_official_python_sdk() {
    let python = spool_tests::peers::python().expect("the openai SDK (pip)");
    let fake = FakeLlm::start(weather_upstream).await;
    let mut stack = Stack::start().await;
    let conform = conforming(&mut stack).await;
    let _worker = stack
        .worker(&[("SPOOL_LLM_BASE_URL", fake.base_url.as_str())])
        .await;
    let root = token_with("root", "acme", true, 3600, spool_tests::JWT_SECRET);
    let (status, agent) = stack
        .post(
            &root,
            "/v1/agents",
            &json!({"name": "forecaster", "model": "gpt-4o-mini"}),
        )
        .await;
    assert_eq!(status, 201, "{agent}");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/peers/openai_structured.py");
    let mut command = tokio::process::Command::new(python);
    command.arg(script).env("MODEL", "forecaster");
    run_sdk_script(&stack, command).await;
    assert!(conform.check() > 10, "the SDK's answers were checked");
}

#[tokio::test]
async fn structured_outputs_parse_a_zod_schema_through_the_official_node_sdk() {
    let dir = spool_tests::peers::node_peers().expect("npm peers");
    let fake = FakeLlm::start(weather_upstream).await;
    let mut stack = Stack::start().await;
    let conform = conforming(&mut stack).await;
    let _worker = stack
        .worker(&[("SPOOL_LLM_BASE_URL", fake.base_url.as_str())])
        .await;
    let root = token_with("root", "acme", true, 3600, spool_tests::JWT_SECRET);
    let (status, agent) = stack
        .post(
            &root,
            "/v1/agents",
            &json!({"name": "forecaster", "model": "gpt-4o-mini"}),
        )
        .await;
    assert_eq!(status, 201, "{agent}");
    let mut command = tokio::process::Command::new("node");
    command
        .arg(dir.join("openai_structured.mjs"))
        .current_dir(&dir)
        .env("MODEL", "forecaster");
    run_sdk_script(&stack, command).await;
    assert!(conform.check() > 4, "the SDK's answers were checked");
}
