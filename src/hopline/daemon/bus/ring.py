"""A session's replay ring (SPEC D-3, T-12): its last events, bounded by ``ring_max_events`` and
``ring_max_bytes`` (SSE bytes), from which a reconnecting client's replay is served when it holds
them all.

The ring keeps its events' bytes in memory of its own: anonymous mappings of ``CHUNK_BYTES``,
events packed one after the other (id, SSE size, type, data), each mapping handed back to the
kernel whole once its last event is evicted or the session goes. Kept as Python objects (an event,
its data, its id: three small blocks each), a ring of small events filled the interpreter's small-
object arenas, and once the session was deleted those arenas stayed with the process, each pinned
by a few long-lived objects allocated among the events meanwhile: 20,000 echo prompts over 8
sessions left about 10 MiB of RSS behind after every session was deleted (bench/memory.py). An
event of ``BY_REFERENCE_BYTES`` or more is kept as it is (its data is an allocation of its own,
outside those arenas, and copying it would cost the relay a copy of every large frame).
"""

from __future__ import annotations

import collections
import functools
import mmap
import struct

from hopline.daemon.bus.bus_event import BusEvent

# Storage layout, not a limit: the size of one mapping. What a ring holds beyond its live events is
# at most the evicted part of its oldest mapping and the unwritten part of its newest (untouched
# pages cost nothing).
CHUNK_BYTES = 256 * 1024
# Storage layout, not a limit: an event whose data is this large is ringed as the object it is.
BY_REFERENCE_BYTES = 64 * 1024
_HEAD = struct.Struct("<qIIH")  # id, SSE size, data length, type length


@functools.lru_cache(maxsize=256)  # the event types (vocabulary), and a few more
def _type_bytes(event_type: str) -> bytes:
    return event_type.encode()


@functools.lru_cache(maxsize=256)
def _type_name(raw: bytes) -> str:
    return raw.decode()


class _Chunk:
    """Events packed in ``map`` from ``start`` to ``end`` (``last_id`` the newest), or one large
    ``event`` kept as it is."""

    __slots__ = ("end", "event", "last_id", "map", "start")

    def __init__(self, event: BusEvent | None) -> None:
        self.map: mmap.mmap | None = None if event is not None else mmap.mmap(-1, CHUNK_BYTES,
                                                                                flags=mmap.MAP_PRIVATE)
        self.event = event
        self.start = 0
        self.end = 0
        self.last_id = event.id if event is not None and event.id is not None else 0

    def room(self) -> int:
        return CHUNK_BYTES - self.end if self.map is not None else 0

    def put(self, event: BusEvent, event_id: int, kind: bytes) -> None:
        data = event.data
        at = self.end
        assert self.map is not None
        _HEAD.pack_into(self.map, at, event_id, event.size, len(data), len(kind))
        at += _HEAD.size
        self.map[at:at + len(kind)] = kind
        at += len(kind)
        self.map[at:at + len(data)] = data
        self.end = at + len(data)
        self.last_id = event_id

    def first(self) -> tuple[int, int, int]:
        """The oldest event's id, SSE size and record length."""
        if self.event is not None:
            return self.last_id, self.event.size, 0
        assert self.map is not None
        event_id, size, data_len, type_len = _HEAD.unpack_from(self.map, self.start)
        return int(event_id), int(size), _HEAD.size + int(type_len) + int(data_len)

    def events(self, after: int, upto: int) -> list[BusEvent]:
        if self.event is not None:
            return [self.event] if after < self.last_id <= upto else []
        out: list[BusEvent] = []
        view = self.map
        assert view is not None
        at = self.start
        while at < self.end:
            event_id, _, data_len, type_len = _HEAD.unpack_from(view, at)
            at += _HEAD.size
            if event_id > upto:
                break
            if event_id > after:
                kind = _type_name(view[at:at + type_len])
                out.append(BusEvent(int(event_id), kind, view[at + type_len:at + type_len + data_len]))
            at += type_len + data_len
        return out

    def close(self) -> None:
        if self.map is not None:
            self.map.close()
            self.map = None


class Ring:
    """A session's last events with an id, oldest first (the newest is always kept)."""

    def __init__(self, max_events: int, max_bytes: int) -> None:
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.count = 0
        self.bytes = 0  # the SSE bytes of the events held
        self._chunks: collections.deque[_Chunk] = collections.deque()

    def append(self, event: BusEvent) -> None:
        self.extend((event,))

    def extend(self, events: tuple[BusEvent, ...] | list[BusEvent]) -> None:
        """Append ``events`` (each with an id), then drop the oldest past either bound."""
        chunks = self._chunks
        for event in events:
            event_id = event.id
            if event_id is None:
                continue
            kind = _type_bytes(event.type)
            record = _HEAD.size + len(kind) + len(event.data)
            if len(event.data) >= BY_REFERENCE_BYTES or record > CHUNK_BYTES:
                chunks.append(_Chunk(event))
            else:
                if not chunks or chunks[-1].room() < record:
                    chunks.append(_Chunk(None))
                chunks[-1].put(event, event_id, kind)
            self.count += 1
            self.bytes += event.size
        while self.count > 1 and (self.count > self.max_events or self.bytes > self.max_bytes):
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        head = self._chunks[0]
        _, size, length = head.first()
        self.count -= 1
        self.bytes -= size
        head.start += length
        if head.event is not None or head.start >= head.end:
            head.close()  # its mapping goes back to the kernel whole
            self._chunks.popleft()

    @property
    def first_id(self) -> int | None:
        return self._chunks[0].first()[0] if self._chunks else None

    @property
    def last_id(self) -> int | None:
        return self._chunks[-1].last_id if self._chunks else None

    def covers(self, after: int, upto: int) -> bool:
        """True when the ring holds every event ``after < id <= upto`` (an event committed and not
        yet delivered is not in it yet: the journal has it)."""
        first, last = self.first_id, self.last_id
        return first is not None and last is not None and first <= after + 1 and last >= upto

    def between(self, after: int, upto: int) -> list[BusEvent]:
        """The events ``after < id <= upto`` the ring holds, in order (new objects, from its bytes)."""
        out: list[BusEvent] = []
        for chunk in self._chunks:
            if chunk.last_id > after:
                out.extend(chunk.events(after, upto))
        return out

    @property
    def events(self) -> list[BusEvent]:
        """Every event held, oldest first."""
        return self.between(0, 2**63 - 1)

    def close(self) -> None:
        """Hand every mapping back now (the session went)."""
        for chunk in self._chunks:
            chunk.close()
        self._chunks.clear()
        self.count = self.bytes = 0
