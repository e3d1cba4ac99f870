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

- **A ceiling on a request head, before authentication** (SPEC T-4): its bytes (request
  line, headers and the blank line, ``HOPLINE_REQUEST_HEAD_MAX_BYTES``) and its number of header
  fields (``HOPLINE_REQUEST_HEAD_MAX_HEADERS``). Past either, a 431 naming the setting, and the
  connection is closed; nothing more of it is read or parsed (a 40 MiB header costs no more than
  the ceiling). The parser says where a head ends: it is fed at most the ceiling's bytes of a head.

The deadline and the connection ceiling live in a subclass of uvicorn's httptools protocol
(``uvicorn[standard]``); the head ceilings in both that and a subclass of uvicorn's h11 protocol,
which runs where httptools is missing (without the deadline and the connection ceiling, said at start).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import math
import sys
from typing import Any

import orjson

from hopline.budget import CEILINGS_BY_KEY, Budget
from hopline.http.errors import error_body

log = logging.getLogger("hopline.http")


REFUSED_LINGER_SECONDS = 2.0  # how long a refused connection's late input is read and dropped


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


def head_too_large_response(hop: str, *, limit: int, observed: int, headers: bool) -> bytes:
    """The one limit shape (hop, setting, limit, observed, unit); a byte head also says
    ``receivedBytes`` (what came before the connection closed, as the 408 does)."""
    ceiling = CEILINGS_BY_KEY["request_head_max_headers" if headers else "request_head_max_bytes"]
    setting = ceiling.name
    fields: dict[str, Any] = ceiling.exceeded(limit, observed).limit_fields()
    if headers:
        message = (f"the request head has over {limit} header fields ({observed} seen) on {hop} ({setting}); "
                   "the connection is closed")
    else:
        message = (f"the request head (request line and headers) is over {limit} bytes ({observed} received) "
                   f"on {hop} ({setting}); the connection is closed")
        fields["receivedBytes"] = observed
    return _response(431, "Request Header Fields Too Large", error_body(
        hop, "request_header_fields_too_large", message, **fields))


class _HeadLimits:
    """The head ceilings over either uvicorn protocol: what a head may feed the parser. A subclass
    says when a head is open (:meth:`_head_is_open`) and counts header fields (:meth:`_count_header`)."""

    transport: asyncio.Transport
    _hop = ""
    _head_max_bytes = 0
    _head_max_headers = 0
    _head_len = 0  # bytes of the open head fed so far
    _headers_seen = 0
    _refused = False

    def _head_is_open(self) -> bool:
        raise NotImplementedError

    def _feed(self, data: bytes) -> None:
        raise NotImplementedError

    def _limited_feed(self, data: bytes) -> None:
        if self._refused:
            return
        if not self._head_is_open():
            self._feed(data)
            return
        room = self._head_max_bytes - self._head_len
        if len(data) <= room:
            self._head_len += len(data)
            self._feed(data)
            return
        self._head_len += room
        self._feed(data[:room])
        if self._refused:
            return
        if self._head_is_open():  # the ceiling's bytes fed, and the head goes on
            self._refuse(head_too_large_response(self._hop, limit=self._head_max_bytes,
                                                 observed=self._head_len + len(data) - room, headers=False))
            return
        self._limited_feed(data[room:])  # the head ended within the ceiling: the rest is a body or a head

    def _count_header(self) -> bool:
        """One more header field; False (and the connection refused) past the ceiling."""
        self._headers_seen += 1
        if self._headers_seen > self._head_max_headers:
            if not self._refused:
                self._refuse(head_too_large_response(self._hop, limit=self._head_max_headers,
                                                     observed=self._headers_seen, headers=True))
            return False
        return True

    def _refuse(self, response: bytes) -> None:
        self._refused = True
        log.warning("connection closed: request head over its ceiling", extra={"hop": self._hop})
        transport = self.transport
        if transport.is_closing():
            return
        transport.write(response)
        # A lingering close: the client may still be sending its head, and a socket closed with bytes
        # unread makes the kernel send a RST that can discard the answer before the client reads it.
        # Writing stops, what comes is discarded (_refused), and the close follows within a bound.
        if transport.can_write_eof():
            transport.write_eof()
            asyncio.get_running_loop().call_later(REFUSED_LINGER_SECONDS, transport.close)
        else:
            transport.close()


