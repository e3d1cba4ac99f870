"""The pipe byte histogram (SPEC O-2) through OpenTelemetry, exported in Prometheus format.

``hopline.daemon.pipe.message_bytes`` (unit ``By``) has one attribute, ``direction``, on purpose:
method, tool name or origin class would make it high-cardinality (they belong in the large-frame
records instead). Its buckets are fixed powers of four from 256 B to 64 MiB plus every ceiling of
this hop read from the budget, so "how many frames are near the limit" is always answerable.

Each :class:`PipeMetrics` owns a private ``CollectorRegistry`` and ``MeterProvider`` (never the
global ones), so several daemons or tests can live in one process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hopline.budget import Budget, KiB, MiB
from hopline.wire.hooks import DIRECTIONS, Direction

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

HISTOGRAM_NAME = "hopline.daemon.pipe.message_bytes"
HISTOGRAM_UNIT = "By"
METER_NAME = "hopline.daemon.pipe"
EXPORTED_NAME = HISTOGRAM_NAME.replace(".", "_")  # its Prometheus spelling (the name ends in _bytes)

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
    """The histogram, its private meter provider and its private Prometheus registry."""

    def __init__(self, budget: Budget, registry: CollectorRegistry | None = None) -> None:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
        from prometheus_client import CollectorRegistry

        self.registry: CollectorRegistry = registry if registry is not None else CollectorRegistry()
        self.boundaries = bucket_boundaries(budget)
        # No scope labels and no target_info: the only label on the histogram is `direction`.
        self._reader = PrometheusMetricReader(
            disable_target_info=True, scope_info_enabled=False, registry=self.registry,
        )
        view = View(
            instrument_name=HISTOGRAM_NAME,
            aggregation=ExplicitBucketHistogramAggregation(boundaries=self.boundaries),
            attribute_keys={"direction"},
        )
        self._provider = MeterProvider(metric_readers=[self._reader], views=[view])
        meter = self._provider.get_meter(METER_NAME)
        self._histogram = meter.create_histogram(
            HISTOGRAM_NAME, unit=HISTOGRAM_UNIT,
            description="Size of one ACP pipe message (frame bytes without the newline)",
        )
        self._attributes = {d: {"direction": d} for d in DIRECTIONS}

    def record(self, direction: Direction, nbytes: int) -> None:
        self._histogram.record(nbytes, attributes=self._attributes[direction])

    def snapshot(self) -> dict[str, dict[str, object]]:
        """Per direction: ``counts`` (one per bucket: ``(previous bound, bound]`` for each of
        :attr:`boundaries`, then the overflow bucket), ``count`` and ``sumBytes``, read from the
        same registry ``/metrics`` renders (so the two never disagree)."""
        cumulative: dict[str, dict[float, float]] = {d: {} for d in DIRECTIONS}
        totals: dict[str, dict[str, float]] = {d: {"count": 0.0, "sum": 0.0} for d in DIRECTIONS}
        for family in self.registry.collect():
            for sample in family.samples:
                direction = sample.labels.get("direction", "")
                if direction not in cumulative:
                    continue
                if sample.name == EXPORTED_NAME + "_bucket":
                    cumulative[direction][float(sample.labels["le"])] = sample.value
                elif sample.name == EXPORTED_NAME + "_count":
                    totals[direction]["count"] = sample.value
                elif sample.name == EXPORTED_NAME + "_sum":
                    totals[direction]["sum"] = sample.value
        out: dict[str, dict[str, object]] = {}
        for direction in DIRECTIONS:
            previous = 0.0
            counts: list[int] = []
            for bound in [*self.boundaries, float("inf")]:
                running = cumulative[direction].get(bound, previous)
                counts.append(int(running - previous))
                previous = running
            out[direction] = {"counts": counts, "count": int(totals[direction]["count"]),
                              "sumBytes": int(totals[direction]["sum"])}
        return out

    def render(self) -> bytes:
        """Prometheus text exposition of the private registry (for ``GET /metrics``)."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry)

    def shutdown(self) -> None:
        self._provider.shutdown()
