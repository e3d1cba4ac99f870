"""The SSE event the bus carries (SPEC D-3): its exact bytes, computed once, shared by the ring and
every subscriber; and a synthetic event's (no id, not journaled)."""

from __future__ import annotations

import functools
from typing import Any

import orjson

from hopline.budget import HOP_JOURNAL
from hopline.vocabulary import FRAME_DROPPED


class BusEvent:
    """One SSE event; ``id`` is None for synthetic events. ``wire`` is the exact SSE bytes and
    ``size`` their length, computed once (the bounds read it several times per event). Treated
    as immutable: one event object is shared by the ring and every subscriber."""

    __slots__ = ("data", "id", "size", "type")

    def __init__(self, id: int | None, type: str, data: bytes) -> None:
        self.id = id
        self.type = type
        self.data = data  # the JSON of the event's data
        self.size = wire_size(id, type, len(data))

    def __repr__(self) -> str:
        return f"BusEvent(id={self.id!r}, type={self.type!r}, {len(self.data)} bytes)"

    @property
    def wire(self) -> bytes:
        return b"".join(self.wire_parts())

    def wire_parts(self) -> tuple[bytes, bytes, bytes]:
        """The SSE bytes in three parts, ``data`` among them as is: several events are joined
        into one socket write without building each event's bytes first."""
        lines = _type_lines(self.type)
        return lines if self.id is None else b"id: %d\n%s" % (self.id, lines), self.data, b"\n\n"

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "type": self.type, "data": orjson.loads(self.data)}


@functools.lru_cache(maxsize=64)  # the event types (vocabulary), and a few more
def _type_lines(event_type: str) -> bytes:
    return b"event: " + event_type.encode() + b"\ndata: "


def wire_size(event_id: int | None, event_type: str, data_bytes: int) -> int:
    head = 0 if event_id is None else len(b"id: \n") + len(str(event_id))
    return head + len(_type_lines(event_type)) + len(b"\n\n") + data_bytes


# orjson returns a small document in a buffer of at least 8 KiB: a ring of 8000 small events would
# hold 64 MiB while its byte bound says 8 MiB. Events kept past the call are copied to their exact
# size.
EXACT_COPY_BELOW_BYTES = 64 * 1024  # where the slack stops mattering (a measure, not a limit)


def exact_bytes(payload: bytes) -> bytes:
    """``payload`` in an allocation of its own size (a copy when it is small)."""
    return memoryview(payload).tobytes() if len(payload) < EXACT_COPY_BELOW_BYTES else payload


def synthetic(event_type: str, data: dict[str, Any]) -> BusEvent:
    return BusEvent(None, event_type, orjson.dumps(data))


# The reason of every gap's frame_dropped: ids the store lost past what it committed durably (a
# crash cut them, a failover to a replica that lacked them), or a Last-Event-ID past its last id.
LOST_PAST_COMMIT_POINT = "lost_past_commit_point"


def missing_ids(first: int, last: int, *, reason: str, **details: Any) -> BusEvent:
    """The one ``frame_dropped`` that tells a reader the event ids ``first..last`` it will never
    get (SPEC T-10: a gap is reported, never hidden): a live reader's event whose commit failed, a
    replay or a catch-up that reaches into ids the store lost (a torn WAL, a failover), a
    Last-Event-ID past the store's last id. Its ``eventId`` is the first of them, ``missingIds``
    the range; ``details`` add what the teller knows (sizes, the event's type, a message)."""
    return synthetic(FRAME_DROPPED, {"direction": "sse", "reason": reason, "hop": HOP_JOURNAL,
                                     "eventId": first, "missingIds": {"first": first, "last": last},
                                     **details})
