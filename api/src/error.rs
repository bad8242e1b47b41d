//! The API's one error type. Variants are HTTP outcomes; every response body is
//! `{"error": {"code": "snake_case", "message": "human text", ...}}` ([`ErrorBody`] documents
//! it). Internal causes are logged once, here, and never shown to the client.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{Map, Value, json};

use spool_shared::WorkflowId;
use spool_shared::agent::FieldError;
use spool_shared::status::RunStatus;

/// The body of every error response: `{"error": {"code", "message", ...}}`.
#[derive(Debug, utoipa::ToSchema)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// An error's code and message, with the extra fields some codes carry.
#[derive(Debug, utoipa::ToSchema)]
pub struct ErrorDetail {
    /// Machine-readable, `snake_case` (`thread_not_found`, `invalid_body`, ...).
    pub code: String,
    /// Human text.
    pub message: String,
    /// `thread_busy`: the active run.
    pub active_workflow_id: Option<WorkflowId>,
    /// `thread_busy`: where to stream the active run.
    pub stream_url: Option<String>,
    /// `run_not_waiting`: the run's status.
    pub status: Option<RunStatus>,
    /// `invalid_agent`, `invalid_overrides`: every problem, by field.
    pub errors: Option<Vec<FieldError>>,
    /// `missing_tool_outputs`: the pending calls without an output.
    pub missing: Option<Vec<String>>,
    /// `rate_limited`, `concurrency_limited`, `budget_exceeded`: whose quota (`user` or
    /// `tenant`).
    #[schema(pattern = "^(user|tenant)$")]
    pub scope: Option<String>,
    /// `rate_limited`, `concurrency_limited`, `budget_exceeded` (of tokens), `too_many_streams`:
    /// the limit reached.
    pub limit: Option<u64>,
    /// `budget_exceeded` of a budget in dollars (`daily_budget_usd`): the budget, in US dollars
    /// (then `limit` is absent).
    pub limit_usd: Option<f64>,
    /// `rate_limited`, `concurrency_limited`, `budget_exceeded`: the agent whose own quota
    /// (its `governance`) is reached; absent for the server's quotas.
    pub agent_id: Option<String>,
    /// `rate_limited`, `concurrency_limited`, `budget_exceeded`, `too_many_streams`: the
    /// `Retry-After` seconds.
    pub retry_after: Option<u32>,
    /// `forbidden`: the permission the token lacks (`runs:create`, `agents:write`, ...).
    pub permission: Option<String>,
}

/// The answers of a route that takes a JSON body to a body it cannot read, for its OpenAPI
/// `responses(...)`.
#[derive(utoipa::IntoResponses)]
pub enum BadBody {
    /// Not JSON.
    #[response(status = 400, description = "`invalid_json`")]
    InvalidJson(ErrorBody),
    /// Over the body limit.
    #[response(status = 413, description = "`body_too_large`")]
    TooLarge(ErrorBody),
    /// Not `application/json`.
    #[response(status = 415, description = "`unsupported_media_type`")]
    UnsupportedMediaType(ErrorBody),
}

