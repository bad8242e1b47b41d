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
pub mod slots;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::Stream;
use serde::Deserialize;
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio::sync::broadcast::error::{RecvError, TryRecvError};
use tokio_util::sync::CancellationToken;

use spool_shared::db::{messages, runs, threads};
use spool_shared::event::{self as envelope, Event, EventType};
use spool_shared::status::{MessageStatus, RunStatus};
use spool_shared::stream::{
    self as events, EntryId, FLUSH_WINDOW, Gap, ReadError, RedisConn, StoredEvent,
};
use spool_shared::{MessageId, ThreadId, WorkflowId};

use crate::app::AppState;
use crate::auth::Caller;
use crate::error::{ApiError, ErrorBody, Unauthenticated};
use crate::extract::{ApiPath, ApiQuery};

pub use hub::Hub;
pub use slots::{StreamSlot, StreamSlots};

/// A slot for one more stream of the caller on this process (429 `too_many_streams` when it
/// holds `SPOOL_SSE_MAX_STREAMS_PER_USER` already): taken by every streaming route before it
/// changes anything.
pub(crate) fn stream_slot(state: &AppState, caller: &Caller) -> Result<StreamSlot, ApiError> {
    state
        .streams
        .slots()
        .take(&caller.owner, state.config.max_streams_per_user)
}

/// Backlog entries read per round trip. Bounded by size, not only count: an entry can hold a
/// whole tool result (50,000 characters, up to about 300 KB once JSON-escaped), so a page is
/// at most about 20 MB in memory, held only while it is written out.
pub(crate) const PAGE: usize = 64;
/// The reconnection delay suggested to clients.
const RETRY: Duration = Duration::from_secs(2);
/// Comment interval that keeps proxies from closing idle streams.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// Silence after which a followed run is checked in Postgres.
const SILENCE: Duration = Duration::from_secs(15);

