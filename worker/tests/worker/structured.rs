//! Structured output: an agent's `response_format` reaches the provider, the final answer is
//! held back until it validates (one repair round), is stored as the message's `output`, and a
//! run whose answer never validates fails with `invalid_output`.

use serde_json::{Value, json};

use spool_tests::fake_llm::{self, FakeLlm};

use crate::harness::Harness;

/// The last message the model was sent.
fn last_message(request: &Value) -> String {
    request["messages"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["content"].as_str())
        .unwrap_or("")
        .to_owned()
}

/// What the client saw of a thread's answer: its text deltas, joined.
async fn streamed(app: &Harness, thread: uuid::Uuid) -> String {
    app.events(thread)
        .await
        .iter()
        .filter(|e| e.event == "text_delta")
        .filter_map(|e| e.json()["data"]["delta"].as_str().map(str::to_owned))
        .collect()
}

fn extractor() -> Value {
    json!({"name": "extract", "model": "gpt-4o-mini",
           "tools": [{"type": "client", "name": "lookup"}],
           "response_format": {"type": "json_schema", "name": "city", "strict": true,
               "schema": {"type": "object", "required": ["city"],
                          "properties": {"city": {"type": "string"}}}}})
}

#[tokio::test]
async fn a_valid_answer_is_stored_as_output_and_a_prose_one_is_repaired_unseen() {
    // "direct": JSON at once (in a fence); "repair": prose, then JSON when told what is wrong.
    let fake = FakeLlm::start(|request, _| {
        let last = last_message(request);
        if last.contains("does not match the required JSON Schema") {
            fake_llm::text("{\"city\": \"Bergen\"}", 3)
        } else if last.contains("direct") {
            fake_llm::text("```json\n{\"city\": \"Oslo\"}\n```", 4)
        } else {
            fake_llm::text("The city is Bergen.", 3)
        }
    })
    .await;
    let app = Harness::start(&fake).await;
    let agent = app.create_agent(&extractor()).await;

    let (thread, accepted) = app.ask(&agent, "direct").await;
    assert_eq!(app.finished(&accepted).await["status"], "completed");
    let message = &app.messages(thread).await["messages"][1];
    assert_eq!(message["output"], json!({"city": "Oslo"}));
    assert_eq!(message["blocked"], false);
    assert_eq!(
        streamed(&app, thread).await,
        "```json\n{\"city\": \"Oslo\"}\n```"
    );
    let first = &fake.requests()[0];
    assert_eq!(
        first["response_format"],
        json!({"type": "json_schema", "json_schema": {"name": "city", "strict": true,
               "schema": extractor()["response_format"]["schema"]}})
    );

    let (thread, accepted) = app.ask(&agent, "where?").await;
    let run = app.finished(&accepted).await;
    assert_eq!(run["status"], "completed", "{run}");
    let message = &app.messages(thread).await["messages"][1];
    assert_eq!(message["output"], json!({"city": "Bergen"}));
    assert_eq!(message["content"], "{\"city\": \"Bergen\"}");
    assert_eq!(
        streamed(&app, thread).await,
        "{\"city\": \"Bergen\"}",
        "the prose that did not validate was never shown"
    );
    let requests = fake.requests();
    let repair = requests.last().expect("the repair call");
    assert!(repair["tools"].is_null(), "no tools in the repair round");
    let sent = repair["messages"].as_array().expect("messages");
    assert_eq!(sent[sent.len() - 2]["content"], "The city is Bergen.");
    let usage = &run["usage"];
    assert!(usage["output_tokens"].as_u64().unwrap_or(0) > 0, "{run}");
    let end = app
        .events(thread)
        .await
        .into_iter()
        .find(|e| e.event == "message_end")
        .expect("message_end");
    assert_eq!(end.json()["data"]["output"], json!({"city": "Bergen"}));
}

#[tokio::test]
async fn an_answer_that_never_validates_fails_the_run_with_invalid_output() {
    let fake = FakeLlm::start(|_, _| fake_llm::text("{\"town\": 3}", 2)).await;
    let app = Harness::start(&fake).await;
    let agent = app.create_agent(&extractor()).await;
    let (thread, accepted) = app.ask(&agent, "where?").await;
    let run = app.finished(&accepted).await;
    assert_eq!(run["status"], "failed");
    assert_eq!(run["error"]["code"], "invalid_output");
    let message = run["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("city"), "{message}");
    assert_eq!(fake.requests().len(), 2, "one repair round, no more");
    let stored = &app.messages(thread).await["messages"][1];
    assert!(stored["output"].is_null());
    assert_eq!(
        streamed(&app, thread).await,
        "",
        "nothing invalid was shown"
    );
}
