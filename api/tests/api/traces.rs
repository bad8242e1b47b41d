//! OpenTelemetry traces: one trace from the API request through the queue to the worker's
//! attempt, its model calls and its tool calls, checked with an in-memory exporter.
//!
//! The subscriber installed here is global to this test binary: the other tests' spans land in
//! the exporter too, so every check first picks the spans of its own (known) trace id.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::trace::{SpanId, TraceId, TracerProvider as _};
use opentelemetry::{KeyValue, Value as OtelValue};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tracing_subscriber::layer::SubscriberExt as _;
use uuid::Uuid;

use spool_tests::fake_llm::{self, FakeLlm, tool_results_in};
use spool_tests::token;

use spool_tests::tools::{Tools, http_tool};

use crate::common::{TestApp, worker_args};
use crate::common::{app_with, finished};

/// The callers' traces (one per test: the tests run side by side) and span.
const MODEL_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const TOOL_TRACE: &str = "5c0a3f4688c45eb7b4df03ae1f1f5847";
const TREE_TRACE: &str = "6d1b4e5799d56fc8c5e0b4f2a2c2e958";
/// The caller's span, as its `traceparent` header carries it.
const CALLER_SPAN_ID: &str = "00f067aa0ba902b7";

/// Installs, once per test binary, a global subscriber exporting Spool's spans synchronously
/// to memory, and the W3C propagator; returns the exporter.
fn exporter() -> &'static InMemorySpanExporter {
    static EXPORTER: OnceLock<InMemorySpanExporter> = OnceLock::new();
    EXPORTER.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        // Spool's own spans only: the dependencies' debug spans would only slow the other tests.
        let targets = tracing_subscriber::filter::Targets::new()
            .with_target("spool_api", tracing::Level::INFO)
            .with_target("spool_worker", tracing::Level::INFO)
            .with_target("spool_shared", tracing::Level::INFO);
        let subscriber = tracing_subscriber::registry().with(targets).with(
            // As `spool_shared::telemetry::init` sets it up: no OS thread attributes.
            tracing_opentelemetry::layer()
                .with_tracer(provider.tracer("spool-tests"))
                .with_threads(false),
        );
        tracing::subscriber::set_global_default(subscriber).expect("the only global subscriber");
        opentelemetry::global::set_text_map_propagator(
            opentelemetry_sdk::propagation::TraceContextPropagator::new(),
        );
        // Kept for the whole binary: the provider must outlive every span.
        std::mem::forget(provider);
        exporter
    })
}

/// The finished spans of the trace `trace`, by span id.
fn spans_of_trace(trace: &str) -> HashMap<SpanId, SpanData> {
    let trace_id = TraceId::from_hex(trace).expect("trace id");
    exporter()
        .get_finished_spans()
        .expect("finished spans")
        .into_iter()
        .filter(|span| span.span_context.trace_id() == trace_id)
        .map(|span| (span.span_context.span_id(), span))
        .collect()
}

/// Waits until spans named `names` (one of each at least) have finished in the trace `trace`.
async fn wait_for_spans(trace: &str, names: &[&str]) -> HashMap<SpanId, SpanData> {
    spool_tests::poll_until(
        &format!("the spans {names:?}"),
        Duration::from_secs(20),
        || async {
            let spans = spans_of_trace(trace);
            names
                .iter()
                .all(|name| spans.values().any(|span| span.name == *name))
                .then_some(spans)
        },
    )
    .await
}

fn named<'a>(spans: &'a HashMap<SpanId, SpanData>, name: &str) -> Vec<&'a SpanData> {
    spans.values().filter(|span| span.name == name).collect()
}

/// The attempts' spans (`invoke_agent {agent}`).
fn attempts(spans: &HashMap<SpanId, SpanData>) -> Vec<&SpanData> {
    spans
        .values()
        .filter(|span| span.name.starts_with("invoke_agent"))
        .collect()
}

fn attribute<'a>(span: &'a SpanData, key: &str) -> Option<&'a OtelValue> {
    span.attributes
        .iter()
        .find(|KeyValue { key: k, .. }| k.as_str() == key)
        .map(|kv| &kv.value)
}

/// The ids of `span`'s ancestors within the trace, nearest first, ending with the first
/// parent not in `spans` (the caller's remote span).
fn ancestors(spans: &HashMap<SpanId, SpanData>, span: &SpanData) -> Vec<SpanId> {
    let mut chain = Vec::new();
    let mut parent = span.parent_span_id;
    while parent != SpanId::INVALID && chain.len() < 32 {
        chain.push(parent);
        parent = spans
            .get(&parent)
            .map_or(SpanId::INVALID, |span| span.parent_span_id);
    }
    chain
}

