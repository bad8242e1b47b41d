//! The Anthropic Messages client against streams recorded from the live API (vendored with
//! their source), framed as the API frames them and served over HTTP, and against the failures
//! the API can produce (error statuses, overloads in the stream, a stream cut short).

use std::time::Duration;

use futures::StreamExt as _;
use serde_json::{Value, json};

use spool_tests::fake_llm::{self, FakeLlm, Reply};
use spool_worker::agent::llm::anthropic::AnthropicClient;
use spool_worker::agent::llm::{
    ChatChunk, ChatMessage, ChatModel, ChatRequest, ChatResponse, Choice, FinishReason, LlmError,
};

/// A recorded transcript's events.
fn recorded(name: &str) -> Vec<Value> {
    let path = format!(
        "{}/tests/fixtures/anthropic/vercel-ai_{name}.chunks.txt",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("one JSON event per line"))
        .collect()
}

fn request() -> ChatRequest {
    ChatRequest {
        model: "claude-sonnet-4-5".into(),
        messages: vec![
            ChatMessage::System {
                content: "Be brief.".into(),
            },
            ChatMessage::User {
                content: "Hello".into(),
            },
        ],
        tools: Vec::new(),
        tool_choice: Choice::Auto,
        temperature: None,
        top_p: None,
        reasoning_effort: None,
        max_output_tokens: Some(256),
        response_format: None,
        parallel_tool_calls: None,
    }
}

/// Streams one call against a fake answering `reply` at `/v1/messages`.
async fn call(reply: Reply) -> (Result<(Vec<String>, ChatResponse), LlmError>, FakeLlm) {
    let fake = FakeLlm::start(move |_, _| reply.clone()).await;
    let client = AnthropicClient::new(
        &fake.base_url,
        Some("sk-ant-test".into()),
        Duration::from_secs(5),
    )
    .expect("client");
    let result = async {
        let mut stream = client.stream(request()).await?;
        let mut deltas = Vec::new();
        while let Some(chunk) = stream.next().await {
            match chunk? {
                ChatChunk::Text(delta) => deltas.push(delta),
                ChatChunk::Done(response) => return Ok((deltas, response)),
            }
        }
        Err(LlmError::Incomplete)
    }
    .await;
    (result, fake)
}

#[tokio::test]
async fn a_recorded_text_answer_parses_to_its_deltas_usage_and_stop_reason() {
    let events = recorded("anthropic-text");
    let expected: String = events
        .iter()
        .filter_map(|e| e["delta"]["text"].as_str())
        .collect();
    let (result, fake) = call(fake_llm::anthropic_events(&events)).await;
    let (deltas, response) = result.expect("parses");
    assert_eq!(deltas.len(), 6, "delta by delta");
    assert_eq!(deltas.concat(), expected);
    assert_eq!(response.text, expected);
    assert!(response.text.starts_with("Hello! I'm doing well"));
    assert_eq!(response.finish_reason, FinishReason::Stop);
    assert!(response.tool_calls.is_empty());
    assert_eq!(
        (response.usage.input_tokens, response.usage.output_tokens),
        (12, 30)
    );
    let sent = &fake.requests()[0];
    assert_eq!(sent["system"], "Be brief.");
    assert_eq!(sent["max_tokens"], 256);
    assert_eq!(sent["stream"], true);
    assert_eq!(
        sent["messages"],
        json!([{"role": "user", "content": [{"type": "text", "text": "Hello"}]}])
    );
}

#[tokio::test]
async fn recorded_tool_use_assembles_text_then_calls_with_their_input() {
    let (result, _) = call(fake_llm::anthropic_events(&recorded(
        "anthropic-tool-no-args",
    )))
    .await;
    let (deltas, response) = result.expect("parses");
    assert_eq!(deltas.concat(), "I'll update the issue list for you.");
    assert_eq!(response.finish_reason, FinishReason::ToolCalls);
    assert_eq!(response.tool_calls.len(), 1);
    let used = &response.tool_calls[0];
    assert_eq!(
        (used.id.as_str(), used.name.as_str()),
        ("toolu_01QE1WLsSVp5hy5Q3GmGTmjP", "updateIssueList")
    );
    assert_eq!(used.arguments, "{}", "no input is an empty object");

    let (result, _) = call(fake_llm::anthropic_events(&recorded(
        "anthropic-json-tool.1",
    )))
    .await;
    let (deltas, response) = result.expect("parses");
    assert!(deltas.is_empty());
    let arguments: Value =
        serde_json::from_str(&response.tool_calls[0].arguments).expect("complete JSON");
    assert_eq!(arguments["elements"][0]["location"], "San Francisco");
    assert_eq!(
        (response.usage.input_tokens, response.usage.output_tokens),
        (849, 47)
    );
}

#[tokio::test]
async fn a_stream_cut_short_or_overloaded_is_retryable_and_a_bad_request_is_not() {
    let mut events = recorded("anthropic-text");
    events.pop(); // no message_stop
    let (result, _) = call(fake_llm::anthropic_events(&events)).await;
    assert_eq!(result.err(), Some(LlmError::Incomplete));

    let mut overloaded = recorded("anthropic-text")[..4].to_vec();
    overloaded.push(
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
    );
    let (result, _) = call(fake_llm::anthropic_events(&overloaded)).await;
    let err = result.expect_err("an error event");
    assert!(
        err.is_retryable() && err.to_string().contains("Overloaded"),
        "{err}"
    );

    let (result, _) = call(Reply::Status(529, "Overloaded".into(), Some("3".into()))).await;
    let err = result.expect_err("529");
    assert!(err.is_retryable());
    assert_eq!(err.retry_after(), Some(Duration::from_secs(3)));
    let (result, _) = call(Reply::Status(
        400,
        "max_tokens: must be positive".into(),
        None,
    ))
    .await;
    let err = result.expect_err("400");
    assert!(!err.is_retryable());
    assert!(
        err.to_string().contains("max_tokens: must be positive"),
        "{err}"
    );

    let (result, _) = call(Reply::Raw("event: message_start\ndata: {oops\n\n".into())).await;
    assert!(matches!(result, Err(LlmError::Protocol(_))), "{result:?}");
}
