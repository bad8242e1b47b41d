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
