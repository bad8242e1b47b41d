//! Citations from the answer in every format a client reads: the native `citations` event and
//! the stored message, the AI SDK's `source-url` chunks, and `url_citation` annotations on the
//! OpenAI-compatible routes (Responses objects, streamed and stored; Chat Completions; the
//! conversation's items), each checked against OpenAI's own document. A retrieval tool on a
//! local server answers chunks; the fake model cites `[2]`, then `[1]`, then a number no chunk
//! has.

use reqwest::StatusCode;
use serde_json::{Value, json};

use spool_shared::stream::{EntryId, read_after};
use spool_tests::conform::Conformance;
use spool_tests::fake_llm::{FakeLlm, search_then_answer};
use spool_tests::sse::SseReader;
use spool_tests::token;
use spool_tests::tools::{SEARCH_CHUNKS, Tools, http_tool};

use crate::common::{TIMEOUT, app_with, ask, finished};
use crate::openapi::check;

/// `[2]` at characters 24..27, `[1]` at 53..56, `[2]` again at 69..72; `[7]` names no chunk.
const ANSWER: &str = "Ships leave before dusk [2]; the tide peaks at 06:12 [1]. Plan ahead [2], \
                      not by [7].";

/// The `url_citation` annotations ANSWER gives, in Responses' shape.
fn annotations() -> Value {
    let (tides, harbour) = (SEARCH_CHUNKS[0], SEARCH_CHUNKS[1]);
    let at = |start: usize, (_, title, url, _): (&str, &str, &str, &str)| {
        json!({"type": "url_citation", "start_index": start, "end_index": start + 3,
            "url": url, "title": title})
    };
    json!([at(24, harbour), at(53, tides), at(69, harbour)])
}

#[tokio::test]
async fn citations_reach_the_ai_sdk_and_the_openai_formats() {
    let fake = FakeLlm::start(search_then_answer(ANSWER)).await;
    let (_tools, base) = Tools::start().await;
    let mut app = app_with(&fake).await;
    let conform = Conformance::start(&app.base).await;
    app.base = conform.base.clone();
    let document: Value = app.openapi_document().await;
    let agent = app
        .create_agent(
            "acme",
            &json!({"name": "librarian", "model": "gpt-4o-mini",
                "tools": [http_tool("search", format!("{base}/search"))]}),
        )
        .await;
    let alice = token("alice", "acme");

    // Native: the event, then the AI SDK's chunks of the same run.
    let (thread, accepted) = ask(&app, &agent, "When can I sail?").await;
    let run = finished(&app, &accepted).await;
    assert_eq!(run["status"], "completed", "{run}");
    let mut conn = spool_shared::redis_conn::connect(&spool_tests::redis_url()).expect("redis");
    let entries = read_after(
        &mut conn,
        &app.keys.events(spool_shared::ThreadId(thread)),
        EntryId::default(),
        1000,
    )
    .await
    .expect("xrange");
    let event = entries
        .iter()
        .find(|e| e.kind == "citations")
        .map(|e| serde_json::from_str::<Value>(&e.json).expect("json"))
        .expect("a citations event");
    check(&document, "StreamEnvelope", &event);
    let citations = &event["data"]["citations"];
    assert_eq!(citations.as_array().map(Vec::len), Some(2), "{citations}");
    assert_eq!(citations[0]["chunk_id"], "harbour");
    assert_eq!(
        citations[0]["spans"],
        json!([{"start": 24, "end": 27}, {"start": 69, "end": 72}])
    );
    assert_eq!(citations[1]["chunk_id"], "tides");
    let start = entries
        .iter()
        .find(|e| e.kind == "message_start")
        .expect("message_start");
    let response = app
        .http
        .get(app.url(&format!("/v1/threads/{thread}/stream?format=ai-sdk")))
        .bearer_auth(&alice)
        .header("Last-Event-ID", start.id.to_string())
        .send()
        .await
        .expect("ai-sdk");
    assert_eq!(response.status(), StatusCode::OK);
    let frames = SseReader::new(response).collect(TIMEOUT).await;
    let sources: Vec<Value> = frames
        .iter()
        .filter(|f| f.data != "[DONE]")
        .map(spool_tests::sse::Frame::json)
        .filter(|c| c["type"].as_str().is_some_and(|t| t.starts_with("source-")))
        .collect();
    assert_eq!(sources.len(), 2, "{sources:?}");
    assert_eq!(
        (
            &sources[0]["type"],
            &sources[0]["sourceId"],
            &sources[0]["url"]
        ),
        (
            &json!("source-url"),
            &json!("harbour"),
            &json!(SEARCH_CHUNKS[1].2)
        )
    );
    assert_eq!(sources[0]["title"], SEARCH_CHUNKS[1].1);
    assert_eq!(sources[0]["providerMetadata"]["spool"]["index"], 1);
    assert_eq!(sources[1]["sourceId"], "tides");

    // Responses: the answer's `output_text` carries the annotations, stored and streamed.
    let (status, conversation) = app.post(&alice, "/v1/conversations", &json!({})).await;
    assert_eq!(status, StatusCode::OK, "{conversation}");
    let conversation = conversation["id"].as_str().expect("id").to_owned();
    let (status, response) = app
        .post(
            &alice,
            "/v1/responses",
            &json!({"model": "librarian", "input": "When can I sail?",
                "conversation": conversation}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{response}");
    check(&document, "ResponseObject", &response);
    let text = response["output"]
        .as_array()
        .and_then(|items| items.iter().find(|i| i["type"] == "message"))
        .map(|item| item["content"][0].clone())
        .expect("a message");
    assert_eq!(text["text"], ANSWER);
    assert_eq!(text["annotations"], annotations());
    let id = response["id"].as_str().expect("id");
    let (_, stored) = app.get(&alice, &format!("/v1/responses/{id}")).await;
    assert_eq!(stored["output"], response["output"]);
    let streamed = app
        .http
        .get(app.url(&format!("/v1/responses/{id}?stream=true")))
        .bearer_auth(&alice)
        .send()
        .await
        .expect("stream");
    let frames = SseReader::new(streamed).collect(TIMEOUT).await;
    let completed = frames
        .iter()
        .map(spool_tests::sse::Frame::json)
        .find(|e| e["type"] == "response.completed")
        .expect("response.completed");
    assert_eq!(completed["response"]["output"], response["output"]);
    // The conversation's item of the answer too.
    let (status, items) = app
        .get(&alice, &format!("/v1/conversations/{conversation}/items"))
        .await;
    assert_eq!(status, StatusCode::OK, "{items}");
    let answer = items["data"]
        .as_array()
        .and_then(|items| items.iter().find(|i| i["role"] == "assistant"))
        .expect("the answer's item");
    assert_eq!(answer["content"][0]["annotations"], annotations());

    // Chat Completions: the message's annotations, in its content.
    let (status, completion) = app
        .post(
            &alice,
            "/v1/chat/completions",
            &json!({"model": "librarian",
                "messages": [{"role": "user", "content": "When can I sail?"}]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{completion}");
    check(&document, "ChatCompletion", &completion);
    let message = &completion["choices"][0]["message"];
    assert_eq!(message["content"], ANSWER);
    let expected: Vec<Value> = annotations()
        .as_array()
        .expect("annotations")
        .iter()
        .map(|a| {
            json!({"type": "url_citation", "url_citation": {"start_index": a["start_index"],
                "end_index": a["end_index"], "url": a["url"], "title": a["title"]}})
        })
        .collect();
    assert_eq!(message["annotations"], json!(expected));
    app.stop().await;
    conform.check();
}
