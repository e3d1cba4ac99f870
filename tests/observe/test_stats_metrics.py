"""Pipe stats (O-1) and the Prometheus histogram (O-2)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from hopline.budget import Budget, KiB, MiB
from hopline.observe.pipe_histogram import PipeMetrics, bucket_boundaries
from hopline.observe.stats import PipeStats

NO_DROPS = {"dropped": 0, "droppedBytes": 0, "maxDroppedBytes": 0}


def test_stats_snapshot_shape_and_values() -> None:
    stats = PipeStats()
    assert stats.snapshot() == {
        "inbound": {"count": 0, "totalBytes": 0, "maxBytes": 0, **NO_DROPS},
        "outbound": {"count": 0, "totalBytes": 0, "maxBytes": 0, **NO_DROPS},
    }
    for n in (10, 300, 20):
        stats.record("inbound", n)
    stats.record("outbound", 7)
    stats.record_dropped("inbound", 500)
    stats.record_dropped("inbound", 40)
    assert stats.snapshot() == {
        "inbound": {"count": 3, "totalBytes": 330, "maxBytes": 300,
                    "dropped": 2, "droppedBytes": 540, "maxDroppedBytes": 500},
        "outbound": {"count": 1, "totalBytes": 7, "maxBytes": 7, **NO_DROPS},
    }


def _samples(metrics: PipeMetrics) -> list[tuple[str, dict[str, str], float]]:
    text = metrics.render().decode()
    return [
        (s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def test_histogram_buckets_and_direction_label_only() -> None:
    metrics = PipeMetrics(Budget.defaults())
    metrics.record("inbound", 300 * KiB)
    metrics.record("inbound", 10)
    metrics.record("outbound", 32 * MiB)
    samples = _samples(metrics)
    buckets = [(labels, value) for name, labels, value in samples
               if name == "hopline_daemon_pipe_message_bytes_bucket"]
    assert buckets, samples
    for labels, _ in buckets:
        assert set(labels) == {"direction", "le"}
    bounds = sorted({float(labels["le"]) for labels, _ in buckets})
    # the powers of four, and the pipe's max frame (32 MiB) among them as a ceiling
    expected = [256, KiB, 4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB, MiB, 4 * MiB, 16 * MiB, 32 * MiB, 64 * MiB]
    assert bounds == [float(b) for b in expected] + [float("inf")]
    inbound = {float(labels["le"]): value for labels, value in buckets if labels["direction"] == "inbound"}
    assert inbound[256.0] == 1 and inbound[256.0 * KiB] == 1 and inbound[float(MiB)] == 2
    outbound = {float(labels["le"]): value for labels, value in buckets
                if labels["direction"] == "outbound"}
    assert outbound[16.0 * MiB] == 0 and outbound[32.0 * MiB] == 1  # the exact max frame is inside
    counts = {labels["direction"]: value for name, labels, value in samples
              if name == "hopline_daemon_pipe_message_bytes_count"}
    assert counts == {"inbound": 2, "outbound": 1}
    assert all(set(labels) <= {"direction", "le"} for _, labels, _ in samples)


def test_budget_ceilings_become_buckets() -> None:
    budget = Budget.defaults().replace(pipe_max_frame_bytes=10 * MiB, agent_max_frame_bytes=10 * MiB,
                                       large_frame_threshold_bytes=300 * KiB)
    bounds = bucket_boundaries(budget)
    assert 10.0 * MiB in bounds and 300.0 * KiB in bounds
    assert bounds == sorted(set(bounds))
    metrics = PipeMetrics(budget)
    metrics.record("inbound", 1)
    les = {labels["le"] for name, labels, _ in _samples(metrics) if name.endswith("_bucket")}
    assert {float(x) for x in les} >= {10.0 * MiB, 300.0 * KiB}


def test_private_registries_coexist() -> None:
    a, b = PipeMetrics(Budget.defaults()), PipeMetrics(Budget.defaults())
    a.record("inbound", 5)
    counts_a = [v for n, _, v in _samples(a) if n.endswith("_count")]
    counts_b = [v for n, _, v in _samples(b) if n.endswith("_count")]
    assert counts_a == [1.0] and counts_b == []
    assert a.registry is not b.registry


def test_snapshot_counts_each_frame_in_its_bucket_at_the_bound_and_one_byte_over() -> None:
    """``PipeMetrics.snapshot`` (what ``GET /daemon/frames`` and the console draw) reads the same
    registry as ``/metrics``: a bucket is ``(previous bound, bound]``, the last one is overflow."""
    budget = Budget.defaults()
    metrics = PipeMetrics(budget)
    bounds = metrics.boundaries
    threshold = budget.large_frame_threshold_bytes
    for size in (0, 256, 257, threshold, threshold + 1, 64 * MiB, 64 * MiB + 1):
        metrics.record("inbound", size)
    snapshot = metrics.snapshot()
    counts = snapshot["inbound"]["counts"]
    assert isinstance(counts, list) and len(counts) == len(bounds) + 1
    expected = [0] * (len(bounds) + 1)
    for size in (0, 256, 257, threshold, threshold + 1, 64 * MiB, 64 * MiB + 1):
        expected[next((i for i, b in enumerate(bounds) if size <= b), len(bounds))] += 1
    assert counts == expected
    assert counts[0] == 2 and counts[-1] == 1  # 0 and 256 in the first bucket; 64 MiB + 1 overflows
    assert snapshot["inbound"]["count"] == 7
    assert snapshot["inbound"]["sumBytes"] == 0 + 256 + 257 + 2 * threshold + 1 + 2 * 64 * MiB + 1
    assert snapshot["outbound"] == {"counts": [0] * (len(bounds) + 1), "count": 0, "sumBytes": 0}
    cumulative = {float(s[1]["le"]): s[2] for s in _samples(metrics)
                  if s[0].endswith("_bucket") and s[1]["direction"] == "inbound"}
    assert [int(cumulative[b]) for b in bounds] == [sum(counts[: i + 1]) for i in range(len(bounds))]


def _otel_reference(budget: Budget, sizes: list[tuple[str, int]]) -> bytes:
    """The exposition of an OpenTelemetry SDK histogram of the same name, unit and view through
    its Prometheus exporter: the standard spelling of this histogram, which /metrics says byte
    for byte (dashboards read it)."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
    from prometheus_client import CollectorRegistry, generate_latest

    from hopline.observe.pipe_histogram import HELP, HISTOGRAM_NAME, HISTOGRAM_UNIT

    registry = CollectorRegistry()
    reader = PrometheusMetricReader(disable_target_info=True, scope_info_enabled=False, registry=registry)
    view = View(instrument_name=HISTOGRAM_NAME, attribute_keys={"direction"},
                aggregation=ExplicitBucketHistogramAggregation(boundaries=bucket_boundaries(budget)))
    provider = MeterProvider(metric_readers=[reader], views=[view])
    histogram = provider.get_meter("reference").create_histogram(HISTOGRAM_NAME, unit=HISTOGRAM_UNIT,
                                                                 description=HELP)
    for direction, size in sizes:
        histogram.record(size, attributes={"direction": direction})
    text = generate_latest(registry)
    provider.shutdown()
    return text


