//! `?format=ai-sdk`: a run with a tool step as AI SDK chunks, resumed from a cursor inside it;
//! `204` with nothing streaming; bad formats and cursors. The AI SDK's own parsers read it in
//! `tests/tests/e2e/ai_sdk.rs`.

use reqwest::StatusCode;
use serde_json::{Value, json};

use spool_shared::stream::{EntryId, read_after};
use spool_tests::fake_llm::{FakeLlm, weather_then_echo};
use spool_tests::sse::SseReader;
use spool_tests::token;
use spool_tests::tools::{Tools, http_tool};

use crate::common::{TIMEOUT, app_with, ask, finished};

#[tokio::test]
async fn a_tool_run_streams_as_ai_sdk_chunks_and_resumes_from_any_chunk() {
    let fake = FakeLlm::start(weather_then_echo()).await;
    let (_tools, base) = Tools::start().await;
    let app = app_with(&fake).await;
    let agent = app
        .create_agent(
            "acme",
            &json!({"name": "weatherman", "model": "gpt-4o-mini",
                "tools": [http_tool("get_weather", format!("{base}/weather"))]}),
        )
        .await;
    let alice = token("alice", "acme");
    let get = |thread: String, cursor: Option<String>, format: &'static str| {
        let mut request = app
            .http
            .get(app.url(&format!("/v1/threads/{thread}/stream?format={format}")))
            .bearer_auth(&alice);
        if let Some(cursor) = cursor {
            request = request.header("Last-Event-ID", cursor);
        }
        request.send()
    };

    let idle = uuid::Uuid::new_v4().to_string();
    let response = get(idle.clone(), None, "ai-sdk").await.expect("get");
    assert_eq!(
        response.status(),
        StatusCode::NOT_FOUND,
        "no such thread yet"
    );
    let (thread, accepted) = ask(&app, &agent, "weather in Paris?").await;
    finished(&app, &accepted).await;
    // Over: nothing streams.
    let response = get(thread.to_string(), None, "ai-sdk").await.expect("get");
    assert_eq!(response.status(), StatusCode::NO_CONTENT);

    // From the message's first entry: every chunk after `start`.
    let mut conn = spool_shared::redis_conn::connect(&spool_tests::redis_url()).expect("redis");
    let entries = read_after(
        &mut conn,
        &app.keys.events(spool_shared::ThreadId(thread)),
        EntryId::default(),
        1000,
    )
    .await
    .expect("xrange");
    let start = entries
        .iter()
        .find(|e| e.kind == "message_start")
        .expect("message_start");
    // Every stored event matches the document's schema for its type.
    let document: Value = app.openapi_document().await;
    let typed = document["components"]["schemas"]["StreamEnvelope"]["oneOf"]
        .as_array()
        .map(Vec::len);
    assert_eq!(typed, Some(16), "one schema per event type");
    let mut kinds = std::collections::BTreeSet::new();
    for entry in entries.iter().filter(|e| !e.is_marker()) {
        let envelope: Value = serde_json::from_str(&entry.json).expect("json");
        crate::openapi::check(&document, "StreamEnvelope", &envelope);
        kinds.insert(entry.kind.clone());
    }
    for kind in [
        "message_start",
        "step_start",
        "step",
        "step_end",
        "text_delta",
        "citations",
        "message_end",
        "done",
    ] {
        assert!(kinds.contains(kind), "{kind} was checked: {kinds:?}");
    }
    let response = get(thread.to_string(), Some(start.id.to_string()), "ai-sdk")
        .await
        .expect("get");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["x-vercel-ai-ui-message-stream"], "v1");
    let mut reader = SseReader::new(response);
    let frames = reader.collect(TIMEOUT).await;
    assert!(reader.closed);
    assert_eq!(frames.last().map(|f| f.data.as_str()), Some("[DONE]"));
    let chunks: Vec<Value> = frames[..frames.len() - 1]
        .iter()
        .map(|f| f.json())
        .collect();
    let types: Vec<&str> = chunks.iter().filter_map(|c| c["type"].as_str()).collect();
    assert!(
        !types.contains(&"start"),
        "the cursor's chunk is not sent again: {types:?}"
    );
    let input = chunks
        .iter()
        .find(|c| c["type"] == "tool-input-available")
        .expect("tool input");
    assert_eq!(
        (input["toolName"].clone(), input["input"]["city"].clone()),
        (json!("get_weather"), json!("Paris"))
    );
    let output = chunks
        .iter()
        .find(|c| c["type"] == "tool-output-available")
        .expect("tool output");
    assert!(
        output["output"]
            .as_str()
            .is_some_and(|o| o.contains("sunny"))
    );
    assert_eq!(types.last(), Some(&"finish"));
    // Two steps (the tool call, then the answer), each started and finished once, in order.
    let steps: Vec<&str> = types
        .iter()
        .copied()
        .filter(|t| t.ends_with("-step"))
        .collect();
    assert_eq!(
        steps,
        ["start-step", "finish-step", "start-step", "finish-step"],
        "{types:?}"
    );
    let first_step = types.iter().position(|t| *t == "start-step");
    let input_at = types.iter().position(|t| *t == "tool-input-available");
    let finished_at = types.iter().position(|t| *t == "finish-step");
    assert!(first_step < input_at && input_at < finished_at, "{types:?}");
    let text: String = chunks
        .iter()
        .filter(|c| c["type"] == "text-delta")
        .filter_map(|c| c["delta"].as_str())
        .collect();
    let (_, page) = app
        .get(&alice, &format!("/v1/threads/{thread}/messages"))
        .await;
    assert_eq!(
        text,
        page["messages"][1]["content"].as_str().expect("content")
    );

    // Every chunk's id resumes after exactly that chunk.
    let ids: Vec<String> = frames.iter().filter_map(|f| f.id.clone()).collect();
    for (at, id) in ids.iter().enumerate() {
        let response = get(thread.to_string(), Some(id.clone()), "ai-sdk")
            .await
            .expect("get");
        let rest: Vec<Value> = SseReader::new(response)
            .collect(TIMEOUT)
            .await
            .iter()
            .filter(|f| f.data != "[DONE]")
            .map(|f| f.json())
            .collect();
        let expected: Vec<Value> = frames
            .iter()
            .skip_while(|f| f.id.as_deref() != Some(id.as_str()))
            .skip(1)
            .filter(|f| f.data != "[DONE]")
            .map(|f| f.json())
            .collect();
        assert_eq!(rest, expected, "after {id} (chunk {at})");
    }

    // Misuse.
    let response = get(thread.to_string(), None, "xml").await.expect("get");
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["error"]["code"], "invalid_format");
    let response = get(thread.to_string(), Some("1-0/x".into()), "ai-sdk")
        .await
        .expect("get");
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    // A cursor Redis does not hold: one `error` chunk, then `[DONE]`.
    let response = get(thread.to_string(), Some("1-0".into()), "ai-sdk")
        .await
        .expect("get");
    let frames = SseReader::new(response).collect(TIMEOUT).await;
    assert_eq!(frames.len(), 2, "{frames:?}");
    assert_eq!(frames[0].json()["type"], "error");
    assert!(
        frames[0].json()["errorText"]
            .as_str()
            .is_some_and(|t| t.starts_with("stream_reset"))
    );
    app.stop().await;
}

