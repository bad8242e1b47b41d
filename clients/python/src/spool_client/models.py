"""Typed models of Spool's API, written from its OpenAPI document (`openapi.json` at the
repository root, also served at `GET /openapi.json`).

Each model is a frozen dataclass with a `from_json` that reads the server's JSON. Fields the
server adds later are ignored (kept in `raw`), so a newer server does not break an older
client; a required field that is missing is a `KeyError`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Literal, Optional, Union

JSON = Dict[str, Any]

#: `RunStatus`: where a run is in its life.
RunStatus = Literal[
    "queued",
    "running",
    "requires_action",
    "awaiting_approval",
    "waiting",
    "completed",
    "failed",
    "cancelled",
]


@dataclass(frozen=True)
class Usage:
    """`Usage`: token usage of one or more model calls."""

    input_tokens: int
    output_tokens: int
    cached_input_tokens: Optional[int] = None
    cache_write_tokens: Optional[int] = None
    reasoning_tokens: Optional[int] = None

    @classmethod
    def from_json(cls, data: Optional[JSON]) -> Optional["Usage"]:
        if data is None:
            return None
        return cls(
            input_tokens=data["input_tokens"],
            output_tokens=data["output_tokens"],
            cached_input_tokens=data.get("cached_input_tokens"),
            cache_write_tokens=data.get("cache_write_tokens"),
            reasoning_tokens=data.get("reasoning_tokens"),
        )


@dataclass(frozen=True)
class Citation:
    """`Citation`: a source an answer cites."""

    title: Optional[str] = None
    url: Optional[str] = None
    snippet: Optional[str] = None

    @classmethod
    def from_json(cls, data: JSON) -> "Citation":
        return cls(title=data.get("title"), url=data.get("url"), snippet=data.get("snippet"))


@dataclass(frozen=True)
class TextPart:
    """A `MessagePart` of type `text`."""

    text: str
    type: Literal["text"] = "text"


@dataclass(frozen=True)
class ToolCallPart:
    """A `MessagePart` of type `tool_call`: a tool call the model made."""

    tool_call_id: str
    name: str
    arguments: str
    step: Optional[int] = None
    type: Literal["tool_call"] = "tool_call"


@dataclass(frozen=True)
class ToolResultPart:
    """A `MessagePart` of type `tool_result`: a tool call's result."""

    tool_call_id: str
    name: str
    output: str
    is_error: bool
    step: Optional[int] = None
    type: Literal["tool_result"] = "tool_result"


@dataclass(frozen=True)
class CitationsPart:
    """A `MessagePart` of type `citations`: the sources the answer cites."""

    citations: List[Citation]
    type: Literal["citations"] = "citations"


MessagePart = Union[TextPart, ToolCallPart, ToolResultPart, CitationsPart]


def message_part(data: JSON) -> Optional[MessagePart]:
    """One `MessagePart`; `None` for a part type this client does not know."""
    kind = data.get("type")
    if kind == "text":
        return TextPart(text=data["text"])
    if kind == "tool_call":
        return ToolCallPart(
            tool_call_id=data["tool_call_id"],
            name=data["name"],
            arguments=data["arguments"],
            step=data.get("step"),
        )
    if kind == "tool_result":
        return ToolResultPart(
            tool_call_id=data["tool_call_id"],
            name=data["name"],
            output=data["output"],
            is_error=data["is_error"],
            step=data.get("step"),
        )
    if kind == "citations":
        return CitationsPart(citations=[Citation.from_json(c) for c in data["citations"]])
    return None


@dataclass(frozen=True)
class Message:
    """`MessageResponse`: a message as clients see it."""

    id: str
    thread_id: str
    role: Literal["user", "assistant", "system", "tool"]
    content: str
    parts: List[MessagePart]
    status: str
    metadata: JSON
    created_at: str
    updated_at: str
    blocked: bool
    workflow_id: Optional[str] = None
    usage: Optional[Usage] = None
    output: Any = None
    raw: JSON = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: JSON) -> "Message":
        parts = [message_part(p) for p in data["parts"]]
        return cls(
            id=data["id"],
            thread_id=data["thread_id"],
            role=data["role"],
            content=data["content"],
            parts=[p for p in parts if p is not None],
            status=data["status"],
            metadata=data["metadata"],
            created_at=data["created_at"],
            updated_at=data["updated_at"],
            blocked=data["blocked"],
            workflow_id=data.get("workflow_id"),
            usage=Usage.from_json(data.get("usage")),
            output=data.get("output"),
            raw=data,
        )


