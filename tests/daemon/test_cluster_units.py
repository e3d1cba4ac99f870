"""The cluster's pure parts (SPEC X): the daemon label on this daemon's own series only, the store's
view without one, and `hopline status`'s cluster table."""

from __future__ import annotations

import io

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from hopline.budget import Budget
from hopline.cli.status import print_status
from hopline.daemon.cluster import ClusterGauges, DaemonLabelled
from hopline.observe.pipe_histogram import PipeMetrics

STATUS = {"daemon": "d_a", "advertiseUrl": "http://127.0.0.1:1", "leaseSeconds": 10.0, "forwardedWrites": 3,
          "adoptedSessions": 1, "leasesLost": 0, "expiredLeases": 2,
          "daemons": [{"id": "d_a", "advertiseUrl": "http://127.0.0.1:1", "self": True, "live": True,
                       "heartbeatAgeSeconds": 0.5, "leases": 4, "sessions": ["s1", "s2", "s3", "s4"]},
                      {"id": "d_b", "advertiseUrl": "http://127.0.0.1:2", "self": False, "live": False,
                       "heartbeatAgeSeconds": 99.0, "leases": 0, "sessions": []}]}


def _scrape(*collectors: object) -> str:
    registry = CollectorRegistry()
    for collector in collectors:
        registry.register(collector)  # type: ignore[arg-type]
    return generate_latest(registry).decode()


def test_every_sample_of_this_daemon_gets_its_label_and_its_family_stays() -> None:
    own = CollectorRegistry()
    Counter("x", "a counter", registry=own).inc(3)
    pipe = PipeMetrics(Budget.defaults())
    pipe.record("inbound", 300)
    text = _scrape(DaemonLabelled([own, pipe.registry], "d_a"))
    lines = text.splitlines()
    assert "# HELP x_total a counter" in lines and "# TYPE x_total counter" in lines
    assert 'x_total{daemon="d_a"} 3.0' in lines
    bucket = 'hopline_daemon_pipe_message_bytes_bucket{daemon="d_a",direction="inbound",le="1024.0"} 1.0'
    assert bucket in lines
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    assert samples and all(s.labels["daemon"] == "d_a" for s in samples)
    assert "daemon" not in generate_latest(own).decode()  # the daemon's own registry is left as it is


def test_the_cluster_totals_carry_no_daemon_label() -> None:
    lines = _scrape(ClusterGauges(STATUS)).splitlines()
    assert 'hopline_cluster_daemons{state="live"} 1.0' in lines
    assert 'hopline_cluster_daemons{state="gone"} 1.0' in lines
    assert "hopline_cluster_expired_leases 2.0" in lines  # the store's view: the same on every daemon
    assert 'hopline_cluster_leases{daemon="d_a"} 4.0' in lines  # counts of a daemon name it
    assert not any("d_b" in line for line in lines)  # a gone daemon holds no live lease
    away = {"daemon": "d_a", "store": "unavailable", "daemons": []}  # cluster_status_or_unavailable's
    unavailable = _scrape(ClusterGauges(away)).splitlines()
    assert "hopline_cluster_expired_leases 0.0" in unavailable
    assert 'hopline_cluster_daemons{state="live"} 0.0' in unavailable


def test_status_shows_the_daemons_and_their_leases() -> None:
    out = io.StringIO()
    print_status(Console(file=out, width=200), {"sessions": [], "cluster": STATUS})
    text = out.getvalue()
    assert "this daemon: d_a" in text and "forwarded writes 3" in text and "expired leases 2" in text
    assert "live (this one)" in text and "gone" in text and "http://127.0.0.1:2" in text
    assert "s1" not in text  # session ids stay out of the tables (--json has them)
