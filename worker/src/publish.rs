//! The per-attempt event publisher: the run hands it events without waiting, and one task
//! XADDs them to the thread's stream in order, through the fenced script in
//! `spool_shared::stream`.
//!
//! - Batching: whatever queued while the previous batch was in flight goes out as the next
//!   batch (one round trip), so a fast model costs few round trips and an idle one adds no
//!   delay. Consecutive `text_delta`s of one block that have not been published yet are
//!   coalesced into one; order and concatenated content never change.
//! - Heartbeats: every lease renewal queues a `heartbeat` event.
//! - Redis outages: a failed batch is retried with backoff and nothing is dropped; the run goes
//!   on meanwhile (its result is in Postgres regardless). A retry sends the same batch under the
//!   same id, so a batch whose reply was lost (it may have been stored) is stored once
//!   (`spool_shared::stream` "Fencing"). [`Publisher::finish`] waits for the backlog as long
//!   as batches keep being stored (a fast model can end its run with a backlog a slow machine
//!   takes many seconds to publish: a million one-delta events, say), and gives up, logging
//!   what was lost, only once none has been for the time it is given (Redis down).
//! - Fencing: an attempt after the first raises the thread's fence for itself with its first
//!   round trip, at once, even with nothing to publish yet (a resumed attempt may stay silent
//!   for a while), so a stale attempt's queued events are refused from the moment a new one
//!   starts. Once Redis refuses the attempt (a newer attempt has published), every later event
//!   is dropped.

use std::collections::VecDeque;
use std::time::Duration;

use backon::{BackoffBuilder as _, ExponentialBuilder};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use spool_shared::event::{Data, Event, Heartbeat, Origin, TextDelta};
use spool_shared::redis_conn::RedisConn;
use spool_shared::stream::{self, Batch, PublishError, StreamKeys};

/// Where events go: a Redis connection, the key names and the retention window.
#[derive(Clone)]
pub struct Streams {
    /// The multiplexed, reconnecting connection.
    pub conn: RedisConn,
    /// The deployment's key names.
    pub keys: StreamKeys,
    /// How long a thread's events stay replayable after a run completes.
    pub retention: Duration,
}

impl Streams {
    /// Streams on the Redis at `redis_url` (connecting lazily: a worker starts while Redis is
    /// down, and its runs still complete).
    pub fn connect(
        redis_url: &str,
        keys: StreamKeys,
        retention: Duration,
    ) -> redis::RedisResult<Self> {
        Ok(Self {
            conn: spool_shared::redis_conn::connect(redis_url)?,
            keys,
            retention,
        })
    }
}

/// Most events in one script call.
const MAX_BATCH: usize = 512;

/// Publishes one attempt's events in order.
pub struct Publisher {
    streams: Streams,
    origin: Origin,
    tx: mpsc::UnboundedSender<Event>,
    task: JoinHandle<()>,
    /// Batches stored so far (for [`Publisher::finish`] to tell a slow flush from a stuck one).
    stored: watch::Receiver<u64>,
}

impl Publisher {
    /// Starts the publishing task; `beats` ticks on every lease renewal; unsent deltas are
    /// merged up to `coalesce` bytes of text (0: never).
    pub fn start(
        streams: Streams,
        origin: Origin,
        beats: watch::Receiver<u64>,
        coalesce: usize,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let (progress, stored) = watch::channel(0);
        let task = tokio::spawn(publish_loop(
            streams.clone(),
            origin,
            rx,
            beats,
            coalesce,
            progress,
        ));
        Self {
            streams,
            origin,
            tx,
            task,
            stored,
        }
    }

