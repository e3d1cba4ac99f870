"""A request body limit enforced while reading (SPEC G-2), as a pure ASGI middleware.

Why not the framework's ``max_body_size`` (Starlette >= 1.6, FastAPI >= 0.164)? It enforces the same
boundary, but answers ``413`` with a plain-text (Starlette) or ``{"detail": ...}`` (FastAPI) body that
names neither the hop nor the limit, and checks ``Content-Length`` only when the app first reads the
body. This middleware refuses a too-large ``Content-Length`` before calling the app at all, cuts a
chunked body off at the first message that passes the limit (so the app holds at most the limit
plus one received chunk), and answers one JSON shape naming the hop, the limit and the size seen.

It is generic (``limit`` and ``hop`` are parameters) so the daemon can guard its own API with it.

Two more rules for hostile clients (SPEC D-10): a body still incomplete ``read_timeout`` seconds
after the request started (``HOPLINE_BODY_READ_TIMEOUT``) gets a 408 and its connection closed; and
a chunked body cut off at the limit is drained (read and discarded, at most the limit again)
before the 413 is sent, because closing a connection with unread data resets it, and a client
that sends its whole body before reading (curl, browsers) then loses the answer.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, TypeVar

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hopline.budget import CEILINGS_BY_KEY


class BodyTooLarge(Exception):
    """Raised from ``receive()`` once the bytes read pass the limit; answered with a 413."""

    def __init__(self, limit: int, received: int) -> None:
        super().__init__(f"request body passed {limit} bytes")
        self.limit = limit
        self.received = received


_E = TypeVar("_E", bound=BaseException)


class BodyReadTimeout(Exception):
    """Raised from ``receive()`` when the body is still incomplete at its deadline; answered 408."""

    def __init__(self, timeout: float, received: int) -> None:
        super().__init__(f"request body incomplete after {timeout} s")
        self.timeout = timeout
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


def body_timeout_error(hop: str, timeout: float, received: int, declared: int | None) -> dict[str, Any]:
    """The 408 JSON body: the hop, the deadline and how much of the body had arrived."""
    expected = f" of {declared}" if declared is not None else ""
    error: dict[str, Any] = {
        "type": "request_timeout",
        "hop": hop,
        "timeoutSeconds": timeout,
        "receivedBytes": received,
        "setting": CEILINGS_BY_KEY["body_read_timeout_seconds"].name,
        "message": f"the request body was not complete after {timeout} s ({received}{expected} bytes "
                   f"received) on {hop}; the connection is closed",
    }
    if declared is not None:
        error["declaredBytes"] = declared
    return {"error": error}


def body_deadline(timeout: float | None) -> float | None:
    """The loop time by which a request's body must be complete (None: no deadline)."""
    return None if timeout is None else asyncio.get_running_loop().time() + timeout


async def receive_by(receive: Receive, deadline: float | None, timeout: float, received: int) -> Message:
    """``receive()``, or :class:`BodyReadTimeout` once ``deadline`` passes."""
    try:
        async with asyncio.timeout_at(deadline):
            return await receive()
    except TimeoutError:
        raise BodyReadTimeout(timeout, received) from None


async def drain_body(receive: Receive, max_bytes: int, deadline: float | None) -> bool:
    """Read and discard up to ``max_bytes`` more of a refused body (see the module docstring).

    True when the body ended within the bound and the deadline (the connection is then clean)."""
    drained = 0
    try:
        async with asyncio.timeout_at(deadline):
            while drained <= max_bytes:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return False
                if message["type"] != "http.request":
                    continue
                drained += len(message.get("body", b""))
                if not message.get("more_body", False):
                    return True
    except TimeoutError:
        pass
    return False


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


def _find(exc: BaseException, kind: type[_E]) -> _E | None:
    """``exc`` or the first ``kind`` inside an exception group (anyio task groups wrap them)."""
    if isinstance(exc, kind):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _find(inner, kind)
            if found is not None:
                return found
    return None


# The connection is closed after a refusal: the rest of an unread body is never read.
_CLOSE = [(b"connection", b"close")]


class BodyLimitMiddleware:
    """Refuse request bodies over ``limit`` bytes with a JSON 413 naming ``hop``."""

    def __init__(self, app: ASGIApp, *, limit: int, hop: str, stats: BodyLimitStats | None = None,
                 discard_up_to: int | None = None, read_timeout: float | None = None) -> None:
        self.app = app
        self.limit = limit
        self.hop = hop
        self.read_timeout = read_timeout
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
        complete = False
        deadline = body_deadline(self.read_timeout)

        async def limited_receive() -> Message:
            nonlocal consumed, complete
            if complete:  # the body is read: later calls only wait for a disconnect, undeadlined
                return await receive()
            message = await receive_by(receive, deadline, self.read_timeout or 0.0, consumed)
            if message["type"] == "http.request":
                size = len(message.get("body", b""))
                consumed += size
                complete = not message.get("more_body", False)
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
            timed_out = _find(exc, BodyReadTimeout)
            if timed_out is not None and not started:
                await send_json(send, 408, body_timeout_error(self.hop, timed_out.timeout, timed_out.received,
                                                              declared), extra_headers=_CLOSE)
                return
            too_large = _find(exc, BodyTooLarge)
            if too_large is not None:
                self.stats.refused += 1
            if too_large is None or started:
                raise
            if not complete:  # the message that passed the limit may have been the body's last
                await drain_body(receive, self.limit, deadline)
            await send_json(send, 413, too_large_error(self.hop, self.limit, received=too_large.received),
                            extra_headers=_CLOSE)
            return

    def _record(self, consumed: int, message_size: int) -> None:
        self.stats.last_consumed_bytes = consumed
        self.stats.max_consumed_bytes = max(self.stats.max_consumed_bytes, consumed)
        self.stats.max_message_bytes = max(self.stats.max_message_bytes, message_size)
