//! `GET /v1/usage` (`usage:read`, docs/operations.md): the tenant's tokens and runs in a
//! window, by user, agent, provider or model, from Postgres: whole UTC days from the daily
//! roll-up, the rest from per-run figures, which are kept `SPOOL_RETENTION_USAGE_DETAIL_DAYS`
//! (`spool_shared::db::usage`).

use axum::Json;
use axum::extract::State;
use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};

use spool_shared::db::usage::{self, GroupBy, UsageRow, Window};

use crate::app::AppState;
use crate::auth::{Caller, Permission};
use crate::error::{ApiError, ErrorBody, MissingPermission, Unauthenticated};
use crate::extract::ApiQuery;
use utoipa_axum::{router::OpenApiRouter, routes};

/// The longest window, in days.
pub const MAX_WINDOW_DAYS: i64 = 366;

/// `/v1/usage`.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(get_usage))
}

/// Query of `GET /v1/usage`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct UsageQuery {
    /// Start of the window (RFC 3339, inclusive; default: today's start, UTC).
    #[serde(default)]
    pub from: Option<DateTime<Utc>>,
    /// End of the window (RFC 3339, exclusive; default: now).
    #[serde(default)]
    pub to: Option<DateTime<Utc>>,
    /// `user`, `agent`, `provider` or `model` (default `user`).
    #[serde(default)]
    #[param(pattern = "^(user|agent|provider|model)$")]
    pub group_by: Option<String>,
}

/// One group's usage.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct UsageGroup {
    /// The user id, the agent id (`default` for the server's default agent), the provider or
    /// the model. A provider is the run's, as its agent named it when the run was enqueued:
    /// `tenant:<name>` (one of the tenant's `/v1/providers`, by the name it had then, also
    /// after it is deleted), `operator:<name>` (one of the server's `SPOOL_PROVIDERS`), or
    /// `unknown` (an agent naming no provider, the server's default agent, and runs counted
    /// before providers were recorded).
    pub group: String,
    /// Prompt tokens.
    pub input_tokens: i64,
    /// Generated tokens.
    pub output_tokens: i64,
    /// Runs that ended in the window (by model: runs with a step on that model).
    pub runs: i64,
    /// What the tokens cost in US dollars, at the providers' `prices`; `null` when some of
    /// them were on a model with no price (see `unpriced_models`) or recorded before costs
    /// were: unpriced tokens are never counted as free.
    pub cost_usd: Option<f64>,
    /// The group's models with no price (their calls have no known cost).
    pub unpriced_models: Vec<String>,
}

/// The tenant's usage.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct UsageResponse {
    /// Start of the window.
    pub from: DateTime<Utc>,
    /// End of the window.
    pub to: DateTime<Utc>,
    /// What `data` is grouped by.
    #[schema(pattern = "^(user|agent|provider|model)$")]
    pub group_by: String,
    /// One row per group, largest total first.
    pub data: Vec<UsageGroup>,
    /// Every model of the window with no price, whatever its group (sorted).
    pub unpriced_models: Vec<String>,
}

/// The tenant's tokens, dollars and runs in a window, by user, agent, provider or model. Runs
/// count when they end (their usage is final then). Models with no price are named, never
/// counted as free.
#[utoipa::path(
    get,
    path = "/v1/usage",
    tag = "usage",
    security(("bearer" = ["usage:read"])),
    params(UsageQuery),
    responses(
        (status = 200, description = "The usage.", body = UsageResponse),
        (status = 400, description = "`invalid_window`, `invalid_group_by`, `usage_detail_expired` (a window starting or ending inside a UTC day older than `SPOOL_RETENTION_USAGE_DETAIL_DAYS`: usage that old is kept by whole day)", body = ErrorBody),
        Unauthenticated,
        MissingPermission,
        (status = 422, description = "`invalid_query` (a time that is not RFC 3339, an unknown parameter)", body = ErrorBody),
    )
)]
async fn get_usage(
    State(state): State<AppState>,
    caller: Caller,
    ApiQuery(query): ApiQuery<UsageQuery>,
) -> Result<Json<UsageResponse>, ApiError> {
    caller.require(Permission::UsageRead)?;
    let now = Utc::now();
    let to = query.to.unwrap_or(now);
    let from = query.from.unwrap_or_else(|| {
        now.date_naive()
            .and_hms_opt(0, 0, 0)
            .map_or(now, |midnight| midnight.and_utc())
    });
    if from >= to || to - from > Duration::days(MAX_WINDOW_DAYS) {
        return Err(ApiError::bad_request(
            "invalid_window",
            format!("`from` must be before `to`, at most {MAX_WINDOW_DAYS} days apart"),
        ));
    }
    let group_by = match query.group_by.as_deref().unwrap_or("user") {
        "user" => GroupBy::User,
        "agent" => GroupBy::Agent,
        "provider" => GroupBy::Provider,
        "model" => GroupBy::Model,
        _ => {
            return Err(ApiError::bad_request(
                "invalid_group_by",
                "group_by must be `user`, `agent`, `provider` or `model`",
            ));
        }
    };
    let window = Window::new(from, to);
    if let (Some(edge), Some(kept)) = (window.oldest_edge(), state.config.retention.usage_detail())
        && edge < now - kept
    {
        return Err(ApiError::bad_request(
            "usage_detail_expired",
            format!(
                "usage older than {} days is kept by UTC day: give `from` and `to` at midnight \
                 UTC for that part of the window",
                kept.num_days()
            ),
        ));
    }
    let rows = usage::report(&state.db, &caller.owner.tenant_id, window, group_by).await?;
    let mut unpriced: Vec<String> = rows
        .iter()
        .flat_map(|row| row.unpriced_models.iter().cloned())
        .collect();
    unpriced.sort();
    unpriced.dedup();
    Ok(Json(UsageResponse {
        from,
        to,
        group_by: query.group_by.unwrap_or_else(|| "user".into()),
        unpriced_models: unpriced,
        data: rows
            .into_iter()
            .map(
                |UsageRow {
                     group,
                     input_tokens,
                     output_tokens,
                     runs,
                     cost_usd,
                     unpriced_models,
                 }| UsageGroup {
                    group,
                    input_tokens,
                    output_tokens,
                    runs,
                    cost_usd,
                    unpriced_models,
                },
            )
            .collect(),
    }))
}
