"""hopline's Python SDK: the daemon client and its bounded SSE reader (SPEC C-1)."""

from hopline.client.daemon import DaemonClient, NoDaemonUrl, RequestTooLarge, TranscriptPage
from hopline.client.events import Event, SidecarRef, content_text
from hopline.errors import DaemonError, SidecarIntegrityError, SseEventTooLarge, SseReconnectExhausted
from hopline.wire.sse import SseMessage, SseParser

__all__ = [
    "DaemonClient",
    "DaemonError",
    "Event",
    "NoDaemonUrl",
    "RequestTooLarge",
    "SidecarIntegrityError",
    "SidecarRef",
    "SseEventTooLarge",
    "SseMessage",
    "SseParser",
    "SseReconnectExhausted",
    "TranscriptPage",
    "content_text",
]
