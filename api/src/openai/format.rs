//! Structured outputs: the Responses API's `text.format` and Chat Completions'
//! `response_format` as the run's `response_format` (DESIGN section 9): the final answer is
//! validated against the schema (one repair round), stored as the message's `output`, and a run
//! whose answer never validates fails with `invalid_output`. `strict` is passed to the provider;
//! the answer is validated here either way, so the SDKs' `parse()` always gets valid JSON.
//!
//! `{"type": "json_schema", "name", "schema", "strict"}` (Chat Completions nests it as
//! `{"type": "json_schema", "json_schema": {...}}`); `{"type": "json_object"}` is a schema of
//! any object; `{"type": "text"}` (or none) leaves the agent's own `response_format`.

use serde_json::{Value, json};

use spool_shared::agent::ResponseFormat;

use crate::error::ApiError;

/// The response format of a Responses request's `text` (`text.format`).
pub(crate) fn from_text(text: Option<&Value>) -> Result<Option<ResponseFormat>, ApiError> {
    let Some(format) = text
        .and_then(|text| text.get("format"))
        .filter(|f| !f.is_null())
    else {
        return Ok(None);
    };
    parse(format, format, "text.format")
}

/// The response format of a Chat Completions request's `response_format`.
pub(crate) fn from_chat(
    response_format: Option<&Value>,
) -> Result<Option<ResponseFormat>, ApiError> {
    let Some(format) = response_format.filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    let schema = format.get("json_schema").unwrap_or(&Value::Null);
    parse(format, schema, "response_format")
}

/// `format` (its `type`) with the `json_schema` fields in `fields`.
fn parse(
    format: &Value,
    fields: &Value,
    param: &'static str,
) -> Result<Option<ResponseFormat>, ApiError> {
    let invalid = |why: String| {
        ApiError::bad_request("invalid_response_format", format!("{param}: {why}"))
            .with("param", param)
    };
    match format["type"].as_str() {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(ResponseFormat::JsonSchema {
            name: None,
            schema: json!({"type": "object"}),
            strict: None,
        })),
        Some("json_schema") => {
            let name = fields["name"].as_str();
            let named = name.is_some_and(|name| {
                (1..=64).contains(&name.len())
                    && name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            });
            if !named {
                return Err(invalid(
                    "name is 1 to 64 of a-z, A-Z, 0-9, `_` and `-`".into(),
                ));
            }
            let schema = fields.get("schema").cloned().unwrap_or(json!({}));
            if !schema.is_object() {
                return Err(invalid("schema must be a JSON Schema object".into()));
            }
            let strict = match &fields["strict"] {
                Value::Null => None,
                Value::Bool(strict) => Some(*strict),
                _ => return Err(invalid("strict must be a boolean".into())),
            };
            let format = ResponseFormat::JsonSchema {
                name: name.map(str::to_owned),
                schema,
                strict,
            };
            if let Some(err) = format.schema_error() {
                return Err(invalid(format!("the schema does not compile: {err}")));
            }
            Ok(Some(format))
        }
        _ => Err(invalid(
            "type is `text`, `json_schema` or `json_object`".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_shapes_give_the_same_format() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}},
            "required": ["a"], "additionalProperties": false});
        let text = json!({"format": {"type": "json_schema", "name": "thing", "schema": schema,
            "strict": true}});
        let chat = json!({"type": "json_schema", "json_schema": {"name": "thing",
            "schema": schema, "strict": true}});
        let a = from_text(Some(&text)).expect("text").expect("a format");
        let b = from_chat(Some(&chat)).expect("chat").expect("a format");
        assert_eq!(a, b);
        assert_eq!(a.strict(), Some(true));
        assert!(a.check(r#"{"a": 1}"#).is_ok());
        assert!(a.check(r#"{"a": "x"}"#).is_err());
    }

    #[test]
    fn text_is_none_and_bad_formats_are_refused() {
        assert_eq!(
            from_text(Some(&json!({"format": {"type": "text"}}))).expect("text"),
            None
        );
        assert_eq!(from_chat(None).expect("none"), None);
        for bad in [
            json!({"type": "json_schema", "json_schema": {"schema": {}}}),
            json!({"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}),
            json!({"type": "json_schema", "json_schema": {"name": "n", "schema": 3}}),
            json!({"type": "json_schema", "json_schema": {"name": "n",
                "schema": {"type": "nope"}}}),
            json!({"type": "xml"}),
        ] {
            assert!(from_chat(Some(&bad)).is_err(), "{bad}");
        }
    }
}
