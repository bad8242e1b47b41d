//! The OpenAI-compatible client against real recorded OpenAI transcripts, served byte for byte
//! by a local HTTP server, and against the failures a provider can produce.

use std::time::Duration;

use futures::StreamExt as _;
use serde_json::Value;

use spool_tests::fake_llm::{FakeLlm, Reply};
use spool_worker::agent::llm::openai::OpenAiClient;
use spool_worker::agent::llm::{
    ChatChunk, ChatMessage, ChatModel, ChatRequest, ChatResponse, Choice, FinishReason, LlmError,
};

fn fixture(name: &str) -> String {
    let path = format!(
        "{}/tests/fixtures/openai/openai-python_{name}.sse",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn request() -> ChatRequest {
    ChatRequest {
        model: "gpt-4o".into(),
        messages: vec![ChatMessage::User {
            content: "What's the weather?".into(),
        }],
        tools: Vec::new(),
        tool_choice: Choice::Auto,
        temperature: None,
        top_p: None,
        reasoning_effort: None,
        max_output_tokens: None,
        response_format: None,
        parallel_tool_calls: None,
    }
}

/// Streams one call; returns the text deltas and the final response, or the error.
async fn call(reply: Reply) -> Result<(Vec<String>, ChatResponse), LlmError> {
    let fake = FakeLlm::start(move |_, _| reply.clone()).await;
    let client = OpenAiClient::new(
        &fake.base_url,
        Some("sk-test".into()),
        Duration::from_secs(5),
    )
    .expect("client");
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

/// Choice 0's text as the transcript has it, read independently of the client.
fn expected_text(transcript: &str) -> String {
    transcript
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .flat_map(|c| c["choices"].as_array().cloned().unwrap_or_default())
        .filter(|c| c["index"] == 0)
        .map(|c| {
            let d = &c["delta"];
            format!(
                "{}{}",
                d["content"].as_str().unwrap_or(""),
                d["refusal"].as_str().unwrap_or("")
            )
        })
        .collect()
}

#[tokio::test]
async fn a_plain_text_transcript_parses_to_its_deltas_usage_and_finish_reason() {
    let transcript = fixture("text-stop-usage");
    let (deltas, response) = call(Reply::Raw(transcript.clone())).await.expect("parses");
    assert!(deltas.len() > 20, "delta by delta: {}", deltas.len());
    assert_eq!(deltas.concat(), expected_text(&transcript));
    assert!(
        response
            .text
            .starts_with("I'm unable to provide real-time weather updates.")
    );
    assert_eq!(response.text, deltas.concat());
    assert_eq!(response.finish_reason, FinishReason::Stop);
    assert!(response.tool_calls.is_empty());
    assert_eq!(
        (response.usage.input_tokens, response.usage.output_tokens),
        (14, 30)
    );
}

#[tokio::test]
async fn a_tool_call_transcript_assembles_the_call_from_its_fragments() {
    let (deltas, response) = call(Reply::Raw(fixture("tool-call-get-weather")))
        .await
        .expect("parses");
    assert!(deltas.is_empty());
    assert_eq!(response.finish_reason, FinishReason::ToolCalls);
    assert_eq!(response.tool_calls.len(), 1);
    let call = &response.tool_calls[0];
    assert_eq!(
        (call.id.as_str(), call.name.as_str()),
        ("call_4XzlGBLtUe9dy3GVNV4jhq7h", "get_weather")
    );
    let arguments: Value = serde_json::from_str(&call.arguments).expect("complete JSON");
    assert_eq!(arguments["city"], "New York City");
    assert_eq!(
        (response.usage.input_tokens, response.usage.output_tokens),
        (44, 16)
    );
}

#[tokio::test]
async fn parallel_tool_calls_are_assembled_by_index() {
    let (_, response) = call(Reply::Raw(fixture("parallel-tool-calls")))
        .await
        .expect("parses");
    let names: Vec<&str> = response
        .tool_calls
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(names, ["GetWeatherArgs", "get_stock_price"]);
    let weather: Value = serde_json::from_str(&response.tool_calls[0].arguments).expect("json");
    let stock: Value = serde_json::from_str(&response.tool_calls[1].arguments).expect("json");
    assert_eq!(
        (weather["city"].as_str(), weather["country"].as_str()),
        (Some("Edinburgh"), Some("GB"))
    );
    assert_eq!(stock["ticker"], "AAPL");
    assert_eq!(response.tool_calls[1].id, "call_DNYTawLBoN8fj3KN6qU9N1Ou");
    assert_eq!(response.finish_reason, FinishReason::ToolCalls);
    assert_eq!(
        (response.usage.input_tokens, response.usage.output_tokens),
        (149, 60)
    );
}

#[tokio::test]
async fn a_refusal_streams_as_text() {
    let transcript = fixture("refusal");
    let (deltas, response) = call(Reply::Raw(transcript.clone())).await.expect("parses");
    assert_eq!(
        response.text,
        "I'm sorry, I can't assist with that request."
    );
    assert_eq!(deltas.concat(), expected_text(&transcript));
    assert_eq!(response.finish_reason, FinishReason::Stop);
    assert_eq!(response.usage.output_tokens, 11);
}

#[tokio::test]
async fn with_several_choices_only_the_first_is_used() {
    let transcript = fixture("n3-choices");
    let (deltas, response) = call(Reply::Raw(transcript.clone())).await.expect("parses");
    assert_eq!(deltas.concat(), expected_text(&transcript));
    let first: Value =
        serde_json::from_str(&response.text).expect("choice 0 alone is one JSON object");
    assert_eq!(first["city"], "San Francisco");
    assert_eq!(
        (response.usage.input_tokens, response.usage.output_tokens),
        (79, 42)
    );
}

#[tokio::test]
async fn a_stream_that_ends_without_done_is_an_error_not_an_answer() {
    let transcript = fixture("text-stop-usage").replace("data: [DONE]", "");
    let result = call(Reply::Raw(transcript)).await;
    assert_eq!(result.err(), Some(LlmError::Incomplete));
}

#[tokio::test]
async fn error_statuses_carry_the_provider_message_retry_after_and_retryability() {
    let err = call(Reply::Status(429, "slow down".into(), Some("2".into())))
        .await
        .expect_err("429");
    assert!(err.is_retryable());
    assert_eq!(err.retry_after(), Some(Duration::from_secs(2)));
    assert!(err.to_string().contains("slow down"));
    let err = call(Reply::Status(503, "overloaded".into(), None))
        .await
        .expect_err("503");
    assert!(err.is_retryable());
    let err = call(Reply::Status(400, "Invalid 'messages': empty".into(), None))
        .await
        .expect_err("400");
    assert!(!err.is_retryable());
    assert!(
        err.to_string().contains("Invalid 'messages': empty"),
        "{err}"
    );
}

#[tokio::test]
async fn the_request_carries_the_key_and_asks_for_usage() {
    let fake = FakeLlm::start(|_, _| spool_tests::fake_llm::text("ok", 1)).await;
    let client = OpenAiClient::new(&fake.base_url, None, Duration::from_secs(5)).expect("client");
    let mut stream = client.stream(request()).await.expect("stream");
    while stream.next().await.is_some() {}
    let body = &fake.requests()[0];
    assert_eq!(body["stream"], true);
    assert_eq!(body["stream_options"]["include_usage"], true);
    assert_eq!(body["messages"][0]["role"], "user");
    assert!(
        body.get("tools").is_none(),
        "no tools offered, no tools field"
    );
}
