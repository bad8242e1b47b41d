//! Fan-out: one live reader per active thread per process feeds all of that thread's
//! subscribers, so Redis connections do not grow with clients (or with threads).
//!
//! Each thread with subscribers has a [`Feed`]: a task that reads new entries with a
//! non-blocking `XRANGE` on the shared multiplexed connection and broadcasts them into a
//! bounded ring (`tokio::sync::broadcast`). Its wake-ups come from one pub/sub connection per
//! process subscribed to `{prefix}:notify`, on which the publish script announces the thread it
//! wrote to; a read without one, every second at first and every 8 s once the thread is idle
//! ([`POLL`]), covers a notification lost some other way (a reconnect of that connection
//! already wakes every feed).
//! A subscriber that falls more than the ring's capacity behind, or more than [`BEHIND_BYTES`]
//! of entries behind (review B-M3: one entry may be a 300 KB tool result, so a count alone
//! bounds nothing), is dropped instead of holding memory; it reconnects with `Last-Event-ID`.
//!
//! Why not a blocking `XREAD` per thread on dedicated connections: that needs a connection per
//! active thread (unbounded), and a multi-key blocking `XREAD` that multiplexes threads on a few
//! connections is refused by Redis Cluster (`CROSSSLOT`: every thread has its own hash tag).
//! Notify-then-read keeps the whole gateway at two Redis connections, standalone or Cluster,
//! and never blocks the shared connection.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt as _;
use tokio::sync::broadcast::error::{RecvError, TryRecvError};
use tokio::sync::{Notify, broadcast};
use tokio_util::sync::CancellationToken;

use spool_shared::ThreadId;
use spool_shared::redis_conn::RedisConn;
use spool_shared::stream::{self, EntryId, ReadError, StoredEvent, StreamKeys};

/// The most entries read per round trip: four sessions' pages ([`super::session::PAGE`]), since
/// a feed keeps up with a whole thread's output (one event per delta: tens of thousands a
/// second) and each read is a round trip.
const PAGE: usize = 256;
/// The bytes a feed aims to read at once (review B-M3): an entry may be a whole tool result
/// (about 300 KB escaped), so 256 of them would be 77 MB. Each read asks for as many entries
/// as the previous read's average size fits (at least one, at most [`PAGE`]).
const PAGE_BYTES: usize = 1024 * 1024;

/// How many entries a feed's next read asks for, after one of `entries` entries and `bytes`
/// bytes (none: as many as [`PAGE`]).
fn next_page(entries: usize, bytes: usize) -> usize {
    match entries {
        0 => PAGE,
        _ => (PAGE_BYTES / (bytes / entries).max(1)).clamp(1, PAGE),
    }
}
/// The most bytes of entries a subscriber may be behind its feed: one further behind is dropped
/// when it next takes an entry. The ring's memory is what its slowest subscriber has not taken
/// yet; a subscriber that takes nothing is one stuck writing to its client, which the write
/// timeout and the minimum drain rate end.
const BEHIND_BYTES: u64 = 16 * 1024 * 1024;
/// The kind of the entry a feed broadcasts when the entry it continued from is gone (trimmed,
/// deleted, lost in a failover): its subscribers end with `stream_reset`.
pub(crate) const GAP: &str = "spool_gap";
/// How long a feed waits for a notification before it reads anyway, at first: each such read
/// that finds nothing doubles the wait, up to [`POLL_MAX`]; a read that finds entries starts
/// again from here. (An idle followed thread, say a run paused for hours with its page open,
/// costs a read every 8 s, not every second.)
const POLL: Duration = Duration::from_secs(1);
/// The longest wait for a notification before a feed reads anyway.
const POLL_MAX: Duration = Duration::from_secs(8);

/// The process's fan-out hub. Cheap to clone.
#[derive(Clone)]
pub struct Hub {
    inner: Arc<Inner>,
}

struct Inner {
    conn: RedisConn,
    client: redis::Client,
    keys: StreamKeys,
    buffer: usize,
    feeds: Mutex<HashMap<ThreadId, Entry>>,
    slots: super::slots::StreamSlots,
    shutdown: CancellationToken,
}

struct Entry {
    feed: Arc<Feed>,
    subscribers: usize,
}

/// A broadcast entry and the feed's byte count once it was sent (its own bytes included).
type Live = (Arc<StoredEvent>, u64);