/// `/v1/threads/{thread_id}/stream`.
pub fn router() -> Router<AppState> {
    Router::new().route("/v1/threads/{thread_id}/stream", get(stream_thread))
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

/// When a followed stream ends.
#[derive(Clone, Debug)]
enum Until {
    /// After the `done` of this message.
    DoneOf(String),
    /// After the first `done`.
    AnyDone,
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
    security(("bearer" = []), ("access_token" = [])),
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
        (status = 404, description = "`thread_not_found`, `not_found`", body = ErrorBody),
        (status = 422, description = "`invalid_query`", body = ErrorBody),
        (status = 429, description = "`too_many_streams`: the caller holds `SPOOL_SSE_MAX_STREAMS_PER_USER` streams open on this server already; with `limit` and `retry_after`.", body = ErrorBody,
            headers(("Retry-After" = u32, description = "Seconds to wait."))),
        (status = 503, description = "`stream_unavailable` (Redis is down)", body = ErrorBody,
            headers(("Retry-After" = u32, description = "Seconds to wait."))),
    )
)]
async fn stream_thread(
    State(state): State<AppState>,
    ApiPath(thread_id): ApiPath<ThreadId>,
    ApiQuery(query): ApiQuery<StreamQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let caller = Caller::from_header_or_query(&headers, &state.jwt, query.access_token.as_deref())?;
    threads::find(&state.db, thread_id, caller.scope())
        .await?
        .ok_or_else(|| ApiError::not_found("thread_not_found", "no such thread"))?;
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

/// Where a session starts, when it ends, and what it watches.
struct Start {
    /// The position it sends after.
    after: EntryId,
    /// Whether `after` is an entry of the stream (which must then still be there).
    after_entry: bool,
    until: Until,
    /// The run whose status is checked when the stream goes quiet.
    watch: Option<WorkflowId>,
    /// With no run active: how long to wait for a just-finished run's last events.
    linger: Option<Linger>,
}

/// A session's wait for the last events of a run that has just finished (its worker writes
/// the run's end to Postgres before it publishes them).
#[derive(Clone, Copy, Debug)]
struct Linger {
    /// Until when. Every entry sent moves it to [`FLUSH_WINDOW`] from then: a worker publishes
    /// for as long as Redis keeps storing its batches.
    until: tokio::time::Instant,
    /// The run: if nothing ends the session by then, it ends with `message_not_streaming`.
    run: WorkflowId,
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

pub(crate) fn sse(
    stream: impl Stream<Item = Result<SseEvent, Infallible>> + Send + 'static,
) -> Response {
    let retry = futures::stream::once(async { Ok(SseEvent::default().retry(RETRY)) });
    sse_without_retry(futures::StreamExt::chain(retry, stream))
}

/// An SSE response without the `retry:` hint (which the OpenAI SDKs read as an event with
/// empty data): keep-alive comments and the no-buffering headers only.
pub(crate) fn sse_without_retry(
    stream: impl Stream<Item = Result<SseEvent, Infallible>> + Send + 'static,
) -> Response {
    let mut response = Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE).text("keep-alive"))
        .into_response();
    let headers = response.headers_mut();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

/// What a session yields: the stream's entries and the gateway's own answers, in order. The
/// native route sends them as they are ([`Item::into_sse`]); the OpenAI-compatible routes
/// translate them (`crate::openai`).
#[derive(Debug)]
pub(crate) enum Item {
    /// An entry of the stream, after the position.
    Entry(std::sync::Arc<StoredEvent>),
    /// What followed the position may be lost (`stream_reset`): the session ends.
    Reset {
        /// The last entry sent.
        last_entry_id: EntryId,
    },
    /// The watched run is over (or gone) but its `done` never came: the session ends.
    NotStreaming {
        /// The run.
        workflow_id: WorkflowId,
    },
    /// A paused run's pause event, rebuilt from Postgres (it has no entry id).
    Pause(Box<Event>),
    /// The backlog is sent: what follows is live (once per session).
    Live,
}

impl Item {
    /// The native SSE event of the item (`None` for [`Item::Live`]).
    fn into_sse(self) -> Option<SseEvent> {
        Some(match self {
            Self::Entry(entry) => SseEvent::default()
                .id(entry.id.to_string())
                .event(&entry.kind)
                .data(&entry.json),
            Self::Reset { last_entry_id } => SseEvent::default()
                .event("stream_reset")
                .data(json!({"last_entry_id": last_entry_id.to_string()}).to_string()),
            Self::NotStreaming { workflow_id } => SseEvent::default()
                .event("message_not_streaming")
                .data(json!({"workflow_id": workflow_id}).to_string()),
            Self::Pause(event) => SseEvent::default()
                .event(event.kind().as_str())
                .data(serde_json::to_string(&event).ok()?),
            Self::Live => return None,
        })
    }
}

/// One client's stream: backlog first, then live entries, until its `done`.
pub(crate) struct Session {
    conn: RedisConn,
    key: String,
    db: PgPool,
    subscription: hub::Subscription,
    /// The last entry sent or skipped; everything after it is still to come.
    position: EntryId,
    /// Whether `position` is an entry (false only before the first one, when a session starts
    /// just before a `message_start`): a continued read then checks that it is still there.
    at_entry: bool,
    backlog: VecDeque<StoredEvent>,
    caught_up: bool,
    until: Until,
    /// The run whose status is checked when the stream goes quiet; `None` when no run was
    /// active (the backlog is replayed, then the stream ends).
    watch: Option<WorkflowId>,
    /// The thread (for an event rebuilt from Postgres).
    thread_id: ThreadId,
    /// Whether the last event sent told the client what a paused run waits for.
    pause_shown: bool,
    /// With no run active: the wait for the `done` of a run that has just finished (see
    /// [`flushing`] and [`unpublished`]).
    linger: Option<Linger>,
    shutdown: CancellationToken,
    finished: bool,
    /// Whether [`Item::Live`] has been yielded.
    live: bool,
    /// Counts the stream against its user's limit and in `spool_sse_streams_open`.
    _slot: StreamSlot,
}

impl Session {
    /// A session of the thread's stream at `key` from `start`, joined to the thread's live
    /// feed first (so nothing written meanwhile is missed).
    async fn open(
        state: &AppState,
        slot: StreamSlot,
        conn: RedisConn,
        key: String,
        thread_id: ThreadId,
        start: Start,
    ) -> Result<Self, ApiError> {
        let subscription = state
            .streams
            .subscribe(thread_id)
            .await
            .map_err(unavailable)?;
        Ok(Self {
            conn,
            key,
            db: state.db.clone(),
            subscription,
            position: start.after,
            at_entry: start.after_entry,
            backlog: VecDeque::new(),
            caught_up: false,
            until: start.until,
            watch: start.watch,
            thread_id,
            pause_shown: false,
            linger: start.linger,
            shutdown: state.shutdown.clone(),
            finished: false,
            live: false,
            _slot: slot,
        })
    }

    fn into_stream(self) -> impl Stream<Item = Result<SseEvent, Infallible>> + Send {
        futures::stream::unfold(self, |mut session| async move {
            loop {
                if let Some(event) = session.next().await?.into_sse() {
                    return Some((Ok(event), session));
                }
            }
        })
    }

    /// The next item, or `None` when the session is over.
    pub(crate) async fn next(&mut self) -> Option<Item> {
        if self.finished {
            return None;
        }
        loop {
            if let Some(entry) = self.backlog.pop_front() {
                if let Some(event) = self.emit(std::sync::Arc::new(entry)) {
                    return Some(event);
                }
                continue;
            }
            if !self.caught_up {
                match self.read_page().await {
                    Ok(page) => {
                        self.caught_up = page.len() < PAGE;
                        self.backlog.extend(page);
                        continue;
                    }
                    Err(ReadError::Gap(gap)) => return Some(self.reset(&gap)),
                    Err(ReadError::Redis(err)) => {
                        tracing::warn!(error = %err, "backlog read failed; closing the stream");
                        return None;
                    }
                }
            }
            if !self.live {
                self.live = true;
                return Some(Item::Live);
            }
            // Nothing runs on the thread: no more events will come (a `done` lost with Redis
            // included), so waiting would only hang the client; unless the run has only just
            // finished and its worker is still publishing its last events.
            let linger = match (self.watch, self.linger) {
                (Some(_), _) => None,
                (None, Some(linger)) => Some(linger),
                (None, None) => return None,
            };
            // Entries already received go out without arming the timers and the shutdown
            // waiter below: a fast stream sends one per poll (spool-bench P3).
            match self.subscription.rx.try_recv() {
                Ok(entry) => {
                    if let Some(event) = self.emit(entry) {
                        return Some(event);
                    }
                    continue;
                }
                Err(TryRecvError::Lagged(missed)) => return Self::lagged(missed),
                Err(TryRecvError::Closed) => return None,
                Err(TryRecvError::Empty) => {}
            }
            tokio::select! {
                received = self.subscription.rx.recv() => match received {
                    Ok(entry) => {
                        if let Some(event) = self.emit(entry) {
                            return Some(event);
                        }
                    }
                    Err(RecvError::Lagged(missed)) => return Self::lagged(missed),
                    Err(RecvError::Closed) => return None,
                },
                () = tokio::time::sleep_until(
                    linger.map_or_else(tokio::time::Instant::now, |linger| linger.until)),
                    if linger.is_some() => {
                    // The run's `done` never came (its worker died or Redis lost it).
                    self.finished = true;
                    return linger.map(|linger| Item::NotStreaming { workflow_id: linger.run });
                }
                () = tokio::time::sleep(SILENCE), if linger.is_none() => {
                    if let Some(event) = self.quiet().await {
                        return Some(event);
                    }
                }
                () = self.shutdown.cancelled() => return None,
            }
        }
    }

    /// A subscriber the live feed overtook by `missed` entries is dropped: it can resume.
    fn lagged(missed: u64) -> Option<Item> {
        metrics::counter!("spool_sse_slow_subscriber_drops_total").increment(1);
        tracing::info!(missed, "slow subscriber dropped; it can resume");
        None
    }

    /// The next page of the backlog, continuing from the position.
    async fn read_page(&mut self) -> Result<Vec<StoredEvent>, ReadError> {
        if self.at_entry {
            events::read_following(&mut self.conn, &self.key, self.position, PAGE).await
        } else {
            Ok(events::read_after(&mut self.conn, &self.key, self.position, PAGE).await?)
        }
    }

    /// Ends the session with `stream_reset`: what followed the position may be lost.
    fn reset(&mut self, gap: &Gap) -> Item {
        tracing::info!(error = %gap, "a stream lost entries under a session; stream_reset");
        metrics::counter!("spool_sse_stream_resets_total").increment(1);
        self.finished = true;
        Item::Reset {
            last_entry_id: self.position,
        }
    }

    /// The item for an entry after the position, if it is one to send.
    fn emit(&mut self, entry: std::sync::Arc<StoredEvent>) -> Option<Item> {
        if entry.kind == hub::GAP {
            // The live feed found the entry it continued from gone: what followed may be lost,
            // for every subscriber (none is ahead of the feed).
            return Some(self.reset(&Gap(entry.id)));
        }
        if entry.id <= self.position {
            return None;
        }
        self.position = entry.id;
        self.at_entry = true;
        if let Some(linger) = &mut self.linger {
            // The run's worker is still publishing: wait on for as long as it does.
            linger.until = tokio::time::Instant::now() + FLUSH_WINDOW;
        }
        if entry.is_marker() {
            return None;
        }
        // Following one message: the previous run's last events (written after the tail
        // this session started from) are not part of it. The events of the agent runs it
        // started (depth > 0) are: a thread has one run of its own at a time, and the child
        // runs' events between its start and its end are its tree's.
        if let Until::DoneOf(message) = &self.until
            && entry.message_id != *message
            && entry.depth == 0
        {
            return None;
        }
        if entry.depth == 0 || matches!(&self.until, Until::DoneOf(m) if *m == entry.message_id) {
            self.pause_shown = [EventType::RequiresAction, EventType::ApprovalRequested]
                .iter()
                .any(|kind| entry.kind == kind.as_str());
        }
        if entry.kind == EventType::Done.as_str() {
            // A child run's `done` ends only a session that follows that child's message.
            self.finished = match &self.until {
                Until::AnyDone => entry.depth == 0,
                Until::DoneOf(message) => *message == entry.message_id,
            };
        }
        Some(Item::Entry(entry))
    }

    /// The stream has gone quiet: if the watched run is over, `message_not_streaming` (its
    /// `done` was lost); if it is paused and the client was not told, its pause event.
    async fn quiet(&mut self) -> Option<Item> {
        let run = self.watch?;
        let standing = match runs::standing(&self.db, run).await {
            Ok(standing) => standing,
            Err(err) => {
                tracing::warn!(error = %err, "reading a quiet run failed");
                return None;
            }
        };
        // A run that is over, or gone (its thread was erased): nothing more will stream.
        let Some(standing) = standing.filter(|s| !s.status.is_terminal()) else {
            self.finished = true;
            return Some(Item::NotStreaming { workflow_id: run });
        };
        let paused = matches!(
            standing.status,
            RunStatus::RequiresAction | RunStatus::AwaitingApproval
        );
        let action = standing
            .pending_action
            .filter(|_| paused && !self.pause_shown)?;
        let data = action.0.event()?;
        let event = Event {
            v: envelope::VERSION,
            thread_id: self.thread_id,
            workflow_id: run,
            message_id: standing.assistant_message_id,
            attempt: standing.attempt,
            depth: 0,
            data,
        };
        self.pause_shown = true;
        metrics::counter!("spool_sse_pauses_recovered_total").increment(1);
        tracing::info!(workflow.id = %run, "a paused run's event was missing; sent from Postgres");
        Some(Item::Pause(Box::new(event)))
    }
}