def h11_guarded_protocol(budget: Budget, hop: str) -> type[Any]:
    """uvicorn's h11 protocol with the head ceilings of ``budget`` (where httptools is missing)."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    max_headers = budget.request_head_max_headers

    class CountedConnection(h11.Connection):
        too_many = 0  # the header fields of a request over the ceiling

        def next_event(self) -> Any:
            event = super().next_event()
            if isinstance(event, h11.Request) and len(event.headers) > max_headers:
                self.too_many = len(event.headers)
                raise h11.RemoteProtocolError("too many header fields", error_status_hint=431)
            return event

    class GuardedH11Protocol(_HeadLimits, H11Protocol):
        _hop = hop
        _head_max_bytes = budget.request_head_max_bytes
        _head_max_headers = max_headers
        _head_open = False

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.conn = CountedConnection(h11.SERVER, max_incomplete_event_size=budget.request_head_max_bytes)

        def _head_is_open(self) -> bool:
            idle = self.conn.their_state is h11.IDLE
            if idle and not self._head_open:  # a new head: what h11 holds of it already counts
                self._head_open, self._head_len = True, len(self.conn.trailing_data[0])
            elif not idle:
                self._head_open = False
            return idle

        def _feed(self, data: bytes) -> None:
            H11Protocol.data_received(self, data)
            self._head_is_open()  # a head parsed whole: closed until the next cycle starts

        def data_received(self, data: bytes) -> None:
            self._limited_feed(data)

        def send_400_response(self, msg: str) -> None:
            if self._refused:
                return
            too_many = getattr(self.conn, "too_many", 0)
            if too_many:  # h11 parses a head whole: its fields are counted once parsed
                self._headers_seen = too_many - 1
                self._count_header()
                return
            super().send_400_response(msg)

    return GuardedH11Protocol


class _HeadDeadline(_HeadLimits):
    """The head deadline over uvicorn's httptools protocol: armed at the connection's start and
    after each response, cancelled once the head is parsed; at it, 408 (when a byte came) and
    closed."""

    loop: asyncio.AbstractEventLoop
    _head_deadline: asyncio.TimerHandle | None = None
    _head_bytes = 0  # bytes of the current head received so far
    _head_timeout = 0.0

    def _arm_head_deadline(self) -> None:
        self._cancel_head_deadline()
        self._head_bytes = 0
        self._head_deadline = self.loop.call_later(self._head_timeout, self._head_timed_out)

    def _cancel_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_timed_out(self) -> None:
        self._head_deadline = None
        if self.transport.is_closing():
            return
        hop, timeout = self._hop, self._head_timeout
        log.warning("connection closed: request head incomplete at its deadline",
                    extra={"hop": hop, "timeoutSeconds": timeout, "bytes": self._head_bytes})
        if self._head_bytes:
            self.transport.write(head_timeout_response(hop, timeout, self._head_bytes))
        self.transport.close()


# I/O granularity, not a limit: a streamed body's chunk at least this large goes out as its three
# parts (size line, body, CRLF) in one vectored write (``writelines``), instead of uvicorn's join of
# them into a new bytes object. Relaying 1 MiB SSE events, that join was 8.8 % of the daemon's CPU
# (an interleaved A/B of 5 rounds of 256 MiB); below this size a join costs less than the vector.
VECTORED_BODY_MIN_BYTES = 16 * 1024


def vectored_cycle(base: type[Any]) -> type[Any]:
    """uvicorn's httptools request cycle ``base`` with its ``send`` changed for a chunk of a chunked
    body that is ``VECTORED_BODY_MIN_BYTES`` or larger and not the last: framed and written
    without a join. Flow control and a disconnected client are honoured as uvicorn's own ``send``
    does; everything else is that ``send``."""

    class VectoredBodyCycle(base):
        async def send(self, message: Any) -> None:
            body = message.get("body", b"")
            if (message["type"] != "http.response.body" or len(body) < VECTORED_BODY_MIN_BYTES
                    or not message.get("more_body", False) or not self.chunked_encoding
                    or self.response_complete or self.scope["method"] == "HEAD"):
                await super().send(message)
                return
            if self.flow.write_paused and not self.disconnected:
                await self.flow.drain()
            if self.disconnected:
                return
            self.transport.writelines((b"%x\r\n" % len(body), body, b"\r\n"))

    return VectoredBodyCycle


def guarded_protocol(budget: Budget, hop: str) -> type[Any] | None:
    """uvicorn's httptools protocol with the head deadline and the connection ceiling of ``budget``;
    None without httptools."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
    except ImportError:
        return None
    cycle_class = vectored_cycle(RequestResponseCycle)
    head_timeout = budget.request_head_timeout_seconds
    max_connections = budget.max_connections

    class GuardedHttpToolsProtocol(_HeadDeadline, HttpToolsProtocol):
        _hop = hop
        _head_timeout = head_timeout
        _head_max_bytes = budget.request_head_max_bytes
        _head_max_headers = budget.request_head_max_headers
        _head_open = True  # from the connection's start, and again after each message

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
            self._limited_feed(data)

        def _head_is_open(self) -> bool:
            return self._head_open

        def _feed(self, data: bytes) -> None:
            HttpToolsProtocol.data_received(self, data)

        def on_message_begin(self) -> None:
            self._headers_seen = 0
            super().on_message_begin()

        def on_header(self, name: bytes, value: bytes) -> None:
            if self._count_header():
                super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._cancel_head_deadline()
            self._head_open = False
            if not self._refused:
                super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            if not self._refused:
                super().on_body(body)

        def on_message_complete(self) -> None:
            self._head_open, self._head_len = True, 0  # the next request's head starts
            if not self._refused:
                super().on_message_complete()

        def _start_asgi_task(self, cycle: Any, app: Any) -> None:
            # Every request's cycle, pipelined ones too, starts here, before the app has its send.
            # Its class changes rather than its send: a send bound to the cycle in the cycle's own
            # attributes would hold it, and the request's body, until the collector runs.
            cycle.__class__ = cycle_class
            super()._start_asgi_task(cycle, app)

    return GuardedHttpToolsProtocol