@dataclass(frozen=True)
class Thread:
    """`ThreadResponse`: a thread as clients see it."""

    id: str
    metadata: JSON
    status: Literal["idle", "busy"]
    created_at: str
    updated_at: str
    agent_id: Optional[str] = None
    active_workflow_id: Optional[str] = None
    last_message_at: Optional[str] = None
    title: Optional[str] = None
    raw: JSON = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: JSON) -> "Thread":
        return cls(
            id=data["id"],
            metadata=data["metadata"],
            status=data["status"],
            created_at=data["created_at"],
            updated_at=data["updated_at"],
            agent_id=data.get("agent_id"),
            active_workflow_id=data.get("active_workflow_id"),
            last_message_at=data.get("last_message_at"),
            title=data.get("title"),
            raw=data,
        )


@dataclass(frozen=True)
class ThreadList:
    """`ThreadList`: a page of threads, newest first."""

    data: List[Thread]
    next_cursor: Optional[str] = None

    @classmethod
    def from_json(cls, data: JSON) -> "ThreadList":
        return cls(
            data=[Thread.from_json(t) for t in data["data"]],
            next_cursor=data.get("next_cursor"),
        )


@dataclass(frozen=True)
class Accepted:
    """`UserMessageResponse`: the `202` of `POST /v1/threads/{id}/user_message`."""

    workflow_id: str
    thread_id: str
    user_message_id: str
    message_id: str
    status: Literal["queued"]
    stream_url: str

    @classmethod
    def from_json(cls, data: JSON) -> "Accepted":
        return cls(
            workflow_id=data["workflow_id"],
            thread_id=data["thread_id"],
            user_message_id=data["user_message_id"],
            message_id=data["message_id"],
            status=data["status"],
            stream_url=data["stream_url"],
        )


@dataclass(frozen=True)
class PendingCall:
    """`PendingCall`: one call a paused run waits on."""

    tool_call_id: str
    tool_name: str
    arguments: Any

    @classmethod
    def from_json(cls, data: JSON) -> "PendingCall":
        return cls(
            tool_call_id=data["tool_call_id"],
            tool_name=data["tool_name"],
            arguments=data["arguments"],
        )


@dataclass(frozen=True)
class PendingAction:
    """`PendingAction`: what a paused run waits for.

    `type` is `submit_tool_outputs` (`tool_calls`: answer them with
    `SpoolClient.submit_tool_outputs`), `approval` (`tool_calls` holds the one call: decide with
    `SpoolClient.approve`) or `agent_runs` (child runs; `raw["runs"]`).
    """

    type: str
    tool_calls: List[PendingCall]
    expires_at: Optional[str] = None
    raw: JSON = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Optional[JSON]) -> Optional["PendingAction"]:
        if data is None:
            return None
        if data["type"] == "approval":
            calls = [PendingCall.from_json(data)]
        else:
            calls = [PendingCall.from_json(c) for c in data.get("tool_calls", [])]
        return cls(type=data["type"], tool_calls=calls, expires_at=data.get("expires_at"), raw=data)


@dataclass(frozen=True)
class RunFailure:
    """`RunFailure`: a failed run's error."""

    code: str
    message: str

    @classmethod
    def from_json(cls, data: Optional[JSON]) -> Optional["RunFailure"]:
        if data is None:
            return None
        return cls(code=data["code"], message=data["message"])


