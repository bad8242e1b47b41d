//! `GET /v1/threads/{thread_id}/stream?format=ai-sdk`: the Vercel AI SDK's UI message stream
//! (docs/streaming.md): SSE `data:` JSON chunks and a last `data: [DONE]`, with the header
//! `x-vercel-ai-ui-message-stream: v1`.
//!
//! | run event | chunks |
//! |---|---|
//! | `message_start` | `start` (`messageId`: the assistant message's id) |
//! | `step_start`, `step_end` | `start-step`, `finish-step` (once per step, whatever the attempts) |
//! | text | `text-start`, `text-delta`, `text-end` |
//! | `step` (call) | `tool-input-available` (`providerExecuted`: Spool runs it) |
//! | `step` (result) | `tool-output-available`, or `tool-output-error` for a failed call |
//! | `citations` | `source-url` per cited source with an address (`source-document` for one without), in the citations' order |
//! | `requires_action`, `approval_requested` | `data-spool-requires-action`, `data-spool-approval-requested` (the event's data: answer on Spool's routes) |
//! | `error` | `error` (`errorText`: `code: message`) |
//! | `done` | `finish` (`stop`, or `error` for a failed run), or `abort` for a cancelled one; then `[DONE]` |
//!
//! `attempt_restarted` (a crashed attempt's successor) cannot take text back from an AI SDK
//! client, so the new attempt's text is compared with what was shown since the last tool
//! result and only what goes beyond it is sent ([`Transcript`]). If the new attempt writes
//! something else, the shown part ends with `text-end` carrying `providerMetadata: {spool:
//! {superseded: true}}` (hide such parts: the final message is the others), or, if it had
//! already ended, is named by a `data-spool-superseded` part (`data: {id}`); the new text comes
//! as a new text part.
//!
//! Resuming: each chunk's `id:` is its entry's id, with `/k` for the k-th chunk after an entry's
//! first (`1732262400123-0/1`), so a cut inside one entry's chunks resumes exactly. The chunks
//! of a cursor's run are rebuilt from its `message_start` and those up to the cursor skipped.
//! A cursor that is a run's `done` (a client that finished one message) follows the thread's
//! next message, as the native format does: the next run in the stream, else the active one,
//! else `204`.
//! With no cursor and nothing streaming the answer is `204`, what `useChat({resume: true})`
//! expects; a cursor whose run Redis no longer holds gets one `error` chunk (`stream_reset`).

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::http::{HeaderValue, StatusCode};
use axum::response::sse::Event as SseEvent;
use axum::response::{IntoResponse, Response};
use futures::Stream;
use serde_json::{Value, json};

use spool_shared::db::runs;
use spool_shared::event::transcript::{Pause, Shown, Transcript};
use spool_shared::event::{Event, EventType};
use spool_shared::run::Citation;
use spool_shared::status::RunStatus;
use spool_shared::stream::{self as events, EntryId};
use spool_shared::{MessageId, ThreadId, WorkflowId};

use super::{Item, Session, follow_run, unavailable};
use crate::app::AppState;
use crate::error::ApiError;

/// An `ai-sdk` cursor: an entry id and how many of its chunks after the first were sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Cursor {
    entry: EntryId,
    chunk: u32,
}

impl std::str::FromStr for Cursor {
    type Err = ();

    fn from_str(text: &str) -> Result<Self, ()> {
        let (entry, chunk) = match text.split_once('/') {
            Some((entry, chunk)) => (entry, chunk.parse().map_err(|_| ())?),
            None => (text, 0),
        };
        Ok(Self {
            entry: entry.parse().map_err(|_| ())?,
            chunk,
        })
    }
}

/// The chunks of one run, from its start: its [`Transcript`], each item mapped once.
struct Chunks {
    transcript: Transcript,
    /// Text parts are named after the message: `msg_<message id>_<n>`.
    prefix: String,
}

impl Chunks {
    fn new(message: Option<MessageId>) -> Self {
        let id = message.map(|m| m.to_string()).unwrap_or_default();
        Self {
            transcript: Transcript::new(),
            prefix: id.replace('-', ""),
        }
    }

