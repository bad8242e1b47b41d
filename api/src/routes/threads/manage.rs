//! The thread sidebar (DESIGN §7): list a user's threads, rename or tag one, erase one.
//!
//! Erasure is a legal duty, so it is thorough: the active run is stopped (its worker's writes
//! then match no row, and the stream's fence refuses its events), and the thread's messages,
//! runs, steps, idempotency keys, webhook deliveries and Redis stream are deleted. The row
//! keeps only its id and `erased_at`, so the id is 404 for everyone afterwards and a
//! `user_message` can never create it again.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Serialize;
use serde_json::{Map, Value};

use spool_shared::ThreadId;
use spool_shared::db;
use spool_shared::db::threads::{self, ThreadFilter, ThreadPatch};
use spool_shared::ids::AgentId;
use spool_shared::stream;

use super::{ThreadResponse, thread_not_found};
use crate::app::AppState;
use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody, Unauthenticated};
use crate::extract::{ApiJson, ApiPath};
use crate::routes::list::{self, List, ListQuery};

/// Longest thread title, in characters.
pub const MAX_TITLE_CHARS: usize = 200;

/// A page of threads.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ThreadList {
    /// The threads, newest first.
    pub data: Vec<ThreadResponse>,
    /// The `cursor` of the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

/// The caller's threads (an admin's: the tenant's), newest first.
#[utoipa::path(
    get,
    path = "/v1/threads",
    tag = "threads",
    security(("bearer" = [])),
    params(
        ("limit" = Option<i64>, Query, minimum = 1, maximum = 100, description = "Rows per page (default 20; over 100 is a 400)."),
        ("cursor" = Option<String>, Query, description = "The `next_cursor` of the previous page."),
        ("status" = Option<String>, Query, description = "`idle` or `busy`."),
        ("agent_id" = Option<AgentId>, Query, description = "Only threads answered by this agent."),
        ("metadata" = Option<Object>, Query, style = DeepObject, explode = true,
            description = "`metadata[key]=value`: only threads whose metadata has the key with this value (compared as text); repeatable with other keys."),
    ),
    responses(
        (status = 200, description = "A page of threads.", body = ThreadList),
        (status = 400, description = "`invalid_limit`, `invalid_cursor`, `invalid_filter`, `unknown_parameter`", body = ErrorBody),
        Unauthenticated,
    )
)]
pub(crate) async fn list_threads(
    State(state): State<AppState>,
    caller: Caller,
    mut query: ListQuery,
) -> Result<Json<List<ThreadResponse>>, ApiError> {
    let mut filter = ThreadFilter::default();
    query.filters(|key, value| {
        match key {
            "status" if filter.busy.is_some() => return Err(list::repeated(key)),
            "status" => {
                filter.busy = Some(match &*value {
                    "busy" => true,
                    "idle" => false,
                    _ => return Err(list::invalid(key, "`idle` or `busy`")),
                });
            }
            "agent_id" if filter.agent_id.is_some() => return Err(list::repeated(key)),
            "agent_id" => {
                filter.agent_id = Some(
                    value
                        .parse()
                        .map_err(|_| list::invalid(key, "an agent id (UUID)"))?,
                );
            }
            _ => match key
                .strip_prefix("metadata[")
                .and_then(|k| k.strip_suffix(']'))
            {
                Some(name) if !name.is_empty() => filter.metadata.push((name.to_owned(), value)),
                _ => return Ok(false),
            },
        }
        Ok(true)
    })?;
    let page = threads::list(
        &state.db,
        caller.scope(),
        &filter,
        query.cursor,
        query.limit,
    )
    .await?;
    Ok(Json(List::of(page, ThreadResponse::from)))
}

/// Body of `PATCH /v1/threads/{thread_id}` (the handler reads it as a JSON object, to tell a
/// `null` that clears from an absent field; this type documents it).
#[derive(Debug, utoipa::ToSchema)]
pub struct PatchThreadRequest {
    /// The new title (at most 200 characters); `null` clears it.
    #[schema(max_length = 200)]
    pub title: Option<String>,
    /// Merged into the metadata: each key is set, or removed when its value is `null`.
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Map<String, Value>>,
}