    /// Takes the run over in Redis for this attempt (see [`stream::takeover`]): what earlier
    /// attempts showed of its step results. Bounded by `timeout` (Redis may be down).
    pub async fn takeover(&self, timeout: Duration) -> Result<stream::Shown, PublishError> {
        let mut conn = self.streams.conn.clone();
        let origin = self.origin;
        let taken = stream::takeover(
            &mut conn,
            &self.streams.keys,
            origin.thread_id,
            origin.workflow_id,
            origin.attempt,
        );
        match tokio::time::timeout(timeout, taken).await {
            Ok(shown) => shown,
            Err(_) => Err(PublishError::Redis(redis::RedisError::from((
                redis::ErrorKind::Io,
                "takeover timed out",
            )))),
        }
    }

    /// Queues an event; never waits.
    pub fn send(&self, data: impl Into<Data>) {
        // The task only ends after `finish` or `abort`, which consume the publisher.
        let _ = self.tx.send(self.origin.event(data));
    }

    /// Waits for every queued event to be published, giving up once no batch has been stored
    /// for `stalled`.
    pub async fn finish(self, stalled: Duration) {
        drop(self.tx);
        let (mut task, mut stored) = (self.task, self.stored);
        loop {
            tokio::select! {
                _ = &mut task => return,
                changed = stored.changed() => if changed.is_err() {
                    // The task has ended (it drops the sender last).
                    let _ = task.await;
                    return;
                },
                () = tokio::time::sleep(stalled) => {
                    tracing::warn!("no events published for {stalled:?} (is Redis down?); dropping the rest");
                    task.abort();
                    return;
                }
            }
        }
    }

    /// Drops whatever is queued: this attempt has lost its lease.
    pub fn abort(self) {
        self.task.abort();
    }
}

async fn publish_loop(
    streams: Streams,
    origin: Origin,
    mut rx: mpsc::UnboundedReceiver<Event>,
    mut beats: watch::Receiver<u64>,
    coalesce: usize,
    progress: watch::Sender<u64>,
) {
    let mut conn = streams.conn.clone();
    let mut outbox = Outbox::new(origin, coalesce);
    let mut backoff = retry_delays();
    loop {
        if outbox.idle() {
            if outbox.closed {
                return;
            }
            tokio::select! {
                event = rx.recv() => match event {
                    Some(event) => outbox.take(event),
                    None => outbox.closed = true,
                },
                changed = beats.changed(), if outbox.beating && !outbox.done => match changed {
                    Ok(()) => outbox.take(origin.event(Heartbeat {})),
                    // The lease is gone; the run's own events still flow until `finish`.
                    Err(_) => outbox.beating = false,
                },
            }
        }
        while let Ok(event) = rx.try_recv() {
            outbox.take(event);
        }
        if outbox.idle() {
            continue;
        }
        let (id, previous, events) = outbox.batch();
        let batch = Batch {
            thread: origin.thread_id,
            workflow: origin.workflow_id,
            attempt: origin.attempt,
            id,
            previous,
            events,
        };
        match stream::publish(&mut conn, &streams.keys, &batch, streams.retention).await {
            Ok(_) => {
                let sent = outbox.sent();
                metrics::counter!("spool_events_published_total").increment(sent as u64);
                backoff = retry_delays();
                progress.send_modify(|n| *n += 1);
            }
            Err(PublishError::Fenced { current }) => {
                tracing::warn!(fence = current, "Redis refused a stale attempt's events");
                return;
            }
            Err(PublishError::Redis(err)) => {
                let delay = backoff.next().unwrap_or(Duration::from_secs(1));
                tracing::warn!(error = %err, backlog = outbox.pending.len(), ?delay,
                    "publishing events failed; retrying the same batch");
                tokio::time::sleep(delay).await;
            }
        }
    }
}

/// The events a publisher holds: those not sent yet, and the batch in flight, which a retry
/// sends exactly as it was first sent (same id, same events), so Redis can tell a retry from a
/// new batch and store it once. Events that arrive meanwhile queue behind it.
struct Outbox {
    pending: VecDeque<Event>,
    in_flight: Option<(String, Vec<Event>)>,
    /// The id of the last batch Redis acknowledged (sent with the next one: see
    /// `spool_shared::stream`, "Acknowledged, then lost").
    stored: Option<String>,
    coalesce: usize,
    closed: bool,
    /// Nothing follows `done`, not even a heartbeat from a renewal during the final flush.
    done: bool,
    /// Renewals stop when the lease is handed back (a run that ended, before its final flush).
    beating: bool,
    /// Whether a round trip has raised the fence; the first does, even empty (the first
    /// attempt has no elder to fence out).
    fenced: bool,
}

