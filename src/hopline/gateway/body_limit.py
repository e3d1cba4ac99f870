"""A request body limit enforced while reading (SPEC G-2), as a pure ASGI middleware.

Why not the framework's ``max_body_size`` (Starlette >= 1.6, FastAPI >= 0.164)? It enforces the same
boundary, but answers ``413`` with a plain-text (Starlette) or ``{"detail": ...}`` (FastAPI) body that
names neither the hop nor the limit, and checks ``Content-Length`` only when the app first reads the
body. This middleware refuses a too-large ``Content-Length`` before calling the app at all, cuts a
chunked body off at the first message that passes the limit (so the app holds at most the limit
plus one received chunk), and answers one JSON shape naming the hop, the limit and the size seen.

It is generic (``limit`` and ``hop`` are parameters) so the daemon can guard its own API with it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyTooLarge(Exception):
    """Raised from ``receive()`` once the bytes read pass the limit; answered with a 413."""

    def __init__(self, limit: int, received: int) -> None:
        super().__init__(f"request body passed {limit} bytes")
        self.limit = limit
        self.received = received


@dataclasses.dataclass
class BodyLimitStats:
    """What the middleware has read, for tests and metrics: bytes pulled from ``receive()``."""

    requests: int = 0
    refused: int = 0
    last_consumed_bytes: int = 0
    max_consumed_bytes: int = 0
    max_message_bytes: int = 0  # the largest single receive() message: "one chunk"


def too_large_error(hop: str, limit: int, *, observed: int | None = None,
                    received: int | None = None) -> dict[str, Any]:
    """The 413 JSON body: the hop, its limit and what was seen of the request."""
    if observed is not None:
        message = f"request body of {observed} bytes is over the {hop} limit of {limit} bytes"
    else:
        message = f"request body passed the {hop} limit of {limit} bytes (read {received} bytes, then cut)"
    error: dict[str, Any] = {
        "type": "request_entity_too_large",
        "hop": hop,
        "limitBytes": limit,
        "origin": "code",
        "sizeError": True,
        "message": message,
    }
    if observed is not None:
        error["observedBytes"] = observed
    if received is not None:
        error["receivedBytes"] = received
    return {"error": error}


def content_length(scope: Scope) -> int | None:
    """The declared ``Content-Length``, or None when absent or unreadable (chunked bodies)."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def send_json(send: Send, status: int, body: dict[str, Any], *,
                    extra_headers: list[tuple[bytes, bytes]] | None = None) -> None:
    payload = orjson.dumps(body)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    headers.extend(extra_headers or [])
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload, "more_body": False})


def _find_too_large(exc: BaseException) -> BodyTooLarge | None:
    if isinstance(exc, BodyTooLarge):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _find_too_large(inner)
            if found is not None:
                return found
    return None


# The connection is closed after a refusal: the rest of an unread body is never read.
_CLOSE = [(b"connection", b"close")]


class BodyLimitMiddleware:
    """Refuse request bodies over ``limit`` bytes with a JSON 413 naming ``hop``."""

    def __init__(self, app: ASGIApp, *, limit: int, hop: str, stats: BodyLimitStats | None = None,
                 discard_up_to: int | None = None) -> None:
        self.app = app
        self.limit = limit
        self.hop = hop
        # A refused body declared at most this large is discarded by the server (never buffered) so
        # that the client reads the 413; a larger one gets the connection closed at once.
        self.discard_up_to = discard_up_to if discard_up_to is not None else 2 * limit
        self.stats = stats if stats is not None else BodyLimitStats()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.stats.requests += 1
        self.stats.last_consumed_bytes = 0
        declared = content_length(scope)
        if declared is not None and declared > self.limit:
            self.stats.refused += 1
            # The app never sees the body. Up to `discard_up_to`, the server discards it (never
            # buffered) so the client reads the 413 rather than a reset that can overtake it; beyond,
            # the connection is closed at once, which a client still uploading sees as a reset.
            close = _CLOSE if declared > self.discard_up_to else None
            await send_json(send, 413, too_large_error(self.hop, self.limit, observed=declared),
                            extra_headers=close)
            return

        consumed = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal consumed
            message = await receive()
            if message["type"] == "http.request":
                size = len(message.get("body", b""))
                consumed += size
                # Recorded as it is read, so the numbers are current before any response is sent.
                self._record(consumed, size)
                if consumed > self.limit:
                    raise BodyTooLarge(self.limit, consumed)
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracked_send)
        except BaseException as exc:
            too_large = _find_too_large(exc)
            if too_large is not None:
                self.stats.refused += 1
            if too_large is None or started:
                raise
            await send_json(send, 413, too_large_error(self.hop, self.limit, received=too_large.received),
                            extra_headers=_CLOSE)
            return

    def _record(self, consumed: int, message_size: int) -> None:
        self.stats.last_consumed_bytes = consumed
        self.stats.max_consumed_bytes = max(self.stats.max_consumed_bytes, consumed)
        self.stats.max_message_bytes = max(self.stats.max_message_bytes, message_size)
