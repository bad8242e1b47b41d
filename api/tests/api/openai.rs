//! The OpenAI-compatible routes' answers match the schemas the document gives them: a response
//! whose agent calls a tool (stream events, the stored object), a failed one, chat completions
//! (whole and streamed), the models. The official SDK's own test is in `tests/tests/e2e/openai.rs`.

use reqwest::StatusCode;
use serde_json::{Value, json};

use spool_tests::conform::Conformance;
use spool_tests::fake_llm::{FakeLlm, Reply, weather_then_echo};
use spool_tests::sse::SseReader;
use spool_tests::token;
use spool_tests::tools::{Tools, http_tool};

use crate::common::{TIMEOUT, TestApp, app_with};
use crate::openapi::check;

/// The app, with the test's requests going through a [`Conformance`] proxy that checks every
/// answer against OpenAI's own document (`conform.check()` at the end).
async fn conforming(app: &mut TestApp) -> Conformance {
    let conform = Conformance::start(&app.base).await;
    app.base = conform.base.clone();
    conform
}

#[tokio::test]
async fn answers_match_their_documented_schemas_and_tool_steps_are_function_call_items() {
    let weather = weather_then_echo();
    let fake = FakeLlm::start(move |request, n| {
        if request["model"] == "broken" {
            return Reply::Status(400, "no such model".into(), None);
        }
        weather(request, n)
    })
    .await;
    let (tools, base) = Tools::start().await;
    let mut app = app_with(&fake).await;
    let conform = conforming(&mut app).await;
    let document: Value = app.openapi_document().await;
    let agent = app
        .create_agent(
            "acme",
            &json!({"name": "weatherman", "model": "gpt-4o-mini",
                "tools": [http_tool("get_weather", format!("{base}/weather"))]}),
        )
        .await;
    let alice = token("alice", "acme");

    // Streamed on the POST, by the agent's name.
    let response = app
        .http
        .post(app.url("/v1/responses"))
        .bearer_auth(&alice)
        .json(
            &json!({"model": "weatherman", "input": "weather in Paris?", "stream": true,
            "temperature": 0.3, "store": false, "tools": []}),
        )
        .send()
        .await
        .expect("create");
    assert_eq!(response.status(), StatusCode::OK);
    let mut reader = SseReader::new(response);
    let frames = reader.collect(TIMEOUT).await;
    assert!(reader.closed);
    for frame in &frames {
        assert_eq!(frame.event, frame.json()["type"], "event: is the type");
        check(&document, "ResponseStreamEvent", &frame.json());
    }
    let events: Vec<Value> = frames.iter().map(spool_tests::sse::Frame::json).collect();
    let types: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(types.first(), Some(&"response.created"));
    assert_eq!(types.last(), Some(&"response.completed"));
    let call = events
        .iter()
        .find(|e| e["type"] == "response.function_call_arguments.done")
        .expect("the tool call is a function_call item");
    assert_eq!(call["name"], "get_weather");
    let completed = events.last().expect("completed")["response"].clone();
    check(&document, "ResponseObject", &completed);
    let output = completed["output"].as_array().expect("output");
    let function_call = output
        .iter()
        .find(|item| item["type"] == "function_call")
        .expect("function_call in output");
    assert_eq!(function_call["status"], "completed");
    assert!(
        function_call["output"]
            .as_str()
            .is_some_and(|o| o.contains("sunny in Paris")),
        "{function_call}"
    );
    assert_eq!(tools.calls().len(), 1, "the tool ran once, server-side");
    // The stored response is the one the stream ended with; its item ids are the stream's.
    let id = completed["id"].as_str().expect("id");
    let (status, stored) = app.get(&alice, &format!("/v1/responses/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    check(&document, "ResponseObject", &stored);
    assert_eq!(stored["output"], completed["output"]);
    let streamed_ids: Vec<Value> = events
        .iter()
        .filter(|e| e["type"] == "response.output_item.done")
        .map(|e| e["item"]["id"].clone())
        .collect();
    let stored_ids: Vec<Value> = output.iter().map(|item| item["id"].clone()).collect();
    assert_eq!(streamed_ids, stored_ids);

    // A failed run: `failed` with the run's error; as a chat completion, a 502.
    let broken = app
        .create_agent("acme", &json!({"name": "broken", "model": "broken"}))
        .await;
    let (status, failed) = app
        .post(
            &alice,
            "/v1/responses",
            &json!({"model": broken, "input": "hi"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(failed["status"], "failed", "{failed}");
    check(&document, "ResponseObject", &failed);
    let (status, error) = app
        .post(
            &alice,
            "/v1/chat/completions",
            &json!({"model": broken, "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    check(&document, "OpenAiErrorBody", &error);

    // Chat completions, whole and streamed.
    let body = json!({"model": agent, "messages": [{"role": "user", "content": "weather?"}]});
    let (status, completion) = app.post(&alice, "/v1/chat/completions", &body).await;
    assert_eq!(status, StatusCode::OK, "{completion}");
    check(&document, "ChatCompletion", &completion);
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let response = app
        .http
        .post(app.url("/v1/chat/completions"))
        .bearer_auth(&alice)
        .json(&streamed)
        .send()
        .await
        .expect("stream");
    let mut reader = SseReader::new(response);
    let frames = reader.collect(TIMEOUT).await;
    assert_eq!(frames.last().map(|f| f.data.as_str()), Some("[DONE]"));
    let mut text = String::new();
    for frame in &frames[..frames.len() - 1] {
        check(&document, "ChatCompletionChunk", &frame.json());
        text.push_str(
            frame.json()["choices"][0]["delta"]["content"]
                .as_str()
                .unwrap_or(""),
        );
    }
    assert_eq!(text, completion["choices"][0]["message"]["content"]);

    let (status, models) = app.get(&alice, "/v1/models").await;
    assert_eq!(status, StatusCode::OK);
    check(&document, "ModelList", &models);
    let ids: Vec<&str> = models["data"]
        .as_array()
        .expect("data")
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert!(
        ids.contains(&"spool-default") && ids.contains(&agent.as_str()),
        "{ids:?}"
    );
    // Another tenant neither sees nor uses these agents.
    let mallory = token("mallory", "evil");
    let (status, error) = app
        .post(
            &mallory,
            "/v1/responses",
            &json!({"model": agent, "input": "hi"}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(error["error"]["code"], "model_not_found");
    check(&document, "OpenAiErrorBody", &error);
    let (status, _) = app.get(&mallory, &format!("/v1/responses/{id}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    app.stop().await;
    conform.check();
}

#[tokio::test]
async fn a_client_tool_call_ends_a_completion_and_too_many_turns_are_clear_errors() {
    use spool_tests::fake_llm::{self, tool_results_in};

    let fake = FakeLlm::start(|request, _| match tool_results_in(request) {
        0 => fake_llm::tool_calls(&[("c1", "read_file", r#"{"path": "/a"}"#)]),
        _ => fake_llm::text("Read it.", 2),
    })
    .await;
    let mut app = app_with(&fake).await;
    let conform = conforming(&mut app).await;
    let reader = app
        .create_agent(
            "acme",
            &json!({"name": "reader", "model": "gpt-4o-mini",
                "tools": [{"type": "client", "name": "read_file"}]}),
        )
        .await;
    let alice = token("alice", "acme");
    let ask = json!({"model": reader, "messages": [{"role": "user", "content": "read /a"}]});

    // A client tool's call ends the completion with it (the run waits): `tool_calls`.
    let (status, completion) = app.post(&alice, "/v1/chat/completions", &ask).await;
    assert_eq!(status, StatusCode::OK, "{completion}");
    let choice = &completion["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{completion}");
    assert_eq!(
        choice["message"]["tool_calls"][0]["id"], "c1",
        "{completion}"
    );
    assert_eq!(
        choice["message"]["tool_calls"][0]["function"]["name"],
        "read_file"
    );
    let mut streamed = ask.clone();
    streamed["stream"] = json!(true);
    let response = app
        .http
        .post(app.url("/v1/chat/completions"))
        .bearer_auth(&alice)
        .json(&streamed)
        .send()
        .await
        .expect("stream");
    let mut reader = SseReader::new(response);
    let frames = reader.collect(TIMEOUT).await;
    assert!(reader.closed, "the stream ends");
    let data: Vec<String> = frames.iter().map(|f| f.data.clone()).collect();
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{data:?}");
    let finish = frames
        .iter()
        .filter(|f| f.data != "[DONE]")
        .filter_map(|f| {
            f.json()["choices"][0]["finish_reason"]
                .as_str()
                .map(str::to_owned)
        })
        .collect::<Vec<_>>();
    assert_eq!(finish, ["tool_calls"], "{data:?}");

    // More earlier turns than a message may bring: 400, nothing stored.
    let (_, before) = app.get(&alice, "/v1/threads").await;
    let mut messages: Vec<Value> = (0..101)
        .map(|i| json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": "x"}))
        .collect();
    messages.push(json!({"role": "user", "content": "and?"}));
    let (status, error) = app
        .post(
            &alice,
            "/v1/chat/completions",
            &json!({"model": "spool-default", "messages": messages}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    assert_eq!(error["error"]["code"], "too_many_turns");
    let (_, after) = app.get(&alice, "/v1/threads").await;
    assert_eq!(before["data"], after["data"], "no thread was created");
    app.stop().await;
    conform.check();
}

#[tokio::test]
async fn metadata_a_streamed_failure_and_a_chat_on_a_named_thread() {
    let fake = FakeLlm::start(|request, _| {
        if request["model"] == "broken" {
            return Reply::Status(400, "no such model".into(), None);
        }
        spool_tests::fake_llm::text("Hello there, friend.", 3)
    })
    .await;
    let mut app = app_with(&fake).await;
    let conform = conforming(&mut app).await;
    let document: Value = app.openapi_document().await;
    app.create_agent("acme", &json!({"name": "greeter", "model": "gpt-4o-mini"}))
        .await;
    let broken = app
        .create_agent("acme", &json!({"name": "broken", "model": "broken"}))
        .await;
    let alice = token("alice", "acme");

    // `metadata` comes back on the answer and on the stored response; `reasoning` (which the
    // SDKs may send) is accepted and ignored.
    let (status, answered) = app
        .post(
            &alice,
            "/v1/responses",
            &json!({"model": "greeter", "input": "hi", "metadata": {"order": "A-17"},
                "reasoning": {"effort": "low"}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{answered}");
    assert_eq!(answered["status"], "completed", "{answered}");
    assert_eq!(answered["metadata"]["order"], "A-17", "{answered}");
    let id = answered["id"].as_str().expect("id");
    let (_, stored) = app.get(&alice, &format!("/v1/responses/{id}")).await;
    assert_eq!(stored["metadata"]["order"], "A-17", "{stored}");

    // Streamed: the text's deltas, then `output_text.done` with all of it.
    let stream = |model: String| {
        let (http, url, alice) = (app.http.clone(), app.url("/v1/responses"), alice.clone());
        async move {
            let response = http
                .post(url)
                .bearer_auth(&alice)
                .json(&json!({"model": model, "input": "hi", "stream": true}))
                .send()
                .await
                .expect("create");
            assert_eq!(response.status(), StatusCode::OK);
            let mut reader = SseReader::new(response);
            reader.collect(TIMEOUT).await
        }
    };
    let events: Vec<Value> = stream("greeter".into())
        .await
        .iter()
        .map(spool_tests::sse::Frame::json)
        .collect();
    let deltas: String = events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .filter_map(|e| e["delta"].as_str())
        .collect();
    let done = events
        .iter()
        .find(|e| e["type"] == "response.output_text.done")
        .expect("output_text.done");
    assert_eq!(done["text"], "Hello there, friend.", "{done}");
    assert_eq!(deltas, "Hello there, friend.");
    check(&document, "ResponseStreamEvent", done);

    // A run that fails ends its stream with `response.failed`, carrying the run's error.
    let frames = stream(broken).await;
    let last = frames.last().expect("events").json();
    assert_eq!(last["type"], "response.failed", "{last}");
    assert_eq!(last["response"]["status"], "failed", "{last}");
    assert!(last["response"]["error"]["message"].is_string(), "{last}");
    for frame in &frames {
        check(&document, "ResponseStreamEvent", &frame.json());
    }

    // A chat completion on the thread `metadata.thread_id` names: made on first use, it keeps
    // the conversation (Spool's own API shows it).
    let thread = uuid::Uuid::new_v4();
    let (status, completion) = app
        .post(
            &alice,
            "/v1/chat/completions",
            &json!({"model": "greeter", "metadata": {"thread_id": thread},
                "messages": [{"role": "user", "content": "remember me"}]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{completion}");
    let (status, messages) = app
        .get(&alice, &format!("/v1/threads/{thread}/messages"))
        .await;
    assert_eq!(status, StatusCode::OK, "{messages}");
    let contents: Vec<&str> = messages["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter_map(|m| m["content"].as_str())
        .collect();
    assert_eq!(
        contents,
        ["remember me", "Hello there, friend."],
        "{messages}"
    );
    let (status, error) = app
        .post(
            &alice,
            "/v1/chat/completions",
            &json!({"model": "greeter", "metadata": {"thread_id": "not-a-uuid"},
                "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    assert_eq!(error["error"]["code"], "invalid_thread_id", "{error}");
    check(&document, "OpenAiErrorBody", &error);
    app.stop().await;
    conform.check();
}

#[tokio::test]
async fn a_response_that_ended_before_its_events_were_published_streams_its_stored_end() {
    // No worker: the run's end is written here, as a worker writes it (Postgres first), and
    // its events never reach Redis (the worker died before publishing them).
    let mut app = crate::common::TestApp::start(0, crate::common::worker_args(5, 0)).await;
    let conform = conforming(&mut app).await;
    let alice = token("alice", "acme");
    let (status, queued) = app
        .post(
            &alice,
            "/v1/responses",
            &json!({"model": "spool-default", "input": "hi", "background": true}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{queued}");
    let id = queued["id"].as_str().expect("id").to_owned();
    sqlx::query(
        "UPDATE runs SET status = 'failed', finished_at = now(), updated_at = now(),
                error = '{\"code\": \"model_error\", \"message\": \"the provider failed\"}'
          WHERE id = $1::uuid",
    )
    .bind(&id)
    .execute(&app.db.pool)
    .await
    .expect("fail the run");
    // Within its flush window: followed (its events may still come), then, the stream quiet,
    // ended from what Postgres stored; not "no longer retained".
    let response = app
        .http
        .get(app.url(&format!("/v1/responses/{id}?stream=true")))
        .bearer_auth(&alice)
        .send()
        .await
        .expect("stream");
    assert_eq!(response.status(), StatusCode::OK);
    let mut reader = SseReader::new(response);
    let frames = reader.collect(TIMEOUT).await;
    let types: Vec<String> = frames
        .iter()
        .filter_map(|f| f.json()["type"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(
        types.last().map(String::as_str),
        Some("response.failed"),
        "{types:?}"
    );
    assert!(!types.iter().any(|t| t == "error"), "{types:?}");
    app.stop().await;
    conform.check();
}