impl Outbox {
    fn new(origin: Origin, coalesce: usize) -> Self {
        Self {
            pending: VecDeque::new(),
            in_flight: None,
            stored: None,
            coalesce,
            closed: false,
            done: false,
            beating: true,
            fenced: origin.attempt <= 1,
        }
    }

    /// Queues an event behind whatever is pending.
    fn take(&mut self, event: Event) {
        self.done |= matches!(event.data, Data::Done(_));
        push(&mut self.pending, event, self.coalesce);
    }

    /// Whether there is nothing to send.
    fn idle(&self) -> bool {
        self.in_flight.is_none() && self.pending.is_empty() && self.fenced
    }

    /// The batch to send: the one in flight, else the next [`MAX_BATCH`] pending events under
    /// a new id; with the id of the last batch stored.
    fn batch(&mut self) -> (&str, Option<&str>, &[Event]) {
        let pending = &mut self.pending;
        let (id, events) = self.in_flight.get_or_insert_with(|| {
            let n = pending.len().min(MAX_BATCH);
            let id = uuid::Uuid::new_v4().simple().to_string();
            (id, pending.drain(..n).collect())
        });
        (id, self.stored.as_deref(), events)
    }

    /// The batch in flight was stored; returns how many events it held.
    fn sent(&mut self) -> usize {
        self.fenced = true;
        let Some((id, events)) = self.in_flight.take() else {
            return 0;
        };
        self.stored = Some(id);
        events.len()
    }
}

fn retry_delays() -> impl Iterator<Item = Duration> {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(50))
        .with_max_delay(Duration::from_secs(1))
        .with_jitter()
        .without_max_times()
        .build()
}

/// Queues an event, merging a `text_delta` into an unpublished `text_delta` of the same block
/// while the merged text stays within `coalesce` bytes, so a fast model's backlog goes out as
/// many modest events, never one huge one. In place: a million queued deltas cost linear time
/// (spool-bench P3 measures it).
fn push(pending: &mut VecDeque<Event>, event: Event, coalesce: usize) {
    if let Data::TextDelta(TextDelta { block_id, delta }) = &event.data
        && let Some(Data::TextDelta(last)) = pending.back_mut().map(|last| &mut last.data)
        && last.block_id == *block_id
        && last.delta.len() + delta.len() <= coalesce
    {
        last.delta.push_str(delta);
        return;
    }
    pending.push_back(event);
}

#[cfg(test)]
mod tests {
    use super::*;
    use spool_shared::event::{BlockId, EventType, TextStart};
    use spool_shared::{MessageId, ThreadId, WorkflowId};

    const CAP: usize = 4096;

    fn origin() -> Origin {
        Origin {
            thread_id: ThreadId::new(),
            workflow_id: WorkflowId::new(),
            message_id: MessageId::new(),
            attempt: 1,
            depth: 0,
        }
    }

    fn delta(o: &Origin, step: u32, text: &str) -> Event {
        o.event(TextDelta {
            block_id: BlockId::of_step(step),
            delta: text.to_owned(),
        })
    }

    /// A `text_delta`'s text and block.
    fn text(event: &Event) -> Option<(&str, &str)> {
        match &event.data {
            Data::TextDelta(d) => Some((d.delta.as_str(), d.block_id.as_str())),
            _ => None,
        }
    }

