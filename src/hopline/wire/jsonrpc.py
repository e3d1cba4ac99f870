"""JSON-RPC 2.0 message kinds, read from a message's shape alone (ACP is JSON-RPC over NDJSON)."""

from __future__ import annotations

from typing import Any, Literal

MessageKind = Literal["request", "notification", "response", "error_response", "invalid"]


def message_kind(msg: Any) -> MessageKind:
    """Classify ``msg``: a method with an ``id`` is a request, without one a notification; no method
    with an ``id`` is a response (``error_response`` when it carries ``error``). The ``jsonrpc``
    version member is not required, so a sloppy peer's messages are still classified."""
    if not isinstance(msg, dict):
        return "invalid"
    method = msg.get("method")
    if method is not None:
        if not isinstance(method, str):
            return "invalid"
        return "request" if "id" in msg else "notification"
    if "id" not in msg:
        return "invalid"
    if "error" in msg:
        return "error_response"
    if "result" in msg:
        return "response"
    return "invalid"


def method_of(msg: Any) -> str | None:
    """The method of a request or notification, else ``None``."""
    if isinstance(msg, dict):
        method = msg.get("method")
        if isinstance(method, str):
            return method
    return None


def is_response(msg: Any) -> bool:
    return message_kind(msg) in ("response", "error_response")