    fn part(&self, index: usize) -> String {
        format!("msg_{}_{index}", self.prefix)
    }

    /// The chunks of one event, in order.
    fn push(&mut self, event: &Event) -> Vec<Value> {
        let mut out = Vec::new();
        for shown in self.transcript.push(event) {
            match shown {
                Shown::Citations(citations) => out.extend(sources(&citations)),
                shown => out.extend(self.chunk(event, shown)),
            }
        }
        out
    }

    fn chunk(&self, event: &Event, shown: Shown) -> Option<Value> {
        Some(match shown {
            Shown::Started => json!({"type": "start", "messageId": event.message_id}),
            Shown::TextStarted { index } => json!({"type": "text-start", "id": self.part(index)}),
            Shown::TextDelta { index, delta } => {
                json!({"type": "text-delta", "id": self.part(index), "delta": delta})
            }
            // A part that had ended, written anew by a new attempt: it can only be named now,
            // for the client to hide.
            Shown::TextEnded {
                index, again: true, ..
            } => json!({"type": "data-spool-superseded", "data": {"id": self.part(index)}}),
            Shown::TextEnded {
                index, superseded, ..
            } => {
                let mut chunk = json!({"type": "text-end", "id": self.part(index)});
                if superseded {
                    chunk["providerMetadata"] = json!({"spool": {"superseded": true}});
                }
                chunk
            }
            Shown::CallMade { call, .. } => json!({"type": "tool-input-available",
                "toolCallId": call.tool_call_id, "toolName": call.tool_name,
                "input": call.arguments, "providerExecuted": true}),
            Shown::CallAnswered { result, .. } if result.is_error => {
                json!({"type": "tool-output-error", "toolCallId": result.tool_call_id,
                    "errorText": result.output, "providerExecuted": true})
            }
            Shown::CallAnswered { result, .. } => json!({"type": "tool-output-available",
                "toolCallId": result.tool_call_id, "output": result.output,
                "providerExecuted": true}),
            Shown::StepStarted(_) => json!({"type": "start-step"}),
            Shown::StepEnded(_) => json!({"type": "finish-step"}),
            Shown::CallEnded { .. } | Shown::Citations(_) => return None,
            Shown::Paused(Pause::RequiresAction(action)) => {
                json!({"type": "data-spool-requires-action", "data": action})
            }
            Shown::Paused(Pause::ApprovalRequested(approval)) => {
                json!({"type": "data-spool-approval-requested", "data": approval})
            }
            Shown::Paused(Pause::InputRequested(input)) => {
                json!({"type": "data-spool-input-requested", "data": input})
            }
            Shown::Failed(failure) => json!({"type": "error",
                "errorText": format!("{}: {}", failure.code.as_str(), failure.message)}),
            Shown::Ended(RunStatus::Cancelled) => json!({"type": "abort", "reason": "cancelled"}),
            Shown::Ended(RunStatus::Failed) => json!({"type": "finish", "finishReason": "error"}),
            Shown::Ended(_) => json!({"type": "finish", "finishReason": "stop"}),
        })
    }
}

/// A chunk per cited source, in the citations' order: `source-url` for a source with an
/// address, `source-document` (text) for one without. `sourceId` is the chunk's id (else the
/// citation's index); `providerMetadata.spool` has the `index`, the `spans` and the `snippet`.
fn sources(citations: &[Citation]) -> Vec<Value> {
    citations
        .iter()
        .map(|citation| {
            let id = citation
                .chunk_id
                .clone()
                .unwrap_or_else(|| citation.index.to_string());
            let metadata = json!({"spool": {"index": citation.index, "spans": citation.spans,
                "snippet": citation.snippet}});
            let title = citation.title.as_str();
            match citation.url.as_str() {
                Some(url) => {
                    let mut chunk = json!({"type": "source-url", "sourceId": id, "url": url,
                        "providerMetadata": metadata});
                    if let Some(title) = title {
                        chunk["title"] = json!(title);
                    }
                    chunk
                }
                None => json!({"type": "source-document", "sourceId": id,
                    "mediaType": "text/plain", "title": title.unwrap_or(id.as_str()),
                    "providerMetadata": metadata}),
            }
        })
        .collect()
}

