"""A bounded, sans-IO Server-Sent Events parser: the client's reader (SPEC C-1, hop ``client.sse``)
and the gateway's reader of a streaming provider (G-5, hop ``gateway.provider``) are this one.

``SseParser.feed(bytes) -> [SseMessage]``: no I/O inside, so the bound is testable byte by byte.
Lines end with ``\\r\\n``, ``\\r`` or ``\\n`` (a ``\\r`` at the end of one chunk and a ``\\n`` at the
start of the next are one line ending). Comment lines (heartbeats) are skipped while they stream, never
buffered. Multi-line ``data:`` is joined with ``\\n``.

The size of an event is the bytes of the field values it delivers: its data (lines joined with
``\\n``), its ``event`` type and its ``id``. An event over ``max_event_bytes`` raises
:class:`SseEventTooLarge` (a :class:`~hopline.budget.LimitExceeded` naming the reader's ceiling)
as soon as the running size passes the limit, before the offending bytes are buffered, so the
parser never holds more than the limit plus one field prefix.
"""

from __future__ import annotations

import dataclasses

from hopline.budget import CEILINGS_BY_KEY
from hopline.errors import SseEventTooLarge

_BOM = b"\xef\xbb\xbf"
# Fields whose values become part of the delivered event; `retry` and unknown fields are dropped.
_KEPT_FIELDS = (b"data", b"event", b"id")
_LONGEST_FIELD = max(len(name) for name in _KEPT_FIELDS)


@dataclasses.dataclass(frozen=True)
class SseMessage:
    """One dispatched event: ``id`` is this event's own ``id:`` value (None when it has none)."""

    id: str | None
    event: str
    data: str
    size: int


