//! The OpenTelemetry GenAI semantic conventions (as of v1.41, the last release in
//! `open-telemetry/semantic-conventions` before they moved to their own repository): the
//! values Spool's spans carry.
//!
//! | span | name | kind | where |
//! |---|---|---|---|
//! | one attempt of a run | `invoke_agent {gen_ai.agent.name}` | internal | `crate::attempt` |
//! | one model call (its retries, fallbacks and continuations included) | `chat {gen_ai.request.model}` | client | [`super::model_call`] |
//! | one tool call | `execute_tool {gen_ai.tool.name}` | internal | [`super::tools`] |
//!
//! Content (prompts, answers, tool arguments and results) is left out unless the operator
//! opts in with `SPOOL_OTEL_CAPTURE_CONTENT=true` (the conventions' default, and the only safe
//! one: it is the tenants' data). Opted in, the chat spans carry `gen_ai.system_instructions`
//! (the agent's instructions: Spool holds them apart from the thread's history),
//! `gen_ai.input.messages` and `gen_ai.output.messages`, and the tool spans
//! `gen_ai.tool.call.arguments` and `gen_ai.tool.call.result`, each a JSON string in the
//! conventions' schema (the Rust SDK has no structured attribute values).

use serde_json::{Value, json};

use spool_shared::run::Usage;

use super::llm::{ChatMessage, FinishReason, LlmError, ToolCall};

/// Records a model call's tokens on its span (as i64: OpenTelemetry has no unsigned integers,
/// and a u64 would arrive as text).
pub(crate) fn record_usage(span: &tracing::Span, usage: &Usage) {
    let tokens = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    span.record("gen_ai.usage.input_tokens", tokens(usage.input_tokens));
    span.record("gen_ai.usage.output_tokens", tokens(usage.output_tokens));
}

/// Marks a model call's span as failed, with the error's kind as `error.type`.
pub(crate) fn record_error(span: &tracing::Span, err: &LlmError) {
    span.record("otel.status_code", "error");
    span.record("error.type", err.kind());
}

/// The conventions' finish reason: `stop`, `length`, `content_filter`, `tool_call`, or the
/// provider's own word.
pub(crate) fn finish_reason(reason: &FinishReason) -> &str {
    match reason {
        FinishReason::ToolCalls => "tool_call",
        other => other.as_str(),
    }
}

/// `gen_ai.system_instructions` and `gen_ai.input.messages` of `messages`, as JSON text:
/// the system messages' text parts, and the rest in order (the first is `None` without
/// system messages).
pub(crate) fn input_messages(messages: &[ChatMessage]) -> (Option<String>, String) {
    let mut instructions = Vec::new();
    let mut input = Vec::new();
    for message in messages {
        match message {
            ChatMessage::System { content } => {
                instructions.push(json!({"type": "text", "content": content}));
            }
            ChatMessage::User { content } => input.push(json!({
                "role": "user",
                "parts": [{"type": "text", "content": content}],
            })),
            ChatMessage::Assistant {
                content,
                tool_calls,
            } => input.push(json!({
                "role": "assistant",
                "parts": assistant_parts(content.as_deref().unwrap_or_default(), tool_calls),
            })),
            ChatMessage::Tool {
                tool_call_id,
                content,
            } => input.push(json!({
                "role": "tool",
                "parts": [{"type": "tool_call_response", "id": tool_call_id,
                    "response": content}],
            })),
        }
    }
    let instructions = (!instructions.is_empty()).then(|| Value::from(instructions).to_string());
    (instructions, Value::from(input).to_string())
}

/// `gen_ai.output.messages` of one answer (Spool asks for one choice), as JSON text.
pub(crate) fn output_messages(text: &str, calls: &[ToolCall], reason: &FinishReason) -> String {
    json!([{
        "role": "assistant",
        "parts": assistant_parts(text, calls),
        "finish_reason": finish_reason(reason),
    }])
    .to_string()
}

/// An assistant turn's parts: its text (if any), then its tool calls with their arguments as
/// JSON where they parse.
fn assistant_parts(text: &str, calls: &[ToolCall]) -> Vec<Value> {
    let text = (!text.is_empty()).then(|| json!({"type": "text", "content": text}));
    text.into_iter()
        .chain(calls.iter().map(|call| {
            json!({"type": "tool_call", "id": call.id, "name": call.name,
                "arguments": call.parsed_arguments()})
        }))
        .collect()
}

/// `gen_ai.tool.type` of a tool of Spool's `kind`: `function` for a client tool (the
/// conventions' client-side tool), `extension` for the rest (called by the agent's side).
pub(crate) fn tool_type(kind: &str) -> &'static str {
    if kind == "client" {
        "function"
    } else {
        "extension"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_follow_the_conventions_schemas() {
        let messages = [
            ChatMessage::System {
                content: "Be brief.".into(),
            },
            ChatMessage::User {
                content: "Weather in Paris?".into(),
            },
            ChatMessage::Assistant {
                content: None,
                tool_calls: vec![ToolCall {
                    id: "call_1".into(),
                    name: "get_weather".into(),
                    arguments: r#"{"city": "Paris"}"#.into(),
                }],
            },
            ChatMessage::Tool {
                tool_call_id: "call_1".into(),
                content: "sunny".into(),
            },
        ];
        let (instructions, input) = input_messages(&messages);
        let instructions: Value = serde_json::from_str(&instructions.expect("some")).expect("json");
        assert_eq!(
            instructions,
            json!([{"type": "text", "content": "Be brief."}])
        );
        let input: Value = serde_json::from_str(&input).expect("json");
        assert_eq!(
            input,
            json!([
                {"role": "user", "parts": [{"type": "text", "content": "Weather in Paris?"}]},
                {"role": "assistant", "parts": [{"type": "tool_call", "id": "call_1",
                    "name": "get_weather", "arguments": {"city": "Paris"}}]},
                {"role": "tool", "parts": [{"type": "tool_call_response", "id": "call_1",
                    "response": "sunny"}]},
            ])
        );
        let output: Value =
            serde_json::from_str(&output_messages("It is sunny.", &[], &FinishReason::Stop))
                .expect("json");
        assert_eq!(
            output,
            json!([{"role": "assistant", "parts": [{"type": "text", "content": "It is sunny."}],
                "finish_reason": "stop"}])
        );
        assert_eq!(finish_reason(&FinishReason::ToolCalls), "tool_call");
        assert_eq!(input_messages(&messages[1..]).0, None);
    }
}