/// The `ai-sdk` stream of the thread (see the module doc).
pub(crate) async fn stream(
    state: &AppState,
    slot: super::StreamSlot,
    thread_id: ThreadId,
    cursor: Option<&str>,
) -> Result<Response, ApiError> {
    let cursor = cursor
        .map(|c| c.trim().parse::<Cursor>())
        .transpose()
        .map_err(|()| {
            ApiError::bad_request(
                "invalid_cursor",
                "the cursor is not an id of this stream's events",
            )
        })?;
    let target = match cursor {
        Some(cursor) => match run_of_entry(state, thread_id, cursor.entry).await? {
            // The cursor is a run's `done` (a client that finished one message): what follows
            // is the thread's next message, as in the native format.
            Some(Entry { done: true, .. }) => match next_run(state, thread_id, cursor.entry).await?
            {
                Some(next) => Some(next),
                None => return Ok(no_content()),
            },
            Some(entry) => Some((entry.run, entry.message)),
            None => None,
        },
        None => active_run(state, thread_id).await?,
    };
    let session = match target {
        Some((run, message)) => follow_run(state, slot, thread_id, run, message).await?,
        None if cursor.is_none() => return Ok(no_content()),
        None => None,
    };
    let feed = Feed {
        session,
        chunks: Chunks::new(target.map(|(_, message)| message)),
        after: cursor,
        queue: VecDeque::new(),
        finished: false,
        reset: cursor.is_some() && target.is_none(),
    };
    let mut response = super::sse_without_retry(feed.into_sse());
    response.headers_mut().insert(
        "x-vercel-ai-ui-message-stream",
        HeaderValue::from_static("v1"),
    );
    Ok(response)
}

fn no_content() -> Response {
    StatusCode::NO_CONTENT.into_response()
}

/// What a cursor's entry belongs to.
struct Entry {
    run: WorkflowId,
    message: MessageId,
    /// Whether it is the `done` of the thread's own run (depth 0): its message is over.
    done: bool,
}

/// The run and message of the entry `entry` of the thread's stream, if Redis holds it.
async fn run_of_entry(
    state: &AppState,
    thread_id: ThreadId,
    entry: EntryId,
) -> Result<Option<Entry>, ApiError> {
    let mut conn = state.streams.conn();
    let key = state.streams.keys().events(thread_id);
    let found = events::read_after(&mut conn, &key, entry.predecessor(), 1)
        .await
        .map_err(unavailable)?;
    let Some(found) = found.into_iter().next().filter(|e| e.id == entry) else {
        return Ok(None);
    };
    let Ok(event) = serde_json::from_str::<Event>(&found.json) else {
        return Ok(None);
    };
    Ok(Some(Entry {
        run: event.workflow_id,
        message: event.message_id,
        done: event.depth == 0 && event.kind() == EventType::Done,
    }))
}

/// How many entries after a `done` are looked at for the next message's start: the thread's
/// next run writes its `message_start` first, markers at most come before it.
const NEXT_RUN_LOOKAHEAD: usize = 16;

/// The run after the one whose `done` is `done`: the first run of the thread's own (depth 0)
/// the stream holds after it, else the thread's active (queued) run.
async fn next_run(
    state: &AppState,
    thread_id: ThreadId,
    done: EntryId,
) -> Result<Option<(WorkflowId, MessageId)>, ApiError> {
    let mut conn = state.streams.conn();
    let key = state.streams.keys().events(thread_id);
    let following = events::read_after(&mut conn, &key, done, NEXT_RUN_LOOKAHEAD)
        .await
        .map_err(unavailable)?;
    let streamed = following
        .iter()
        .filter(|entry| !entry.is_marker() && entry.depth == 0)
        .find_map(|entry| serde_json::from_str::<Event>(&entry.json).ok());
    match streamed {
        Some(event) => Ok(Some((event.workflow_id, event.message_id))),
        None => active_run(state, thread_id).await,
    }
}

