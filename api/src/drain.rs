//! The minimum drain rate: a connection whose client takes its bytes too slowly is closed.
//!
//! The write timeout (`SPOOL_WRITE_TIMEOUT_SECS`) closes a connection on which a write made no
//! progress at all for that long; a client that takes one TCP segment every few seconds never
//! trips it. Meanwhile its stream keeps what it has not sent (a page of events, each up to a
//! whole tool result) and holds its thread's live buffer, so a few such clients could pin
//! gigabytes (review B-M3). This rule measures each [`WINDOW`]: if the connection's writes
//! waited on the client for at least half of it and the client took fewer than
//! `SPOOL_MIN_DRAIN_BYTES_PER_SEC` × the window's length, the next write fails and the
//! connection closes. A stream's client then resumes with `Last-Event-ID`, as after any drop.
//! A timer ends the window while a write waits: a slow reader frees the socket's buffer too
//! little at a time for the kernel to say it is writable again, so no write would come to check.
//! An idle connection (nothing to send) waits on nobody and is never closed by it.

use std::future::Future as _;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// How long each measure of a connection's drain rate lasts.
pub(crate) const WINDOW: Duration = Duration::from_secs(10);

/// An I/O stream whose writes must drain at `min_rate` bytes a second (see the module doc).
pub(crate) struct Drain<T> {
    inner: T,
    min_rate: u64,
    window_start: Instant,
    written: u64,
    blocked: Duration,
    blocked_since: Option<Instant>,
    /// Fires at the window's end while a write waits.
    timer: Pin<Box<tokio::time::Sleep>>,
}

impl<T> Drain<T> {
    /// `inner`, held to `min_rate` bytes a second (0: no minimum).
    pub(crate) fn new(inner: T, min_rate: u64) -> Self {
        Self {
            inner,
            min_rate,
            window_start: Instant::now(),
            written: 0,
            blocked: Duration::ZERO,
            blocked_since: None,
            timer: Box::pin(tokio::time::sleep(WINDOW)),
        }
    }

    /// Accounts one write's result (`None`: it waits), and while a write waits keeps a timer
    /// on the window's end, so the check runs even if the socket never becomes writable.
    fn check(&mut self, cx: &mut Context<'_>, written: Option<usize>) -> std::io::Result<()> {
        self.account(written)?;
        if written.is_none() && self.min_rate > 0 {
            loop {
                let end = self.window_start + WINDOW;
                if self.timer.deadline() != end {
                    self.timer.as_mut().reset(end);
                }
                if self.timer.as_mut().poll(cx).is_pending() {
                    break;
                }
                // The window is over with the write still waiting: the check, then a new one.
                self.account(None)?;
            }
        }
        Ok(())
    }

    /// Accounts one write's result; an error when the window that just ended was too slow.
    fn account(&mut self, written: Option<usize>) -> std::io::Result<()> {
        let now = Instant::now();
        match written {
            None => {
                self.blocked_since.get_or_insert(now);
            }
            Some(n) => {
                if let Some(since) = self.blocked_since.take() {
                    self.blocked += now - since;
                }
                self.written += n as u64;
            }
        }
        let elapsed = now - self.window_start;
        if self.min_rate == 0 || elapsed < WINDOW {
            return Ok(());
        }
        let blocked = self.blocked + self.blocked_since.map_or(Duration::ZERO, |s| now - s);
        let expected = (self.min_rate as f64 * elapsed.as_secs_f64()) as u64;
        if blocked >= elapsed / 2 && self.written < expected {
            metrics::counter!("spool_http_slow_client_drops_total").increment(1);
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "the client took {} bytes in {:.0} s, under the minimum drain rate",
                    self.written,
                    elapsed.as_secs_f64()
                ),
            ));
        }
        self.window_start = now;
        self.written = 0;
        self.blocked = Duration::ZERO;
        self.blocked_since = self.blocked_since.map(|_| now);
        Ok(())
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Drain<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Drain<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write(cx, buf);
        let written = match &result {
            Poll::Pending => None,
            Poll::Ready(Ok(n)) => Some(*n),
            Poll::Ready(Err(_)) => return result,
        };
        if let Err(err) = self.check(cx, written) {
            return Poll::Ready(Err(err));
        }
        result
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        let written = match &result {
            Poll::Pending => None,
            Poll::Ready(Ok(n)) => Some(*n),
            Poll::Ready(Err(_)) => return result,
        };
        if let Err(err) = self.check(cx, written) {
            return Poll::Ready(Err(err));
        }
        result
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
