//! One run as the OpenAI-compatible streams follow it: its events from its `message_start`
//! through a gateway [`Session`], as the format-neutral [`Transcript`] items, and its end as
//! stored in Postgres. The Responses stream ([`super::translate`]) and the Chat Completions
//! stream ([`super::chat`]) each map what a [`Feed`] yields once.

use std::collections::VecDeque;

use spool_shared::WorkflowId;
use spool_shared::db::runs::Run;
use spool_shared::event::Event;
use spool_shared::event::transcript::{Shown, Transcript};

use crate::app::AppState;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::gateway::{self, Item, Session};

/// What a [`Feed`] yields, in order.
#[derive(Debug)]
pub(crate) enum Followed {
    /// The run's events are no longer retained (the retention window passed): the stored run
    /// is the answer. Only ever first; the feed ends.
    Expired,
    /// What the client is shown next.
    Shown(Shown),
    /// The backlog has been sent: what follows is live (once).
    Live,
    /// What followed may be lost (`stream_reset`); the feed ends.
    Reset,
    /// The run is over, as stored; the feed ends.
    Ended(Box<Run>),
}

/// A run's [`Followed`] items (see the module doc).
pub(crate) struct Feed {
    state: AppState,
    caller: Caller,
    workflow_id: WorkflowId,
    /// `None` when Redis no longer holds the run's events.
    session: Option<Session>,
    transcript: Transcript,
    queue: VecDeque<Followed>,
    finished: bool,
}

impl Feed {
    /// The feed of `run`, from its `message_start`.
    pub(crate) async fn open(
        state: &AppState,
        caller: &Caller,
        slot: gateway::StreamSlot,
        run: &Run,
    ) -> Result<Self, ApiError> {
        let session =
            gateway::follow_run(state, slot, run.thread_id, run.id, run.assistant_message_id)
                .await?;
        let mut queue = VecDeque::new();
        if session.is_none() {
            queue.push_back(Followed::Expired);
        }
        Ok(Self {
            state: state.clone(),
            caller: caller.clone(),
            workflow_id: run.id,
            finished: session.is_none(),
            session,
            transcript: Transcript::new(),
            queue,
        })
    }

    /// Whether Redis held the run's events when the feed opened (else [`Followed::Expired`]
    /// comes first, and only).
    pub(crate) fn retained(&self) -> bool {
        self.session.is_some()
    }

    /// The next item, or `None` at the end.
    pub(crate) async fn next(&mut self) -> Option<Followed> {
        loop {
            if let Some(item) = self.queue.pop_front() {
                return Some(item);
            }
            if self.finished {
                return None;
            }
            if self.transcript.ended() {
                self.finish().await;
                continue;
            }
            let item = match &mut self.session {
                Some(session) => session.next().await,
                None => None,
            };
            match item {
                Some(Item::Entry(entry)) => {
                    let Ok(event) = serde_json::from_str::<Event>(&entry.json) else {
                        continue;
                    };
                    if event.workflow_id == self.workflow_id {
                        self.push(&event);
                    }
                }
                // A paused run's event, rebuilt from Postgres.
                Some(Item::Pause(event)) => self.push(&event),
                Some(Item::Live) => return Some(Followed::Live),
                Some(Item::Reset { .. }) => {
                    self.finished = true;
                    return Some(Followed::Reset);
                }
                // Over, but its `done` was lost with Redis: the stored end.
                Some(Item::NotStreaming { .. }) => self.finish().await,
                // The session was cut (the server stops, a lagging client dropped, Redis
                // failed): end here, so the client resumes.
                None => self.finished = true,
            }
        }
    }

    fn push(&mut self, event: &Event) {
        let shown = self.transcript.push(event);
        self.queue.extend(shown.into_iter().map(Followed::Shown));
    }

    /// Queues the stored run if it has ended; the feed is over.
    async fn finish(&mut self) {
        self.finished = true;
        match super::find_run(&self.state, &self.caller, self.workflow_id).await {
            Ok(run) if run.status.is_terminal() => {
                self.queue.push_back(Followed::Ended(Box::new(run)));
            }
            Ok(_) => {}
            Err(err) => tracing::warn!(error = %err, "reading a response's end failed"),
        }
    }
}
