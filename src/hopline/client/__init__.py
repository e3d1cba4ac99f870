"""hopline's Python SDK: the daemon client, its bounded SSE reader and the API's answers, typed
(SPEC C-1, A-1)."""

from hopline.client.answers import (
    Cancelled,
    DaemonStatus,
    GateRun,
    GateSummary,
    Health,
    Loaded,
    PermissionAnswered,
    PermissionOutcome,
    SessionRow,
    SessionShown,
    SessionSummary,
    TranscriptEvent,
    TranscriptPage,
)
from hopline.client.daemon import DaemonClient, NoDaemonUrl, RequestTooLarge
from hopline.client.events import Event, SidecarRef, content_text
from hopline.errors import DaemonError, SidecarIntegrityError, SseEventTooLarge, SseReconnectExhausted
from hopline.wire.sse import SseMessage, SseParser

__all__ = [
    "Cancelled",
    "DaemonClient",
    "DaemonError",
    "DaemonStatus",
    "Event",
    "GateRun",
    "GateSummary",
    "Health",
    "Loaded",
    "NoDaemonUrl",
    "PermissionAnswered",
    "PermissionOutcome",
    "RequestTooLarge",
    "SessionRow",
    "SessionShown",
    "SessionSummary",
    "SidecarIntegrityError",
    "SidecarRef",
    "SseEventTooLarge",
    "SseMessage",
    "SseParser",
    "SseReconnectExhausted",
    "TranscriptEvent",
    "TranscriptPage",
    "content_text",
]