struct Feed {
    tx: broadcast::Sender<Live>,
    /// Bytes of entries sent so far.
    sent: AtomicU64,
    wake: Notify,
    stop: CancellationToken,
}

impl Feed {
    /// Broadcasts `entry` to the subscribers, counting its bytes.
    fn send(&self, entry: StoredEvent) {
        let bytes = entry.json.len() as u64;
        let end = self.sent.fetch_add(bytes, Ordering::Relaxed) + bytes;
        // No receivers left is fine: the feed is about to stop.
        let _ = self.tx.send((Arc::new(entry), end));
    }
}

/// One subscriber's view of a thread's live events. Dropping it unsubscribes; the last one
/// stops the thread's reader.
pub struct Subscription {
    /// Live entries, in order, from the moment of subscribing.
    rx: broadcast::Receiver<Live>,
    feed: Arc<Feed>,
    thread: ThreadId,
    inner: Arc<Inner>,
}

/// Why a subscription gives no entry.
#[derive(Debug, PartialEq, Eq)]
pub enum Missed {
    /// Nothing new yet ([`Subscription::try_recv`] only).
    Empty,
    /// The feed stopped (the process is shutting down).
    Closed,
    /// The subscriber fell too far behind and is dropped: it resumes from its cursor.
    Behind,
}

impl Subscription {
    /// The next live entry if one is there.
    pub fn try_recv(&mut self) -> Result<Arc<StoredEvent>, Missed> {
        match self.rx.try_recv() {
            Ok(live) => self.taken(live),
            Err(TryRecvError::Empty) => Err(Missed::Empty),
            Err(TryRecvError::Closed) => Err(Missed::Closed),
            Err(TryRecvError::Lagged(entries)) => Err(dropped("entries", entries)),
        }
    }

    /// The next live entry, waiting for it.
    pub async fn recv(&mut self) -> Result<Arc<StoredEvent>, Missed> {
        match self.rx.recv().await {
            Ok(live) => self.taken(live),
            Err(RecvError::Closed) => Err(Missed::Closed),
            Err(RecvError::Lagged(entries)) => Err(dropped("entries", entries)),
        }
    }

    fn taken(&self, (entry, end): Live) -> Result<Arc<StoredEvent>, Missed> {
        let behind = self.feed.sent.load(Ordering::Relaxed).saturating_sub(end);
        if behind > BEHIND_BYTES {
            return Err(dropped("bytes", behind));
        }
        Ok(entry)
    }
}

/// Counts and logs a subscriber dropped for being `behind` (`what`: entries or bytes).
fn dropped(what: &'static str, behind: u64) -> Missed {
    metrics::counter!("spool_sse_slow_subscriber_drops_total").increment(1);
    tracing::info!(
        behind,
        unit = what,
        "slow subscriber dropped; it can resume"
    );
    Missed::Behind
}

impl Hub {
    /// Starts the hub and its notification listener. Connects lazily: a hub starts while Redis
    /// is down and works once it is back.
    pub fn start(
        redis_url: &str,
        keys: StreamKeys,
        buffer: usize,
        shutdown: CancellationToken,
    ) -> redis::RedisResult<Self> {
        let inner = Arc::new(Inner {
            conn: spool_shared::redis_conn::connect(redis_url)?,
            // Pub/sub goes to one node: in a cluster, PUBLISH reaches every node's subscribers.
            client: spool_shared::redis_conn::client(
                spool_shared::redis_conn::nodes(redis_url)
                    .first()
                    .map_or(redis_url, String::as_str),
            )?,
            keys,
            buffer: buffer.max(1),
            feeds: Mutex::default(),
            slots: super::slots::StreamSlots::default(),
            shutdown,
        });
        tokio::spawn(listen(inner.clone()));
        Ok(Self { inner })
    }

    /// The process's open streams per user.
    pub fn slots(&self) -> &super::slots::StreamSlots {
        &self.inner.slots
    }

    /// The shared multiplexed connection (never used for blocking commands).
    pub fn conn(&self) -> RedisConn {
        self.inner.conn.clone()
    }

    /// The key names.
    pub fn keys(&self) -> &StreamKeys {
        &self.inner.keys
    }

    /// Threads with a live reader in this process.
    pub fn active_feeds(&self) -> usize {
        lock(&self.inner.feeds).len()
    }

