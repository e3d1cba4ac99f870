"""A counting SSE reader for the benchmarks: splits events, counts the ones carrying a marker.

The search for the event separator resumes where it stopped, and events are never copied, so the
reader's own cost is linear in the bytes received whatever the event size.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator


class SseCounter:
    def __init__(self, marker: bytes = b"agent_message_chunk") -> None:
        self.marker = marker
        self._buf = bytearray()
        self._scan = 0
        self._sep: bytes | None = None
        self.bytes_received = 0
        self.events = 0
        self.marked = 0
        self.comments = 0
        self.names: dict[str, int] = {}
        self.last_id: int | None = None
        self.first_byte_at: float | None = None
        self.last_marked_at: float | None = None

    def feed(self, chunk: bytes) -> None:
        if not chunk:
            return
        if self.first_byte_at is None:
            self.first_byte_at = time.perf_counter()
        self.bytes_received += len(chunk)
        # A chunk that starts at an event boundary is scanned in place (no copy); only an
        # unfinished event's bytes are kept for the next chunk.
        buf: bytes | bytearray
        if self._buf:
            self._buf += chunk
            buf = self._buf
        else:
            buf = chunk
        if self._sep is None:
            crlf, lf = buf.find(b"\r\n"), buf.find(b"\n")
            if lf == -1:
                self._buf = bytearray(buf)
                return
            self._sep = b"\r\n\r\n" if crlf != -1 and crlf < lf else b"\n\n"
        sep = self._sep
        start = 0
        while True:
            idx = buf.find(sep, max(start, self._scan))
            if idx == -1:
                self._scan = max(start, len(buf) - len(sep) + 1)
                break
            self._event(buf, start, idx)
            start = idx + len(sep)
            self._scan = start
        if buf is self._buf:
            if start:
                del self._buf[:start]
        else:
            self._buf = bytearray(buf[start:])
        self._scan -= start

    def _event(self, buf: bytes | bytearray, start: int, end: int) -> None:
        if buf.startswith(b":", start):
            self.comments += 1
            return
        self.events += 1
        if buf.startswith(b"id:", start):
            stop = buf.find(b"\n", start, end)
            text = bytes(buf[start + 3:stop if stop != -1 else end]).strip()
            if text.isdigit():
                self.last_id = int(text)
            start = stop + 1 if stop != -1 else end
        if buf.startswith(b"event:", start):
            stop = buf.find(b"\n", start, end)
            name = bytes(buf[start + 6:stop if stop != -1 else end]).strip().decode("utf-8", "replace")
            self.names[name] = self.names.get(name, 0) + 1
        if buf.find(self.marker, start, end) != -1:
            self.marked += 1
            self.last_marked_at = time.perf_counter()


# The benchmarks' HTTP reader: a bare HTTP/1.1 GET on asyncio streams that yields the body as it
# arrives (chunked transfer decoded). httpx's streaming reader tops out at about 250-310 MB/s on
# this machine with 1 MiB events (measured against a socket that only sends): below twice the
# naive relay, so it would measure itself, not the relays. Both relays are read with this one.
READER_BUFFER_BYTES = 8 * 1024 * 1024  # the stream buffer, not a limit on what is read


class HttpStatusError(RuntimeError):
    pass


async def stream_body(host: str, port: int, path: str, headers: dict[str, str] | None = None,
                      ) -> AsyncIterator[bytes]:
    """GET ``path`` and yield the response body's bytes as they come; raise on a non-200."""
    reader, writer = await asyncio.open_connection(host, port, limit=READER_BUFFER_BYTES)
    try:
        lines = [f"GET {path} HTTP/1.1", f"Host: {host}:{port}", "Accept: text/event-stream",
                 *(f"{k}: {v}" for k, v in (headers or {}).items())]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        status = await reader.readline()
        chunked = False
        while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            if name.strip().lower() == "transfer-encoding" and "chunked" in value.lower():
                chunked = True
        if status.split(b" ", 2)[1:2] != [b"200"]:
            raise HttpStatusError(f"GET {path}: {status.decode('latin-1').strip()}")
        if not chunked:
            while block := await reader.read(READER_BUFFER_BYTES):
                yield block
            return
        while True:
            size = int((await reader.readline()).split(b";", 1)[0], 16)
            if size == 0:
                return
            yield await reader.readexactly(size)
            await reader.readexactly(2)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
