"""The stream helper across a worker killed mid-answer and a dropped connection. Needs
`SPOOL_WORKER_PID` (the only worker: this test kills it mid-answer, and the suite starts
another) and `SPOOL_EXPECTED_REPLY` (the demo model's answer to "nested resume")."""

import os
import signal
import uuid

import httpx

from conftest import env
from spool_client import SpoolClient


class DroppingTransport(httpx.BaseTransport):
    """Passes requests through; the first stream's body, after `after` text deltas, calls
    `on_cut` and then fails as a dropped connection does."""

    def __init__(self, after, on_cut):
        self.inner = httpx.HTTPTransport()
        self.after = after
        self.on_cut = on_cut
        self.streams = []

    def handle_request(self, request):
        response = self.inner.handle_request(request)
        if not request.url.path.endswith("/stream"):
            return response
        self.streams.append(dict(request.headers))
        if len(self.streams) > 1:
            return response
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=Dropping(response.stream, self.after, self.on_cut),
            extensions=response.extensions,
        )

    def close(self):
        self.inner.close()


class Dropping(httpx.SyncByteStream):
    def __init__(self, inner, after, on_cut):
        self.inner, self.after, self.on_cut = inner, after, on_cut

    def __iter__(self):
        seen = 0
        for chunk in self.inner:
            yield chunk
            seen += chunk.count(b"event: text_delta")
            if seen >= self.after:
                self.on_cut()
                self.inner.close()
                raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")

    def close(self):
        self.inner.close()


def test_the_reply_is_whole_across_a_worker_crash_and_a_dropped_connection():
    worker = int(env("SPOOL_WORKER_PID"))
    token = env("SPOOL_TOKEN")
    transport = DroppingTransport(after=5, on_cut=lambda: os.kill(worker, signal.SIGKILL))
    seen = []
    with SpoolClient(env("SPOOL_URL"), token, http=httpx.Client(transport=transport, timeout=30)) as client:
        thread = str(uuid.uuid4())
        accepted = client.send_message(thread, "nested resume")
        reply = client.follow(thread, on_event=lambda event, _: seen.append(event), reconnect_delay=0.2)

    assert reply.status == "completed"
    assert reply.text == env("SPOOL_EXPECTED_REPLY")
    assert reply.message_id == accepted.message_id
    assert reply.restarts >= 1, "a new attempt took over the killed worker's run"
    assert "attempt_restarted" in [e.type for e in seen]
    # Resumed with the last event's id, never with the long-lived token.
    assert len(transport.streams) >= 2
    ids = [e.id for e in seen if e.id is not None]
    resumed_from = transport.streams[1]["last-event-id"]
    assert resumed_from in ids
    assert len(ids) == len(set(ids)), "no event twice"
    assert all(s["authorization"] != f"Bearer {token}" for s in transport.streams)