    /// Subscribes to the thread's live entries, starting a reader for it if none runs.
    pub async fn subscribe(&self, thread: ThreadId) -> redis::RedisResult<Subscription> {
        if let Some(subscription) = self.join(thread) {
            return Ok(subscription);
        }
        // A new reader starts after the current end of the stream; the subscriber reads
        // everything up to (and past) that point itself, after subscribing.
        let start = stream::tail(&mut self.conn(), &self.inner.keys.events(thread))
            .await?
            .unwrap_or_default();
        let mut feeds = lock(&self.inner.feeds);
        if let Some(entry) = feeds.get_mut(&thread) {
            entry.subscribers += 1;
            let rx = entry.feed.tx.subscribe();
            return Ok(Subscription {
                rx,
                feed: entry.feed.clone(),
                thread,
                inner: self.inner.clone(),
            });
        }
        let (tx, rx) = broadcast::channel(self.inner.buffer);
        let feed = Arc::new(Feed {
            tx,
            sent: AtomicU64::new(0),
            wake: Notify::new(),
            stop: CancellationToken::new(),
        });
        feeds.insert(
            thread,
            Entry {
                feed: feed.clone(),
                subscribers: 1,
            },
        );
        tokio::spawn(read_feed(self.inner.clone(), thread, feed.clone(), start));
        Ok(Subscription {
            rx,
            feed,
            thread,
            inner: self.inner.clone(),
        })
    }

    fn join(&self, thread: ThreadId) -> Option<Subscription> {
        let mut feeds = lock(&self.inner.feeds);
        let entry = feeds.get_mut(&thread)?;
        entry.subscribers += 1;
        Some(Subscription {
            rx: entry.feed.tx.subscribe(),
            feed: entry.feed.clone(),
            thread,
            inner: self.inner.clone(),
        })
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut feeds = lock(&self.inner.feeds);
        if let Some(entry) = feeds.get_mut(&self.thread) {
            entry.subscribers -= 1;
            if entry.subscribers == 0 {
                entry.feed.stop.cancel();
                feeds.remove(&self.thread);
            }
        }
    }
}

fn lock(
    feeds: &Mutex<HashMap<ThreadId, Entry>>,
) -> std::sync::MutexGuard<'_, HashMap<ThreadId, Entry>> {
    // Every update is one insert, remove or counter change: consistent even after a panic.
    feeds.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One thread's reader: reads whatever is new, broadcasts it, sleeps until woken or polled.
/// It continues from the last entry it read, which must still be in the stream; if it is gone,
/// what followed may be lost too, so it tells its subscribers ([`GAP`]) and starts over from
/// the stream's end.
async fn read_feed(inner: Arc<Inner>, thread: ThreadId, feed: Arc<Feed>, mut last: EntryId) {
    let key = inner.keys.events(thread);
    let mut conn = inner.conn.clone();
    let mut poll = POLL;
    let mut count = PAGE;
    loop {
        loop {
            let read = if last == EntryId::default() {
                stream::read_after(&mut conn, &key, last, count)
                    .await
                    .map_err(ReadError::from)
            } else {
                stream::read_following(&mut conn, &key, last, count).await
            };
            match read {
                Err(ReadError::Gap(gap)) => {
                    tracing::info!(thread.id = %thread, error = %gap, "a followed stream lost entries");
                    feed.send(StoredEvent {
                        id: last,
                        kind: GAP.to_owned(),
                        message_id: String::new(),
                        json: String::new(),
                        depth: 0,
                    });
                    match stream::tail(&mut conn, &key).await {
                        Ok(tail) => last = tail.unwrap_or_default(),
                        Err(_) => break,
                    }
                }
                Ok(entries) => {
                    if !entries.is_empty() {
                        poll = POLL;
                    }
                    let full = entries.len() == count;
                    let bytes = entries.iter().map(|e| e.json.len()).sum();
                    count = next_page(entries.len(), bytes);
                    for entry in entries {
                        last = entry.id;
                        if !entry.is_marker() {
                            feed.send(entry);
                        }
                    }
                    if !full {
                        break;
                    }
                }
                Err(ReadError::Redis(err)) => {
                    tracing::debug!(thread.id = %thread, error = %err, "feed read failed");
                    break;
                }
            }
        }
        tokio::select! {
            () = feed.wake.notified() => {}
            () = tokio::time::sleep(poll) => poll = (poll * 2).min(POLL_MAX),
            () = feed.stop.cancelled() => return,
            () = inner.shutdown.cancelled() => return,
        }
    }
}

