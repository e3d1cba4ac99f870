"""uvicorn for hopline's two servers (``hopline serve``, ``hopline gateway``), with the two bounds
uvicorn does not have (SPEC D-10, B-5).

- **A deadline on the request head.** uvicorn arms its keep-alive timeout only after a response, so a
  connection that sends nothing, or half a request head, is held forever (slowloris). Here a
  connection's head (request line and headers) must be complete ``HOPLINE_REQUEST_HEAD_TIMEOUT``
  seconds after the connection opened, or after the previous response: then it gets a 408 naming
  the hop and the setting (when part of a head had arrived) and is closed.
- **A connection ceiling.** A connection past ``HOPLINE_MAX_CONNECTIONS`` open at once gets a 503
  naming the hop, the limit and the count, and is closed before anything is read. (uvicorn's own
  ``limit_concurrency`` answers with plain text, after reading the head.)

Both live in a subclass of uvicorn's httptools protocol (``uvicorn[standard]``). Without httptools,
uvicorn's h11 protocol runs with neither bound (said at start).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import math
from typing import Any

import orjson

from hopline.budget import CEILINGS_BY_KEY, Budget
from hopline.gateway.errors import error_body

log = logging.getLogger("hopline.http")


def _response(status: int, reason: str, body: dict[str, Any]) -> bytes:
    payload = orjson.dumps(body)
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n" % (status, reason.encode(), len(payload))) + payload


def head_timeout_response(hop: str, timeout: float, received: int) -> bytes:
    setting = CEILINGS_BY_KEY["request_head_timeout_seconds"].name
    return _response(408, "Request Timeout", error_body(
        hop, "request_timeout",
        f"the request head (request line and headers) was not complete after {timeout} s "
        f"({received} bytes received) on {hop} ({setting}); the connection is closed",
        timeoutSeconds=timeout, receivedBytes=received, setting=setting))


def too_many_connections_response(hop: str, limit: int, observed: int) -> bytes:
    setting = CEILINGS_BY_KEY["max_connections"].name
    return _response(503, "Service Unavailable", error_body(
        hop, "too_many_connections",
        f"this would be connection {observed} open at once on {hop}, over the limit of {limit} "
        f"({setting}); retry when fewer are open",
        **CEILINGS_BY_KEY["max_connections"].exceeded(limit, observed).limit_fields()))


def guarded_protocol(budget: Budget, hop: str) -> type[Any] | None:
    """uvicorn's httptools protocol with the head deadline and the connection ceiling of ``budget``;
    None without httptools."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return None
    head_timeout = budget.request_head_timeout_seconds
    max_connections = budget.max_connections

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        _head_deadline: asyncio.TimerHandle | None = None
        _head_bytes = 0  # bytes of the current head received so far

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            open_now = len(self.connections)
            if open_now > max_connections:
                log.warning("connection refused: too many open",
                            extra={"hop": hop, "limit": max_connections, "observed": open_now})
                transport.write(too_many_connections_response(hop, max_connections, open_now))
                transport.close()
                return
            self._arm_head_deadline()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_head_deadline()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._head_deadline is None and self.cycle is not None and self.cycle.response_complete:
                self._arm_head_deadline()  # the next request on a kept-alive connection
            if self._head_deadline is not None:
                self._head_bytes += len(data)
            super().data_received(data)

        def on_headers_complete(self) -> None:
            self._cancel_head_deadline()
            super().on_headers_complete()

        def _arm_head_deadline(self) -> None:
            self._cancel_head_deadline()
            self._head_bytes = 0
            self._head_deadline = self.loop.call_later(head_timeout, self._head_timed_out)

        def _cancel_head_deadline(self) -> None:
            if self._head_deadline is not None:
                self._head_deadline.cancel()
                self._head_deadline = None

        def _head_timed_out(self) -> None:
            self._head_deadline = None
            if self.transport.is_closing():
                return
            log.warning("connection closed: request head incomplete at its deadline",
                        extra={"hop": hop, "timeoutSeconds": head_timeout, "bytes": self._head_bytes})
            if self._head_bytes:
                self.transport.write(head_timeout_response(hop, head_timeout, self._head_bytes))
            self.transport.close()

    return GuardedHttpToolsProtocol


def freeze_startup_heap() -> None:
    """Before a server runs: what was built so far (the modules, the app, its routes) lives as long
    as the process, so it leaves the collector's generations (``gc.freeze``) and a full collection
    walks only what came after. Measured in ``hopline serve`` relaying 5 x 32768 frames of 1 KiB:
    the 3 full collections took 33 ms each (the whole relay stalls meanwhile); with the freeze, 2 of 15 ms."""
    gc.freeze()


def uvicorn_config(app: Any, budget: Budget, hop: str, **options: Any) -> Any:
    """The ``uvicorn.Config`` both servers run: no access log (request lines carry session ids,
    SPEC O-5), the budget's keep-alive timeout, and the guarded protocol. uvicorn's own records go
    through hopline's JSON formatter (``log_config=None``: uvicorn installs no handler of its own)."""
    import uvicorn

    options.setdefault("log_config", None)
    protocol = guarded_protocol(budget, hop)
    if protocol is None:
        log.warning("httptools is not installed: no request head deadline and no connection ceiling")
    return uvicorn.Config(app, access_log=False, lifespan="on", http=protocol or "h11",
                          timeout_keep_alive=math.ceil(budget.keep_alive_timeout_seconds), **options)
