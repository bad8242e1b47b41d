//! The thread's event stream in Redis: the replay buffer for live and recent output, never the
//! only copy of anything a user must keep (the final message is in Postgres).
//!
//! # Key layout
//! Every key of a thread shares the hash tag `{<thread_id>}`, so in Redis Cluster they live in
//! one slot and one script can touch them all:
//! - `{prefix}:{<thread_id>}:events`: the Redis Stream; one entry per event of every run of the
//!   thread, one field `x`: `{type} {message id} {depth} {the JSON envelope}` (the gateway reads
//!   the type, message and depth of an entry without parsing its JSON; one field rather than
//!   four, because decoding `XRANGE` replies is most of the gateway's work per event: see
//!   [`RawEntry`]). The `stream_start` marker is `t stream_start`; entries written before the
//!   packed field (fields `t`, `m`, `e` and `d`) are read as well.
//! - `{prefix}:{<thread_id>}:fence`: hash `workflow_id → highest attempt that published`, with
//!   `{workflow_id}:batches` (see Fencing), `{workflow_id}:done → ms of its done`,
//!   `:oldest_done` (the earliest of those as of the last time they were looked through), and,
//!   until its done, `{workflow_id}:shown` (the run's step results in the stream, see
//!   [`takeover`]).
//! - `{prefix}:{<thread_id>}:starts`: hash `message_id → entry id of its message_start`,
//!   `:trimmed → the newest entry id removed by trimming`, and `:oldest_start` (the earliest
//!   start's ms as of the last time the starts were looked through).
//!
//! Neither hash grows with a long-lived thread: on `done`, the fields of workflows done before
//! the retention window and of message_starts trimmed are deleted. Each hash is looked through
//! only when its oldest field (`:oldest_done`, `:oldest_start`) is more than an eighth of a
//! window before the window, so about eight times a window rather than at every `done`: a
//! fence goes between one and 1.125 windows after its run's done, and a start up to an eighth
//! of a window after its entry was trimmed: whoever reads a start takes one at or before
//! `:trimmed` as gone ([`message_start`], and the publish script's reuse of a start). (A
//! worker stopped for
//! longer than the window and then continued could publish again for such a workflow; its
//! database writes are fenced as always, and its stray events carry their own message id.)
//!
//! In a Redis Cluster (`REDIS_URL` lists the nodes, comma-separated) each thread's keys live in
//! one slot, so every script and command of a thread goes to one node; PUBLISH reaches every
//! node's subscribers over the cluster bus.
//!
//! The quota counters live under `{prefix}:quota:` with a hash tag per tenant (see
//! [`crate::quota::admission`]).
//!
//! Notifications go to the pub/sub channel `{prefix}:notify` (payload: the thread id). They are
//! wake-up hints for the SSE gateway's per-thread readers, never data: a lost notification only
//! delays delivery until the reader's next poll.
//!
//! # Entry ids and cursors
//! Entry ids are Redis's own (`<ms>-<seq>`, strictly increasing within a stream). The SSE `id:`
//! of an event is its entry id, so `Last-Event-ID` alone resumes: the gateway sends every entry
//! after it (`XRANGE key (<id> +`).
//!
//! The first entry a stream ever gets is a `stream_start` marker (never sent to clients). A
//! cursor is *retained* if the stream exists, the cursor is not older than the newest trimmed
//! entry (recorded by the publish script: Redis 7.0's `max-deleted-entry-id` does not move on
//! `XTRIM`), and the cursor's own entry is still in the stream. An entry that is gone was
//! trimmed (by anyone), lost in a restart or failover, or belongs to a stream re-created after
//! it (expired or lost); a cursor from another thread's stream or from the future has none.
//! Every such cursor gets `stream_reset`: a gap is always explicit, never silent.
//!
//! The same check guards every read that continues from an entry ([`read_following`]): a
//! session's backlog and the gateway's live feed read from their last entry inclusively, and
//! an entry that vanished under them (`XTRIM`, `XDEL`, a failover to a replica that never had
//! it) is a [`Gap`], which the gateway turns into `stream_reset`.
//!
//! # Fencing
//! Publishing is one Lua script ([`publish`]): it refuses (error `SPOOL_FENCED`) a batch whose
//! attempt is lower than the highest attempt that has published for that workflow, then XADDs
//! the batch and notifies. A stale worker's events are therefore refused by Redis itself, even
//! if the worker has not yet noticed that it lost its lease. `message_start` is idempotent per
//! message: a new attempt's `message_start` reuses the first one's entry.
//!
//! Publishing is idempotent per batch: each batch carries an id, the script remembers the last
//! 16 applied for the workflow (field `{workflow_id}:batches` of the fence hash), and a batch
//! it has seen is not stored again. A retry after a lost reply (a timeout, a reset connection,
//! a failover) therefore never duplicates events, as long as the retry sends the same batch.
//!
//! # Acknowledged, then lost
//! Replication to a Cluster replica is asynchronous: a master may acknowledge a batch and die
//! before its replica has it, and a restarted Redis keeps nothing. The publisher then goes on
//! after a hole that no cursor check sees (its next entries follow entries that still exist).
//! So each batch names the attempt's previous acknowledged batch, and where the script does not
//! find it among those applied it writes a `stream_gap` marker (`t stream_gap`, never sent)
//! before the batch: a session that reads across it ends with `stream_reset`.
//!
//! # Trimming
//! On `done` the script trims entries older than the retention window counted from now (the
//! run's completion), never the just-finished message, and sets the thread's keys to expire
//! after the window; the next `message_start` removes the expiry. An idle thread's keys vanish
//! one window after its last completion.
//!
//! # The end of a run
//! A worker writes a run's end to Postgres first and publishes its last events (`message_end`,
//! `done`) after it: for as long as Redis keeps storing its batches, and for at most
//! [`FLUSH_WINDOW`] once it does not. The gateway follows a just-finished run's stream that
//! long, so a client resuming in between gets the `done`, not a stream cut short; a client
//! already following keeps getting events for as long as they come.