def test_metrics_exposition_is_the_otel_prometheus_exporters() -> None:
    budget = Budget.defaults().replace(pipe_max_frame_bytes=3 * MiB, agent_max_frame_bytes=3 * MiB)
    assert PipeMetrics(budget).render() == _otel_reference(budget, []) == b""  # nothing before a frame
    bounds = [int(b) for b in bucket_boundaries(budget)]
    sizes = [("inbound", b + d) for b in bounds for d in (0, 1)] + [("inbound", 0), ("outbound", 700)]
    metrics = PipeMetrics(budget)
    for direction, size in sizes:
        metrics.record(direction, size)  # type: ignore[arg-type]
    assert metrics.render() == _otel_reference(budget, sizes)
    only_outbound = PipeMetrics(budget)
    only_outbound.record("outbound", 5)
    assert only_outbound.render() == _otel_reference(budget, [("outbound", 5)])


def test_record_many_equals_recording_each_frame_at_the_bound_and_one_byte_over() -> None:
    budget = Budget.defaults()
    one, many = PipeMetrics(budget), PipeMetrics(budget)
    stats_one, stats_many = PipeStats(), PipeStats()
    for sizes in ([1024, 1024, 1024], [1024, 1025], [1, 256, 257, 64 * 1024 * 1024], [], [300]):
        for nbytes in sizes:
            one.record("inbound", nbytes)
            stats_one.record("inbound", nbytes)
        many.record_many("inbound", sizes)
        stats_many.record_many("inbound", sizes)
        assert many.snapshot() == one.snapshot()
        assert stats_many.snapshot() == stats_one.snapshot()
    assert stats_many.snapshot()["inbound"]["count"] == 10
    assert stats_many.snapshot()["inbound"]["maxBytes"] == 64 * 1024 * 1024