@dataclass(frozen=True)
class Workflow:
    """`WorkflowResponse`: a run as clients see it."""

    workflow_id: str
    thread_id: str
    status: RunStatus
    attempt: int
    user_message_id: str
    message_id: str
    depth: int
    created_at: str
    updated_at: str
    agent_id: Optional[str] = None
    pending_action: Optional[PendingAction] = None
    error: Optional[RunFailure] = None
    usage: Optional[Usage] = None
    started_at: Optional[str] = None
    finished_at: Optional[str] = None
    parent_workflow_id: Optional[str] = None
    raw: JSON = field(default_factory=dict, repr=False, compare=False)

    @property
    def is_terminal(self) -> bool:
        """Whether the run is over (`completed`, `failed` or `cancelled`)."""
        return self.status in ("completed", "failed", "cancelled")

    @classmethod
    def from_json(cls, data: JSON) -> "Workflow":
        return cls(
            workflow_id=data["workflow_id"],
            thread_id=data["thread_id"],
            status=data["status"],
            attempt=data["attempt"],
            user_message_id=data["user_message_id"],
            message_id=data["message_id"],
            depth=data["depth"],
            created_at=data["created_at"],
            updated_at=data["updated_at"],
            agent_id=data.get("agent_id"),
            pending_action=PendingAction.from_json(data.get("pending_action")),
            error=RunFailure.from_json(data.get("error")),
            usage=Usage.from_json(data.get("usage")),
            started_at=data.get("started_at"),
            finished_at=data.get("finished_at"),
            parent_workflow_id=data.get("parent_workflow_id"),
            raw=data,
        )


@dataclass(frozen=True)
class WorkflowList:
    """`WorkflowList`: a page of runs, newest first."""

    data: List[Workflow]
    next_cursor: Optional[str] = None

    @classmethod
    def from_json(cls, data: JSON) -> "WorkflowList":
        return cls(
            data=[Workflow.from_json(w) for w in data["data"]],
            next_cursor=data.get("next_cursor"),
        )


@dataclass(frozen=True)
class StreamToken:
    """`StreamTokenResponse`: a token for one thread's stream, valid 5 minutes."""

    token: str
    expires_at: str

    @classmethod
    def from_json(cls, data: JSON) -> "StreamToken":
        return cls(token=data["token"], expires_at=data["expires_at"])


@dataclass(frozen=True)
class Agent:
    """`AgentResponse`: an agent's spec with its `id` (the whole spec is in `spec`)."""

    id: str
    name: str
    model: str
    created_at: str
    updated_at: str
    spec: JSON = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: JSON) -> "Agent":
        return cls(
            id=data["id"],
            name=data["name"],
            model=data["model"],
            created_at=data["created_at"],
            updated_at=data["updated_at"],
            spec=data,
        )


#: The event types the worker writes (`StreamEnvelope`'s `type`).
EventType = Literal[
    "message_start",
    "text_start",
    "text_delta",
    "text_end",
    "step_start",
    "step",
    "step_end",
    "citations",
    "heartbeat",
    "attempt_restarted",
    "requires_action",
    "approval_requested",
    "input_requested",
    "error",
    "message_end",
    "done",
]


@dataclass(frozen=True)
class StreamEvent:
    """One event of a thread's stream (docs/streaming.md).

    A stored event (`StreamEnvelope`) has its entry `id` and its envelope fields. The gateway's
    own events, `stream_reset` and `message_not_streaming`, have no `id` and no envelope: their
    `data` is the whole payload, and the stream ends after them.
    """

    type: str
    data: JSON
    id: Optional[str] = None
    thread_id: Optional[str] = None
    workflow_id: Optional[str] = None
    message_id: Optional[str] = None
    attempt: Optional[int] = None
    depth: int = 0

    @property
    def is_gateway_event(self) -> bool:
        """Whether the API sent it itself (`stream_reset`, `message_not_streaming`)."""
        return self.type in ("stream_reset", "message_not_streaming")

    @classmethod
    def from_sse(cls, event: str, data: JSON, id: Optional[str]) -> "StreamEvent":
        if "v" in data and "type" in data and isinstance(data.get("data"), dict):
            return cls(
                type=data["type"],
                data=data["data"],
                id=id,
                thread_id=data.get("thread_id"),
                workflow_id=data.get("workflow_id"),
                message_id=data.get("message_id"),
                attempt=data.get("attempt"),
                depth=data.get("depth") or 0,
            )
        return cls(type=event, data=data, id=id)
