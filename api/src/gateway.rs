//! The SSE gateway: `GET /v1/threads/{thread_id}/stream` ([`hub`] holds the per-thread feeds
//! and the fan-out to subscribers).
//!
//! - No cursor: if a message is streaming (or queued), replay it from its `message_start` and
//!   follow it live to its `done`, then close; otherwise `message_not_streaming`.
//! - A cursor (`Last-Event-ID`, else `?last_entry_id=`): every entry after it, live until a
//!   `done`, then close. Not an entry id: 400. An entry Redis no longer holds (trimmed, lost,
//!   another thread's, from the future): `stream_reset`. Nothing after it and no run active:
//!   `message_not_streaming`, unless the thread's last run ended within [`FLUSH_WINDOW`] and
//!   its `done` is not in the stream yet (its worker is still publishing): the session waits
//!   for its events, until [`FLUSH_WINDOW`] passes without one (then `message_not_streaming`).
//! - `?last_message_id=` of a finished message: `message_not_streaming` with that id.
//!
//! Subscribing never races the worker: the subscriber joins the thread's live feed first, then
//! reads the backlog from its starting point, and drops live entries it has already sent. A
//! gap is never silent: a lagging subscriber is disconnected (and resumes with its cursor); an
//! entry that vanishes under a session's backlog read or the live feed (trimmed, deleted, lost
//! in a failover) ends the session with `stream_reset`; and a stream that has gone quiet while
//! its run is terminal in Postgres (its `done` was lost with Redis) ends with
//! `message_not_streaming`. A run that paused while its pause event was lost (Redis down past
//! the publisher's last flush, a worker killed between the commit and the publish) would leave
//! its followers waiting on nothing: when the stream goes quiet on a paused run and the last
//! event sent was not its pause event, the session sends that event, rebuilt from the run's
//! `pending_action` in Postgres (without an `id`, so the client's cursor stays on a real
//! entry; a client may therefore see the same pause twice, if the original turns up late).

pub mod ai_sdk;
pub mod hub;
mod session;
pub mod slots;

use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::response::sse::Event as SseEvent;
use serde::Deserialize;
use serde_json::{Value, json};
use sqlx::PgPool;

use spool_shared::db::{messages, runs};
use spool_shared::event::EventType;
use spool_shared::redis_conn::RedisConn;
use spool_shared::status::MessageStatus;
use spool_shared::stream::{self as events, EntryId, FLUSH_WINDOW, StoredEvent};
use spool_shared::{MessageId, ThreadId, WorkflowId};

use crate::app::AppState;
use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody, MissingPermission, Unauthenticated};
use crate::extract::{ApiPath, ApiQuery};
use utoipa_axum::{router::OpenApiRouter, routes};

pub use hub::Hub;
pub(crate) use session::{Item, Session, sse, sse_without_retry};
use session::{Linger, Start, Until};
pub use slots::{StreamLimits, StreamSlot, StreamSlots};

/// A slot for one more stream of the caller on this process (429 `too_many_streams` when it
/// holds `SPOOL_SSE_MAX_STREAMS_PER_USER` already, 503 `server_stream_capacity` when the
/// process holds `SPOOL_SSE_MAX_STREAMS`): taken by every streaming route before it changes
/// anything.
pub(crate) fn stream_slot(state: &AppState, caller: &Caller) -> Result<StreamSlot, ApiError> {
    state.streams.slots().take(
        &caller.owner,
        StreamLimits {
            per_user: state.config.max_streams_per_user,
            per_process: state.config.max_streams,
        },
    )
}

/// `/v1/threads/{thread_id}/stream`.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(stream_thread))
}

/// Query of the stream endpoint.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamQuery {
    /// Resume after this entry id (the `Last-Event-ID` header wins).
    #[serde(default)]
    pub last_entry_id: Option<String>,
    /// The message the client was following.
    #[serde(default)]
    pub last_message_id: Option<String>,
    /// The token, for `EventSource` (which cannot set headers).
    #[serde(default)]
    pub access_token: Option<String>,
    /// `native` (the default) or `ai-sdk` (the AI SDK's UI message stream).
    #[serde(default)]
    pub format: Option<String>,
}

pub(crate) fn unavailable(err: redis::RedisError) -> ApiError {
    tracing::warn!(error = %err, "Redis unavailable for a stream");
    ApiError::Unavailable {
        code: "stream_unavailable",
        message: "the event stream is temporarily unavailable; retry".into(),
        retry_after: 2,
    }
}