    #[test]
    fn unpublished_deltas_of_one_block_coalesce_without_reordering() {
        let o = origin();
        let mut pending = VecDeque::new();
        let start = TextStart {
            block_id: BlockId::of_step(0),
        };
        push(&mut pending, o.event(start), CAP);
        for text in ["Hel", "lo", ", wor", "ld"] {
            push(&mut pending, delta(&o, 0, text), CAP);
        }
        push(&mut pending, o.event(Heartbeat {}), CAP);
        push(&mut pending, delta(&o, 0, "!"), CAP);
        push(&mut pending, delta(&o, 1, "x"), CAP);
        let kinds: Vec<_> = pending.iter().map(Event::kind).collect();
        assert_eq!(
            kinds,
            [
                EventType::TextStart,
                EventType::TextDelta,
                EventType::Heartbeat,
                EventType::TextDelta,
                EventType::TextDelta
            ]
        );
        assert_eq!(text(&pending[1]), Some(("Hello, world", "s0")));
        assert_eq!(text(&pending[3]), Some(("!", "s0")));
        assert_eq!(text(&pending[4]), Some(("x", "s1")));
    }

    #[test]
    fn coalescing_is_linear_and_bounded_and_keeps_every_byte() {
        let o = origin();
        let mut pending = VecDeque::new();
        let n = 200_000;
        for i in 0..n {
            push(&mut pending, delta(&o, 0, &format!("{} ", i % 10)), CAP);
        }
        assert!(pending.len() > 1, "a long backlog is split");
        assert!(
            pending
                .iter()
                .all(|e| text(e).is_some_and(|(d, _)| d.len() <= CAP))
        );
        let text: String = pending
            .iter()
            .filter_map(|e| text(e).map(|(d, _)| d))
            .collect();
        let expected: String = (0..n).map(|i| format!("{} ", i % 10)).collect();
        assert_eq!(text, expected);
    }

    #[test]
    fn a_batch_is_retried_exactly_as_it_was_first_sent() {
        let o = origin();
        let delta = |text: &str| delta(&o, 0, text);
        let mut outbox = Outbox::new(o, CAP);
        outbox.take(delta("Hel"));
        let (id, previous, events) = outbox.batch();
        assert_eq!(previous, None, "the attempt's first batch follows none");
        let first = (id.to_owned(), events.to_vec());
        // More text arrives while the batch is in flight, and the send fails.
        outbox.take(delta("lo"));
        let (id, _, events) = outbox.batch();
        assert_eq!(
            (id.to_owned(), events.to_vec()),
            first,
            "the retry is the same batch"
        );
        assert_eq!(outbox.sent(), 1);
        let (id, previous, events) = outbox.batch();
        assert_ne!(id, first.0, "the next batch has an id of its own");
        assert_eq!(
            previous,
            Some(first.0.as_str()),
            "and names the one stored before it"
        );
        assert_eq!(events.len(), 1);
        assert_eq!(text(&events[0]), Some(("lo", "s0")));
        assert_eq!(outbox.sent(), 1);
        assert!(outbox.idle());
    }

    #[test]
    fn a_later_attempt_raises_the_fence_before_it_has_anything_to_send() {
        let mut later = origin();
        later.attempt = 3;
        let mut outbox = Outbox::new(later, CAP);
        assert!(!outbox.idle(), "the first round trip goes out at once");
        let (_, _, events) = outbox.batch();
        assert!(events.is_empty());
        assert_eq!(outbox.sent(), 0);
        assert!(outbox.idle());
        assert!(
            Outbox::new(origin(), CAP).idle(),
            "a first attempt has no elder"
        );
    }

    #[test]
    fn a_cap_of_zero_sends_every_delta_as_its_own_event() {
        let o = origin();
        let mut pending = VecDeque::new();
        for text in ["a", "b", "c"] {
            push(&mut pending, delta(&o, 0, text), 0);
        }
        let deltas: Vec<_> = pending
            .iter()
            .filter_map(|e| text(e).map(|(d, _)| d))
            .collect();
        assert_eq!(deltas, ["a", "b", "c"]);
    }
}
