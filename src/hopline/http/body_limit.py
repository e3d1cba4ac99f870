"""The request body limit of both apps (SPEC G-2, D-10), enforced while reading, as one pure ASGI
middleware: the gateway guards ``API_JSON_BODY_LIMIT`` with it, the daemon API
``HOPLINE_DAEMON_JSON_BODY_LIMIT``.

Why not the framework's ``max_body_size`` (Starlette >= 1.6, FastAPI >= 0.164)? It enforces the same
boundary, but answers ``413`` with a plain-text (Starlette) or ``{"detail": ...}`` (FastAPI) body that
names neither the hop nor the limit, and checks ``Content-Length`` only when the app first reads the
body. This middleware refuses a too-large ``Content-Length`` before calling the app at all, and
reads every other body itself before the app runs: a chunked body is cut off at the first message
that passes the limit (so it holds at most the limit plus one received message), and a body within
the limit is replayed to the app whole. Reading first is what makes one middleware serve both apps:
FastAPI's body-parameter parsing turns an exception raised from ``receive()`` into a 400, so a
limit enforced from inside the app's reads could not answer the daemon's routes with a 413. The
413 is the one "too large" shape, :meth:`hopline.budget.LimitExceeded.to_json`, naming the hop,
the setting, the limit and the size seen.

Two more rules for hostile clients (SPEC D-10): a body still incomplete ``read_timeout`` seconds
after the request started (``HOPLINE_BODY_READ_TIMEOUT``) gets a 408 and its connection closed; and
a chunked body cut off at the limit is drained (read and discarded, until what was read comes
within one message of twice the limit) before the 413 is sent, because closing a connection with
unread data resets it, and a client that sends its whole body before reading (curl, browsers)
then loses the answer. Methods that carry no body (GET, HEAD, DELETE, OPTIONS) pass through unread.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hopline.budget import CEILINGS_BY_KEY
from hopline.errors import InputError


class BodyReadTimeout(InputError):
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

    def record(self, consumed: int, message_size: int) -> None:
        self.last_consumed_bytes = consumed
        self.max_consumed_bytes = max(self.max_consumed_bytes, consumed)
        self.max_message_bytes = max(self.max_message_bytes, message_size)


def too_large_error(ceiling: str, limit: int, observed: int, *, cut: bool) -> dict[str, Any]:
    """The 413 body: the :class:`~hopline.budget.LimitExceeded` of ``ceiling``. ``cut``: the body
    was read until it passed the limit (``observed`` is what was read, also ``receivedBytes``),
    else its declared ``Content-Length`` alone was over it."""
    hop = CEILINGS_BY_KEY[ceiling].hop
    if cut:
        message = f"request body passed the {hop} limit of {limit} bytes (read {observed} bytes, then cut)"
        extra: dict[str, Any] = {"receivedBytes": observed}
    else:
        message = f"request body of {observed} bytes is over the {hop} limit of {limit} bytes"
        extra = {}
    exceeded = CEILINGS_BY_KEY[ceiling].exceeded(limit, observed, message, kind="request_entity_too_large",
                                                 origin="code", **extra)
    return exceeded.to_json()


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
            while drained < max_bytes:
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


# The connection is closed after a refusal: the rest of an unread body is never read.
_CLOSE = [(b"connection", b"close")]
_BODILESS_METHODS = frozenset({"GET", "HEAD", "DELETE", "OPTIONS"})


class BodyLimit:
    """Refuse request bodies over ``limit`` bytes with a JSON 413 naming the hop of ``ceiling``
    (a budget key); read a body within it before the app runs, and replay it to the app."""

    def __init__(self, app: ASGIApp, *, limit: int, ceiling: str, stats: BodyLimitStats | None = None,
                 discard_up_to: int | None = None, read_timeout: float | None = None) -> None:
        self.app = app
        self.limit = limit
        self.ceiling = ceiling
        self.hop = CEILINGS_BY_KEY[ceiling].hop
        self.read_timeout = read_timeout
        # A refused body declared at most this large is discarded by the server (never buffered) so
        # that the client reads the 413; a larger one gets the connection closed at once.
        self.discard_up_to = discard_up_to if discard_up_to is not None else 2 * limit
        self.stats = stats if stats is not None else BodyLimitStats()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") in _BODILESS_METHODS:
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
            await send_json(send, 413, too_large_error(self.ceiling, self.limit, declared, cut=False),
                            extra_headers=close)
            return
        chunks: list[bytes] = []
        consumed = 0
        largest = 0  # the largest body message so far (the drain's margin for the next one)
        deadline = body_deadline(self.read_timeout)
        while True:
            try:
                message = await receive_by(receive, deadline, self.read_timeout or 0.0, consumed)
            except BodyReadTimeout as timed_out:
                timeout = body_timeout_error(self.hop, timed_out.timeout, consumed, declared)
                await send_json(send, 408, timeout, extra_headers=_CLOSE)
                return
            if message["type"] == "http.disconnect":
                return
            if message["type"] != "http.request":
                continue
            body = message.get("body", b"")
            consumed += len(body)
            largest = max(largest, len(body))
            self.stats.record(consumed, len(body))
            if consumed > self.limit:
                self.stats.refused += 1
                chunks.clear()
                if message.get("more_body", False):  # this message may have been the body's last
                    # What was read and what is drained stay within twice the limit, with a
                    # margin of the largest message for the one that ends the drain.
                    await drain_body(receive, 2 * self.limit - consumed - largest, deadline)
                await send_json(send, 413, too_large_error(self.ceiling, self.limit, consumed, cut=True),
                                extra_headers=_CLOSE)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
