//! One client's session of a thread's stream ([`Session`]): the backlog from its starting point,
//! then live entries from the thread's feed, until the `done` it waits for; and the SSE
//! response that carries it.
//!
//! Subscribing never races the worker: the session joins the thread's live feed first, then
//! reads the backlog, and drops live entries it has already sent. A gap is never silent: a
//! lagging subscriber is disconnected (and resumes with its cursor); an entry that vanishes
//! under the backlog read or the live feed ends the session with `stream_reset`; a stream gone
//! quiet while its run is terminal in Postgres ends with `message_not_streaming`; and a paused
//! run whose pause event was lost gets it rebuilt from Postgres (see [`Session::next`]).

use std::collections::{HashSet, VecDeque};
use std::convert::Infallible;
use std::time::Duration;

use axum::http::{HeaderValue, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use serde_json::json;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use spool_shared::db::runs;
use spool_shared::event::{self as envelope, Event, EventType};
use spool_shared::redis_conn::RedisConn;
use spool_shared::status::RunStatus;
use spool_shared::stream::{self as events, EntryId, FLUSH_WINDOW, Gap, ReadError, StoredEvent};
use spool_shared::{ThreadId, WorkflowId};

use super::hub::Missed;
use super::{StreamSlot, hub, unavailable};
use crate::app::AppState;
use crate::error::ApiError;

/// The most backlog entries read per round trip.
pub(crate) const PAGE: usize = 64;
/// The bytes a session aims to hold of its backlog at once (review B-M3): an entry can hold a
/// whole tool result (50,000 characters, up to about 300 KB once JSON-escaped), so 64 of them
/// would be about 20 MB held while a slow client takes them. Each read asks for as many entries
/// as the previous page's average size fits in this budget (at least one); the first asks for
/// [`FIRST_PAGE`].
const PAGE_BYTES: usize = 256 * 1024;
/// Entries asked for by a session's first read, before it knows how large they are.
const FIRST_PAGE: usize = 8;

/// How many entries the next read asks for, after a page of `entries` entries and `bytes`
/// bytes: as many as fit in [`PAGE_BYTES`] at that average size, from 1 to [`PAGE`].
fn next_page(entries: usize, bytes: usize) -> usize {
    match entries {
        0 => FIRST_PAGE,
        _ => (PAGE_BYTES / (bytes / entries).max(1)).clamp(1, PAGE),
    }
}
/// The reconnection delay suggested to clients.
const RETRY: Duration = Duration::from_secs(2);
/// Comment interval that keeps proxies from closing idle streams.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// Silence after which a followed run is checked in Postgres.
const SILENCE: Duration = Duration::from_secs(15);

/// When a followed stream ends.
#[derive(Clone, Debug)]
pub(super) enum Until {
    /// After the `done` of this message.
    DoneOf(String),
    /// After the first `done`.
    AnyDone,
}

/// Where a session starts, when it ends, and what it watches.
pub(super) struct Start {
    /// The position it sends after.
    pub(super) after: EntryId,
    /// Whether `after` is an entry of the stream (which must then still be there).
    pub(super) after_entry: bool,
    pub(super) until: Until,
    /// The run whose status is checked when the stream goes quiet.
    pub(super) watch: Option<WorkflowId>,
    /// With no run active: how long to wait for a just-finished run's last events.
    pub(super) linger: Option<Linger>,
}

/// A session's wait for the last events of a run that has just finished (its worker writes
/// the run's end to Postgres before it publishes them).
#[derive(Clone, Copy, Debug)]
pub(super) struct Linger {
    /// Until when. Every entry sent moves it to [`FLUSH_WINDOW`] from then: a worker publishes
    /// for as long as Redis keeps storing its batches.
    pub(super) until: tokio::time::Instant,
    /// The run: if nothing ends the session by then, it ends with `message_not_streaming`.
    pub(super) run: WorkflowId,
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
    /// The pauses of child runs (agents as tools) the client was told of, by assistant message
    /// and attempt (a run pauses at most once per attempt).
    child_pauses_shown: HashSet<(String, i64)>,
    /// With no run active: the wait for the `done` of a run that has just finished (see
    /// [`super::flushing`] and [`super::unpublished`]).
    linger: Option<Linger>,
    shutdown: CancellationToken,
    finished: bool,
    /// Whether [`Item::Live`] has been yielded.
    live: bool,
    /// Entries the next backlog read asks for ([`next_page`]).
    page: usize,
    /// Counts the stream against its user's limit and in `spool_sse_streams_open`.
    _slot: StreamSlot,
}

impl Session {
    /// A session of the thread's stream at `key` from `start`, joined to the thread's live
    /// feed first (so nothing written meanwhile is missed).
    pub(super) async fn open(
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
            child_pauses_shown: HashSet::new(),
            linger: start.linger,
            shutdown: state.shutdown.clone(),
            finished: false,
            live: false,
            page: FIRST_PAGE,
            _slot: slot,
        })
    }

    pub(super) fn into_stream(self) -> impl Stream<Item = Result<SseEvent, Infallible>> + Send {
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
                        self.caught_up = page.len() < self.page;
                        let bytes = page.iter().map(|e| e.json.len()).sum();
                        self.page = next_page(page.len(), bytes);
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
            // A subscriber dropped for falling behind ends here: it can resume.
            match self.subscription.try_recv() {
                Ok(entry) => {
                    if let Some(event) = self.emit(entry) {
                        return Some(event);
                    }
                    continue;
                }
                Err(Missed::Behind | Missed::Closed) => return None,
                Err(Missed::Empty) => {}
            }
            tokio::select! {
                received = self.subscription.recv() => match received {
                    Ok(entry) => {
                        if let Some(event) = self.emit(entry) {
                            return Some(event);
                        }
                    }
                    Err(Missed::Behind | Missed::Closed | Missed::Empty) => return None,
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

    /// The next page of the backlog, continuing from the position.
    async fn read_page(&mut self) -> Result<Vec<StoredEvent>, ReadError> {
        if self.at_entry {
            events::read_following(&mut self.conn, &self.key, self.position, self.page).await
        } else {
            Ok(events::read_after(&mut self.conn, &self.key, self.position, self.page).await?)
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
        if entry.is_gap() {
            // Batches acknowledged before it were lost (a failover, a restart): what this
            // session was following may have a hole.
            return Some(self.reset(&Gap(entry.id)));
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
        let is_pause = [
            EventType::RequiresAction,
            EventType::ApprovalRequested,
            EventType::InputRequested,
        ]
        .iter()
        .any(|kind| entry.kind == kind.as_str());
        if entry.depth == 0 || matches!(&self.until, Until::DoneOf(m) if *m == entry.message_id) {
            self.pause_shown = is_pause;
        }
        if is_pause && entry.depth > 0 {
            // Rare (a child's pause), so reading its attempt from the JSON costs little.
            let attempt = serde_json::from_str::<serde_json::Value>(&entry.json)
                .ok()
                .and_then(|event| event["attempt"].as_i64())
                .unwrap_or_default();
            self.child_pauses_shown
                .insert((entry.message_id.clone(), attempt));
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
    /// `done` was lost); if it is paused and the client was not told, its pause event; if it
    /// waits for its child runs, the pause event of a paused child the client was not told of
    /// (see [`Session::child_pause`]).
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
        if standing.status == RunStatus::Waiting {
            return self.child_pause(run).await;
        }
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

    /// The watched run waits for its child runs: the pause event of the first paused run of its
    /// tree the client was not told of, rebuilt from Postgres, as [`Session::quiet`] does for
    /// the run itself. Otherwise a child's lost `requires_action` would leave the client waiting
    /// for up to the child's `human_timeout`. The tree is bounded (`limits.max_tree_runs`).
    async fn child_pause(&mut self, root: WorkflowId) -> Option<Item> {
        let runs = match runs::active_descendants(&self.db, root).await {
            Ok(runs) => runs,
            Err(err) => {
                tracing::warn!(error = %err, "reading a waiting run's children failed");
                return None;
            }
        };
        let (child, data) = runs.into_iter().find_map(|child| {
            let paused = matches!(
                child.status,
                RunStatus::RequiresAction | RunStatus::AwaitingApproval
            );
            let key = (
                child.assistant_message_id.to_string(),
                i64::from(child.attempt),
            );
            let data = child.pending_action.as_ref()?.0.event()?;
            (paused && !self.child_pauses_shown.contains(&key)).then_some((child, data))
        })?;
        self.child_pauses_shown.insert((
            child.assistant_message_id.to_string(),
            i64::from(child.attempt),
        ));
        let event = Event {
            v: envelope::VERSION,
            thread_id: self.thread_id,
            workflow_id: child.id,
            message_id: child.assistant_message_id,
            attempt: child.attempt,
            depth: u32::try_from(child.depth).unwrap_or(0),
            data,
        };
        metrics::counter!("spool_sse_pauses_recovered_total").increment(1);
        tracing::info!(workflow.id = %child.id, "a child run's pause event was missing; sent \
            from Postgres");
        Some(Item::Pause(Box::new(event)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backlog_page_holds_about_its_byte_budget_whatever_the_size_of_the_entries() {
        assert_eq!(next_page(0, 0), FIRST_PAGE);
        // Deltas of 200 bytes: the most entries a page takes.
        assert_eq!(next_page(8, 8 * 200), PAGE);
        // Tool results of 300 KB: one at a time, not 64 (about 20 MB).
        assert_eq!(next_page(8, 8 * 300_000), 1);
        // 40 KB entries: what fits in the budget.
        let n = next_page(4, 4 * 40_000);
        assert!(
            n * 40_000 <= PAGE_BYTES && (n + 1) * 40_000 > PAGE_BYTES,
            "{n}"
        );
    }
}
