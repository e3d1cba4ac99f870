"""Checked on read (SPEC T-3): every stored event's bytes carry a checksum, and the damage a read finds.

One checksum for both journals: CRC-32, zlib's polynomial (the values ``zlib.crc32`` gives), over
the event's data bytes, stored beside them (the SQLite row or the PostgreSQL row; an
event whose bytes live in a segment file has its checksum in its row, so a moved offset, an
overwritten or truncated file is caught). A read that finds damage never raises: it returns the
row with a reason (``CHECKSUM_MISMATCH``, ``SEGMENT_MISSING``, ``SEGMENT_SHORT``,
``ROW_UNREADABLE``), and the stream says ``data_corrupt`` in its place.
"""

from __future__ import annotations

from typing import Any, Protocol

# The same CRC-32 as zlib's, computed by Intel's ISA-L (python-isal), many times faster than
# zlib.crc32: every relayed byte is checksummed, so its cost is the relay's. The two give the same
# values (tests/daemon/test_checked_store.py holds them equal).
from isal.isal_zlib import crc32

CHECKSUM_MISMATCH = "checksum_mismatch"  # the bytes read are not the bytes written
SEGMENT_MISSING = "segment_missing"  # the session's segment file is gone
SEGMENT_SHORT = "segment_short"  # the segment file ends before the event's bytes do
ROW_UNREADABLE = "row_unreadable"  # the store could not read the row (a damaged page)
QUARANTINED = "quarantined"  # `hopline store check --repair` moved its damaged bytes aside
QUARANTINED_CRC = -1  # the stored checksum of a quarantined row (a CRC-32 is never negative)
REASONS = (CHECKSUM_MISMATCH, SEGMENT_MISSING, SEGMENT_SHORT, ROW_UNREADABLE, QUARANTINED)
# Distinct damaged events remembered for /daemon/status (a count beyond it is still counted).
REMEMBERED_DAMAGED_EVENTS = 10_000


def checksum(data: bytes | memoryview) -> int:
    """The stored checksum of an event's data bytes (unsigned 32 bits)."""
    return crc32(data)


def verified(data: bytes, stored: int | None) -> bool:
    """True when ``data`` matches ``stored`` (None: a row written before checksums, not checkable)."""
    return stored is None or crc32(data) == int(stored)


class _Row(Protocol):
    @property
    def seq(self) -> int: ...
    @property
    def type(self) -> str: ...
    @property
    def corrupt(self) -> str | None: ...


def corrupt_json(row: _Row) -> dict[str, Any]:
    """The data of the ``data_corrupt`` event (and the transcript entry) for a damaged row."""
    return {"eventId": row.seq, "eventType": row.type, "reason": row.corrupt,
            "message": f"event {row.seq} is damaged in the store ({row.corrupt}); it is not served. "
                       "`hopline store check` lists the damage"}


class CorruptCount:
    """The damaged events a daemon met on its reads: how many reads, how many distinct events."""

    def __init__(self) -> None:
        self.reads = 0
        self._events: set[tuple[str, int]] = set()
        self._beyond = 0

    def seen(self, session_id: str, seq: int) -> None:
        self.reads += 1
        key = (session_id, seq)
        if key in self._events:
            return
        if len(self._events) < REMEMBERED_DAMAGED_EVENTS:
            self._events.add(key)
        else:
            self._beyond += 1

    @property
    def events(self) -> int:
        return len(self._events) + self._beyond

    def status(self) -> dict[str, int]:
        return {"corruptEvents": self.events, "corruptReads": self.reads}