/// Server-Sent Events of the thread's run: replayed, then live until its `done`.
///
/// Each event has an `id:` (its stream entry id, the cursor to resume from), an `event:` (its
/// type) and a `data:` line with the JSON envelope `{v, type, thread_id, workflow_id,
/// message_id, attempt, data}`. A cursor Redis no longer covers gets one `stream_reset` event;
/// nothing to follow gets one `message_not_streaming` event.
#[utoipa::path(
    get,
    path = "/v1/threads/{thread_id}/stream",
    tag = "threads",
    security(("bearer" = ["runs:create"]), ("bearer" = ["runs:read:tenant"]),
        ("access_token" = ["runs:create"]), ("access_token" = ["runs:read:tenant"])),
    params(
        ("thread_id" = spool_shared::ThreadId, Path, description = "The thread."),
        ("Last-Event-ID" = Option<String>, Header, pattern = "^[0-9]{1,19}-[0-9]{1,19}$",
            description = "Resume after this entry id (`1732262400123-0`); wins over `last_entry_id`."),
        ("last_entry_id" = Option<String>, Query, pattern = "^[0-9]{1,19}-[0-9]{1,19}$",
            description = "Resume after this entry id."),
        ("last_message_id" = Option<spool_shared::MessageId>, Query,
            description = "The message the client was following."),
        ("access_token" = Option<String>, Query,
            description = "The bearer token, for `EventSource` (which cannot set headers)."),
        ("format" = Option<String>, Query, pattern = "^(native|ai-sdk)$",
            description = "`ai-sdk`: the Vercel AI SDK's UI message stream (`data:` chunks, `[DONE]`, header `x-vercel-ai-ui-message-stream: v1`; ids `ENTRY` or `ENTRY/k`, resumable the same way; `204` when nothing streams)."),
    ),
    responses(
        (status = 200, description = "The event stream.", content_type = "text/event-stream",
            body = crate::openapi::StreamEvent),
        (status = 204, description = "`format=ai-sdk` without a cursor: nothing is streaming."),
        (status = 400, description = "`invalid_cursor`, `invalid_message_id`, `invalid_format`", body = ErrorBody),
        Unauthenticated,
        MissingPermission,
        (status = 404, description = "`thread_not_found`, `not_found`", body = ErrorBody),
        (status = 422, description = "`invalid_query`", body = ErrorBody),
        (status = 429, description = "`too_many_streams`: the caller holds `SPOOL_SSE_MAX_STREAMS_PER_USER` streams open on this server already; with `limit` and `retry_after`.", body = ErrorBody,
            headers(("Retry-After" = u32, description = "Seconds to wait."))),
        (status = 503, description = "`stream_unavailable` (Redis is down); `server_stream_capacity`: this server holds `SPOOL_SSE_MAX_STREAMS` streams open already", body = ErrorBody,
            headers(("Retry-After" = u32, description = "Seconds to wait."))),
    )
)]
async fn stream_thread(
    State(state): State<AppState>,
    ApiPath(thread_id): ApiPath<ThreadId>,
    ApiQuery(query): ApiQuery<StreamQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let caller = crate::auth::stream_token::authorize_stream(
        &state,
        &headers,
        query.access_token.as_deref(),
        thread_id,
    )
    .await?;
    let slot = stream_slot(&state, &caller)?;
    match query.format.as_deref() {
        None | Some("native") => {}
        Some("ai-sdk") => {
            let cursor = match headers.get("last-event-id") {
                Some(value) => Some(value.to_str().unwrap_or("").to_owned()),
                None => query.last_entry_id.clone(),
            };
            return ai_sdk::stream(&state, slot, thread_id, cursor.as_deref()).await;
        }
        Some(_) => {
            return Err(ApiError::bad_request(
                "invalid_format",
                "format must be `native` or `ai-sdk`",
            ));
        }
    }
    let (cursor, last_message) = cursors(&headers, &query)?;
    let hub = &state.streams;
    let mut conn = hub.conn();
    let key = hub.keys().events(thread_id);
    let start = match cursor {
        Some(cursor) => resume_after(&state, &mut conn, thread_id, &key, cursor).await?,
        None => follow_streaming(&state, &mut conn, thread_id, &key, last_message).await?,
    };
    let start = match start {
        Ok(start) => start,
        Err(control) => return Ok(control),
    };
    let session = Session::open(&state, slot, conn, key, thread_id, start).await?;
    Ok(sse(session.into_stream()))
}

