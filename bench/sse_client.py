"""A counting SSE reader for the benchmarks: splits events, counts the ones carrying a marker.

The search for the event separator resumes where it stopped, and events are never copied, so the
reader's own cost is linear in the bytes received whatever the event size.
"""

from __future__ import annotations

import time


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
        buf = self._buf
        buf += chunk
        if self._sep is None:
            crlf, lf = buf.find(b"\r\n"), buf.find(b"\n")
            if lf == -1:
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
        if start:
            del buf[:start]
            self._scan -= start

    def _event(self, buf: bytearray, start: int, end: int) -> None:
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
