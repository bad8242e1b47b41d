//! Extractors whose rejections are [`ApiError`]s, so malformed requests get the same JSON error
//! shape as every other error: not JSON → 400 `invalid_json`, wrong content type → 415
//! `unsupported_media_type`, wrong field types or unknown fields → 422 `invalid_body`, too
//! large → 413 `body_too_large`, an id that is not a UUID → 404 (it cannot exist). Bodies
//! must be JSON objects: serde would otherwise accept an array for a struct (`[null, null]`).

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::ApiError;

/// A JSON object body, with [`ApiError`] rejections.
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        // Content type, size and syntax are axum's checks; the shape is ours.
        let axum::Json(value) = axum::Json::<Value>::from_request(request, state).await?;
        if !value.is_object() {
            return Err(ApiError::unprocessable(
                "invalid_body",
                "the body must be a JSON object",
            ));
        }
        serde_json::from_value(value)
            .map(ApiJson)
            .map_err(|err| ApiError::unprocessable("invalid_body", err.to_string()))
    }
}

/// `axum::extract::Path` with [`ApiError`] rejections.
#[derive(Debug, FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
pub struct ApiPath<T>(pub T);

/// `axum::extract::Query` with [`ApiError`] rejections.
#[derive(Debug, FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiError))]
pub struct ApiQuery<T>(pub T);

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> Self {
        let (status, code) = match &rejection {
            JsonRejection::MissingJsonContentType(_) => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
            }
            JsonRejection::JsonSyntaxError(_) => (StatusCode::BAD_REQUEST, "invalid_json"),
            JsonRejection::JsonDataError(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_body"),
            _ if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                (StatusCode::PAYLOAD_TOO_LARGE, "body_too_large")
            }
            _ => (StatusCode::BAD_REQUEST, "invalid_body"),
        };
        ApiError::invalid(status, code, rejection.body_text())
    }
}

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> Self {
        ApiError::not_found(
            "not_found",
            format!("no such resource: {}", rejection.body_text()),
        )
    }
}

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> Self {
        ApiError::unprocessable("invalid_query", rejection.body_text())
    }
}
