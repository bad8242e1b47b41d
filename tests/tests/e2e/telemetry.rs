//! Spans as an operator's collector receives them: OTLP/HTTP from real `spool-api` and
//! `spool-worker` processes to a loopback collector. A run with a tool call is
//! `invoke_agent {agent}` → `chat {model}`, `execute_tool {tool}`, `chat {model}` with the
//! GenAI semantic conventions' attributes; prompts, answers and tool arguments and results
//! appear only with `SPOOL_OTEL_CAPTURE_CONTENT=true`.

use serde_json::{Value, json};
use spool_tests::fake_llm::{self, FakeLlm, tool_results_in};
use spool_tests::otlp::{Collector, Span};
use spool_tests::poll_until;
use spool_tests::tools::{Tools, http_tool};

use crate::stack::{Stack, TIMEOUT};

/// The run's content: the instructions, the question and the answer; `CONTENT` holds words
/// that occur only there, in the tool's arguments (`Quokkaville`) and in its result (`sunny`).
const INSTRUCTIONS: &str = "You help travellers to Quokkaville.";
const QUESTION: &str = "Weather in Quokkaville?";
const ANSWER: &str = "Quokkaville looks sunny today.";
const CONTENT: [&str; 3] = ["Quokka", "sunny", "travellers"];

/// The spans of one run with a tool call, each finished span of its trace, with
/// `capture` as `SPOOL_OTEL_CAPTURE_CONTENT`; and the run's ids.
async fn traced_run(capture: &str) -> (Vec<Span>, Value) {
    let collector = Collector::start().await;
    let fake = FakeLlm::start(|request, _| match tool_results_in(request) {
        0 => fake_llm::tool_calls(&[("call_q", "get_weather", r#"{"city": "Quokkaville"}"#)]),
        _ => fake_llm::text(ANSWER, 2),
    })
    .await;
    let (_tools, base) = Tools::start().await;
    let otel = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint.as_str()),
        // Batches every 100 ms rather than 5 s.
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
    ];
    let stack = Stack::start_with(&spool_tests::redis_url(), &otel).await;
    let worker_settings = [
        &otel[..],
        &[
            ("SPOOL_LLM_BASE_URL", fake.base_url.as_str()),
            ("SPOOL_TOOLS_ALLOW_NETWORKS", "127.0.0.1/32"),
            ("SPOOL_OTEL_CAPTURE_CONTENT", capture),
        ],
    ]
    .concat();
    let _worker = stack.worker(&worker_settings).await;
    let agent = stack
        .create_agent(&json!({"name": "forecaster", "model": "gpt-4o-mini",
            "instructions": INSTRUCTIONS,
            "tools": [http_tool("get_weather", format!("{base}/weather"))]}))
        .await;
    let accepted = stack.ask(&agent, QUESTION).await;
    stack.wait_run(&accepted, "completed").await;
    let workflow = accepted["workflow_id"]
        .as_str()
        .expect("workflow_id")
        .to_owned();
    let spans = poll_until("the run's spans at the collector", TIMEOUT, || async {
        let spans = collector.spans();
        // The attempt's span ends last: once it is in, its children are too.
        let attempt = spans.iter().find(|s| {
            s.name == "invoke_agent forecaster" && s.str("workflow.id") == Some(workflow.as_str())
        })?;
        let trace: Vec<Span> = spans
            .iter()
            .filter(|s| s.trace_id == attempt.trace_id)
            .cloned()
            .collect();
        let chats = trace
            .iter()
            .filter(|s| s.name == "chat gpt-4o-mini")
            .count();
        let tools = trace
            .iter()
            .filter(|s| s.name == "execute_tool get_weather")
            .count();
        (chats == 2 && tools == 1).then_some(trace)
    })
    .await;
    (spans, accepted)
}

fn one<'a>(spans: &'a [Span], name: &str) -> &'a Span {
    let found: Vec<&Span> = spans.iter().filter(|s| s.name == name).collect();
    assert_eq!(found.len(), 1, "one span {name}: {found:#?}");
    found[0]
}

