//! What a `POST /v1/responses` asked for that its response object shows, so the object is true
//! to its request (a plain create is `background: false`; `instructions`, `text`,
//! `previous_response_id` and the rest are the request's), kept per response in
//! `openai_response_requests`.

use serde_json::{Map, Value, json};
use spool_shared::WorkflowId;
use sqlx::PgPool;
use sqlx::types::Json;

/// A field's value when the request leaves it out.
type Fallback = fn() -> Value;

/// The request fields a response object shows, with their value when the request leaves them
/// out (OpenAI's defaults, or what Spool does).
const ECHOED: [(&str, Fallback); 17] = [
    ("background", || json!(false)),
    ("instructions", || Value::Null),
    ("previous_response_id", || Value::Null),
    ("text", || json!({"format": {"type": "text"}})),
    ("temperature", || Value::Null),
    ("top_p", || Value::Null),
    ("max_output_tokens", || Value::Null),
    ("max_tool_calls", || Value::Null),
    ("reasoning", || Value::Null),
    ("store", || json!(true)),
    ("user", || Value::Null),
    ("safety_identifier", || Value::Null),
    ("prompt_cache_key", || Value::Null),
    ("tools", || json!([])),
    ("tool_choice", || json!("auto")),
    ("parallel_tool_calls", || json!(true)),
    ("truncation", || json!("disabled")),
];

/// The fields of `request` (a `POST /v1/responses` body) its response shows, every one of them
/// (defaults filled in).
pub(crate) fn of_request(request: &Value) -> Value {
    let mut echo = Map::new();
    for (field, default) in ECHOED {
        let value = request
            .get(field)
            .filter(|v| !v.is_null())
            .cloned()
            .unwrap_or_else(default);
        echo.insert(field.to_owned(), value);
    }
    Value::Object(echo)
}

/// Keeps what `workflow_id`'s request asked for (a retry of the same create keeps the first).
pub(crate) async fn save(db: &PgPool, workflow_id: WorkflowId, echo: &Value) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO openai_response_requests (workflow_id, request) VALUES ($1, $2)
         ON CONFLICT (workflow_id) DO NOTHING",
    )
    .bind(workflow_id)
    .bind(Json(echo))
    .execute(db)
    .await?;
    Ok(())
}

/// What `workflow_id`'s request asked for, if it was made through `POST /v1/responses`.
pub(crate) async fn load(db: &PgPool, workflow_id: WorkflowId) -> sqlx::Result<Option<Value>> {
    let row: Option<(Json<Value>,)> =
        sqlx::query_as("SELECT request FROM openai_response_requests WHERE workflow_id = $1")
            .bind(workflow_id)
            .fetch_optional(db)
            .await?;
    Ok(row.map(|(Json(echo),)| echo))
}

/// Sets `echo`'s fields on `response`. A run made through Spool's own API has none: it ran in
/// the background, and the rest are the defaults.
pub(crate) fn apply(response: &mut Value, echo: Option<&Value>) {
    let defaults = of_request(&json!({"background": true}));
    let echo = echo.unwrap_or(&defaults);
    if let (Some(response), Some(echo)) = (response.as_object_mut(), echo.as_object()) {
        for (field, value) in echo {
            // OpenAI's document has `user` a string, not null: absent when not given.
            if field == "user" && value.is_null() {
                continue;
            }
            response.insert(field.clone(), value.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_create_is_not_background_and_sent_fields_are_kept() {
        let echo = of_request(
            &json!({"model": "m", "input": "hi", "instructions": "Be brief.",
            "temperature": 0.2, "text": {"format": {"type": "json_object"}}}),
        );
        assert_eq!(echo["background"], false);
        assert_eq!(echo["instructions"], "Be brief.");
        assert_eq!(echo["temperature"], 0.2);
        assert_eq!(echo["text"]["format"]["type"], "json_object");
        assert_eq!(echo["tools"], json!([]));
        assert!(echo.get("input").is_none(), "only the echoed fields");
        let background = of_request(&json!({"background": true}));
        assert_eq!(background["background"], true);
    }
}
