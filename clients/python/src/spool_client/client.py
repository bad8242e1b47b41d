"""`SpoolClient`: Spool's REST API over httpx, and its stream with resuming."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Union

import httpx

from .models import (
    Accepted,
    Agent,
    Message,
    StreamEvent,
    StreamToken,
    Thread,
    ThreadList,
    Workflow,
    WorkflowList,
)

JSON = Dict[str, Any]

#: The events a run pauses on, waiting for an answer: a client tool's outputs
#: (`submit_tool_outputs`), a person's approval (`approve`), a graph's human input (`submit_input`).
PAUSES = ("requires_action", "approval_requested", "input_requested")


class SpoolError(Exception):
    """An error answer of Spool's API: its HTTP `status`, its `code` (`thread_not_found`,
    `invalid_body`, ...), its `message`, and the whole `error` object in `detail`."""

    def __init__(self, status: int, code: str, message: str, detail: Optional[JSON] = None):
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.detail = detail or {}


class StreamLost(SpoolError):
    """The stream could not be resumed: it dropped `max_reconnects` times in a row."""


def _error(response: httpx.Response) -> SpoolError:
    try:
        body = response.json()
        error = body["error"]
        return SpoolError(response.status_code, error["code"], error.get("message", ""), error)
    except (ValueError, KeyError, TypeError):
        return SpoolError(response.status_code, "http_error", response.text or response.reason_phrase)


def _sse(lines: Iterator[str]) -> Iterator[tuple]:
    """`(event, data, id)` of each SSE event in `lines` (comments and `retry:` skipped)."""
    event, data, id_ = "message", [], None
    for line in lines:
        if line == "":
            if data:
                yield event, "\n".join(data), id_
            event, data, id_ = "message", [], None
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
        elif name == "id":
            id_ = value


@dataclass
class Reply:
    """An assistant message assembled from its stream, as a client shows it.

    `text` is what to show: the text kept since the last tool result is tentative, and a new
    attempt after a crash (`attempt_restarted`) replaces it, so no text shows twice. Events of
    child runs (agents called as tools, `depth` > 0) are left out of the text.
    """

    message_id: Optional[str] = None
    workflow_id: Optional[str] = None
    kept: str = ""
    tentative: str = ""
    status: Optional[str] = None
    error: Optional[JSON] = None
    restarts: int = 0
    tool_calls: List[JSON] = field(default_factory=list)
    tool_results: List[JSON] = field(default_factory=list)
    pause: Optional[StreamEvent] = None
    events: int = 0

    @property
    def text(self) -> str:
        return self.kept + self.tentative

    @property
    def done(self) -> bool:
        return self.status is not None

    def push(self, event: StreamEvent) -> None:
        """Takes one event of the stream into account."""
        self.events += 1
        if event.depth:
            return
        kind = event.type
        if kind == "message_start":
            if event.message_id != self.message_id:
                self.message_id, self.kept, self.tentative = event.message_id, "", ""
            self.workflow_id = event.workflow_id
        elif kind == "text_delta":
            self.tentative += event.data.get("delta", "")
        elif kind == "step":
            if event.data.get("phase") == "result":
                self.kept += self.tentative
                self.tentative = ""
                self.tool_results.append(event.data)
            else:
                self.tool_calls.append(event.data)
        elif kind == "attempt_restarted":
            self.restarts += 1
            self.tentative = ""
        elif kind in PAUSES:
            self.pause = event
        elif kind == "error":
            self.error = event.data
        elif kind == "done":
            self.status = event.data.get("status")
        if kind not in (*PAUSES, "heartbeat", "done"):
            # The run went on: the pause was answered.
            self.pause = None


class SpoolClient:
    """A client of Spool's API.

    ``SpoolClient(base_url, token)``; each method is one route (docs/api.md) and returns a
    typed model (`spool_client.models`), or raises `SpoolError` for an error answer. Pass
    ``http=httpx.Client(...)`` to bring your own client (proxies, transports, timeouts).
    """

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8080",
        token: Union[str, Callable[[], str], None] = None,
        *,
        timeout: float = 30.0,
        http: Optional[httpx.Client] = None,
    ):
        self.base_url = base_url.rstrip("/")
        self._token = token
        self._http = http or httpx.Client(timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "SpoolClient":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _headers(self, extra: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
        headers: Dict[str, str] = {}
        token = self._token() if callable(self._token) else self._token
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if extra:
            headers.update(extra)
        return headers

    def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: Optional[Mapping[str, Any]] = None,
        headers: Optional[Mapping[str, str]] = None,
    ) -> Any:
        """One request; the JSON answer (`None` for an empty one), or `SpoolError`."""
        query = {k: v for k, v in (params or {}).items() if v is not None}
        response = self._http.request(
            method,
            self.base_url + path,
            json=json_body,
            params=query,
            headers=self._headers(headers),
        )
        if response.status_code >= 400:
            raise _error(response)
        if not response.content:
            return None
        return response.json()

    # Threads and messages.

    def create_thread(self, *, agent_id: Optional[str] = None, metadata: Optional[JSON] = None) -> Thread:
        body = {k: v for k, v in {"agent_id": agent_id, "metadata": metadata}.items() if v is not None}
        return Thread.from_json(self.request("POST", "/v1/threads", json_body=body))

    def get_thread(self, thread_id: str) -> Thread:
        return Thread.from_json(self.request("GET", f"/v1/threads/{thread_id}"))

    def list_threads(
        self, *, limit: Optional[int] = None, cursor: Optional[str] = None, status: Optional[str] = None
    ) -> ThreadList:
        params = {"limit": limit, "cursor": cursor, "status": status}
        return ThreadList.from_json(self.request("GET", "/v1/threads", params=params))

    def delete_thread(self, thread_id: str) -> None:
        self.request("DELETE", f"/v1/threads/{thread_id}")

    def send_message(
        self,
        thread_id: str,
        input_text: str,
        *,
        agent_id: Optional[str] = None,
        metadata: Optional[JSON] = None,
        idempotency_key: Optional[str] = None,
        **overrides: Any,
    ) -> Accepted:
        """Posts a user message (the thread is created on first use); the run is queued.
        `overrides` are the request's other fields (`max_steps`, `tool_choice`, ...)."""
        body: JSON = {"input_text": input_text, **overrides}
        if agent_id is not None:
            body["agent_id"] = agent_id
        if metadata is not None:
            body["metadata"] = metadata
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        answer = self.request("POST", f"/v1/threads/{thread_id}/user_message", json_body=body, headers=headers)
        return Accepted.from_json(answer)

    def list_messages(self, thread_id: str, *, limit: Optional[int] = None, before: Optional[str] = None) -> List[Message]:
        """A page of the thread's messages, oldest first."""
        answer = self.request("GET", f"/v1/threads/{thread_id}/messages", params={"limit": limit, "before": before})
        return [Message.from_json(m) for m in answer["messages"]]

    def stream_token(self, thread_id: str) -> StreamToken:
        """A token for this thread's stream only, valid 5 minutes."""
        return StreamToken.from_json(self.request("POST", f"/v1/threads/{thread_id}/stream_token"))

    # Runs.

    def get_workflow(self, workflow_id: str) -> Workflow:
        return Workflow.from_json(self.request("GET", f"/v1/workflows/{workflow_id}"))

    def list_workflows(
        self, *, thread_id: Optional[str] = None, limit: Optional[int] = None, cursor: Optional[str] = None
    ) -> WorkflowList:
        params = {"thread_id": thread_id, "limit": limit, "cursor": cursor}
        return WorkflowList.from_json(self.request("GET", "/v1/workflows", params=params))

    def cancel(self, workflow_id: str, *, reason: Optional[str] = None) -> Workflow:
        body = {"reason": reason} if reason is not None else {}
        return Workflow.from_json(self.request("POST", f"/v1/workflows/{workflow_id}/cancel", json_body=body))

    def submit_tool_outputs(self, workflow_id: str, outputs: Mapping[str, Any]) -> Workflow:
        """Answers a `requires_action` pause: `{tool_call_id: output}` for every pending call
        (an output is a string, or any JSON)."""
        body = {"tool_outputs": [{"tool_call_id": k, "output": v} for k, v in outputs.items()]}
        return Workflow.from_json(self.request("POST", f"/v1/workflows/{workflow_id}/tool_outputs", json_body=body))

    def approve(
        self, workflow_id: str, tool_call_id: str, approved: bool = True, *, reason: Optional[str] = None
    ) -> Workflow:
        """Decides an `approval_requested` pause (a denial's `reason` reaches the model)."""
        body: JSON = {"approved": approved}
        if reason is not None:
            body["reason"] = reason
        path = f"/v1/workflows/{workflow_id}/approvals/{tool_call_id}"
        return Workflow.from_json(self.request("POST", path, json_body=body))

    def submit_input(self, workflow_id: str, text: str) -> Workflow:
        """Answers an `input_requested` pause (a graph agent's `human_input` node): `text` is the
        node's output, and the run goes on."""
        return Workflow.from_json(
            self.request("POST", f"/v1/workflows/{workflow_id}/input", json_body={"text": text})
        )

    def get_steps(self, workflow_id: str) -> JSON:
        """The run's durable timeline (`StepsResponse`, as JSON)."""
        return self.request("GET", f"/v1/workflows/{workflow_id}/steps")

    def wait(self, workflow_id: str, *, until: Callable[[Workflow], bool] = lambda w: w.is_terminal,
             timeout: float = 60.0, interval: float = 0.2) -> Workflow:
        """Polls the run until `until` holds (default: it is over); `TimeoutError` after `timeout` s."""
        deadline = time.monotonic() + timeout
        while True:
            run = self.get_workflow(workflow_id)
            if until(run):
                return run
            if time.monotonic() > deadline:
                raise TimeoutError(f"run {workflow_id} is still {run.status}")
            time.sleep(interval)

    # Agents.

    def list_agents(self) -> List[Agent]:
        return [Agent.from_json(a) for a in self.request("GET", "/v1/agents")["agents"]]

    def get_agent(self, agent_id: str) -> Agent:
        return Agent.from_json(self.request("GET", f"/v1/agents/{agent_id}"))

    def create_agent(self, spec: JSON) -> Agent:
        """Creates an agent (`AgentSpec`, docs/agents.md); needs an `admin` token."""
        return Agent.from_json(self.request("POST", "/v1/agents", json_body=spec))

    def delete_agent(self, agent_id: str) -> None:
        self.request("DELETE", f"/v1/agents/{agent_id}")

    # The stream.

    def stream(
        self,
        thread_id: str,
        *,
        last_event_id: Optional[str] = None,
        max_reconnects: int = 5,
        reconnect_delay: float = 0.5,
        stop_at_pause: bool = False,
    ) -> Iterator[StreamEvent]:
        """The thread's stream (docs/streaming.md), as `StreamEvent`s.

        Without `last_event_id`: the message in progress, from its start; with it, every event
        after it. Each connection is opened with a fresh stream token (this thread's stream
        only), never the client's own token. A dropped connection is resumed with
        `Last-Event-ID` (the last event's id), after `reconnect_delay` s, doubled up to 8 s;
        `StreamLost` after `max_reconnects` drops in a row without an event. Ends after the
        followed message's `done`, or a gateway event (`message_not_streaming`,
        `stream_reset`), which is yielded first. `stop_at_pause`: end after a pause too
        (`requires_action`, `approval_requested` or a graph's `input_requested`: answer it, then
        stream again from its id).
        `attempt_restarted` is yielded as it is: `Reply` shows how to handle it.
        """
        cursor = last_event_id
        failures = 0
        while True:
            token = self.stream_token(thread_id).token
            headers = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
            if cursor is not None:
                headers["Last-Event-ID"] = cursor
            url = f"{self.base_url}/v1/threads/{thread_id}/stream"
            try:
                with self._http.stream("GET", url, headers=headers, timeout=httpx.Timeout(30.0, read=60.0)) as response:
                    if response.status_code >= 400:
                        response.read()
                        raise _error(response)
                    for event, data, id_ in _sse(response.iter_lines()):
                        parsed = StreamEvent.from_sse(event, json.loads(data), id_)
                        if id_ is not None:
                            cursor = id_
                        failures = 0
                        yield parsed
                        if parsed.is_gateway_event:
                            return
                        if parsed.depth == 0 and parsed.type == "done":
                            return
                        if stop_at_pause and parsed.type in PAUSES:
                            return
            except httpx.TransportError:
                pass  # The connection dropped: resume below.
            # The connection ended before the message's end: resume after the last event.
            failures += 1
            if failures > max_reconnects:
                raise StreamLost(503, "stream_lost", f"the stream dropped {max_reconnects} times in a row")
            time.sleep(min(reconnect_delay * 2 ** (failures - 1), 8.0))

    def follow(
        self,
        thread_id: str,
        *,
        last_event_id: Optional[str] = None,
        on_event: Optional[Callable[[StreamEvent, Reply], None]] = None,
        **stream_options: Any,
    ) -> Reply:
        """Follows the thread's message in progress to its end (or its pause, with
        `stop_at_pause=True`) and returns it assembled (`Reply`); `on_event(event, reply)` sees
        each event as it comes."""
        reply = Reply()
        for event in self.stream(thread_id, last_event_id=last_event_id, **stream_options):
            reply.push(event)
            if on_event is not None:
                on_event(event, reply)
        return reply