/// The 401 of every authenticated route, for its OpenAPI `responses(...)`.
#[derive(utoipa::IntoResponses)]
#[response(
    status = 401,
    description = "`missing_token`, `invalid_token`, `token_expired`, `api_key_revoked`"
)]
pub struct Unauthenticated(#[expect(dead_code, reason = "documents the body")] ErrorBody);

/// The 403 of every route that needs a permission, for its OpenAPI `responses(...)`: the
/// operation's `security` names the permission.
#[derive(utoipa::IntoResponses)]
#[response(
    status = 403,
    description = "`forbidden`: the token lacks the permission the operation's `security` \
                   names (`permission` says which)"
)]
pub struct MissingPermission(#[expect(dead_code, reason = "documents the body")] ErrorBody);

/// An error answered to a client.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The resource does not exist or belongs to someone else (never 403: invariant 9).
    #[error("{message}")]
    NotFound {
        /// Machine-readable code.
        code: &'static str,
        /// Human text.
        message: String,
    },
    /// No valid credentials.
    #[error("{message}")]
    Unauthorized {
        /// Machine-readable code.
        code: &'static str,
        /// Human text.
        message: String,
    },
    /// Valid credentials without the right (a permission the token lacks); `details` are
    /// merged into the body (`permission`).
    #[error("{message}")]
    Forbidden {
        /// Machine-readable code.
        code: &'static str,
        /// Human text.
        message: String,
        /// Extra fields of the error object.
        details: Map<String, Value>,
    },
    /// The request conflicts with the current state; `details` are merged into the body.
    #[error("{message}")]
    Conflict {
        /// Machine-readable code.
        code: &'static str,
        /// Human text.
        message: String,
        /// Extra fields of the error object.
        details: Map<String, Value>,
    },
    /// The request is malformed or invalid (400, 413, 415 or 422); `details` are merged into
    /// the body (e.g. every problem of an agent spec).
    #[error("{message}")]
    Invalid {
        /// The status: 400, 413, 415 or 422.
        status: StatusCode,
        /// Machine-readable code.
        code: &'static str,
        /// Human text.
        message: String,
        /// Extra fields of the error object.
        details: Map<String, Value>,
    },
    /// A quota refuses the request (429); retry after the given seconds. `details` are merged
    /// into the body.
    #[error("{message}")]
    TooManyRequests {
        /// Machine-readable code.
        code: &'static str,
        /// Human text.
        message: String,
        /// Seconds for `Retry-After`.
        retry_after: u32,
        /// Extra fields of the error object.
        details: Map<String, Value>,
    },
    /// A dependency is down; retry after the given seconds.
    #[error("{message}")]
    Unavailable {
        /// Machine-readable code.
        code: &'static str,
        /// Human text.
        message: String,
        /// Seconds for `Retry-After`.
        retry_after: u32,
    },
    /// Anything else: logged, answered as a bare 500.
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

impl ApiError {
    /// An invalid request: `status` (400, 413, 415 or 422) with a code.
    pub fn invalid(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self::Invalid {
            status,
            code,
            message: message.into(),
            details: Map::new(),
        }
    }

    /// 422 with a code.
    pub fn unprocessable(code: &'static str, message: impl Into<String>) -> Self {
        Self::invalid(StatusCode::UNPROCESSABLE_ENTITY, code, message)
    }

    /// 422 with a code and every problem by field (`errors: [{field, message}]`); `what` names
    /// what has them (`the agent`).
    pub fn invalid_fields(code: &'static str, what: &str, errors: Vec<FieldError>) -> Self {
        let message = format!("{what}: {} problem(s); see `errors`", errors.len());
        Self::unprocessable(code, message).with("errors", errors)
    }

    /// 400 with a code.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::invalid(StatusCode::BAD_REQUEST, code, message)
    }

    /// 409 with a code.
    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        Self::Conflict {
            code,
            message: message.into(),
            details: Map::new(),
        }
    }

    /// The same error with `key: value` in its body (conflicts, refusals, invalid requests and
    /// quotas; other kinds carry no extra fields).
    pub fn with(mut self, key: &str, value: impl Serialize) -> Self {
        if let Self::Conflict { details, .. }
        | Self::Forbidden { details, .. }
        | Self::Invalid { details, .. }
        | Self::TooManyRequests { details, .. } = &mut self
        {
            details.insert(key.into(), json!(value));
        }
        self
    }

    /// 404 with a code.
    pub fn not_found(code: &'static str, message: impl Into<String>) -> Self {
        Self::NotFound {
            code,
            message: message.into(),
        }
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(err: sqlx::Error) -> Self {
        // Postgres stores no NUL character (`\u0000`) in `text` (22021) or `jsonb` (22P05): the
        // client's text is what is invalid, not the server.
        if let sqlx::Error::Database(db) = &err
            && matches!(db.code().as_deref(), Some("22021" | "22P05"))
        {
            return Self::unprocessable(
                "invalid_body",
                "text must not contain the NUL character (\\u0000)",
            );
        }
        Self::Internal(err.into())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code, message, details, retry_after) = match self {
            Self::NotFound { code, message } => {
                (StatusCode::NOT_FOUND, code, message, Map::new(), None)
            }
            Self::Unauthorized { code, message } => {
                (StatusCode::UNAUTHORIZED, code, message, Map::new(), None)
            }
            Self::Forbidden {
                code,
                message,
                details,
            } => (StatusCode::FORBIDDEN, code, message, details, None),
            Self::Conflict {
                code,
                message,
                details,
            } => (StatusCode::CONFLICT, code, message, details, None),
            Self::Invalid {
                status,
                code,
                message,
                details,
            } => (status, code, message, details, None),
            Self::TooManyRequests {
                code,
                message,
                retry_after,
                details,
            } => (
                StatusCode::TOO_MANY_REQUESTS,
                code,
                message,
                details,
                Some(retry_after),
            ),
            Self::Unavailable {
                code,
                message,
                retry_after,
            } => (
                StatusCode::SERVICE_UNAVAILABLE,
                code,
                message,
                Map::new(),
                Some(retry_after),
            ),
            Self::Internal(err) => {
                tracing::error!(error = format!("{err:#}"), "internal error");
                let message = "internal error".to_owned();
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal_error",
                    message,
                    Map::new(),
                    None,
                )
            }
        };
        let mut error = Map::new();
        error.insert("code".into(), code.into());
        error.insert("message".into(), message.into());
        error.extend(details);
        let mut response = (status, Json(json!({ "error": error }))).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let Some(seconds) = retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}