class SseParser:
    """Incremental SSE parser with an explicit per-event byte limit; ``ceiling`` is the budget key
    of that limit (its hop and setting name the error)."""

    def __init__(self, max_event_bytes: int, *, ceiling: str = "client_sse_max_event_bytes") -> None:
        if max_event_bytes < 1:
            raise ValueError("max_event_bytes must be positive")
        self.max_event_bytes = max_event_bytes
        self._ceiling = CEILINGS_BY_KEY[ceiling]
        self._line = bytearray()  # the pending (incomplete) line
        self._field: bytes | None = None  # its field name, once its colon was seen
        self._value_start = 0  # where its value starts in _line (after ":" and one optional space)
        self._skipping = False  # pending line is a comment or a dropped field: not buffered
        self._after_cr = False  # the previous chunk ended with "\r"
        self._started = False  # a leading BOM was checked
        self._bom_matched = 0  # the BOM's bytes seen so far at the stream's start
        self._data: list[bytes] = []
        self._data_bytes = 0
        self._event: bytes | None = None
        self._id: bytes | None = None
        self._size = 0  # delivered bytes of the event so far (complete lines only)
        self.max_buffered = 0  # high-water mark of bytes held for one event

    @property
    def buffered(self) -> int:
        """Bytes held right now: the pending line plus the event's completed data lines."""
        return len(self._line) + self._data_bytes + len(self._event or b"") + len(self._id or b"")

    def feed(self, chunk: bytes) -> list[SseMessage]:
        out: list[SseMessage] = []
        pos = 0
        if not self._started and chunk:
            pos = self._after_bom(chunk)
        if self._after_cr and pos < len(chunk):
            self._after_cr = False
            if chunk[pos] == 0x0A:
                pos += 1
        n = len(chunk)
        # The next "\n" and "\r" at or after pos, each found with a one-byte search (memchr) and
        # searched again only once passed: a regex for either byte scanned at a tenth of the speed.
        lf, cr = chunk.find(b"\n", pos), chunk.find(b"\r", pos)
        while pos < n:
            if 0 <= lf < pos:
                lf = chunk.find(b"\n", pos)
            if 0 <= cr < pos:
                cr = chunk.find(b"\r", pos)
            end = lf if cr == -1 else cr if lf == -1 else min(lf, cr)
            if end == -1:
                self._extend(chunk, pos, n)
                break
            if self._line or self._skipping:
                self._extend(chunk, pos, end)
                self._finish_line(out)
            else:
                self._whole_line(chunk, pos, end, out)
            if chunk[end] == 0x0D:
                if end + 1 < n:
                    pos = end + 2 if chunk[end + 1] == 0x0A else end + 1
                else:
                    self._after_cr = True
                    pos = n
            else:
                pos = end + 1
        return out

    # --- internals --------------------------------------------------------------------------

    def _after_bom(self, chunk: bytes) -> int:
        """Where the stream starts in ``chunk``: after a leading BOM, even one cut across chunks."""
        matched = self._bom_matched
        take = min(len(_BOM) - matched, len(chunk))
        if chunk.startswith(_BOM[matched:matched + take]):
            self._bom_matched = matched + take
            self._started = self._bom_matched == len(_BOM)
            return take
        self._started = True
        if matched:
            self._skipping = True  # the first line starts with part of a BOM: it names no kept field
        return 0

    def _pending_contribution(self, piece: bytes | memoryview = b"") -> int:
        """What the pending line (plus ``piece``) adds to the event's size once complete.

        Before its colon a line is all field name and is counted in full (conservative)."""
        total = len(self._line) + len(piece)
        if self._field is None:
            return total
        value = total - self._value_start
        if value > 0:
            held = len(self._line)
            first = self._line[self._value_start] if held > self._value_start \
                else piece[self._value_start - held]
            if first == 0x20:
                value -= 1  # the optional space after the colon is syntax, not value
        if self._field == b"data" and self._data:
            return value + 1  # the "\n" that joins it to the previous data line
        if self._field == b"event":
            return value - len(self._event or b"")  # a repeated field replaces the earlier value
        if self._field == b"id":
            return value - len(self._id or b"")
        return value

    def _extend(self, chunk: bytes, start: int, end: int) -> None:
        if start >= end or self._skipping:
            return
        if not self._line and chunk[start] == 0x3A:  # ":" first: a comment or heartbeat
            self._skipping = True
            return
        if self._field is None:
            colon = chunk.find(b":", start, end)
            if colon >= 0:
                name = bytes(self._line) + chunk[start:colon]
                if name not in _KEPT_FIELDS:
                    self._skipping = True
                    self._line.clear()
                    return
                self._field = name
                self._value_start = len(self._line) + (colon - start) + 1
        # Checked before buffering: the projected size includes this piece.
        piece = memoryview(chunk)[start:end]  # appended below: one copy, not two
        projected = self._size + self._pending_contribution(piece)
        if projected > self.max_event_bytes:
            self._reset_event()
            raise self._too_large(projected)
        self._line += piece
        self._note_buffered()

    def _note_buffered(self) -> None:
        held = self.buffered
        if held > self.max_buffered:
            self.max_buffered = held

    def _finish_line(self, out: list[SseMessage]) -> None:
        """The pending line (buffered across chunks) is complete."""
        if self._skipping:
            self._skipping = False
            self._line.clear()
            return
        line = self._line
        field, value_start = self._field, self._value_start
        self._field, self._value_start = None, 0
        if not line:
            self._dispatch(out)
            return
        if field is None:
            # No colon: the whole line is a field name with an empty value.
            field, value_start = bytes(line), len(line)
        elif value_start < len(line) and line[value_start] == 0x20:
            value_start += 1  # the optional space after the colon
        if field in _KEPT_FIELDS:
            self._take_field(field, line, value_start, len(line))
        line.clear()
        self._note_buffered()

    def _whole_line(self, chunk: bytes, start: int, end: int, out: list[SseMessage]) -> None:
        """A line that is whole in ``chunk`` (nothing pending): read where it lies, not buffered."""
        if start == end:
            self._dispatch(out)
            return
        if chunk[start] == 0x3A:  # ":" first: a comment or heartbeat
            return
        colon = chunk.find(b":", start, end)
        name_end = end if colon == -1 else colon
        if name_end - start > _LONGEST_FIELD:
            return  # not a kept field (nor copied to find it out)
        value_start = end if colon == -1 else colon + 1
        if value_start < end and chunk[value_start] == 0x20:
            value_start += 1
        name = chunk[start:name_end]
        if name in _KEPT_FIELDS:
            self._take_field(name, chunk, value_start, end)
            self._note_buffered()

    def _take_field(self, name: bytes, line: bytes | bytearray, start: int, end: int) -> None:
        """``line[start:end]`` is the value of a kept field: checked against the limit, then copied
        (once: a 1 MiB data line was copied three times)."""
        size = end - start
        if name == b"data":
            self._grow(size + (1 if self._data else 0))
            self._data.append(_copy(line, start, end))
            self._data_bytes += size
        elif name == b"event":
            self._grow(size - len(self._event or b""))
            self._event = _copy(line, start, end)
        else:
            value = _copy(line, start, end)
            if b"\x00" not in value:  # an id with NUL is ignored (the SSE rule)
                self._grow(size - len(self._id or b""))
                self._id = value

    def _grow(self, added: int) -> None:
        if self._size + added > self.max_event_bytes:
            seen = self._size + added
            self._reset_event()
            raise self._too_large(seen)
        self._size += added

    def _too_large(self, observed: int) -> SseEventTooLarge:
        ceiling, limit = self._ceiling, self.max_event_bytes
        return SseEventTooLarge(ceiling.hop, ceiling.name, limit, observed,
                                f"hop {ceiling.hop}: event exceeds {limit} bytes (read {observed} so far)")

    def _dispatch(self, out: list[SseMessage]) -> None:
        if not self._data and self._event is None and self._id is None:
            return
        if self._data:
            out.append(SseMessage(
                id=self._id.decode("utf-8", "replace") if self._id is not None else None,
                event=self._event.decode("utf-8", "replace") if self._event else "message",
                data=b"\n".join(self._data).decode("utf-8", "replace"),
                size=self._size,
            ))
        self._reset_event()

    def _reset_event(self) -> None:
        self._data = []
        self._data_bytes = 0
        self._event = None
        self._id = None
        self._size = 0
        self._line.clear()
        self._field = None
        self._value_start = 0


def _copy(line: bytes | bytearray, start: int, end: int) -> bytes:
    if isinstance(line, bytes):
        return line[start:end]
    with memoryview(line) as view:  # released before the pending line is cleared
        return bytes(view[start:end])
