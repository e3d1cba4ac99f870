"""The daemon API's body limit (``HOPLINE_DAEMON_JSON_BODY_LIMIT``), enforced while reading.

The gateway's middleware raises from ``receive()`` once a body passes the limit, which works for
routes that read the body themselves; FastAPI's body-parameter parsing catches that exception and
answers 400. So the daemon reads the body here first: a declared ``Content-Length`` over the limit
is refused before a byte is read, a chunked body is cut off at the first message that passes the
limit, and a body within the limit (held in memory, at most ``limit`` bytes) is replayed to the
app. The 413 answer is the gateway's JSON shape, naming the hop, the limit and what was seen.
As in the gateway, a body still incomplete at ``read_timeout`` gets a 408 (connection closed) and a
chunked body cut off at the limit is drained, at most the limit again, before its 413 is sent.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hopline.gateway.body_limit import (
    BodyReadTimeout,
    body_deadline,
    body_timeout_error,
    content_length,
    drain_body,
    receive_by,
    send_json,
    too_large_error,
)

_CLOSE = [(b"connection", b"close")]


class ReadAheadBodyLimit:
    def __init__(self, app: ASGIApp, *, limit: int, hop: str, read_timeout: float | None = None) -> None:
        self.app = app
        self.limit = limit
        self.hop = hop
        self.read_timeout = read_timeout
        self.refused = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") in ("GET", "HEAD", "DELETE", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        declared = content_length(scope)
        if declared is not None and declared > self.limit:
            self.refused += 1
            await send_json(send, 413, too_large_error(self.hop, self.limit, observed=declared),
                            extra_headers=_CLOSE)
            return
        chunks: list[bytes] = []
        received = 0
        deadline = body_deadline(self.read_timeout)
        while True:
            try:
                message = await receive_by(receive, deadline, self.read_timeout or 0.0, received)
            except BodyReadTimeout as timed_out:
                timeout = body_timeout_error(self.hop, timed_out.timeout, received, declared)
                await send_json(send, 408, timeout, extra_headers=_CLOSE)
                return
            if message["type"] == "http.disconnect":
                return
            if message["type"] != "http.request":
                continue
            body = message.get("body", b"")
            received += len(body)
            if received > self.limit:
                self.refused += 1
                chunks.clear()
                if message.get("more_body", False):  # this message may have been the body's last
                    await drain_body(receive, self.limit, deadline)
                await send_json(send, 413, too_large_error(self.hop, self.limit, received=received),
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