/// A client that finished one message holds its `done` as cursor: with it, the thread's next
/// message streams (queued, streaming or over), as the native format follows it; after the
/// last message's `done` with nothing next, `204`.
#[tokio::test]
async fn the_previous_messages_done_as_cursor_follows_the_next_message() {
    let fake = FakeLlm::start(|_, n| match n {
        0 => spool_tests::fake_llm::text("first answer", 2),
        _ => spool_tests::fake_llm::paced_text(
            "the second answer",
            6,
            std::time::Duration::from_millis(150),
        ),
    })
    .await;
    let app = app_with(&fake).await;
    let agent = app
        .create_agent("acme", &json!({"name": "plain", "model": "gpt-4o-mini"}))
        .await;
    let alice = token("alice", "acme");
    let (thread, first) = ask(&app, &agent, "one").await;
    finished(&app, &first).await;
    let mut conn = spool_shared::redis_conn::connect(&spool_tests::redis_url()).expect("redis");
    let key = app.keys.events(spool_shared::ThreadId(thread));
    let done_of = |entries: &[spool_shared::stream::StoredEvent], message: &Value| {
        entries
            .iter()
            .find(|e| e.kind == "done" && Some(e.message_id.as_str()) == message.as_str())
            .map(|e| e.id.to_string())
            .expect("done")
    };
    let entries = read_after(&mut conn, &key, EntryId::default(), 1000)
        .await
        .expect("xrange");
    let first_done = done_of(&entries, &first["message_id"]);

    let (status, second) = app
        .post(
            &alice,
            &format!("/v1/threads/{thread}/user_message"),
            &json!({"input_text": "two", "agent_id": agent}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{second}");
    let stream = |cursor: String| {
        app.http
            .get(app.url(&format!("/v1/threads/{thread}/stream?format=ai-sdk")))
            .bearer_auth(&alice)
            .header("Last-Event-ID", cursor)
            .send()
    };
    let response = stream(first_done.clone()).await.expect("get");
    assert_eq!(response.status(), StatusCode::OK);
    let frames = SseReader::new(response).collect(TIMEOUT).await;
    assert_eq!(frames.last().map(|f| f.data.as_str()), Some("[DONE]"));
    let chunks: Vec<Value> = frames[..frames.len() - 1]
        .iter()
        .map(|f| f.json())
        .collect();
    assert_eq!(chunks[0]["type"], "start", "{chunks:?}");
    assert_eq!(chunks[0]["messageId"], second["message_id"]);
    let text: String = chunks
        .iter()
        .filter(|c| c["type"] == "text-delta")
        .filter_map(|c| c["delta"].as_str())
        .collect();
    assert_eq!(text, "the second answer");
    assert_eq!(
        chunks.last().map(|c| c["type"].clone()),
        Some(json!("finish"))
    );

    // Once it is over, its chunks are replayed from the first message's `done`, and after its
    // own `done` nothing follows.
    finished(&app, &second).await;
    let response = stream(first_done).await.expect("get");
    let again = SseReader::new(response).collect(TIMEOUT).await;
    assert_eq!(again.len(), frames.len(), "{again:?}");
    let entries = read_after(&mut conn, &key, EntryId::default(), 1000)
        .await
        .expect("xrange");
    let response = stream(done_of(&entries, &second["message_id"]))
        .await
        .expect("get");
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    app.stop().await;
}
