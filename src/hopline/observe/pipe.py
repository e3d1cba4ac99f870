"""The pipe's instruments, one set per daemon, shared by every child (SPEC O-1..O-6, D-8).

:class:`PipeObservability` wires the stats (O-1), the histogram (O-2) and the large-frame observer
(O-3..O-6) into both :class:`hopline.wire.hooks.PipeTap` directions of every child, counts the
frames that were not relayed, and answers its part of ``GET /daemon/status``.

Two switches, for A/B measurements (``bench/daemon_server.py``): ``histogram=False`` leaves the
byte histogram out of the taps (stats and large frames stay), ``hooks=False`` gives the
taps no hooks at all. The daemon runs with both on; ``/metrics`` and the console read the same
objects either way.
"""

from __future__ import annotations

from typing import Any

from hopline.budget import Budget
from hopline.observe.large_frames import LargeFrameObserver
from hopline.observe.pipe_histogram import PipeMetrics
from hopline.observe.stats import PipeStats
from hopline.wire.hooks import Direction, FrameObservation, PipeTap


class PipeObservability:
    def __init__(self, budget: Budget, *, histogram: bool = True, hooks: bool = True) -> None:
        self.stats = PipeStats()
        self.metrics = PipeMetrics(budget)
        self.large_frames = LargeFrameObserver(budget)
        self.histogram = histogram
        self.hooks = hooks
        self.frames_dropped = 0

    def _observe_large(self, observation: FrameObservation) -> None:
        self.large_frames.observe(observation.direction, observation.bytes, observation.message)

    def tap(self, direction: Direction) -> PipeTap:
        """The tap of one direction of one child: size hooks for the stats and the histogram, an
        observer for the large frames (it alone reads the message)."""
        tap = PipeTap(direction)
        if not self.hooks:
            return tap
        # One sizes hook: a read's frames are recorded in one call (PipeTap.notify_read_frames), the
        # stats and the histogram sharing the count, the sum and the extremes of the read.
        stats, metrics = self.stats.direction(direction), self.metrics if self.histogram else None

        def record(sizes: list[int], total: int, smallest: int, largest: int) -> None:
            count = len(sizes)
            stats.add(count, total, largest)
            if metrics is not None:
                metrics.add(direction, sizes, count, total, smallest, largest)

        tap.add_sizes_hook(record)
        tap.add_observer(self._observe_large, min_bytes=self.large_frames.threshold_bytes)
        return tap

    def record_dropped(self, direction: Direction, nbytes: int, *, observed: bool = False) -> None:
        """A frame that was not relayed (SPEC D-8). One that was never decoded (``observed`` false)
        and is at least the large-frame threshold also gets a large-frame record: its origin is
        ``unknown`` and it holds sizes only."""
        self.frames_dropped += 1
        self.stats.record_dropped(direction, nbytes)
        if not observed:
            self.large_frames.observe(direction, nbytes, None)

    def status(self) -> dict[str, Any]:
        """Its part of ``GET /daemon/status``: ``runtime.perf.pipe`` (per-direction stats), the
        large-frame counters and the frames dropped."""
        large = self.large_frames.snapshot()
        return {
            "runtime": {"perf": {"pipe": self.stats.snapshot()}},
            "largeFrames": {"logged": large["logged"], "suppressed": large["suppressed"],
                            "thresholdBytes": large["thresholdBytes"]},
            "framesDropped": self.frames_dropped,
        }
