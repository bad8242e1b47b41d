//! Connections kept alive across answers given before the body was read (DESIGN section 15):
//! after a 401, 413, 415 or 404 that left part of a request body unread, the connection either
//! still serves the next request or the answer said `Connection: close`. A raw HTTP/1.1 client
//! on one socket sends the head and part of the body, reads the answer, then, unless told to
//! close, the rest of the body and a `GET /healthz`, which must be answered.

use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::TcpStream;
use uuid::Uuid;

use spool_tests::token;

use crate::common::{TestApp, worker_args};

/// A client's connection.
struct Connection {
    stream: BufReader<TcpStream>,
}

impl Connection {
    async fn open(app: &TestApp) -> Self {
        let addr = app.base.trim_start_matches("http://");
        let stream = TcpStream::connect(addr).await.expect("connect");
        Self {
            stream: BufReader::new(stream),
        }
    }

    async fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.get_mut().write_all(bytes).await
    }

    /// The next answer's status and whether it says `Connection: close` (its body is read).
    async fn answer(&mut self) -> std::io::Result<(u16, bool)> {
        let read = async {
            let mut line = String::new();
            if self.stream.read_line(&mut line).await? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            let status = line
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            let (mut length, mut close) = (0, false);
            loop {
                line.clear();
                self.stream.read_line(&mut line).await?;
                let header = line.trim_end().to_ascii_lowercase();
                if header.is_empty() {
                    break;
                }
                if let Some(value) = header.strip_prefix("content-length:") {
                    length = value.trim().parse().unwrap_or(0);
                }
                close |= header == "connection: close";
            }
            let mut body = vec![0; length];
            self.stream.read_exact(&mut body).await?;
            Ok((status, close))
        };
        tokio::time::timeout(Duration::from_secs(10), read)
            .await
            .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()))
    }
}

#[tokio::test]
async fn a_connection_answered_before_its_body_was_read_serves_the_next_request_or_says_close() {
    let app = TestApp::start(0, worker_args(1, 0)).await;
    let alice = token("alice", "acme");
    let path = format!("/v1/threads/{}/user_message", Uuid::new_v4());
    // (status, headers, Content-Length, bytes of the body sent before the answer)
    let limit = 1 << 20;
    let cases = [
        (401, String::new(), 100_000, 1_000),
        (
            415,
            format!("Authorization: Bearer {alice}\r\n"),
            100_000,
            1_000,
        ),
        (
            413,
            format!("Authorization: Bearer {alice}\r\n"),
            2 * limit,
            limit + 1_000,
        ),
    ];
    let mut conn = Connection::open(&app).await;
    for round in 0..20 {
        for (expected, auth, length, sent) in &cases {
            let content_type = if *expected == 415 {
                "text/plain"
            } else {
                "application/json"
            };
            let head = format!(
                "POST {path} HTTP/1.1\r\nHost: spool\r\n{auth}Content-Type: {content_type}\r\n\
                 Content-Length: {length}\r\n\r\n"
            );
            conn.send(head.as_bytes()).await.expect("head");
            conn.send(&vec![b'x'; *sent])
                .await
                .expect("part of the body");
            let (status, close) = conn.answer().await.expect("the early answer");
            assert_eq!(status, *expected, "round {round}");
            if close {
                conn = Connection::open(&app).await;
                continue;
            }
            // Told the connection stays: the rest of the body, then the next request on it.
            let rest = conn.send(&vec![b'x'; length - sent]).await;
            let next = conn
                .send(b"GET /healthz HTTP/1.1\r\nHost: spool\r\n\r\n")
                .await;
            let answer = match (rest, next) {
                (Ok(()), Ok(())) => conn.answer().await,
                (Err(err), _) | (_, Err(err)) => Err(err),
            };
            assert!(
                matches!(answer, Ok((200, _))),
                "round {round}: a {expected} without `Connection: close`, then the next request \
                 on its connection got {answer:?}"
            );
        }
    }
    app.stop().await;
}
