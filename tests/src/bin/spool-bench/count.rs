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
            let mut done = false;
            while let Some(end) = frame_end(&self.carry[start..]) {
                let (from, to) = (start, start + end);
                start = to + 2;
                done |= self.frame(from, to);
            }
            self.carry.drain(..start);
            if done {
                return Ok(End::Done);
            }
        }
    }

    /// Counts the frame at `carry[from..to]`; whether it is `done`.
    fn frame(&mut self, from: usize, to: usize) -> bool {
        let (mut data, mut done, mut id) = (false, false, None);
        for line in self.carry[from..to].split(|b| *b == b'\n') {
            if let Some(value) = line.strip_prefix(b"data: ") {
                data = true;
                self.bytes += value.len();
            } else if let Some(value) = line.strip_prefix(b"id: ") {
                id = Some(value);
            } else if line == b"event: done" {
                done = true;
            }
        }
        if data {
            self.events += 1;
        }
        if let Some(id) = id {
            self.last_id = Some(String::from_utf8_lossy(id).into_owned());
        }
        done
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
