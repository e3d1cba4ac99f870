"""One object the daemon wires into both :class:`hopline.wire.hooks.PipeTap` directions.

It feeds every successfully read or written message to the stats (O-1), the histogram (O-2) and
the large-frame observer (O-3..O-6), and answers ``runtime.perf.pipe`` for ``GET /daemon/status``.
"""

from __future__ import annotations

from typing import Any

from hopline.budget import Budget
from hopline.observe.large_frames import LargeFrameObserver
from hopline.observe.metrics import PipeMetrics
from hopline.observe.stats import Direction, PipeStats
from hopline.wire.hooks import FrameObservation, PipeTap


class PipeObservability:
    def __init__(self, budget: Budget, *, metrics: PipeMetrics | None = None,
                 large_frames: LargeFrameObserver | None = None) -> None:
        self.stats = PipeStats()
        self.metrics = metrics if metrics is not None else PipeMetrics(budget)
        self.large_frames = large_frames if large_frames is not None else LargeFrameObserver(budget)

    def observe(self, observation: FrameObservation) -> None:
        """A :data:`hopline.wire.hooks.Observer`: call only after a successful read or write."""
        direction: Direction = observation.direction
        self.stats.record(direction, observation.bytes)
        self.metrics.record(direction, observation.bytes)
        self.large_frames.observe(direction, observation.bytes, observation.message)

    def tap(self, direction: Direction) -> PipeTap:
        """A tap for one direction with this object as its observer."""
        return PipeTap(direction, observers=[self.observe])

    def status(self) -> dict[str, Any]:
        """``runtime.perf.pipe``: per-direction stats plus the large-frame counters."""
        return {**self.stats.snapshot(), "largeFrames": self.large_frames.snapshot()}