/// The thread's active run and its message.
async fn active_run(
    state: &AppState,
    thread_id: ThreadId,
) -> Result<Option<(WorkflowId, MessageId)>, ApiError> {
    Ok(runs::find_active(&state.db, thread_id)
        .await?
        .map(|run| (run.id, run.assistant_message_id)))
}

/// A run's chunks with their ids, after the cursor.
struct Feed {
    session: Option<Session>,
    chunks: Chunks,
    after: Option<Cursor>,
    /// Chunks with their SSE id.
    queue: VecDeque<(Option<String>, String)>,
    finished: bool,
    /// The cursor's entry is gone: say so and end.
    reset: bool,
}

impl Feed {
    fn into_sse(self) -> impl Stream<Item = Result<SseEvent, Infallible>> + Send {
        futures::stream::unfold(self, |mut feed| async move {
            let (id, data) = feed.next().await?;
            let mut event = SseEvent::default().data(data);
            if let Some(id) = id {
                event = event.id(id);
            }
            Some((Ok(event), feed))
        })
    }

    async fn next(&mut self) -> Option<(Option<String>, String)> {
        loop {
            if let Some(chunk) = self.queue.pop_front() {
                return Some(chunk);
            }
            if self.finished {
                return None;
            }
            if self.reset {
                self.end_with_error(
                    "stream_reset: the events after this cursor are gone; reload the messages",
                );
                continue;
            }
            if self.chunks.transcript.ended() {
                self.queue.push_back((None, "[DONE]".to_owned()));
                self.finished = true;
                continue;
            }
            let item = match &mut self.session {
                Some(session) => session.next().await,
                None => {
                    self.reset = true;
                    continue;
                }
            };
            match item {
                Some(Item::Entry(entry)) => {
                    // The agent runs the run started (depth > 0) stream into the native format
                    // only: here their answers show as the agent tools' outputs.
                    if entry.depth > 0 {
                        continue;
                    }
                    let Ok(event) = serde_json::from_str::<Event>(&entry.json) else {
                        continue;
                    };
                    let chunks = self.chunks.push(&event);
                    for (k, chunk) in chunks.into_iter().enumerate() {
                        let k = u32::try_from(k).unwrap_or(u32::MAX);
                        let cursor = Cursor {
                            entry: entry.id,
                            chunk: k,
                        };
                        if self.after.is_some_and(|after| cursor <= after) {
                            continue;
                        }
                        let id = if k == 0 {
                            entry.id.to_string()
                        } else {
                            format!("{}/{k}", entry.id)
                        };
                        self.queue.push_back((Some(id), chunk.to_string()));
                    }
                }
                Some(Item::Pause(event)) => {
                    for chunk in self.chunks.push(&event) {
                        self.queue.push_back((None, chunk.to_string()));
                    }
                }
                Some(Item::Live) => {}
                Some(Item::Reset { .. }) => {
                    self.end_with_error("stream_reset: events were lost; reload the messages");
                }
                Some(Item::NotStreaming { .. }) => {
                    // Over, but its `done` was lost with Redis.
                    self.queue.push_back((None, "[DONE]".to_owned()));
                    self.finished = true;
                }
                // The session was cut (the server stops, a lagging client dropped, Redis
                // failed): end without `[DONE]`, so the client resumes with its cursor.
                None => self.finished = true,
            }
        }
    }

    fn end_with_error(&mut self, text: &str) {
        let chunk = json!({"type": "error", "errorText": text});
        self.queue.push_back((None, chunk.to_string()));
        self.queue.push_back((None, "[DONE]".to_owned()));
        self.finished = true;
        self.reset = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_are_entry_ids_with_an_optional_chunk() {
        let plain: Cursor = "1732262400123-0".parse().expect("plain");
        let nth: Cursor = "1732262400123-0/2".parse().expect("nth");
        assert_eq!(plain.chunk, 0);
        assert_eq!(nth.chunk, 2);
        assert!(plain < nth);
        for bad in ["", "x", "1-0/", "1-0/x", "1-0/1/2"] {
            assert!(bad.parse::<Cursor>().is_err(), "{bad}");
        }
    }
}
