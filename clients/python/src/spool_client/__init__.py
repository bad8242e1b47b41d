"""A typed Python client of Spool's API (docs/clients.md)."""

from .client import Reply, SpoolClient, SpoolError, StreamLost
from .models import (
    Accepted,
    Agent,
    Citation,
    CitationsPart,
    Message,
    PendingAction,
    PendingCall,
    RunFailure,
    StreamEvent,
    StreamToken,
    TextPart,
    Thread,
    ThreadList,
    ToolCallPart,
    ToolResultPart,
    Usage,
    Workflow,
    WorkflowList,
)

__all__ = [
    "Accepted",
    "Agent",
    "Citation",
    "CitationsPart",
    "Message",
    "PendingAction",
    "PendingCall",
    "Reply",
    "RunFailure",
    "SpoolClient",
    "SpoolError",
    "StreamEvent",
    "StreamLost",
    "StreamToken",
    "TextPart",
    "Thread",
    "ThreadList",
    "ToolCallPart",
    "ToolResultPart",
    "Usage",
    "Workflow",
    "WorkflowList",
]
__version__ = "0.1.0"