/// A session over one run's message, from its `message_start` (whether the run is over or not)
/// to its `done`: what the OpenAI-compatible routes translate. `Ok(None)` when the run is over
/// and Redis no longer holds its events (the stored response is then the answer).
pub(crate) async fn follow_run(
    state: &AppState,
    slot: StreamSlot,
    thread_id: ThreadId,
    workflow_id: WorkflowId,
    message_id: MessageId,
) -> Result<Option<Session>, ApiError> {
    let hub = &state.streams;
    let mut conn = hub.conn();
    let key = hub.keys().events(thread_id);
    // The tail before Postgres: a `message_start` written in between is after it.
    let tail = events::tail(&mut conn, &key)
        .await
        .map_err(unavailable)?
        .unwrap_or_default();
    let start = events::message_start(&mut conn, hub.keys(), thread_id, message_id)
        .await
        .map_err(unavailable)?;
    let (after, after_entry) = match start {
        Some(start) => {
            // The index of starts may outlive the entries (trimmed, lost): then the events are
            // gone, not to be replayed from wherever the stream now begins.
            let retention = events::inspect(&mut conn, hub.keys(), thread_id, start)
                .await
                .map_err(unavailable)?;
            if !retention.holds_cursor {
                return Ok(None);
            }
            (start.predecessor(), false)
        }
        None => {
            let Some(standing) = runs::standing(&state.db, workflow_id).await? else {
                return Ok(None);
            };
            // Ended without a `message_start` in the stream: gone, unless it ended within its
            // flush window, when its worker (which writes Postgres first) may still be
            // publishing it (a run that fails at once, followed at once, meets exactly that).
            if standing.status.is_terminal() {
                let age = runs::seconds_since_update(&state.db, workflow_id, thread_id).await?;
                if age.is_none_or(|age| age >= FLUSH_WINDOW.as_secs_f64()) {
                    return Ok(None);
                }
            }
            (tail, tail != EntryId::default())
        }
    };
    let start = Start {
        after,
        after_entry,
        until: Until::DoneOf(message_id.to_string()),
        // Watched even when it is over: its worker may still be publishing its last events, and
        // a `done` lost with Redis ends the session once the stream is quiet.
        watch: Some(workflow_id),
        linger: None,
    };
    Ok(Some(
        Session::open(state, slot, conn, key, thread_id, start).await?,
    ))
}

/// The cursor (`Last-Event-ID`, which wins, else `?last_entry_id=`) and `?last_message_id=`.
fn cursors(
    headers: &HeaderMap,
    query: &StreamQuery,
) -> Result<(Option<EntryId>, Option<MessageId>), ApiError> {
    let cursor = match headers.get("last-event-id") {
        Some(value) => Some(value.to_str().unwrap_or("").to_owned()),
        None => query.last_entry_id.clone(),
    };
    let cursor = cursor
        .map(|c| c.trim().parse::<EntryId>())
        .transpose()
        .map_err(|_| {
            ApiError::bad_request("invalid_cursor", "the cursor is not a stream entry id")
        })?;
    let last_message = query
        .last_message_id
        .as_deref()
        .map(str::parse::<MessageId>)
        .transpose()
        .map_err(|_| {
            ApiError::bad_request("invalid_message_id", "last_message_id is not a UUID")
        })?;
    Ok((cursor, last_message))
}

/// A session resuming after `cursor`: every later entry, live until a `done`; or the one
/// gateway event that answers instead (`stream_reset` for a cursor Redis does not retain,
/// `message_not_streaming` when nothing follows it).
async fn resume_after(
    state: &AppState,
    conn: &mut RedisConn,
    thread_id: ThreadId,
    key: &str,
    cursor: EntryId,
) -> Result<Result<Start, Response>, ApiError> {
    let retention = events::inspect(conn, state.streams.keys(), thread_id, cursor)
        .await
        .map_err(unavailable)?;
    if !retention.retains(cursor) {
        return Ok(Err(control("stream_reset", reset_data(thread_id, cursor))));
    }
    let mut watch = runs::find_active(&state.db, thread_id)
        .await?
        .map(|run| run.id);
    let mut linger = None;
    if watch.is_none() {
        let last = events::last(conn, key).await.map_err(unavailable)?;
        let follows = last.as_ref().filter(|last| last.id > cursor);
        match follows {
            Some(last) => linger = flushing(&state.db, thread_id, last).await?,
            None => match runs::latest_on_thread(&state.db, thread_id).await? {
                // Enqueued since the question above: followed as the active run it is.
                Some(latest) if !latest.status.is_terminal() => watch = Some(latest.id),
                latest => linger = unpublished(latest.as_ref(), last.as_ref()),
            },
        }
        if watch.is_none() && linger.is_none() && follows.is_none() {
            let data = json!({"thread_id": thread_id});
            return Ok(Err(control("message_not_streaming", data)));
        }
    }
    Ok(Ok(Start {
        after: cursor,
        after_entry: retention.holds_cursor,
        until: Until::AnyDone,
        watch,
        linger,
    }))
}

