"""The pipe byte histogram (SPEC O-2): plain bucket counts, exported in Prometheus format by a
``prometheus_client`` collector at scrape time.

``hopline.daemon.pipe.message_bytes`` (unit ``By``) has one label, ``direction``, on purpose:
method, tool name or origin class would make it high-cardinality (they belong in the large-frame
records instead). Its buckets are fixed powers of four from 256 B to 64 MiB plus every ceiling of
this hop read from the budget, so "how many frames are near the limit" is always answerable.

Recording a frame is a ``bisect`` into the boundaries and two additions on per-direction lists:
the relay records every frame, so nothing heavier runs per frame. The counts are read only when
someone asks: :class:`_HistogramCollector` renders them at scrape time (``/metrics``), and
:meth:`PipeMetrics.snapshot` gives them to ``GET /daemon/frames`` and the console.

Each :class:`PipeMetrics` owns a private ``CollectorRegistry`` (never the global one), so several
daemons or tests can live in one process.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import TYPE_CHECKING

from hopline.budget import Budget, KiB, MiB
from hopline.wire.hooks import DIRECTIONS, Direction

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

HISTOGRAM_NAME = "hopline.daemon.pipe.message_bytes"  # as GET /daemon/frames names it
HISTOGRAM_UNIT = "By"
EXPORTED_NAME = HISTOGRAM_NAME.replace(".", "_")  # its Prometheus spelling (the name ends in _bytes)
HELP = "Size of one ACP pipe message (frame bytes without the newline)"

# Shape of the histogram, not a ceiling: the budget's pipe ceilings are merged in below.
_BASE_BOUNDARIES: tuple[int, ...] = (
    256, 1 * KiB, 4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB,
)
PIPE_CEILING_KEYS: tuple[str, ...] = (
    "pipe_max_frame_bytes", "agent_max_frame_bytes", "large_frame_threshold_bytes",
)


def bucket_boundaries(budget: Budget) -> list[float]:
    """Explicit bucket bounds: the fixed ladder plus every pipe ceiling, sorted, deduplicated."""
    bounds = set(_BASE_BOUNDARIES)
    bounds.update(int(budget.value(key)) for key in PIPE_CEILING_KEYS)
    return [float(b) for b in sorted(bounds)]


class PipeMetrics:
    """The histogram's counts and its private Prometheus registry."""

    def __init__(self, budget: Budget, registry: CollectorRegistry | None = None) -> None:
        from prometheus_client import CollectorRegistry

        self.boundaries = bucket_boundaries(budget)
        self._bounds = [int(b) for b in self.boundaries]
        # per direction: one count per bucket ((previous bound, bound], then the overflow)
        self._counts: dict[str, list[int]] = {d: [0] * (len(self._bounds) + 1) for d in DIRECTIONS}
        self._sums: dict[str, int] = dict.fromkeys(DIRECTIONS, 0)
        self.registry: CollectorRegistry = registry if registry is not None else CollectorRegistry()
        self.registry.register(_HistogramCollector(self))

    def record(self, direction: Direction, nbytes: int) -> None:
        self._counts[direction][bisect.bisect_left(self._bounds, nbytes)] += 1
        self._sums[direction] += nbytes

    def record_many(self, direction: Direction, sizes: list[int]) -> None:
        """:meth:`record` for each of ``sizes`` (one read's frames). The frames of one read are
        mostly of one size class: when the smallest and the largest fall in one bucket, the whole
        list is one addition."""
        if sizes:
            self.add(direction, sizes, len(sizes), sum(sizes), min(sizes), max(sizes))

    def add(self, direction: Direction, sizes: list[int], count: int, total: int, smallest: int,
            largest: int) -> None:
        """:meth:`record_many` with the count, sum and extremes of ``sizes`` already known."""
        bounds, counts = self._bounds, self._counts[direction]
        low = bisect.bisect_left(bounds, smallest)
        if low == bisect.bisect_left(bounds, largest):
            counts[low] += count
        else:
            for nbytes in sizes:
                counts[bisect.bisect_left(bounds, nbytes)] += 1
        self._sums[direction] += total

    def seen(self) -> list[Direction]:
        """The directions with at least one frame (only those are exported)."""
        return [d for d in DIRECTIONS if any(self._counts[d])]

    def cumulative(self, direction: Direction) -> list[tuple[str, int]]:
        """``(le, frames of at most le bytes)`` per bucket, ``le`` spelled as Prometheus does."""
        out: list[tuple[str, int]] = []
        running = 0
        for bound, count in zip([*self.boundaries, float("inf")], self._counts[direction], strict=True):
            running += count
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
        return out

    def snapshot(self) -> dict[str, dict[str, object]]:
        """Per direction: ``counts`` (one per bucket: ``(previous bound, bound]`` for each of
        :attr:`boundaries`, then the overflow bucket), ``count`` and ``sumBytes``."""
        return {d: {"counts": list(self._counts[d]), "count": sum(self._counts[d]), "sumBytes": self._sums[d]}
                for d in DIRECTIONS}

    def render(self) -> bytes:
        """Prometheus text exposition of the private registry (for ``GET /metrics``)."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


class _HistogramCollector:
    """Renders the counts at scrape time: nothing before the first frame, then one series per
    direction seen."""

    def __init__(self, metrics: PipeMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import HistogramMetricFamily

        metrics = self.metrics
        seen = metrics.seen()
        if not seen:
            return
        family = HistogramMetricFamily(EXPORTED_NAME, HELP, labels=["direction"])
        for direction in seen:
            buckets = [(le, float(running)) for le, running in metrics.cumulative(direction)]
            family.add_metric([direction], buckets, float(metrics._sums[direction]))
        yield family