/// The notification listener: one pub/sub connection, reconnecting with backoff.
async fn listen(inner: Arc<Inner>) {
    let channel = inner.keys.notify_channel();
    let mut delay = Duration::from_millis(100);
    loop {
        match inner.client.get_async_pubsub().await {
            Ok(mut pubsub) => match pubsub.subscribe(&channel).await {
                Ok(()) => {
                    delay = Duration::from_millis(100);
                    // Anything published while we were away: every feed reads once.
                    for entry in lock(&inner.feeds).values() {
                        entry.feed.wake.notify_one();
                    }
                    let mut messages = pubsub.into_on_message();
                    loop {
                        tokio::select! {
                            message = messages.next() => {
                                let Some(message) = message else { break };
                                let Ok(payload) = message.get_payload::<String>() else { continue };
                                let Ok(thread) = payload.parse::<ThreadId>() else { continue };
                                if let Some(entry) = lock(&inner.feeds).get(&thread) {
                                    entry.feed.wake.notify_one();
                                }
                            }
                            () = inner.shutdown.cancelled() => return,
                        }
                    }
                    tracing::warn!("Redis notification connection closed; reconnecting");
                }
                Err(err) => tracing::warn!(error = %err, "SUBSCRIBE failed"),
            },
            Err(err) => tracing::debug!(error = %err, "Redis unreachable for notifications"),
        }
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = inner.shutdown.cancelled() => return,
        }
        delay = (delay * 2).min(Duration::from_secs(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Appends `n` entries of `bytes` bytes each to the thread's stream, in the stored format
    /// (`{type} {message id} {depth} {json}`), and announces them as the publish script does.
    async fn append(hub: &Hub, thread: ThreadId, n: usize, bytes: usize) {
        let mut conn = hub.conn();
        let json = format!("{{\"pad\":\"{}\"}}", "x".repeat(bytes - 10));
        for _ in 0..n {
            let _: String = redis::cmd("XADD")
                .arg(hub.keys().events(thread))
                .arg("*")
                .arg("x")
                .arg(format!("text_delta m1 0 {json}"))
                .query_async(&mut conn)
                .await
                .expect("XADD");
        }
        let _: i64 = redis::cmd("PUBLISH")
            .arg(hub.keys().notify_channel())
            .arg(thread.to_string())
            .query_async(&mut conn)
            .await
            .expect("PUBLISH");
    }

    #[tokio::test]
    async fn a_subscriber_more_bytes_behind_than_the_budget_is_dropped_and_one_that_keeps_up_is_not()
     {
        let prefix = format!("hubtest-{}", uuid::Uuid::new_v4().simple());
        let shutdown = CancellationToken::new();
        let hub = Hub::start(
            &spool_tests::redis_url(),
            StreamKeys::new(prefix),
            1024,
            shutdown.clone(),
        )
        .expect("hub");
        let thread = ThreadId::new();
        let mut slow = hub.subscribe(thread).await.expect("subscribe");
        let mut fast = hub.subscribe(thread).await.expect("subscribe");
        // 20 entries of 1 MiB: far fewer than the ring's 1,024, more bytes than the budget.
        let entry = 1024 * 1024;
        let n = (BEHIND_BYTES as usize / entry) + 4;
        let reader = tokio::spawn(async move {
            let mut got = 0;
            while got < n {
                let entry = tokio::time::timeout(Duration::from_secs(20), fast.recv())
                    .await
                    .expect("the fast subscriber is fed in time");
                assert!(
                    entry.is_ok(),
                    "the fast subscriber is not dropped: {entry:?}"
                );
                got += 1;
            }
            got
        });
        append(&hub, thread, n, entry).await;
        assert_eq!(reader.await.expect("reader"), n);
        // The slow one took nothing meanwhile: its first entry is now 23 MiB behind the feed.
        assert_eq!(slow.recv().await.map(|_| ()), Err(Missed::Behind));
        shutdown.cancel();
    }

    #[test]
    fn a_feed_reads_about_its_byte_budget_whatever_the_size_of_the_entries() {
        assert_eq!(next_page(0, 0), PAGE);
        assert_eq!(next_page(256, 256 * 200), PAGE);
        // Tool results of 300 KB: three at a time, not 256 (77 MB).
        assert_eq!(next_page(4, 4 * 300_000), 3);
        assert_eq!(next_page(1, 5_000_000), 1);
    }
}
