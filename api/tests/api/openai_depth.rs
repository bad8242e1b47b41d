//! The OpenAI-compatible routes beyond the basics: sampling parameters reach the model calls,
//! a cancelled stream ends with an event OpenAI's document defines, conversation items one at
//! a time, and follow-ups under an `Idempotency-Key`.

use reqwest::StatusCode;
use serde_json::{Value, json};

use spool_tests::conform::Conformance;
use spool_tests::fake_llm::{self, FakeLlm, tool_results_in};
use spool_tests::token;

use crate::common::{TestApp, app_with};

/// The app, its answers checked against OpenAI's own document (`conform.check()` at the end).
async fn conforming(app: &mut TestApp) -> Conformance {
    let conform = Conformance::start(&app.base).await;
    app.base = conform.base.clone();
    conform
}

/// The sampling fields of the model call `request` (as the provider received it).
fn sampling_of(request: &Value) -> Value {
    json!({"temperature": request["temperature"], "top_p": request["top_p"],
        "max_tokens": request["max_tokens"], "reasoning_effort": request["reasoning_effort"]})
}

#[tokio::test]
async fn sampling_parameters_reach_every_model_call_and_are_echoed_truthfully() {
    let fake = FakeLlm::start(|request, _| {
        let asks_tool = request["tools"].as_array().is_some_and(|t| !t.is_empty());
        if asks_tool && tool_results_in(request) == 0 {
            return fake_llm::tool_calls(&[("c1", "lookup", "{}")]);
        }
        fake_llm::text("Done.", 2)
    })
    .await;
    let mut app = app_with(&fake).await;
    let conform = conforming(&mut app).await;
    app.create_agent(
        "acme",
        &json!({"name": "tuned", "model": "gpt-4o-mini", "temperature": 0.9,
            "limits": {"max_output_tokens": 500}}),
    )
    .await;
    let alice = token("alice", "acme");

    // Every setting reaches the model call, and the response shows what applied.
    let (status, response) = app
        .post(
            &alice,
            "/v1/responses",
            &json!({"model": "tuned", "input": "hi", "temperature": 0.2, "top_p": 0.5,
                "max_output_tokens": 300, "reasoning": {"effort": "low"}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{response}");
    assert_eq!(response["status"], "completed", "{response}");
    let call = fake.requests().last().cloned().expect("a model call");
    assert_eq!(
        sampling_of(&call),
        json!({"temperature": 0.2, "top_p": 0.5, "max_tokens": 300, "reasoning_effort": "low"})
    );
    for (field, value) in [
        ("temperature", json!(0.2)),
        ("top_p", json!(0.5)),
        ("max_output_tokens", json!(300)),
    ] {
        assert_eq!(response[field], value, "{field}: {response}");
    }
    assert_eq!(response["reasoning"]["effort"], "low", "{response}");
    let id = response["id"].as_str().expect("id");
    let (_, stored) = app.get(&alice, &format!("/v1/responses/{id}")).await;
    assert_eq!(stored["temperature"], 0.2, "{stored}");

    // Left out: the agent's own settings apply, and the response says so. A larger output
    // limit than the agent's is held to the agent's.
    let (status, response) = app
        .post(
            &alice,
            "/v1/responses",
            &json!({"model": "tuned", "input": "hi", "max_output_tokens": 4000}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{response}");
    let call = fake.requests().last().cloned().expect("a model call");
    assert_eq!(
        sampling_of(&call),
        json!({"temperature": 0.9, "top_p": null, "max_tokens": 500, "reasoning_effort": null})
    );
    assert_eq!(response["temperature"], 0.9, "{response}");
    assert_eq!(response["max_output_tokens"], 500, "{response}");

    // Chat Completions: `max_completion_tokens` (over `max_tokens`) and `reasoning_effort`.
    let (status, completion) = app
        .post(
            &alice,
            "/v1/chat/completions",
            &json!({"model": "tuned", "messages": [{"role": "user", "content": "hi"}],
                "temperature": 1.5, "top_p": 0.25, "max_tokens": 50,
                "max_completion_tokens": 60, "reasoning_effort": "high"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{completion}");
    let call = fake.requests().last().cloned().expect("a model call");
    assert_eq!(
        sampling_of(&call),
        json!({"temperature": 1.5, "top_p": 0.25, "max_tokens": 60, "reasoning_effort": "high"})
    );

    // A function call's follow-up: the run's settings last, and the follow-up's apply to the
    // rest of the run.
    let tools = json!([{"type": "function", "name": "lookup",
        "parameters": {"type": "object", "properties": {}}}]);
    let (status, first) = app
        .post(
            &alice,
            "/v1/responses",
            &json!({"model": "tuned", "input": "look it up", "tools": tools, "top_p": 0.4}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(first["output"][0]["type"], "function_call", "{first}");
    let (status, second) = app
        .post(
            &alice,
            "/v1/responses",
            &json!({"model": "tuned", "previous_response_id": first["id"], "tools": tools,
                "temperature": 0.1, "input": [{"type": "function_call_output",
                "call_id": "c1", "output": "42"}]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{second}");
    assert_eq!(second["status"], "completed", "{second}");
    let call = fake.requests().last().cloned().expect("a model call");
    assert_eq!(tool_results_in(&call), 1, "the call after the output");
    assert_eq!(
        (call["temperature"].clone(), call["top_p"].clone()),
        (json!(0.1), json!(0.4))
    );

    // Out of range, or a reasoning summary Spool cannot give: 400 naming it, no model call.
    let calls = fake.requests().len();
    for (body, param) in [
        (json!({"temperature": 3}), "temperature"),
        (json!({"top_p": -0.5}), "top_p"),
        (json!({"max_output_tokens": 0}), "max_output_tokens"),
        (
            json!({"reasoning": {"effort": "extreme"}}),
            "reasoning.effort",
        ),
        (
            json!({"reasoning": {"summary": "auto"}}),
            "reasoning.summary",
        ),
    ] {
        let mut request = json!({"model": "tuned", "input": "hi"});
        request
            .as_object_mut()
            .expect("object")
            .extend(body.as_object().expect("object").clone());
        let (status, error) = app.post(&alice, "/v1/responses", &request).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{param}: {error}");
        assert_eq!(error["error"]["param"], param, "{error}");
    }
    let (status, error) = app
        .post(
            &alice,
            "/v1/chat/completions",
            &json!({"model": "tuned", "messages": [{"role": "user", "content": "hi"}],
                "max_completion_tokens": 1.5}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    assert_eq!(error["error"]["param"], "max_completion_tokens", "{error}");
    assert_eq!(fake.requests().len(), calls, "nothing ran");
    app.stop().await;
    conform.check();
}

#[tokio::test]
async fn a_cancelled_stream_ends_with_response_failed_whose_status_says_cancelled() {
    let gap = std::time::Duration::from_millis(200);
    let fake =
        FakeLlm::start(move |_, _| fake_llm::paced_text(&"word ".repeat(100), 100, gap)).await;
    let mut app = app_with(&fake).await;
    let conform = conforming(&mut app).await;
    let document: Value = app.openapi_document().await;
    app.create_agent("acme", &json!({"name": "slow", "model": "gpt-4o-mini"}))
        .await;
    let alice = token("alice", "acme");
    let response = app
        .http
        .post(app.url("/v1/responses"))
        .bearer_auth(&alice)
        .json(&json!({"model": "slow", "input": "talk", "stream": true}))
        .send()
        .await
        .expect("stream");
    assert_eq!(response.status(), StatusCode::OK);
    let mut reader = spool_tests::sse::SseReader::new(response);
    let mut events = Vec::new();
    // The answer has begun: cancel it.
    while let Some(frame) = reader.next(crate::common::TIMEOUT).await {
        let event = frame.json();
        events.push(event.clone());
        if event["type"] == "response.output_text.delta" {
            break;
        }
    }
    let id = events[0]["response"]["id"].as_str().expect("id").to_owned();
    let (status, cancelled) = app
        .post(&alice, &format!("/v1/responses/{id}/cancel"), &json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{cancelled}");
    events.extend(
        reader
            .collect(crate::common::TIMEOUT)
            .await
            .iter()
            .map(spool_tests::sse::Frame::json),
    );
    assert!(reader.closed, "the stream ends");
    let last = events.last().expect("events");
    // OpenAI's document defines no `response.cancelled`: the terminal event is
    // `response.failed`, its response `cancelled`.
    assert_eq!(last["type"], "response.failed", "{last}");
    assert_eq!(last["response"]["status"], "cancelled", "{last}");
    let types: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert!(!types.contains(&"response.cancelled"), "{types:?}");
    for event in &events {
        crate::openapi::check(&document, "ResponseStreamEvent", event);
    }
    let (_, stored) = app.get(&alice, &format!("/v1/responses/{id}")).await;
    assert_eq!(stored["status"], "cancelled", "{stored}");
    app.stop().await;
    conform.check();
}

#[tokio::test]
async fn a_conversation_item_is_read_and_deleted_by_its_owner_only() {
    let fake = FakeLlm::start(|_, _| fake_llm::text("Noted.", 2)).await;
    let mut app = app_with(&fake).await;
    let conform = conforming(&mut app).await;
    app.create_agent("acme", &json!({"name": "notes", "model": "gpt-4o-mini"}))
        .await;
    let alice = token("alice", "acme");
    let (status, conversation) = app
        .post(
            &alice,
            "/v1/conversations",
            &json!({"items": [{"role": "user", "content": "My code is 7341."},
                {"role": "assistant", "content": "Got it."}]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{conversation}");
    let conv = conversation["id"].as_str().expect("id").to_owned();
    let (_, items) = app
        .get(&alice, &format!("/v1/conversations/{conv}/items?order=asc"))
        .await;
    let ids: Vec<String> = items["data"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| i["id"].as_str().expect("id").to_owned())
        .collect();
    assert_eq!(ids.len(), 2, "{items}");
    let secret = format!("/v1/conversations/{conv}/items/{}", ids[0]);

    // Its owner reads one item.
    let (status, item) = app.get(&alice, &secret).await;
    assert_eq!(status, StatusCode::OK, "{item}");
    assert_eq!(item, items["data"][0], "the item as the list shows it");

    // Another tenant, or another user of the tenant: 404 in OpenAI's shape, nothing deleted.
    let delete = |token: String, path: String| {
        let (http, url) = (app.http.clone(), app.url(&path));
        async move {
            let response = http
                .delete(url)
                .bearer_auth(token)
                .send()
                .await
                .expect("delete");
            let status = response.status();
            (status, response.json::<Value>().await.expect("json"))
        }
    };
    for other in [token("mallory", "globex"), token("bob", "acme")] {
        let (status, error) = app.get(&other, &secret).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{error}");
        assert_eq!(error["error"]["code"], "conversation_not_found", "{error}");
        assert!(error["error"]["message"].is_string(), "{error}");
        let (status, error) = delete(other.clone(), secret.clone()).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{error}");
        assert_eq!(error["error"]["code"], "conversation_not_found", "{error}");
    }
    let (status, _) = app.get(&alice, &secret).await;
    assert_eq!(status, StatusCode::OK);
    let (status, error) = app
        .get(&alice, &format!("/v1/conversations/{conv}/items/msg_nope"))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{error}");
    assert_eq!(error["error"]["code"], "item_not_found", "{error}");

    // Deleted: the conversation comes back; the item is gone from it and from what the next
    // response's model call is given.
    let (status, answer) = delete(alice.clone(), secret.clone()).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["id"], conv.as_str(), "{answer}");
    assert_eq!(answer["object"], "conversation", "{answer}");
    let (status, error) = app.get(&alice, &secret).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{error}");
    assert_eq!(error["error"]["code"], "item_not_found", "{error}");
    let (status, error) = delete(alice.clone(), secret.clone()).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "deleted once: {error}");
    let (_, items) = app
        .get(&alice, &format!("/v1/conversations/{conv}/items"))
        .await;
    let left: Vec<&str> = items["data"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|i| i["id"].as_str())
        .collect();
    assert_eq!(left, [ids[1].as_str()], "{items}");
    let (status, response) = app
        .post(
            &alice,
            "/v1/responses",
            &json!({"model": "notes", "conversation": conv, "input": "What was my code?"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{response}");
    let call = fake.requests().last().cloned().expect("a model call");
    let prompt = call["messages"].to_string();
    assert!(
        !prompt.contains("7341"),
        "the deleted item is not replayed: {prompt}"
    );
    assert!(prompt.contains("Got it."), "the other item is: {prompt}");
    app.stop().await;
    conform.check();
}

#[tokio::test]
async fn a_follow_up_resent_with_its_idempotency_key_answers_nothing_twice() {
    let fake = FakeLlm::start(|request, _| match tool_results_in(request) {
        0 => fake_llm::tool_calls(&[("c1", "lookup", "{}")]),
        _ => fake_llm::text("The answer is 42.", 2),
    })
    .await;
    let mut app = app_with(&fake).await;
    let conform = conforming(&mut app).await;
    app.create_agent("acme", &json!({"name": "asker", "model": "gpt-4o-mini"}))
        .await;
    let alice = token("alice", "acme");
    let post_keyed = |path: &'static str, key: &'static str, body: Value| {
        let (http, url, alice) = (app.http.clone(), app.url(path), alice.clone());
        async move {
            let response = http
                .post(url)
                .bearer_auth(alice)
                .header("Idempotency-Key", key)
                .json(&body)
                .send()
                .await
                .expect("post");
            let status = response.status();
            (status, response.json::<Value>().await.expect("json"))
        }
    };

    // Responses: a follow-up, then the same follow-up again with its key.
    let tools = json!([{"type": "function", "name": "lookup",
        "parameters": {"type": "object", "properties": {}}}]);
    let (status, first) = app
        .post(
            &alice,
            "/v1/responses",
            &json!({"model": "asker", "input": "look it up", "tools": tools}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let follow_up = json!({"model": "asker", "previous_response_id": first["id"],
        "tools": tools, "input": [{"type": "function_call_output", "call_id": "c1",
        "output": "42"}]});
    let (status, answered) = post_keyed("/v1/responses", "fu-1", follow_up.clone()).await;
    assert_eq!(status, StatusCode::OK, "{answered}");
    assert_eq!(answered["status"], "completed", "{answered}");
    let calls = fake.requests().len();
    let (status, again) = post_keyed("/v1/responses", "fu-1", follow_up.clone()).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(
        again["id"], answered["id"],
        "the first follow-up's response"
    );
    assert_eq!(again["output"], answered["output"]);
    assert_eq!(fake.requests().len(), calls, "no model call for the retry");
    // The key with another request: refused, in OpenAI's shape.
    let mut other = follow_up.clone();
    other["input"][0]["output"] = json!("43");
    let (status, error) = post_keyed("/v1/responses", "fu-1", other).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{error}");
    assert_eq!(error["error"]["code"], "idempotency_key_reused", "{error}");
    // Without a key, the outputs answer nothing any more.
    let (status, error) = app.post(&alice, "/v1/responses", &follow_up).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    assert_eq!(error["error"]["code"], "no_pending_call", "{error}");

    // Chat Completions: the same follow-up sent twice at once with one key continues the run
    // once; both get its completion.
    let ask = json!({"model": "asker", "tools": [{"type": "function", "function": {
        "name": "lookup", "parameters": {"type": "object", "properties": {}}}}],
        "messages": [{"role": "user", "content": "look it up"}]});
    let (status, completion) = app.post(&alice, "/v1/chat/completions", &ask).await;
    assert_eq!(status, StatusCode::OK, "{completion}");
    assert_eq!(completion["choices"][0]["finish_reason"], "tool_calls");
    let mut answer = ask.clone();
    let messages = answer["messages"].as_array_mut().expect("messages");
    messages.push(completion["choices"][0]["message"].clone());
    messages.push(json!({"role": "tool", "tool_call_id": "c1", "content": "42"}));
    let calls = fake.requests().len();
    let (one, two) = tokio::join!(
        post_keyed("/v1/chat/completions", "fu-2", answer.clone()),
        post_keyed("/v1/chat/completions", "fu-2", answer.clone()),
    );
    assert_eq!(
        (one.0, two.0),
        (StatusCode::OK, StatusCode::OK),
        "{one:?} {two:?}"
    );
    assert_eq!(one.1["id"], two.1["id"], "one completion");
    assert_eq!(
        one.1["choices"][0]["message"]["content"], "The answer is 42.",
        "{one:?}"
    );
    assert_eq!(fake.requests().len(), calls + 1, "one model call for both");
    app.stop().await;
    conform.check();
}
