//! A small SSE client for tests: reads a response body as a client would, frame by frame.

use std::time::Duration;

use futures::StreamExt as _;
use serde_json::Value;

/// One SSE event as received.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Frame {
    /// The `id:` field, if any.
    pub id: Option<String>,
    /// The `event:` field (`message` if absent).
    pub event: String,
    /// The `data:` lines, joined by `\n`.
    pub data: String,
}

impl Frame {
    /// The data parsed as JSON (`Null` if it is not).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.data).unwrap_or(Value::Null)
    }
}

/// An open SSE response being read.
pub struct SseReader {
    body: futures::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    buffer: String,
    /// Where the unread part of `buffer` starts: frames are consumed by moving it, and the
    /// buffer is compacted once per chunk, so a chunk holding many frames costs O(its size).
    read: usize,
    /// Whether the server has closed the stream.
    pub closed: bool,
}

impl SseReader {
    /// Reads `response`'s body as SSE.
    pub fn new(response: reqwest::Response) -> Self {
        Self {
            body: response.bytes_stream().boxed(),
            buffer: String::new(),
            read: 0,
            closed: false,
        }
    }

    /// The next event with data (comments and `retry:`-only blocks are skipped); `None` when
    /// the stream ends or nothing arrives within `timeout`.
    pub async fn next(&mut self, timeout: Duration) -> Option<Frame> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(end) = self.buffer[self.read..].find("\n\n") {
                let block = &self.buffer[self.read..self.read + end + 2];
                self.read += end + 2;
                if let Some(frame) = parse(block) {
                    return Some(frame);
                }
                continue;
            }
            match tokio::time::timeout_at(deadline, self.body.next()).await {
                Ok(Some(Ok(chunk))) => {
                    self.buffer.drain(..self.read);
                    self.read = 0;
                    self.buffer.push_str(&String::from_utf8_lossy(&chunk));
                }
                Ok(Some(Err(_)) | None) => {
                    self.closed = true;
                    return None;
                }
                Err(_) => return None,
            }
        }
    }

    /// Every event until the stream closes (or `timeout` passes with nothing new).
    pub async fn collect(&mut self, timeout: Duration) -> Vec<Frame> {
        let mut frames = Vec::new();
        while let Some(frame) = self.next(timeout).await {
            frames.push(frame);
        }
        frames
    }
}

fn parse(block: &str) -> Option<Frame> {
    let mut frame = Frame {
        event: "message".into(),
        ..Frame::default()
    };
    let mut data = Vec::new();
    for line in block.lines() {
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "id" => frame.id = Some(value.to_owned()),
            "event" => frame.event = value.to_owned(),
            "data" => data.push(value.to_owned()),
            _ => {}
        }
    }
    if data.is_empty() {
        return None;
    }
    frame.data = data.join("\n");
    Some(frame)
}
