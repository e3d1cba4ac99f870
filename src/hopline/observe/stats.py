"""Per-direction pipe counters (SPEC O-1), shaped for ``GET /daemon/status`` -> runtime.perf.pipe."""

from __future__ import annotations

import dataclasses
from typing import Literal

Direction = Literal["inbound", "outbound"]  # inbound = child -> daemon, outbound = daemon -> child
DIRECTIONS: tuple[Direction, ...] = ("inbound", "outbound")


@dataclasses.dataclass
class DirectionStats:
    count: int = 0
    total_bytes: int = 0
    max_bytes: int = 0

    def to_json(self) -> dict[str, int]:
        return {"count": self.count, "totalBytes": self.total_bytes, "maxBytes": self.max_bytes}


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

    def direction(self, direction: Direction) -> DirectionStats:
        return self._by_direction[direction]

    def snapshot(self) -> dict[str, dict[str, int]]:
        return {d: self._by_direction[d].to_json() for d in DIRECTIONS}