use std::fmt;
use std::str::FromStr;
use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;

use crate::event::{Data, Event, Step};
use crate::ids::{MessageId, ThreadId, WorkflowId};
use crate::redis_conn::RedisConn;

/// How long after a run's end is in Postgres its worker waits for Redis to store its last
/// events, counted from the last batch stored.
pub const FLUSH_WINDOW: Duration = Duration::from_secs(10);

/// The names of a deployment's Redis keys.
#[derive(Clone, Debug)]
pub struct StreamKeys {
    prefix: String,
}

impl StreamKeys {
    /// Keys under `prefix`.
    pub fn new(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
        }
    }

    /// The prefix of every key.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The thread's stream.
    pub fn events(&self, thread: ThreadId) -> String {
        format!("{}:{{{thread}}}:events", self.prefix)
    }

    /// The thread's fence hash.
    pub fn fence(&self, thread: ThreadId) -> String {
        format!("{}:{{{thread}}}:fence", self.prefix)
    }

    /// The thread's `message_start` index.
    pub fn starts(&self, thread: ThreadId) -> String {
        format!("{}:{{{thread}}}:starts", self.prefix)
    }

    /// The channel that wakes gateways when a thread's stream grows.
    pub fn notify_channel(&self) -> String {
        format!("{}:notify", self.prefix)
    }
}

/// A stream entry id, `<ms>-<seq>`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EntryId {
    /// Milliseconds part.
    pub ms: u64,
    /// Sequence part.
    pub seq: u64,
}

/// A string that is not an entry id.
#[derive(Debug, thiserror::Error)]
#[error("not a stream entry id (expected <ms>-<seq>)")]
pub struct InvalidEntryId;

