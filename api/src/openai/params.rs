//! Honest refusals (DESIGN section 11): a request parameter the OpenAI-compatible routes do not
//! honour is a 400 `unsupported_parameter` whose `param` names it, never silently ignored; and
//! instructions (`instructions`, `system` and `developer` messages) from a caller who may not
//! replace an agent's are a 400 `instructions_not_allowed` saying why.
//!
//! Each route lists the parameters it takes. A parameter it does not apply is still accepted
//! when its value asks for nothing (`null`, or OpenAI's default: a `frequency_penalty` of 0,
//! `logprobs: false`, `n: 1`, ...), as generic clients send those with every request.

use serde_json::{Value, json};

use crate::auth::{Caller, Permission};
use crate::error::ApiError;

/// The parameters of `POST /v1/responses` Spool takes.
const RESPONSES: &[&str] = &[
    "model",
    "input",
    "instructions",
    "previous_response_id",
    "conversation",
    "background",
    "stream",
    "stream_options",
    "metadata",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "text",
    "temperature",
    "top_p",
    "max_output_tokens",
    "reasoning",
    "store",
    "user",
    "safety_identifier",
    "prompt_cache_key",
];

/// The parameters of `POST /v1/chat/completions` Spool takes.
const CHAT: &[&str] = &[
    "model",
    "messages",
    "stream",
    "stream_options",
    "metadata",
    "n",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "reasoning_effort",
    "store",
    "user",
    "safety_identifier",
    "prompt_cache_key",
];

/// Parameters Spool does not apply, with the values that ask for nothing (OpenAI's defaults).
fn harmless(name: &str, value: &Value) -> bool {
    match name {
        "frequency_penalty" | "presence_penalty" | "top_logprobs" => value.as_f64() == Some(0.0),
        "logprobs" => *value == json!(false),
        "logit_bias" => value.as_object().is_some_and(serde_json::Map::is_empty),
        "stop" | "include" => value.as_array().is_some_and(Vec::is_empty),
        "modalities" => *value == json!(["text"]),
        "service_tier" => matches!(value.as_str(), Some("auto" | "default")),
        "truncation" => value.as_str() == Some("disabled"),
        _ => false,
    }
}

/// Why Spool does not take a parameter, for the error message.
fn why(name: &str) -> &'static str {
    match name {
        "web_search_options" | "file_search" | "code_interpreter" => {
            "hosted tools are not offered: an agent's own tools run server-side"
        }
        "include" => "Spool sends no hosted tools' results or logprobs",
        "functions" | "function_call" => "use `tools` and `tool_choice`",
        "frequency_penalty" | "presence_penalty" | "logit_bias" | "seed" | "stop" | "logprobs"
        | "top_logprobs" => "the agent's model settings decide sampling",
        "audio" | "modalities" | "prediction" => "Spool answers in text",
        "truncation" => "Spool manages the agent's context itself (history depth, summaries)",
        _ => "Spool does not apply it",
    }
}

/// 400 `unsupported_parameter` for the first top-level parameter of `raw` that the route does
/// not take (see the module doc).
fn check(raw: &Value, accepted: &[&str]) -> Result<(), ApiError> {
    let Some(body) = raw.as_object() else {
        return Ok(());
    };
    for (name, value) in body {
        if accepted.contains(&name.as_str()) || value.is_null() || harmless(name, value) {
            continue;
        }
        return Err(ApiError::bad_request(
            "unsupported_parameter",
            format!("`{name}` is not supported: {}", why(name)),
        )
        .with("param", name));
    }
    Ok(())
}

/// Checks the parameters of a `POST /v1/responses` body.
pub(crate) fn check_responses(raw: &Value) -> Result<(), ApiError> {
    check(raw, RESPONSES)
}

/// Checks the parameters of a `POST /v1/chat/completions` body.
pub(crate) fn check_chat(raw: &Value) -> Result<(), ApiError> {
    check(raw, CHAT)
}

/// 400 `instructions_not_allowed` unless the caller may replace an agent's instructions (an
/// admin token): `param` names where the request gives them.
pub(crate) fn check_instructions(caller: &Caller, param: &str) -> Result<(), ApiError> {
    if caller.holds(Permission::Admin) {
        return Ok(());
    }
    Err(ApiError::bad_request(
        "instructions_not_allowed",
        format!(
            "`{param}` gives instructions, which replace the agent's system prompt: only an \
             admin token may do that. Put the instructions in the agent (`instructions` of \
             PUT /v1/agents/{{id}}), or send the text as a user message"
        ),
    )
    .with("param", param))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_spool_does_not_apply_are_named() {
        let err = check_chat(&json!({"model": "m", "messages": [], "seed": 7})).expect_err("seed");
        assert!(format!("{err:?}").contains("\"seed\""), "{err:?}");
        let err = check_responses(&json!({"model": "m", "include": ["file_search_call.results"]}))
            .expect_err("include");
        assert!(format!("{err:?}").contains("include"), "{err:?}");
        let err =
            check_chat(&json!({"model": "m", "web_search_options": {}})).expect_err("web search");
        assert!(format!("{err:?}").contains("web_search_options"), "{err:?}");
    }

    #[test]
    fn defaults_and_nulls_ask_for_nothing() {
        let body = json!({"model": "m", "messages": [], "frequency_penalty": 0,
            "presence_penalty": 0.0, "logprobs": false, "stop": null, "seed": null,
            "logit_bias": {}, "service_tier": "auto", "n": 1});
        assert!(check_chat(&body).is_ok());
        let body = json!({"model": "m", "input": "x", "truncation": "disabled", "include": []});
        assert!(check_responses(&body).is_ok());
    }
}