# The daemon's journal writer is a thread of its own: every commit it settles waits for the event
# loop's thread to hand over the GIL, which a busy loop does only each switch interval (5 ms by
# default). A prompt's round trip waits on several commits, so while one session floods, another's
# round trip waits a switch interval per commit. A shorter interval shortens that wait and leaves
# the flood's throughput as it is; its price is some CPU per relayed byte (bench/fair_share.py
# measures both).
DAEMON_SWITCH_INTERVAL_SECONDS = 0.0005


def prepare_daemon_process() -> None:
    """Before the daemon's server runs: what was built so far (the modules, the app, its routes) lives
    as long as the process, so it leaves the collector's generations (``gc.freeze``) and a full
    collection walks only what came after: a full collection stalls the whole relay, for a time
    that grows with what it walks. And the GIL changes hands every
    ``DAEMON_SWITCH_INTERVAL_SECONDS``."""
    gc.freeze()
    sys.setswitchinterval(DAEMON_SWITCH_INTERVAL_SECONDS)


def uvicorn_config(app: Any, budget: Budget, hop: str, **options: Any) -> Any:
    """The ``uvicorn.Config`` both servers run: no access log (request lines carry session ids,
    SPEC O-5), the budget's keep-alive timeout, and the guarded protocol. uvicorn's own records go
    through hopline's JSON formatter (``log_config=None``: uvicorn installs no handler of its own)."""
    import uvicorn

    options.setdefault("log_config", None)
    protocol = options.pop("http", None) or guarded_protocol(budget, hop)
    if protocol is None:
        log.warning("httptools is not installed: no request head deadline and no connection ceiling "
                    "(h11 runs, with the head ceilings)")
        protocol = h11_guarded_protocol(budget, hop)
    return uvicorn.Config(app, access_log=False, lifespan="on", http=protocol,
                          h11_max_incomplete_event_size=budget.request_head_max_bytes,
                          timeout_keep_alive=math.ceil(budget.keep_alive_timeout_seconds), **options)