impl FromStr for EntryId {
    type Err = InvalidEntryId;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let digits = |part: &str| {
            if part.is_empty() || part.len() > 20 || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(InvalidEntryId);
            }
            part.parse::<u64>().map_err(|_| InvalidEntryId)
        };
        let (ms, seq) = s.split_once('-').ok_or(InvalidEntryId)?;
        Ok(Self {
            ms: digits(ms)?,
            seq: digits(seq)?,
        })
    }
}

impl EntryId {
    /// The largest id before this one, so that "after the predecessor" includes this entry.
    pub fn predecessor(self) -> Self {
        match (self.ms, self.seq) {
            (0, 0) => self,
            (ms, 0) => Self {
                ms: ms - 1,
                seq: u64::MAX,
            },
            (ms, seq) => Self { ms, seq: seq - 1 },
        }
    }
}

impl fmt::Display for EntryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

static PUBLISH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("stream/fence.lua"),
        include_str!("stream/publish.lua")
    ))
});
static TAKEOVER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("stream/fence.lua"),
        include_str!("stream/takeover.lua")
    ))
});
static ERASE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("stream/erase.lua")));
static INSPECT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("stream/inspect.lua")));

/// Why a batch was not published.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// A newer attempt of the workflow has published: this attempt is stale.
    #[error("a newer attempt ({current}) has published for this workflow")]
    Fenced {
        /// The attempt that holds the fence.
        current: i64,
    },
    /// Redis failed or is unreachable; the batch may be retried.
    #[error(transparent)]
    Redis(#[from] redis::RedisError),
}

/// One batch of one attempt's events: what [`publish`] stores, at most once per `id`.
#[derive(Clone, Copy, Debug)]
pub struct Batch<'a> {
    /// The thread whose stream it goes to.
    pub thread: ThreadId,
    /// The run.
    pub workflow: WorkflowId,
    /// The attempt that publishes it (the fence).
    pub attempt: i32,
    /// Unique per batch; a retry of the batch sends the same id (and the same events).
    pub id: &'a str,
    /// The id of the attempt's previous batch that Redis acknowledged, if any: Redis checks it
    /// is still there, and marks a gap where it is not (lost in a failover or a restart).
    pub previous: Option<&'a str>,
    /// The events, in order; none only raises the fence.
    pub events: &'a [Event],
}

/// Publishes a batch, in order, fenced on its attempt; returns the number of events in the
/// batch (0 if it is empty or was already stored).
pub async fn publish(
    conn: &mut RedisConn,
    keys: &StreamKeys,
    batch: &Batch<'_>,
    retention: Duration,
) -> Result<usize, PublishError> {
    let Batch {
        thread,
        workflow,
        attempt,
        id,
        previous,
        events,
    } = *batch;
    let mut invocation = PUBLISH.prepare_invoke();
    invocation
        .key(keys.events(thread))
        .key(keys.fence(thread))
        .key(keys.starts(thread))
        .arg(workflow.to_string())
        .arg(attempt)
        .arg(
            u64::try_from(retention.as_millis())
                .unwrap_or(u64::MAX)
                .max(1),
        )
        .arg(keys.notify_channel())
        .arg(thread.to_string())
        .arg(id)
        .arg(previous.unwrap_or(""));
    for event in events {
        let kind = event.kind().as_str();
        let message = event.message_id.to_string();
        let entry = entry(event).map_err(|err| {
            redis::RedisError::from((redis::ErrorKind::Client, "event encoding", err.to_string()))
        })?;
        match shown_result(event) {
            // The script records it in the workflow's `:shown` field (see [`takeover`]).
            Some((step, call)) => invocation.arg(format!("step result {step}\n{call}")),
            None => invocation.arg(kind),
        };
        invocation.arg(message).arg(entry);
    }
    match invocation.invoke_async::<usize>(conn).await {
        Ok(published) => Ok(published),
        Err(err) => match fenced_by(&err) {
            Some(current) => Err(PublishError::Fenced { current }),
            None => Err(PublishError::Redis(err)),
        },
    }
}

