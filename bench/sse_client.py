"""The benchmarks' SSE reader: a bare HTTP/1.1 GET that hands the body, as it arrives, to a counter
of events (``SseCounter``), in place, from one reused receive buffer.

Every path of a CPU benchmark is read with this one reader, so what it costs is added to every path
alike and dilutes every ratio toward 1. It is built to cost about what a reader of a raw pipe costs
(0.27 ms per MiB here, against 1.4 for the asyncio-streams reader it replaced):

* the socket is read with ``recv_into`` into one buffer, reused (``asyncio.BufferedProtocol``): no
  allocation per read. On this VM, memory the allocator takes fresh from the kernel costs about
  2.5 ms of system CPU per MiB on first write, ten times a reused page; the streams reader
  allocated a ``bytes`` per read and per chunk and moved its heap's top up and down;
* chunked framing is decoded in place, and each piece of body is counted where it lies; only an
  unfinished event's bytes are kept, in a buffer that is reused too;
* the blank line that ends an event is found with a one-byte search (``memchr``) and a check of
  the bytes around it: ``find(b"\\n\\n")`` costs 0.9 ms per MiB scanned here, one byte 0.015.

Reading pauses when the consumer falls ``READ_AHEAD_BYTES`` behind, so a slow consumer is a slow
reader, as with a stream.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

Sink = Callable[[bytearray, int, int], None]

RECEIVE_BUFFER_BYTES = 1024 * 1024  # one recv_into at most; I/O granularity, not a limit on what is read
# Reading pauses once this much was counted that the consumer has not looked at (as an asyncio stream
# with the old reader's 8 MiB limit paused at twice it): a slow consumer is a slow reader. The reader
# is not paused per read: that would add two epoll_ctl calls per read, more for a relay that writes
# each frame on its own (the naive one) than for one that joins them.
READ_AHEAD_BYTES = 16 * 1024 * 1024


def _find_separator(buf: bytes | bytearray, sep: bytes, start: int, end: int) -> int:
    """Where ``sep`` (``\\n\\n`` or ``\\r\\n\\r\\n``) starts in ``buf[start:end]``, or -1: a one-byte
    search for its first ``\\n``, then a check of the bytes around it."""
    lead = len(sep) // 2 - 1  # the separator's bytes before its first "\n"
    nl = start + lead
    while (nl := buf.find(b"\n", nl, end)) != -1:
        at = nl - lead
        if at + len(sep) > end:
            return -1
        if buf.startswith(sep, at):
            return at
        nl += 1
    return -1


class SseCounter:
    """Counts the events of an SSE body fed to it in pieces: all of them, those carrying ``marker``,
    comments, and each event name; keeps the last id. It keeps no event, only the unfinished one."""

    def __init__(self, marker: bytes = b"agent_message_chunk") -> None:
        self.marker = marker
        self._held = bytearray()  # the unfinished event (capacity reused: it is never shrunk)
        self._held_len = 0
        self._scan = 0  # where the separator search resumes in the held bytes
        self._sep: bytes | None = None
        self.bytes_received = 0
        self.events = 0
        self.marked = 0
        self.comments = 0
        self._names: dict[bytes, int] = {}
        self.last_id: int | None = None
        self.first_byte_at: float | None = None
        self.last_marked_at: float | None = None

    def feed(self, chunk: bytes) -> None:
        self.feed_from(chunk, 0, len(chunk))

    def feed_from(self, buf: bytes | bytearray, start: int, end: int) -> None:
        """Count what ``buf[start:end]`` completes; keep the rest of an unfinished event."""
        if start >= end:
            return
        if self.first_byte_at is None:
            self.first_byte_at = time.perf_counter()
        self.bytes_received += end - start
        if self._held_len:
            self._hold(buf, start, end)
            buf, start, end = self._held, 0, self._held_len
            scan = self._scan
        else:
            scan = start
        if self._sep is None:
            lf = buf.find(b"\n", start, end)
            if lf == -1:
                if buf is not self._held:
                    self._hold(buf, start, end)
                return
            self._sep = b"\r\n\r\n" if lf > start and buf[lf - 1] == 0x0D else b"\n\n"
        sep = self._sep
        while (at := _find_separator(buf, sep, max(start, scan), end)) != -1:
            self._event(buf, start, at)
            start = scan = at + len(sep)
        rest_scan = max(start, end - len(sep) + 1) - start
        if buf is self._held:
            if start:
                self._held[:end - start] = self._held[start:end]
            self._held_len = end - start
        else:
            self._held_len = 0
            self._hold(buf, start, end)
        self._scan = rest_scan

    def _hold(self, buf: bytes | bytearray, start: int, end: int) -> None:
        size = end - start
        if not size:
            return
        need = self._held_len + size
        if need > len(self._held):
            self._held.extend(bytes(need - len(self._held)))
        self._held[self._held_len:need] = memoryview(buf)[start:end]
        self._held_len = need

    @property
    def names(self) -> dict[str, int]:
        """How many events of each name were counted (``event:`` field)."""
        return {name.decode("utf-8", "replace"): count for name, count in self._names.items()}

    def _event(self, buf: bytes | bytearray, start: int, end: int) -> None:
        first = buf[start]
        if first == 0x3A:  # ":", a comment
            self.comments += 1
            return
        self.events += 1
        if first == 0x69 and buf.startswith(b"id:", start, end):  # "i"
            stop = buf.find(b"\n", start, end)
            stop = end if stop == -1 else stop
            text = buf[start + 3:stop].strip()
            if text.isdigit():  # else not an id this reader resumes from
                self.last_id = int(text)
            start = stop + 1
        if start < end and buf[start] == 0x65 and buf.startswith(b"event:", start, end):  # "e"
            stop = buf.find(b"\n", start, end)
            name = bytes(buf[start + 6:end if stop == -1 else stop]).strip()
            self._names[name] = self._names.get(name, 0) + 1
        if buf.find(self.marker, start, end) != -1:
            self.marked += 1
            self.last_marked_at = time.perf_counter()


class HttpStatusError(RuntimeError):
    pass


class _BodyReader(asyncio.BufferedProtocol):
    """One HTTP/1.1 response: its head checked (200), its body (chunked or not) handed to ``sink``
    piece by piece from the receive buffer as it is read; ``next_read`` tells the consumer how much."""

    def __init__(self, sink: Sink, path: str) -> None:
        self.sink = sink
        self.path = path
        self.buffer = bytearray(RECEIVE_BUFFER_BYTES)
        self.view = memoryview(self.buffer)
        self.head: bytearray | None = bytearray()  # None once the response head is read
        self.line = bytearray()  # an unfinished chunk-size line
        self.chunked = False
        self.chunk_left = 0  # body bytes of the current chunk still to come
        self.crlf_left = 0  # the CRLF after a chunk's data
        self.fed = 0  # body bytes handed to the sink that the consumer has not been told of
        self.paused = False
        self.ended = False
        self.error: Exception | None = None
        self.transport: asyncio.Transport | None = None
        self.wake: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.view

    def buffer_updated(self, nbytes: int) -> None:
        try:
            self._parse(nbytes)
        except Exception as exc:  # handed to the consumer, which raises it
            self.error = exc
        if self.fed >= READ_AHEAD_BYTES and not self.error:
            assert self.transport is not None
            self.transport.pause_reading()  # the consumer is behind: stop reading until it looks
            self.paused = True
        if self.fed or self.ended or self.error:
            self._wake()

    def eof_received(self) -> bool:
        self.ended = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended = True
        self.error = self.error or exc
        self._wake()

    def _wake(self) -> None:
        if self.wake is not None and not self.wake.done():
            self.wake.set_result(None)

    def _parse(self, n: int) -> None:
        buf, pos = self.buffer, 0
        if self.head is not None:
            pos = self._parse_head(n)
        while pos < n and not self.ended:
            if not self.chunked:
                self.sink(buf, pos, n)
                self.fed += n - pos
                return
            if self.crlf_left:
                skip = min(self.crlf_left, n - pos)
                self.crlf_left -= skip
                pos += skip
            elif self.chunk_left:
                take = min(self.chunk_left, n - pos)
                self.sink(buf, pos, pos + take)
                self.fed += take
                self.chunk_left -= take
                pos += take
                if not self.chunk_left:
                    self.crlf_left = 2
            else:
                nl = buf.find(b"\n", pos, n)
                if nl == -1:
                    self.line += self.view[pos:n]
                    return
                self.line += self.view[pos:nl]
                size = int(bytes(self.line).split(b";", 1)[0], 16)
                self.line.clear()
                pos = nl + 1
                self.chunk_left = size
                self.ended = size == 0

    def _parse_head(self, n: int) -> int:
        assert self.head is not None
        before = len(self.head)
        self.head += self.view[:n]
        end = self.head.find(b"\r\n\r\n")
        if end == -1:
            return n
        status, *fields = bytes(self.head[:end]).decode("latin-1").split("\r\n")
        self.head = None
        if status.split(" ", 2)[1:2] != ["200"]:
            raise HttpStatusError(f"GET {self.path}: {status.strip()}")
        for field in fields:
            name, _, value = field.partition(":")
            if name.strip().lower() == "transfer-encoding" and "chunked" in value.lower():
                self.chunked = True
        return end + 4 - before

    async def next_read(self) -> int:
        """The body bytes handed to the sink since the last call (waiting for some); 0 at the end."""
        if not (self.fed or self.ended or self.error):
            self.wake = asyncio.get_running_loop().create_future()
            await self.wake
        fed, self.fed = self.fed, 0
        if self.paused:
            assert self.transport is not None
            self.paused = False
            self.transport.resume_reading()
        if not fed and self.error is not None:
            raise self.error
        return fed


async def stream_sse(host: str, port: int, path: str, sink: Sink,
                     headers: dict[str, str] | None = None) -> AsyncIterator[int]:
    """GET ``path`` and hand its body to ``sink(buffer, start, end)`` as it arrives (``sink`` must
    not keep the buffer); yields how many body bytes it was handed since the consumer last looked
    (one read or more); raises on a non-200."""
    loop = asyncio.get_running_loop()
    transport, reader = await loop.create_connection(lambda: _BodyReader(sink, path), host, port)
    try:
        lines = [f"GET {path} HTTP/1.1", f"Host: {host}:{port}", "Accept: text/event-stream",
                 *(f"{k}: {v}" for k, v in (headers or {}).items())]
        transport.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        while nbytes := await reader.next_read():
            yield nbytes
    finally:
        transport.close()