/// Renames a thread or changes its metadata.
#[utoipa::path(
    patch,
    path = "/v1/threads/{thread_id}",
    tag = "threads",
    security(("bearer" = [])),
    params(("thread_id" = ThreadId, Path, description = "The thread.")),
    request_body = PatchThreadRequest,
    responses(
        (status = 200, description = "The thread as it is now.", body = ThreadResponse),
        (status = 400, description = "`invalid_json`", body = ErrorBody),
        Unauthenticated,
        (status = 404, description = "`thread_not_found` (also another owner's, or erased), `not_found`", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`", body = ErrorBody),
        (status = 422, description = "`invalid_body`, `invalid_title`: nothing is changed", body = ErrorBody),
    )
)]
pub(crate) async fn patch_thread(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(thread_id): ApiPath<ThreadId>,
    ApiJson(body): ApiJson<Map<String, Value>>,
) -> Result<Json<ThreadResponse>, ApiError> {
    let mut patch = ThreadPatch::default();
    for (key, value) in body {
        match (key.as_str(), value) {
            ("title", Value::Null) => patch.title = Some(None),
            ("title", Value::String(title)) => {
                if title.chars().count() > MAX_TITLE_CHARS {
                    return Err(ApiError::unprocessable(
                        "invalid_title",
                        format!("title is over {MAX_TITLE_CHARS} characters"),
                    ));
                }
                patch.title = Some(Some(title));
            }
            ("metadata", Value::Object(metadata)) => patch.metadata = Some(metadata),
            ("title", _) => {
                return Err(ApiError::unprocessable(
                    "invalid_body",
                    "title must be a string or null",
                ));
            }
            ("metadata", _) => {
                return Err(ApiError::unprocessable(
                    "invalid_body",
                    "metadata must be an object",
                ));
            }
            (other, _) => {
                return Err(ApiError::unprocessable(
                    "invalid_body",
                    format!("unknown field `{other}`, expected `title` or `metadata`"),
                ));
            }
        }
    }
    let thread = threads::update(&state.db, thread_id, caller.scope(), &patch)
        .await?
        .ok_or_else(thread_not_found)?;
    Ok(Json(thread.into()))
}

/// Erases a thread: stops its active run, deletes its messages, runs, steps, idempotency keys,
/// webhook deliveries and stream. The id is 404 for everyone afterwards, and a `user_message`
/// to it is refused (404), never a new thread.
#[utoipa::path(
    delete,
    path = "/v1/threads/{thread_id}",
    tag = "threads",
    security(("bearer" = [])),
    params(("thread_id" = ThreadId, Path, description = "The thread.")),
    responses(
        (status = 204, description = "Erased."),
        Unauthenticated,
        (status = 404, description = "`thread_not_found` (also another owner's, or already erased), `not_found`", body = ErrorBody),
        (status = 503, description = "`redis_unavailable`: nothing was erased; try again", body = ErrorBody),
    )
)]
pub(crate) async fn delete_thread(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(thread_id): ApiPath<ThreadId>,
) -> Result<StatusCode, ApiError> {
    let mut tx = state.db.begin().await?;
    let erasing = threads::lock_for_erasure(&mut tx, thread_id, caller.scope())
        .await?
        .ok_or_else(thread_not_found)?;
    // Redis first, under the thread's lock: if it fails, nothing is erased and the client can
    // try again; once it succeeds, the active run's worker can publish nothing more.
    let mut conn = state.streams.conn();
    stream::erase(
        &mut conn,
        state.streams.keys(),
        thread_id,
        &erasing.publishing,
    )
    .await
    .map_err(|err| {
        tracing::warn!(error = %err, thread.id = %thread_id, "could not erase the stream");
        ApiError::Unavailable {
            code: "redis_unavailable",
            message: "the stream store is unavailable; try again".into(),
            retry_after: 1,
        }
    })?;
    let erased = match threads::erase(&mut tx, thread_id).await {
        Ok(()) => tx.commit().await,
        Err(err) => Err(err),
    };
    if let Err(err) = erased {
        // The thread stays: lift the fences, or its active run could never publish again (best
        // effort; the stream itself is gone, which only a replay notices: `stream_reset`).
        let fields: Vec<String> = erasing.publishing.iter().map(ToString::to_string).collect();
        let fence = state.streams.keys().fence(thread_id);
        let lifted: redis::RedisResult<()> = redis::cmd("HDEL")
            .arg(&fence)
            .arg(fields)
            .query_async(&mut conn)
            .await;
        if let Err(redis_err) = lifted {
            tracing::error!(error = %redis_err, thread.id = %thread_id,
                "erasure failed after its stream was erased; the fences of its runs stay up");
        }
        return Err(err.into());
    }
    // The erased active runs hold no room in their quotas any more.
    for (run, tenant, quota) in &erasing.admitted {
        state.admission.release(tenant, *run, quota).await;
    }
    for run in &erasing.publishing {
        // An active run's worker stops at once (else at its next heartbeat, which matches no
        // row); an ended run ignores it.
        db::notify_cancel(&state.db, *run).await?;
    }
    tracing::info!(thread.id = %thread_id, runs = erasing.runs.len(), "thread erased");
    Ok(StatusCode::NO_CONTENT)
}
