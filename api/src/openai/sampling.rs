//! How a request to the OpenAI-compatible routes samples (DESIGN section 11): `temperature`,
//! `top_p`, `max_output_tokens` (Chat Completions: `max_completion_tokens`, or the older
//! `max_tokens`) and `reasoning.effort` (Chat Completions: `reasoning_effort`) are kept with the
//! run ([`Sampling`] in its overrides) and apply to every model call it makes, in place of the
//! agent's settings; `max_output_tokens` never raises the agent's own `limits.max_output_tokens`.
//! A value out of range is a 400 `invalid_value` naming it; `reasoning.summary`, which Spool
//! cannot produce, a 400 `unsupported_parameter`.

use serde_json::Value;

use spool_shared::agent::{AgentSpec, RunOverrides, Sampling};

use crate::error::ApiError;
use crate::openai::functions::Api;

/// The reasoning efforts OpenAI's document lists (`ReasoningEffort`).
const EFFORTS: &[&str] = &["none", "minimal", "low", "medium", "high", "xhigh", "max"];

/// The most tokens a request may ask a model call to generate (as an agent's limit).
const MAX_OUTPUT_TOKENS: u64 = 1_000_000;

fn invalid(param: &str, message: String) -> ApiError {
    ApiError::bad_request("invalid_value", message).with("param", param)
}

/// A number within `range`, if given.
fn number(
    raw: &Value,
    param: &str,
    range: std::ops::RangeInclusive<f64>,
) -> Result<Option<f64>, ApiError> {
    match &raw[param] {
        Value::Null => Ok(None),
        value => value
            .as_f64()
            .filter(|n| range.contains(n))
            .map(Some)
            .ok_or_else(|| {
                invalid(
                    param,
                    format!(
                        "`{param}` must be a number from {} to {}",
                        range.start(),
                        range.end()
                    ),
                )
            }),
    }
}

/// A reasoning effort, if given.
fn effort(value: &Value, param: &str) -> Result<Option<String>, ApiError> {
    match value {
        Value::Null => Ok(None),
        Value::String(effort) if EFFORTS.contains(&effort.as_str()) => Ok(Some(effort.clone())),
        _ => Err(invalid(
            param,
            format!("`{param}` must be one of {}", EFFORTS.join(", ")),
        )),
    }
}

/// Reads the sampling parameters of a request body (400 naming a bad one).
pub(crate) fn parse(raw: &Value, api: Api) -> Result<Sampling, ApiError> {
    let mut sampling = Sampling {
        temperature: number(raw, "temperature", 0.0..=2.0)?,
        top_p: number(raw, "top_p", 0.0..=1.0)?,
        ..Sampling::default()
    };
    let limits: &[&str] = match api {
        Api::Responses => &["max_output_tokens"],
        Api::Chat => &["max_completion_tokens", "max_tokens"],
    };
    for param in limits {
        let value = &raw[*param];
        if value.is_null() || sampling.max_output_tokens.is_some() {
            continue;
        }
        let tokens = value
            .as_u64()
            .filter(|n| (1..=MAX_OUTPUT_TOKENS).contains(n))
            .ok_or_else(|| {
                invalid(
                    param,
                    format!("`{param}` must be a whole number from 1 to {MAX_OUTPUT_TOKENS}"),
                )
            })?;
        sampling.max_output_tokens = u32::try_from(tokens).ok();
    }
    sampling.reasoning_effort = match api {
        Api::Chat => effort(&raw["reasoning_effort"], "reasoning_effort")?,
        Api::Responses => match &raw["reasoning"] {
            Value::Null => None,
            Value::Object(reasoning) => {
                for summary in ["summary", "generate_summary"] {
                    if reasoning.get(summary).is_some_and(|v| !v.is_null()) {
                        return Err(ApiError::bad_request(
                            "unsupported_parameter",
                            format!(
                                "`reasoning.{summary}` is not supported: Spool sends no \
                                 reasoning summaries"
                            ),
                        )
                        .with("param", format!("reasoning.{summary}")));
                    }
                }
                effort(
                    reasoning.get("effort").unwrap_or(&Value::Null),
                    "reasoning.effort",
                )?
            }
            _ => {
                return Err(invalid(
                    "reasoning",
                    "`reasoning` must be an object (`{\"effort\": \"low\"}`)".into(),
                ));
            }
        },
    };
    Ok(sampling)
}

/// `overrides` with `sampling` added (none if both ask for nothing).
pub(crate) fn add_to(overrides: Option<RunOverrides>, sampling: &Sampling) -> Option<RunOverrides> {
    if *sampling == Sampling::default() {
        return overrides;
    }
    Some(RunOverrides {
        sampling: Some(sampling.clone()),
        ..overrides.unwrap_or_default()
    })
}

/// What a response object shows for these settings on a run of `agent`: the request's values,
/// else the agent's (its temperature, its output limit).
pub(crate) fn echoed(sampling: &Sampling, agent: Option<&AgentSpec>) -> [(&'static str, Value); 3] {
    let temperature = sampling
        .temperature
        .or_else(|| agent.and_then(|a| a.temperature));
    let limit = sampling.max_output_tokens(agent.and_then(|a| a.limits.max_output_tokens));
    [
        ("temperature", temperature.into()),
        ("top_p", sampling.top_p.into()),
        ("max_output_tokens", limit.into()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn settings_are_read_per_route_and_bad_values_named() {
        let sampling = parse(
            &json!({"temperature": 0.2, "top_p": 0.9, "max_output_tokens": 300,
                "reasoning": {"effort": "low", "summary": null}}),
            Api::Responses,
        )
        .expect("valid");
        assert_eq!(
            sampling,
            Sampling {
                temperature: Some(0.2),
                top_p: Some(0.9),
                max_output_tokens: Some(300),
                reasoning_effort: Some("low".into()),
            }
        );
        let chat = parse(
            &json!({"max_tokens": 10, "max_completion_tokens": 20, "reasoning_effort": "high"}),
            Api::Chat,
        )
        .expect("valid");
        assert_eq!(chat.max_output_tokens, Some(20), "the newer name wins");
        assert_eq!(chat.reasoning_effort.as_deref(), Some("high"));
        for (body, api, param) in [
            (json!({"temperature": 2.5}), Api::Responses, "temperature"),
            (json!({"top_p": "x"}), Api::Chat, "top_p"),
            (
                json!({"max_output_tokens": 0}),
                Api::Responses,
                "max_output_tokens",
            ),
            (json!({"max_tokens": -3}), Api::Chat, "max_tokens"),
            (
                json!({"reasoning": {"effort": "lots"}}),
                Api::Responses,
                "reasoning.effort",
            ),
            (
                json!({"reasoning": {"summary": "auto"}}),
                Api::Responses,
                "reasoning.summary",
            ),
            (
                json!({"reasoning_effort": 3}),
                Api::Chat,
                "reasoning_effort",
            ),
        ] {
            let err = parse(&body, api).expect_err(param);
            assert!(
                format!("{err:?}").contains(&format!("\"{param}\"")),
                "{param}: {err:?}"
            );
        }
        assert_eq!(add_to(None, &Sampling::default()), None);
    }
}
