"""Sans-IO NDJSON codec for the ACP pipe (SPEC W-1, W-2).

``NdjsonDecoder.feed(bytes)`` returns the frames (and the frame errors) completed by those bytes;
``encode(message)`` returns one line. The decoder keeps only the pending, newline-free tail of the
stream, so every byte fed is searched for a newline exactly once whatever the chunking: the scan
resumes where it stopped (the boundary between the pending buffer and the new chunk), and the
pending buffer is never rescanned. ``scanned_bytes`` counts that work so tests can prove it.

An oversized frame is never buffered past ``max_frame_bytes``: as soon as the pending frame passes
the limit its bytes are dropped, the rest of the line is discarded as it arrives, and one
:class:`FrameTooLarge` with the full observed size (no payload) is reported at its newline. The
stream goes on. Invalid JSON or UTF-8 is reported with its size and SHA-256 only.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import orjson

from hopline.budget import CEILINGS_BY_KEY, HOP_PIPE, Budget

_NL = 0x0A
_CR = 0x0D
_MAX_FRAME_SETTING = CEILINGS_BY_KEY["pipe_max_frame_bytes"].name
# How much a reader of the pipe hands to feed() at once (both ends): I/O granularity, not a limit;
# frames of any size up to the max frame are reassembled.
READ_CHUNK_BYTES = 64 * 1024


class Frame:
    """One decoded line: its bytes (no ``\\n``, no trailing ``\\r``), the parsed JSON, its size.

    A plain class with slots, not a frozen dataclass: one is made per frame, and a frozen
    dataclass's ``__init__`` sets each field through ``object.__setattr__``, about twice the cost.
    Treated as immutable; its repr holds no payload."""

    __slots__ = ("message", "raw", "size")

    def __init__(self, raw: bytes, message: Any, size: int) -> None:
        self.raw = raw
        self.message = message
        self.size = size

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Frame):
            return NotImplemented
        return (self.raw, self.size, self.message) == (other.raw, other.size, other.message)

    __hash__ = None  # type: ignore[assignment]  # equal frames compare by value, as the dataclass did

    def __repr__(self) -> str:
        return f"Frame(size={self.size})"


@dataclasses.dataclass(frozen=True)
class FrameError:
    """A line that did not become a frame; ``size`` is the observed byte count of the line and
    ``reason`` names the rule it broke (the ``reason`` of the daemon's ``frame_dropped``)."""

    size: int
    reason: str = dataclasses.field(default="bad_frame", kw_only=True)

    def describe(self) -> str:  # pragma: no cover - overridden
        return f"{HOP_PIPE}: bad frame of {self.size} bytes"


@dataclasses.dataclass(frozen=True)
class FrameTooLarge(FrameError):
    """The line passed the reader's max frame; it was discarded without being buffered."""

    limit: int
    reason: str = dataclasses.field(default="frame_too_large", kw_only=True)

    def describe(self) -> str:
        return (f"{HOP_PIPE}: frame of {self.size} bytes exceeds the max frame of {self.limit} bytes "
                f"({_MAX_FRAME_SETTING}); discarded")


@dataclasses.dataclass(frozen=True)
class InvalidFrame(FrameError):
    """The line is not valid UTF-8 JSON; only its size and SHA-256 are kept (no payload)."""

    sha256: str
    reason: str = dataclasses.field(default="invalid_json", kw_only=True)  # or "invalid_utf8"

    def describe(self) -> str:
        return f"{HOP_PIPE}: {self.reason} frame of {self.size} bytes (sha256 {self.sha256}); skipped"


@dataclasses.dataclass(frozen=True)
class IncompleteFrame(FrameError):
    """The stream ended inside a frame (no newline after its last bytes)."""

    reason: str = dataclasses.field(default="incomplete_frame", kw_only=True)

    def describe(self) -> str:
        return f"{HOP_PIPE}: stream ended inside a frame after {self.size} bytes"


def encode(message: Any) -> bytes:
    """One NDJSON line: the compact JSON of ``message`` followed by ``\\n``."""
    return orjson.dumps(message, option=orjson.OPT_APPEND_NEWLINE)


def _decode_line(raw: bytes) -> Frame | InvalidFrame:
    try:
        message = orjson.loads(raw)
    except orjson.JSONDecodeError:
        # Only on the error path: tell invalid UTF-8 from invalid JSON.
        try:
            raw.decode("utf-8")
            reason = "invalid_json"
        except UnicodeDecodeError:
            reason = "invalid_utf8"
        return InvalidFrame(size=len(raw), sha256=hashlib.sha256(raw).hexdigest(), reason=reason)
    return Frame(raw=raw, message=message, size=len(raw))


class NdjsonDecoder:
    """Incremental NDJSON decoder with an explicit max frame (bytes, without ``\\n``/``\\r``)."""

    def __init__(self, max_frame_bytes: int) -> None:
        if max_frame_bytes < 1:
            raise ValueError(f"max_frame_bytes must be at least 1, got {max_frame_bytes}")
        self._limit = max_frame_bytes
        # The pending frame: bytes after the last newline, already scanned (holds no newline), as
        # the parts it arrived in, joined once at its newline: a frame spanning several reads is
        # copied once (a bytearray grown per read and turned into bytes copied a 1 MiB frame
        # three times, a twentieth of the daemon's CPU at 1 MiB frames).
        self._parts: list[bytes | memoryview] = []
        self._pending_bytes = 0
        # Discard mode: the current line passed the limit; count its bytes until the newline.
        self._discarding = False
        self._discard_size = 0
        self._discard_last_cr = False
        self._closed = False
        self.scanned_bytes = 0  # bytes searched for a newline (each byte fed is searched once)
        self.fed_bytes = 0
        self.frames_decoded = 0
        self.frames_too_large = 0
        self.frames_invalid = 0
        self.frames_incomplete = 0

    @classmethod
    def for_budget(cls, budget: Budget) -> NdjsonDecoder:
        """The daemon's reader: max frame ``budget.pipe_max_frame_bytes`` (B-3)."""
        return cls(budget.pipe_max_frame_bytes)

    @property
    def max_frame_bytes(self) -> int:
        return self._limit

    @property
    def buffered_bytes(self) -> int:
        """Bytes held for the pending frame: at most ``max_frame_bytes`` (+1 for a pending ``\\r``)."""
        return self._pending_bytes

    @property
    def frame_errors(self) -> int:
        """Lines that did not become frames so far (too large, invalid, incomplete)."""
        return self.frames_too_large + self.frames_invalid + self.frames_incomplete

    @property
    def discarding(self) -> bool:
        """True while the rest of an oversized line is being discarded."""
        return self._discarding

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame | FrameError]:
        """Consume ``data``; return the frames and errors it completes, in stream order."""
        if self._closed:
            raise RuntimeError("feed() after eof()")
        chunk = data if isinstance(data, bytes) else bytes(data)
        out: list[Frame | FrameError] = []
        n = len(chunk)
        self.fed_bytes += n
        pos = 0
        find, limit, append = chunk.find, self._limit, out.append
        decoded = 0
        while pos < n:
            # The search starts at the first byte not yet scanned: the pending buffer is never
            # searched again, so the work is linear in the bytes fed.
            idx = find(b"\n", pos)
            if idx == -1:
                self._take_tail(chunk, pos, n)
                pos = n
                break
            if self._parts or self._discarding or idx - pos > limit or chunk[idx - 1] == _CR or idx == pos:
                self._finish_line(chunk, pos, idx, out)
            else:
                # The common line, inline (one call per frame less): whole in this chunk, within
                # the limit, no \r, not empty. Anything else takes _finish_line.
                raw = chunk[pos:idx]
                try:
                    append(Frame(raw, orjson.loads(raw), idx - pos))
                    decoded += 1
                except orjson.JSONDecodeError:
                    append(_decode_line(raw))
                    self.frames_invalid += 1
            pos = idx + 1
        self.scanned_bytes += pos
        self.frames_decoded += decoded
        return out

    def eof(self) -> list[FrameError]:
        """The stream ended: report a frame left without its newline. The decoder is then closed."""
        self._closed = True
        out: list[FrameError] = []
        if self._discarding:
            size = self._discard_size - (1 if self._discard_last_cr else 0)
            out.append(FrameTooLarge(size=size, limit=self._limit))
            self.frames_too_large += 1
        elif self._parts:
            out.append(IncompleteFrame(size=self._pending_bytes))
            self.frames_incomplete += 1
        self._reset_line()
        return out

    # --- internals -----------------------------------------------------------------------------

    def _reset_line(self) -> None:
        self._parts = []
        self._pending_bytes = 0
        self._discarding = False
        self._discard_size = 0
        self._discard_last_cr = False

    def _take_tail(self, chunk: bytes, start: int, end: int) -> None:
        """Keep ``chunk[start:end]`` (no newline in it) as pending, or discard it if over the limit."""
        size = end - start
        if self._discarding:
            self._discard_size += size
            self._discard_last_cr = chunk[end - 1] == _CR
            return
        total = self._pending_bytes + size
        last_cr = chunk[end - 1] == _CR
        # A trailing \r is not part of the frame, so it may sit one byte past the limit.
        if total - (1 if last_cr else 0) > self._limit:
            self._discarding = True
            self._discard_size = total
            self._discard_last_cr = last_cr
            self._parts = []  # drop, do not grow: never buffered past the limit
            self._pending_bytes = 0
            return
        # A whole read is kept as it is (no copy); a read's tail is copied out, so the rest of the
        # read is not held with it.
        self._parts.append(chunk if start == 0 and end == len(chunk) else chunk[start:end])
        self._pending_bytes = total

    def _finish_line(self, chunk: bytes, start: int, nl: int,
                     out: list[Frame | FrameError]) -> None:
        """A newline at ``nl`` ends the line begun in the pending buffer and ``chunk[start:nl]``."""
        if self._discarding:
            size = self._discard_size + (nl - start)
            ends_cr = chunk[nl - 1] == _CR if nl > start else self._discard_last_cr
            self._reset_line()
            out.append(FrameTooLarge(size=size - (1 if ends_cr else 0), limit=self._limit))
            self.frames_too_large += 1
            return
        ends_cr = chunk[nl - 1] == _CR if nl > start else bool(self._parts) and self._parts[-1][-1:] == b"\r"
        size = self._pending_bytes + (nl - start) - (1 if ends_cr else 0)
        if size > self._limit:  # pending + this chunk's part: reported, never concatenated
            self._reset_line()
            self.frames_too_large += 1
            out.append(FrameTooLarge(size=size, limit=self._limit))
            return
        if self._parts:
            parts = self._parts
            parts.append(memoryview(chunk)[start:nl])  # copied once, by the join
            raw = b"".join(parts)
            self._reset_line()
        else:
            raw = chunk[start:nl]
        if ends_cr:
            raw = raw[:-1]
        if not raw:
            return  # empty line
        decoded = _decode_line(raw)
        if isinstance(decoded, Frame):
            self.frames_decoded += 1
        else:
            self.frames_invalid += 1
        out.append(decoded)