/// A session following the message in progress (or `last_message`, if it still streams) from
/// its `message_start` to its `done`; or `message_not_streaming` when there is none.
async fn follow_streaming(
    state: &AppState,
    conn: &mut RedisConn,
    thread_id: ThreadId,
    key: &str,
    last_message: Option<MessageId>,
) -> Result<Result<Start, Response>, ApiError> {
    // Read the end of the stream before asking Postgres, so a message_start written in
    // between is after `tail` and is replayed.
    let tail = events::tail(conn, key)
        .await
        .map_err(unavailable)?
        .unwrap_or_default();
    let target = match last_message {
        Some(message) => messages::find_in_thread(&state.db, message, thread_id)
            .await?
            .filter(|m| matches!(m.status, MessageStatus::Queued | MessageStatus::Streaming))
            .and_then(|m| m.workflow_id.map(|run| (m.id, run))),
        None => runs::find_active(&state.db, thread_id)
            .await?
            .map(|run| (run.assistant_message_id, run.id)),
    };
    let Some((message, run)) = target else {
        let data = json!({"thread_id": thread_id, "message_id": last_message});
        return Ok(Err(control("message_not_streaming", data)));
    };
    let start = events::message_start(conn, state.streams.keys(), thread_id, message)
        .await
        .map_err(unavailable)?;
    Ok(Ok(Start {
        // From the message's start (not an entry: the one before it), else from the tail.
        after: start.map_or(tail, EntryId::predecessor),
        after_entry: start.is_none() && tail != EntryId::default(),
        until: Until::DoneOf(message.to_string()),
        watch: Some(run),
        linger: None,
    }))
}

/// With no run active and `last` after the cursor: until when to wait for more events. Only
/// when `last` is not a `done` and its run (of this thread) changed within [`FLUSH_WINDOW`]:
/// its worker may still be publishing its `message_end` and `done`, and a client resuming in
/// between must get them, not a stream cut short (spool-bench P2 hit this).
async fn flushing(
    db: &PgPool,
    thread: ThreadId,
    last: &StoredEvent,
) -> Result<Option<Linger>, ApiError> {
    if last.kind == EventType::Done.as_str() || last.is_marker() {
        return Ok(None);
    }
    let Some(run) = run_of(last) else {
        return Ok(None);
    };
    let age = runs::seconds_since_update(db, run, thread).await?;
    Ok(age.and_then(|age| lingering(age, run)))
}

/// With no run active and nothing after the cursor (`last` is the stream's last entry): how
/// long to wait for the events of the thread's `latest` run (which is over). Only when it
/// changed within [`FLUSH_WINDOW`] and its `done` is not the last entry: it ended in Postgres
/// before its worker published its events (a fast run ends before its first batch is stored),
/// and a client resuming in between must get them, not `message_not_streaming` (spool-bench
/// P2 hit this).
fn unpublished(latest: Option<&runs::Latest>, last: Option<&StoredEvent>) -> Option<Linger> {
    let latest = latest?;
    let shown = last.is_some_and(|last| {
        last.kind == EventType::Done.as_str() && last.depth == 0 && run_of(last) == Some(latest.id)
    });
    if shown {
        return None;
    }
    lingering(latest.age, latest.id)
}

/// The run of an event (from its envelope).
fn run_of(event: &StoredEvent) -> Option<WorkflowId> {
    /// The one field of an envelope read here.
    #[derive(Deserialize)]
    struct Envelope {
        workflow_id: WorkflowId,
    }
    serde_json::from_str::<Envelope>(&event.json)
        .ok()
        .map(|e| e.workflow_id)
}

/// The wait for the last events of `run`, which changed `age` seconds ago, if that is within
/// [`FLUSH_WINDOW`].
fn lingering(age: f64, run: WorkflowId) -> Option<Linger> {
    let left = FLUSH_WINDOW.saturating_sub(Duration::from_secs_f64(age.max(0.0)));
    (!left.is_zero()).then(|| Linger {
        until: tokio::time::Instant::now() + left,
        run,
    })
}

/// The data of a `stream_reset` answering `cursor`.
fn reset_data(thread: ThreadId, cursor: EntryId) -> Value {
    json!({"thread_id": thread, "last_entry_id": cursor.to_string()})
}

/// A response that sends one gateway event (no `id:`) and closes.
fn control(kind: &'static str, data: Value) -> Response {
    let event = SseEvent::default().event(kind).data(data.to_string());
    sse(futures::stream::iter([Ok(event)]))
}