/// The stored field `x` of an event's entry: `{type} {message id} {depth} {JSON envelope}`
/// (see the module doc), the JSON written straight into the bytes.
pub fn entry(event: &Event) -> serde_json::Result<Vec<u8>> {
    let mut entry = format!(
        "{} {} {} ",
        event.kind().as_str(),
        event.message_id,
        event.depth
    )
    .into_bytes();
    serde_json::to_writer(&mut entry, event)?;
    Ok(entry)
}

/// The step and tool call of a `step` event of phase `result`.
fn shown_result(event: &Event) -> Option<(u32, &str)> {
    match &event.data {
        Data::Step(Step::Result(result)) => Some((result.step, &result.tool_call_id)),
        _ => None,
    }
}

/// What the earlier attempts of a run showed of its step results, as a client that follows the
/// stream keeps it across `attempt_restarted` (everything up to the last step result): the
/// latest step with a result in the stream, and which of its results are.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Shown {
    /// The step (0: no result of the run is in the stream).
    pub step: u64,
    /// The tool call ids of that step's results in the stream, in order.
    pub calls: Vec<String>,
}

/// A new attempt takes the run over: raises the fence to `attempt` (no earlier attempt
/// publishes after this) and returns what the earlier attempts showed of the run's step
/// results, in one round trip. A new attempt re-shows what follows (the steps saved after it).
pub async fn takeover(
    conn: &mut RedisConn,
    keys: &StreamKeys,
    thread: ThreadId,
    workflow: WorkflowId,
    attempt: i32,
) -> Result<Shown, PublishError> {
    let reply: redis::RedisResult<Option<String>> = TAKEOVER
        .key(keys.fence(thread))
        .arg(workflow.to_string())
        .arg(attempt)
        .invoke_async(conn)
        .await;
    let reply = reply.map_err(|err| match fenced_by(&err) {
        Some(current) => PublishError::Fenced { current },
        None => PublishError::Redis(err),
    })?;
    let Some(reply) = reply else {
        return Ok(Shown::default());
    };
    let mut lines = reply.split('\n');
    let step = lines.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    Ok(Shown {
        step,
        calls: lines.map(str::to_owned).collect(),
    })
}