/// The attempt, the two model calls (in order) and the tool call, with their common checks.
fn check_structure<'a>(spans: &'a [Span], accepted: &Value) -> (&'a Span, Vec<&'a Span>, &'a Span) {
    let attempt = one(spans, "invoke_agent forecaster");
    let thread = accepted["thread_id"].as_str().expect("thread_id");
    assert_eq!(attempt.service, "spool-worker");
    assert_eq!(attempt.kind, 1, "internal");
    assert_eq!(attempt.str("gen_ai.operation.name"), Some("invoke_agent"));
    assert_eq!(attempt.str("gen_ai.agent.name"), Some("forecaster"));
    assert!(
        attempt
            .str("gen_ai.agent.id")
            .is_some_and(|id| !id.is_empty()),
        "{attempt:#?}"
    );
    assert_eq!(attempt.str("gen_ai.provider.name"), Some("openai"));
    assert_eq!(attempt.str("gen_ai.request.model"), Some("gpt-4o-mini"));
    assert_eq!(attempt.str("gen_ai.conversation.id"), Some(thread));
    assert_eq!(attempt.attribute("error.type"), None);

    let mut chats: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name == "chat gpt-4o-mini")
        .collect();
    chats.sort_by_key(|s| s.attribute("run.step").and_then(Value::as_i64));
    assert_eq!(chats.len(), 2);
    for chat in &chats {
        assert_eq!(chat.parent_span_id, attempt.span_id);
        assert_eq!(chat.kind, 3, "client");
        assert_eq!(chat.str("gen_ai.operation.name"), Some("chat"));
        assert_eq!(chat.str("gen_ai.provider.name"), Some("openai"));
        assert_eq!(chat.str("gen_ai.request.model"), Some("gpt-4o-mini"));
        // The fake upstream answers as the model `fake`.
        assert_eq!(chat.str("gen_ai.response.model"), Some("fake"));
        assert_eq!(chat.str("gen_ai.response.id"), Some("chatcmpl-fake"));
        assert_eq!(chat.str("gen_ai.conversation.id"), Some(thread));
        assert!(
            chat.attribute("gen_ai.usage.input_tokens")
                .is_some_and(Value::is_i64),
            "{chat:#?}"
        );
        assert!(
            chat.attribute("gen_ai.usage.output_tokens")
                .is_some_and(Value::is_i64)
        );
    }
    assert_eq!(
        chats[0].attribute("gen_ai.response.finish_reasons"),
        Some(&json!(["tool_call"]))
    );
    assert_eq!(
        chats[1].attribute("gen_ai.response.finish_reasons"),
        Some(&json!(["stop"]))
    );

    let tool = one(spans, "execute_tool get_weather");
    assert_eq!(tool.parent_span_id, attempt.span_id);
    assert_eq!(tool.kind, 1, "internal");
    assert_eq!(tool.str("gen_ai.operation.name"), Some("execute_tool"));
    assert_eq!(tool.str("gen_ai.tool.name"), Some("get_weather"));
    assert_eq!(tool.str("gen_ai.tool.call.id"), Some("call_q"));
    assert_eq!(tool.str("gen_ai.tool.type"), Some("extension"));
    assert_eq!(tool.attribute("error.type"), None);
    (attempt, chats, tool)
}

#[tokio::test]
async fn genai_spans_reach_the_collector_without_content_by_default() {
    let (spans, accepted) = traced_run("false").await;
    check_structure(&spans, &accepted);
    // No span of the trace (the API's included) carries any of the run's content.
    for span in &spans {
        for (key, value) in &span.attributes {
            let text = value.to_string();
            assert!(
                !CONTENT.iter().any(|word| text.contains(word)),
                "{} carries content in {key}: {text}",
                span.name
            );
        }
    }
    for key in [
        "gen_ai.input.messages",
        "gen_ai.output.messages",
        "gen_ai.system_instructions",
        "gen_ai.tool.call.arguments",
        "gen_ai.tool.call.result",
    ] {
        assert!(spans.iter().all(|s| s.attribute(key).is_none()), "{key}");
    }
}

#[tokio::test]
async fn with_capture_content_the_spans_carry_prompts_answers_and_tool_calls() {
    let (spans, accepted) = traced_run("true").await;
    let (_, chats, tool) = check_structure(&spans, &accepted);
    let parsed = |span: &Span, key: &str| -> Value {
        serde_json::from_str(span.str(key).unwrap_or_else(|| panic!("{key}: {span:#?}")))
            .unwrap_or_else(|e| panic!("{key} is JSON: {e}"))
    };
    for chat in &chats {
        assert_eq!(
            parsed(chat, "gen_ai.system_instructions"),
            json!([{"type": "text", "content": INSTRUCTIONS}])
        );
        let input = parsed(chat, "gen_ai.input.messages");
        assert_eq!(
            input[0],
            json!({"role": "user", "parts": [{"type": "text", "content": QUESTION}]}),
            "{input}"
        );
    }
    // The second call's input: the question, the model's tool call, the tool's result.
    let input = parsed(chats[1], "gen_ai.input.messages");
    assert_eq!(
        input[1]["parts"][0],
        json!({"type": "tool_call", "id": "call_q", "name": "get_weather",
            "arguments": {"city": "Quokkaville"}}),
        "{input}"
    );
    assert_eq!(input[2]["role"], "tool", "{input}");
    assert_eq!(input[2]["parts"][0]["id"], "call_q", "{input}");
    assert!(
        input[2]["parts"][0]["response"]
            .as_str()
            .is_some_and(|r| r.contains("sunny in Quokkaville")),
        "{input}"
    );
    assert_eq!(
        parsed(chats[0], "gen_ai.output.messages"),
        json!([{"role": "assistant", "finish_reason": "tool_call", "parts": [
            {"type": "tool_call", "id": "call_q", "name": "get_weather",
                "arguments": {"city": "Quokkaville"}}]}])
    );
    assert_eq!(
        parsed(chats[1], "gen_ai.output.messages"),
        json!([{"role": "assistant", "finish_reason": "stop",
            "parts": [{"type": "text", "content": ANSWER}]}])
    );
    assert_eq!(
        parsed(tool, "gen_ai.tool.call.arguments"),
        json!({"city": "Quokkaville"})
    );
    assert!(
        tool.str("gen_ai.tool.call.result")
            .is_some_and(|r| r.contains("sunny in Quokkaville")),
        "{tool:#?}"
    );
}
