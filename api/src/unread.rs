//! `Connection: close` on an HTTP/1.1 answer given before its request's body was read.
//!
//! Many answers come before the body is read: a 401 from the token check, a 413 from a
//! `Content-Length` over the limit, a 415 from the content type, a 404 for no route. hyper then
//! drains what of the body has already arrived, and if more is still on the way it closes the
//! connection after the answer, since the rest of the body stands between it and the next
//! request. But the answer's head was written first, without `Connection: close`: the client
//! believes the connection is still usable, sends its next request on it and gets "server
//! disconnected without a response" (about 1 in 300 with Python's httpx, whose bodies arrive in
//! pieces). DESIGN section 15: a connection stays usable after any answer, or the answer says it
//! will not be.
//!
//! This layer tracks whether the body reached its end, and when an HTTP/1.x answer leaves it
//! unread, adds `Connection: close`, which hyper honours by closing after the answer: the client
//! opens a new connection for its next request instead of losing it. Draining the body instead
//! would keep the connection, but would read up to the body limit for requests refused precisely
//! so as not to read them (an unauthenticated client's upload), and cannot help a 413.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use axum::http::{HeaderValue, Version, header};
use axum::middleware::Next;
use axum::response::Response;

/// The middleware: see the module's documentation.
pub(crate) async fn close_when_unread(request: Request, next: Next) -> Response {
    if !matches!(request.version(), Version::HTTP_11 | Version::HTTP_10) {
        return next.run(request).await;
    }
    let read = Arc::new(AtomicBool::new(request.body().is_end_stream()));
    let request = request.map(|body| {
        Body::new(Tracked {
            inner: body,
            read: Arc::clone(&read),
        })
    });
    let mut response = next.run(request).await;
    if !read.load(Ordering::Acquire) {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// A request body that records when it has been read to its end.
struct Tracked {
    inner: Body,
    read: Arc<AtomicBool>,
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let frame = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(frame, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.read.store(true, Ordering::Release);
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
