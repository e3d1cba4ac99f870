"""The cluster's pure parts (SPEC X): the daemon label on this daemon's own series only, the store's
view without one, and `hopline status`'s cluster table."""

from __future__ import annotations

import io

from rich.console import Console

from hopline.cli.status import print_status
from hopline.daemon.cluster import cluster_metrics, with_daemon_label

STATUS = {"daemon": "d_a", "advertiseUrl": "http://127.0.0.1:1", "leaseSeconds": 10.0, "forwardedWrites": 3,
          "adoptedSessions": 1, "leasesLost": 0, "expiredLeases": 2,
          "daemons": [{"id": "d_a", "advertiseUrl": "http://127.0.0.1:1", "self": True, "live": True,
                       "heartbeatAgeSeconds": 0.5, "leases": 4, "sessions": ["s1", "s2", "s3", "s4"]},
                      {"id": "d_b", "advertiseUrl": "http://127.0.0.1:2", "self": False, "live": False,
                       "heartbeatAgeSeconds": 99.0, "leases": 0, "sessions": []}]}


def test_every_sample_of_this_daemon_gets_its_label_and_comments_stay() -> None:
    exposition = ("# HELP x_total a counter\n# TYPE x_total counter\nx_total 3.0\n"
                  'h_bucket{direction="inbound",le="256.0"} 1.0\n')
    assert with_daemon_label(exposition, "d_a").splitlines() == [
        "# HELP x_total a counter", "# TYPE x_total counter", 'x_total{daemon="d_a"} 3.0',
        'h_bucket{daemon="d_a",direction="inbound",le="256.0"} 1.0']


def test_the_cluster_totals_carry_no_daemon_label() -> None:
    lines = cluster_metrics(STATUS).splitlines()
    assert 'hopline_cluster_daemons{state="live"} 1' in lines
    assert 'hopline_cluster_daemons{state="gone"} 1' in lines
    assert "hopline_cluster_expired_leases 2" in lines  # the store's view: the same on every daemon
    assert 'hopline_cluster_leases{daemon="d_a"} 4' in lines  # counts of a daemon name it
    assert not any("d_b" in line for line in lines)  # a gone daemon holds no live lease


def test_status_shows_the_daemons_and_their_leases() -> None:
    out = io.StringIO()
    print_status(Console(file=out, width=200), {"sessions": [], "cluster": STATUS})
    text = out.getvalue()
    assert "this daemon: d_a" in text and "forwarded writes 3" in text and "expired leases 2" in text
    assert "live (this one)" in text and "gone" in text and "http://127.0.0.1:2" in text
    assert "s1" not in text  # session ids stay out of the tables (--json has them)