/// Posts `body` as a user message with a `traceparent` in `trace`; returns the 202 body.
async fn post_traced(app: &TestApp, trace: &str, body: &Value) -> Value {
    let response = app
        .http
        .post(app.url(&format!("/v1/threads/{}/user_message", Uuid::new_v4())))
        .bearer_auth(token("alice", "acme"))
        .header("traceparent", format!("00-{trace}-{CALLER_SPAN_ID}-01"))
        .json(body)
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    response.json().await.expect("json")
}

/// The request span of `POST user_message`, named `{method} {route}` as the HTTP semantic
/// conventions name server spans.
const USER_MESSAGE_SPAN: &str = "POST /v1/threads/{thread_id}/user_message";

/// Checks the request → attempt links; returns the attempt span.
fn check_request_and_attempt(spans: &HashMap<SpanId, SpanData>) -> &SpanData {
    let caller = SpanId::from_hex(CALLER_SPAN_ID).expect("span id");
    let requests: Vec<&SpanData> = named(spans, USER_MESSAGE_SPAN)
        .into_iter()
        .filter(|span| span.parent_span_id == caller)
        .collect();
    assert_eq!(
        requests.len(),
        1,
        "the request span is a child of the caller's span"
    );
    let request = requests[0];
    assert_eq!(
        attribute(request, "http.request.method"),
        Some(&OtelValue::from("POST"))
    );
    assert_eq!(
        attribute(request, "http.route"),
        Some(&OtelValue::from("/v1/threads/{thread_id}/user_message"))
    );
    assert_eq!(
        attribute(request, "http.response.status_code"),
        Some(&OtelValue::I64(202))
    );
    let attempts = attempts(spans);
    assert_eq!(attempts.len(), 1, "one attempt");
    let attempt = attempts[0];
    let chain = ancestors(spans, attempt);
    assert_eq!(
        chain.first(),
        Some(&request.span_context.span_id()),
        "the attempt's parent is the request that enqueued the run: {chain:?}"
    );
    assert_eq!(chain.last(), Some(&caller));
    assert_eq!(attribute(attempt, "run.attempt"), Some(&OtelValue::I64(1)));
    attempt
}

#[tokio::test]
async fn a_run_is_one_trace_from_the_request_through_the_queue_to_its_model_call() {
    exporter();
    let app = TestApp::start(1, worker_args(3, 0)).await;
    let accepted = post_traced(&app, MODEL_TRACE, &json!({"input_text": "hello traces"})).await;
    let workflow = accepted["workflow_id"].as_str().expect("workflow_id");
    app.wait_for_status(&token("alice", "acme"), workflow, "completed")
        .await;

    let spans = wait_for_spans(
        MODEL_TRACE,
        &[USER_MESSAGE_SPAN, "invoke_agent default", "chat demo"],
    )
    .await;
    let attempt = check_request_and_attempt(&spans);
    assert_eq!(
        attribute(attempt, "workflow.id"),
        Some(&OtelValue::from(workflow.to_owned()))
    );
    let thread = accepted["thread_id"].as_str().expect("thread_id");
    assert_eq!(
        attribute(attempt, "thread.id"),
        Some(&OtelValue::from(thread.to_owned()))
    );
    // GenAI semantic conventions: the default agent, its model's provider, the thread.
    for (key, value) in [
        ("gen_ai.operation.name", "invoke_agent"),
        ("gen_ai.agent.name", "default"),
        ("gen_ai.provider.name", "spool.demo"),
        ("gen_ai.request.model", "demo"),
        ("gen_ai.conversation.id", thread),
    ] {
        assert_eq!(
            attribute(attempt, key),
            Some(&OtelValue::from(value.to_owned())),
            "{key}"
        );
    }
    let chats = named(&spans, "chat demo");
    assert_eq!(chats.len(), 1, "one model call");
    let chat = chats[0];
    assert_eq!(
        attribute(chat, "gen_ai.response.model"),
        Some(&OtelValue::from("demo"))
    );
    assert_eq!(
        attribute(chat, "gen_ai.response.finish_reasons"),
        Some(&OtelValue::Array(opentelemetry::Array::String(vec![
            "stop".into()
        ])))
    );
    assert_eq!(
        attribute(chat, "gen_ai.conversation.id"),
        Some(&OtelValue::from(thread.to_owned()))
    );
    assert_eq!(chat.parent_span_id, attempt.span_context.span_id());
    assert_eq!(
        attribute(chat, "gen_ai.request.model"),
        Some(&OtelValue::from("demo"))
    );
    assert_eq!(
        attribute(chat, "gen_ai.operation.name"),
        Some(&OtelValue::from("chat"))
    );
    assert_eq!(
        attribute(chat, "gen_ai.provider.name"),
        Some(&OtelValue::from("spool.demo"))
    );
    // The demo model counts the input's words and answers `demo_tokens` pieces.
    assert_eq!(
        attribute(chat, "gen_ai.usage.input_tokens"),
        Some(&OtelValue::I64(2))
    );
    assert_eq!(
        attribute(chat, "gen_ai.usage.output_tokens"),
        Some(&OtelValue::I64(3))
    );
    app.stop().await;
}

