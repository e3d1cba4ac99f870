"""Per-direction pipe counters (SPEC O-1, D-8), shaped for ``GET /daemon/status`` -> runtime.perf.pipe.

``count`` / ``totalBytes`` / ``maxBytes`` are the frames read or written; ``dropped`` /
``droppedBytes`` / ``maxDroppedBytes`` the frames that were not relayed (oversize, invalid JSON or
UTF-8, the stream ending inside a frame, an update for another session or without an update).
"""

from __future__ import annotations

import dataclasses

from hopline.wire.hooks import DIRECTIONS, Direction


@dataclasses.dataclass
class DirectionStats:
    count: int = 0
    total_bytes: int = 0
    max_bytes: int = 0
    dropped: int = 0
    dropped_bytes: int = 0
    max_dropped_bytes: int = 0

    def add(self, count: int, total: int, largest: int) -> None:
        """``count`` frames of ``total`` bytes, the largest of ``largest`` bytes."""
        self.count += count
        self.total_bytes += total
        if largest > self.max_bytes:
            self.max_bytes = largest

    def to_json(self) -> dict[str, int]:
        return {"count": self.count, "totalBytes": self.total_bytes, "maxBytes": self.max_bytes,
                "dropped": self.dropped, "droppedBytes": self.dropped_bytes,
                "maxDroppedBytes": self.max_dropped_bytes}


class PipeStats:
    """Count, total bytes and max bytes of the messages of each direction."""

    def __init__(self) -> None:
        self._by_direction: dict[Direction, DirectionStats] = {d: DirectionStats() for d in DIRECTIONS}

    def record(self, direction: Direction, nbytes: int) -> None:
        stats = self._by_direction[direction]  # KeyError on an unknown direction: a caller bug
        stats.count += 1
        stats.total_bytes += nbytes
        if nbytes > stats.max_bytes:
            stats.max_bytes = nbytes

    def record_many(self, direction: Direction, sizes: list[int]) -> None:
        """:meth:`record` for each of ``sizes`` (one read's frames), in one call."""
        if not sizes:
            return
        self._by_direction[direction].add(len(sizes), sum(sizes), max(sizes))

    def record_dropped(self, direction: Direction, nbytes: int) -> None:
        """A frame of ``nbytes`` that was dropped, not relayed."""
        stats = self._by_direction[direction]
        stats.dropped += 1
        stats.dropped_bytes += nbytes
        if nbytes > stats.max_dropped_bytes:
            stats.max_dropped_bytes = nbytes

    def direction(self, direction: Direction) -> DirectionStats:
        return self._by_direction[direction]

    def snapshot(self) -> dict[str, dict[str, int]]:
        return {d: self._by_direction[d].to_json() for d in DIRECTIONS}
