//! P3's client: counts SSE events straight from the response bytes, without building a frame
//! per event, so that the client is not what P3 ends up measuring (the general
//! `spool_tests::sse::SseReader` allocates three strings per event).

use std::time::Duration;

use futures::StreamExt as _;

/// How a stream read ended.
pub(crate) enum End {
    /// The `done` event arrived.
    Done,
    /// The server closed the stream first (a slow client is dropped; it resumes).
    Closed,
    /// The server said the events cannot be followed (`message_not_streaming` or
    /// `stream_reset`, named here): resuming would get the same answer again.
    Gone(&'static str),
}

/// Running totals over one or more responses of the same stream.
#[derive(Default)]
pub(crate) struct Counter {
    /// Events with data.
    pub(crate) events: u64,
    /// Bytes of their `data:` lines.
    pub(crate) bytes: usize,
    /// The last `id:` seen (the cursor to resume from).
    pub(crate) last_id: Option<String>,
    carry: Vec<u8>,
}

impl Counter {
    /// A counter resuming after `cursor`.
    pub(crate) fn after(cursor: &str) -> Self {
        Self {
            last_id: Some(cursor.to_owned()),
            ..Self::default()
        }
    }

    /// Reads `response` until `done` or until the server closes it.
    pub(crate) async fn read(
        &mut self,
        response: reqwest::Response,
        idle: Duration,
    ) -> anyhow::Result<End> {
        self.carry.clear();
        let mut body = response.bytes_stream();
        loop {
            let chunk = match tokio::time::timeout(idle, body.next()).await {
                Ok(Some(chunk)) => chunk?,
                Ok(None) => return Ok(End::Closed),
                Err(_) => anyhow::bail!("no bytes for {idle:?}"),
            };
            self.carry.extend_from_slice(&chunk);
            let mut start = 0;
            let mut ended = None;
            while let Some(end) = frame_end(&self.carry[start..]) {
                let (from, to) = (start, start + end);
                start = to + 2;
                ended = ended.or(self.frame(from, to));
            }
            self.carry.drain(..start);
            if let Some(end) = ended {
                return Ok(end);
            }
        }
    }

    /// Counts the frame at `carry[from..to]`; the end it is, if any (`done`, or the server's
    /// word that the stream cannot be followed).
    fn frame(&mut self, from: usize, to: usize) -> Option<End> {
        let (mut data, mut end, mut id) = (false, None, None);
        for line in self.carry[from..to].split(|b| *b == b'\n') {
            if let Some(value) = line.strip_prefix(b"data: ") {
                data = true;
                self.bytes += value.len();
            } else if let Some(value) = line.strip_prefix(b"id: ") {
                id = Some(value);
            } else if line == b"event: done" {
                end = Some(End::Done);
            } else if line == b"event: message_not_streaming" {
                end = Some(End::Gone("message_not_streaming"));
            } else if line == b"event: stream_reset" {
                end = Some(End::Gone("stream_reset"));
            }
        }
        if data {
            self.events += 1;
        }
        if let Some(id) = id {
            self.last_id = Some(String::from_utf8_lossy(id).into_owned());
        }
        end
    }
}

/// Where the first `\n\n` starts, if any.
fn frame_end(bytes: &[u8]) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = bytes[from..].iter().position(|b| *b == b'\n') {
        let at = from + i;
        if bytes.get(at + 1) == Some(&b'\n') {
            return Some(at);
        }
        from = at + 1;
    }
    None
}