#[tokio::test]
async fn a_tool_call_is_a_child_span_of_the_attempt_with_its_outcome() {
    exporter();
    let fake = FakeLlm::start(|request, _| match tool_results_in(request) {
        0 => fake_llm::tool_calls(&[("call_1", "get_weather", r#"{"city": "Paris"}"#)]),
        _ => fake_llm::text("It is sunny in Paris.", 2),
    })
    .await;
    let (_tools, base) = Tools::start().await;
    let app = app_with(&fake).await;
    let agent = app
        .create_agent(
            "acme",
            &json!({"name": "weather", "model": "gpt-4o-mini",
                "tools": [http_tool("get_weather", format!("{base}/weather"))]}),
        )
        .await;
    let accepted = post_traced(
        &app,
        TOOL_TRACE,
        &json!({"input_text": "Weather in Paris?", "agent_id": agent}),
    )
    .await;
    assert_eq!(finished(&app, &accepted).await["status"], "completed");

    let spans = wait_for_spans(
        TOOL_TRACE,
        &[
            USER_MESSAGE_SPAN,
            "invoke_agent weather",
            "chat gpt-4o-mini",
            "execute_tool get_weather",
        ],
    )
    .await;
    let attempt = check_request_and_attempt(&spans);
    let attempt_id = attempt.span_context.span_id();
    let chats = named(&spans, "chat gpt-4o-mini");
    assert_eq!(chats.len(), 2, "a model call before and after the tool");
    assert!(chats.iter().all(|chat| chat.parent_span_id == attempt_id));
    assert!(chats.iter().all(|chat| {
        attribute(chat, "gen_ai.provider.name") == Some(&OtelValue::from("openai"))
            && matches!(
                attribute(chat, "gen_ai.usage.input_tokens"),
                Some(OtelValue::I64(_))
            )
    }));
    let tools = named(&spans, "execute_tool get_weather");
    assert_eq!(tools.len(), 1);
    let tool = tools[0];
    assert_eq!(tool.parent_span_id, attempt_id);
    assert_eq!(
        attribute(tool, "gen_ai.tool.name"),
        Some(&OtelValue::from("get_weather"))
    );
    assert_eq!(attribute(tool, "tool.kind"), Some(&OtelValue::from("http")));
    assert_eq!(
        attribute(tool, "tool.outcome"),
        Some(&OtelValue::from("ok"))
    );
    app.stop().await;
}

#[tokio::test]
async fn an_agent_run_started_by_an_agent_tool_call_is_in_its_parent_s_trace() {
    exporter();
    let fake = FakeLlm::start(fake_llm::lead_and_researcher(|| {
        fake_llm::text("Found it.", 1)
    }))
    .await;
    let app = app_with(&fake).await;
    let researcher = app.create_agent("acme", &fake_llm::researcher_spec()).await;
    let lead = app
        .create_agent("acme", &fake_llm::lead_spec(&researcher))
        .await;
    let accepted = post_traced(
        &app,
        TREE_TRACE,
        &json!({"input_text": "Find it", "agent_id": lead}),
    )
    .await;
    assert_eq!(finished(&app, &accepted).await["status"], "completed");

    // Three attempts in the trace: the lead's first (which started the child), the child's,
    // and the lead's second; the child's is a descendant of the lead's first.
    let spans = spool_tests::poll_until("three attempts", Duration::from_secs(20), || async {
        let spans = spans_of_trace(TREE_TRACE);
        (attempts(&spans).len() == 3).then_some(spans)
    })
    .await;
    let parent = accepted["workflow_id"].as_str().expect("id");
    let runs = attempts(&spans);
    let (lead_runs, child_runs): (Vec<&SpanData>, Vec<&SpanData>) =
        runs.into_iter().partition(|span| {
            attribute(span, "workflow.id") == Some(&OtelValue::from(parent.to_owned()))
        });
    assert_eq!((lead_runs.len(), child_runs.len()), (2, 1));
    let first = lead_runs
        .iter()
        .find(|span| attribute(span, "run.attempt") == Some(&OtelValue::I64(1)))
        .expect("the lead's first attempt");
    let chain = ancestors(&spans, child_runs[0]);
    assert!(
        chain.contains(&first.span_context.span_id()),
        "the child's attempt descends from the attempt that called it: {chain:?}"
    );
    app.stop().await;
}