fn fenced_by(err: &redis::RedisError) -> Option<i64> {
    // redis-rs renders a script error as `"SPOOL_FENCED": 2` (code, then detail).
    let text = err.to_string();
    let rest = &text[text.find("SPOOL_FENCED")? + "SPOOL_FENCED".len()..];
    let digits: String = rest
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// How long an erased thread's fence keeps refusing the worker of its run that was active: far
/// longer than any lease, so that worker learns from Postgres (its writes match no row) that
/// the run is gone before the fence does.
pub const ERASED_FENCE_SECS: i64 = 86_400;

/// Erases a thread's stream and `message_start` index. For each run that may still publish
/// (`publishing`: active, or just ended), the fence refuses every attempt of it (so its worker
/// publishes nothing and the stream is not born again); the fence holds only those runs' ids,
/// for [`ERASED_FENCE_SECS`]. With none, the fence goes too.
pub async fn erase(
    conn: &mut RedisConn,
    keys: &StreamKeys,
    thread: ThreadId,
    publishing: &[WorkflowId],
) -> redis::RedisResult<()> {
    // A script, not MULTI: atomic on a Cluster too (the keys share one slot).
    ERASE
        .prepare_invoke()
        .key(keys.events(thread))
        .key(keys.fence(thread))
        .key(keys.starts(thread))
        .arg(ERASED_FENCE_SECS)
        .arg(
            publishing
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
        )
        .invoke_async::<()>(conn)
        .await
}

/// Undoes [`erase`]'s fences for `publishing` (the erasure failed after the stream was erased,
/// and the thread stays): their runs may publish again.
pub async fn lift_fences(
    conn: &mut RedisConn,
    keys: &StreamKeys,
    thread: ThreadId,
    publishing: &[WorkflowId],
) -> redis::RedisResult<()> {
    if publishing.is_empty() {
        return Ok(());
    }
    let fields: Vec<String> = publishing.iter().map(ToString::to_string).collect();
    redis::cmd("HDEL")
        .arg(keys.fence(thread))
        .arg(fields)
        .query_async(conn)
        .await
}

/// One stored event as the gateway serves it.
#[derive(Clone, Debug)]
pub struct StoredEvent {
    /// Its entry id (the SSE `id:`).
    pub id: EntryId,
    /// Its type (`stream_start` for the marker that is never sent).
    pub kind: String,
    /// Its message id (empty for the marker).
    pub message_id: String,
    /// The JSON envelope (the SSE `data:`).
    pub json: String,
    /// Its run's depth in a tree of agent calls (0: the thread's own run).
    pub depth: u32,
}

impl StoredEvent {
    /// Whether this is the internal `stream_start` marker.
    pub fn is_marker(&self) -> bool {
        self.kind == "stream_start"
    }

    /// Whether this is a `stream_gap` marker: batches acknowledged before it were lost (a
    /// failover, a restart), so what a reader crossing it was following has a hole.
    pub fn is_gap(&self) -> bool {
        self.kind == "stream_gap"
    }
}

/// The entry a read continued from is no longer in the stream: what came after it may be lost.
#[derive(Debug, thiserror::Error)]
#[error("the stream no longer holds entry {0}: what followed it may be lost")]
pub struct Gap(pub EntryId);

/// Why a continued read returned nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The entry read from is gone.
    #[error(transparent)]
    Gap(#[from] Gap),
    /// Redis failed.
    #[error(transparent)]
    Redis(#[from] redis::RedisError),
}

/// Up to `count` entries after the entry `entry`, oldest first, provided `entry` is still in
/// the stream; [`Gap`] if it is not. One round trip (`XRANGE key entry + COUNT count+1`).
pub async fn read_following(
    conn: &mut RedisConn,
    key: &str,
    entry: EntryId,
    count: usize,
) -> Result<Vec<StoredEvent>, ReadError> {
    let reply: Vec<RawEntry> = redis::cmd("XRANGE")
        .arg(key)
        .arg(entry.to_string())
        .arg("+")
        .arg("COUNT")
        .arg(count + 1)
        .query_async(conn)
        .await?;
    let mut entries = reply.into_iter().filter_map(stored);
    match entries.next() {
        Some(first) if first.id == entry => Ok(entries.collect()),
        _ => Err(Gap(entry).into()),
    }
}

/// Up to `count` entries after `after` (an entry id or not), oldest first.
pub async fn read_after(
    conn: &mut RedisConn,
    key: &str,
    after: EntryId,
    count: usize,
) -> redis::RedisResult<Vec<StoredEvent>> {
    let reply: Vec<RawEntry> = redis::cmd("XRANGE")
        .arg(key)
        .arg(format!("({after}"))
        .arg("+")
        .arg("COUNT")
        .arg(count)
        .query_async(conn)
        .await?;
    Ok(reply.into_iter().filter_map(stored).collect())
}

/// An entry as `XRANGE` returns it: its id, then its fields and values, flat. Decoded into
/// this rather than `StreamRangeReply`, which builds a `HashMap` of `Value`s per entry: the
/// gateway reads every event this way, and the API's CPU per event fell from 9.9 to 8.5 µs
/// without it (spool-bench P3, one event per delta). What is left of that work is redis-rs's
/// RESP parser, whose cost goes by reply element: hence one packed field per entry (`x`), five
/// elements per entry where `t`/`m`/`e`/`d` took eleven.
type RawEntry = (String, Vec<String>);

fn stored((id, fields): RawEntry) -> Option<StoredEvent> {
    let mut event = StoredEvent {
        id: id.parse().ok()?,
        kind: String::new(),
        message_id: String::new(),
        json: String::new(),
        depth: 0,
    };
    let mut fields = fields.into_iter();
    while let (Some(name), Some(value)) = (fields.next(), fields.next()) {
        match name.as_str() {
            "x" => return unpack(event, value),
            "t" => event.kind = value,
            "m" => event.message_id = value,
            "e" => event.json = value,
            "d" => event.depth = value.parse().unwrap_or(0),
            _ => {}
        }
    }
    Some(event)
}

/// An entry's packed field, `{type} {message id} {depth} {json}`, into `event`; the JSON keeps
/// the field's allocation.
fn unpack(mut event: StoredEvent, mut value: String) -> Option<StoredEvent> {
    let mut parts = value.splitn(4, ' ');
    let (kind, message, depth) = (parts.next()?, parts.next()?, parts.next()?);
    parts.next()?;
    let head = kind.len() + message.len() + depth.len() + 3;
    event.kind = kind.to_owned();
    event.message_id = message.to_owned();
    event.depth = depth.parse().unwrap_or(0);
    value.drain(..head);
    event.json = value;
    Some(event)
}

/// The newest entry of the stream, if it has any.
pub async fn last(conn: &mut RedisConn, key: &str) -> redis::RedisResult<Option<StoredEvent>> {
    let reply: Vec<RawEntry> = redis::cmd("XREVRANGE")
        .arg(key)
        .arg("+")
        .arg("-")
        .arg("COUNT")
        .arg(1)
        .query_async(conn)
        .await?;
    Ok(reply.into_iter().next().and_then(stored))
}

/// The newest entry id of the stream, if it has any.
pub async fn tail(conn: &mut RedisConn, key: &str) -> redis::RedisResult<Option<EntryId>> {
    Ok(last(conn, key).await?.map(|entry| entry.id))
}

/// The entry id of the message's `message_start`, if it has been published and not trimmed
/// (a start at or before the newest trimmed entry went with it: the index forgets it later).
pub async fn message_start(
    conn: &mut RedisConn,
    keys: &StreamKeys,
    thread: ThreadId,
    message: MessageId,
) -> redis::RedisResult<Option<EntryId>> {
    let (start, trimmed): (Option<String>, Option<String>) = redis::cmd("HMGET")
        .arg(keys.starts(thread))
        .arg(message.to_string())
        .arg(":trimmed")
        .query_async(conn)
        .await?;
    let trimmed: EntryId = trimmed.and_then(|id| id.parse().ok()).unwrap_or_default();
    Ok(start
        .and_then(|id| id.parse().ok())
        .filter(|start| *start > trimmed))
}

/// What the gateway needs to know to judge a cursor.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Retention {
    /// Whether the stream exists.
    pub exists: bool,
    /// The newest entry removed by trimming: a cursor before it has lost events.
    pub trimmed_through: EntryId,
    /// The first entry's id and type.
    pub first: Option<(EntryId, String)>,
    /// Whether the cursor's own entry is in the stream.
    pub holds_cursor: bool,
}

impl Retention {
    /// Whether every entry after `cursor` is still in the stream: the stream exists, the cursor
    /// is not older than what trimming removed, and its entry is still there (or it is exactly
    /// the newest trimmed entry, everything after which trimming kept).
    pub fn retains(&self, cursor: EntryId) -> bool {
        if !self.exists || cursor < self.trimmed_through {
            return false;
        }
        let trimmed_exactly = cursor == self.trimmed_through && cursor != EntryId::default();
        self.holds_cursor || trimmed_exactly
    }
}

/// Reads the thread's retention facts, and whether it still holds `cursor`, in one round trip.
pub async fn inspect(
    conn: &mut RedisConn,
    keys: &StreamKeys,
    thread: ThreadId,
    cursor: EntryId,
) -> redis::RedisResult<Retention> {
    let reply: Vec<String> = INSPECT
        .key(keys.events(thread))
        .key(keys.starts(thread))
        .arg(cursor.to_string())
        .invoke_async(conn)
        .await?;
    if reply.first().map(String::as_str) != Some("1") {
        return Ok(Retention::default());
    }
    let trimmed_through = reply
        .get(1)
        .and_then(|id| id.parse().ok())
        .unwrap_or_default();
    let first = match (reply.get(2).and_then(|id| id.parse().ok()), reply.get(3)) {
        (Some(id), Some(kind)) => Some((id, kind.clone())),
        _ => None,
    };
    Ok(Retention {
        exists: true,
        trimmed_through,
        first,
        holds_cursor: reply.get(4).map(String::as_str) == Some("1"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_read_packed_or_in_the_older_fields() {
        let packed = (
            "5-1".to_owned(),
            vec![
                "x".to_owned(),
                "text_delta m-1 2 {\"a\": \"b c\"}".to_owned(),
            ],
        );
        let event = stored(packed).expect("an entry");
        assert_eq!(
            (event.kind.as_str(), event.message_id.as_str(), event.depth),
            ("text_delta", "m-1", 2)
        );
        assert_eq!(event.json, "{\"a\": \"b c\"}");
        let old = (
            "6-0".to_owned(),
            ["t", "done", "m", "m-2", "e", "{}"]
                .map(str::to_owned)
                .to_vec(),
        );
        let event = stored(old).expect("an entry");
        assert_eq!(
            (
                event.kind.as_str(),
                event.message_id.as_str(),
                event.json.as_str(),
                event.depth
            ),
            ("done", "m-2", "{}", 0)
        );
        let marker = (
            "7-0".to_owned(),
            vec!["t".to_owned(), "stream_start".to_owned()],
        );
        assert!(stored(marker).expect("the marker").is_marker());
        let cut = (
            "8-0".to_owned(),
            vec!["x".to_owned(), "done m-3".to_owned()],
        );
        assert!(stored(cut).is_none());
    }

    #[test]
    fn entry_ids_parse_strictly_and_order_numerically() {
        let a: EntryId = "1732262400123-0".parse().expect("valid");
        let b: EntryId = "1732262400123-10".parse().expect("valid");
        let c: EntryId = "999-99".parse().expect("valid");
        assert!(c < a && a < b);
        assert_eq!(a.to_string(), "1732262400123-0");
        for bad in [
            "", "-", "1-", "-1", "1", "a-1", "1-1-1", " 1-1", "1-1 ", "+1-1", "$", ">",
        ] {
            assert!(bad.parse::<EntryId>().is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn a_cursor_is_retained_only_if_nothing_after_it_can_be_missing() {
        let id = |ms| EntryId { ms, seq: 0 };
        let gone = Retention::default();
        assert!(!gone.retains(id(5)));
        let facts = |trimmed, first: u64, holds_cursor| Retention {
            exists: true,
            trimmed_through: id(trimmed),
            first: Some((id(first), "done".into())),
            holds_cursor,
        };
        // Older than what trimming removed: lost, even if an entry of that id came back.
        assert!(!facts(10, 11, true).retains(id(9)));
        // Exactly the newest trimmed entry: everything after it was kept.
        assert!(facts(10, 11, false).retains(id(10)));
        assert!(facts(10, 11, true).retains(id(12)));
        // Its entry is gone (XTRIM or XDEL by anyone, a failover, a re-created stream, a
        // cursor of another thread or from the future): a gap.
        assert!(!facts(10, 11, false).retains(id(12)));
        assert!(!facts(0, 50, false).retains(id(40)));
        assert!(!facts(0, 50, false).retains(EntryId::default()));
    }

    #[test]
    fn every_key_of_a_thread_shares_its_hash_tag() {
        let keys = StreamKeys::new("spool");
        let thread = ThreadId::new();
        let tag = format!("{{{thread}}}");
        for key in [keys.events(thread), keys.fence(thread), keys.starts(thread)] {
            assert!(key.contains(&tag), "{key}");
            assert_eq!(key.matches('{').count(), 1, "{key}");
        }
        assert_eq!(keys.events(thread), format!("spool:{{{thread}}}:events"));
    }
}
