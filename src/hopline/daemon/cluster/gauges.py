"""The cluster's part of ``/metrics`` (SPEC X), as ``prometheus_client`` collectors: this daemon's
own series labelled with its id, and the store's view of the whole cluster."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


class DaemonLabelled(Collector):
    """Every sample of ``collectors`` with ``daemon="<id>"`` first among its labels: those series
    are this daemon's own (its pipe, its gateway), and another daemon exports the same names."""

    def __init__(self, collectors: Iterable[Collector], daemon_id: str) -> None:
        self.collectors = list(collectors)
        self.daemon_id = daemon_id

    def collect(self) -> Iterator[Metric]:
        for collector in self.collectors:
            for metric in collector.collect():
                labelled = copy.copy(metric)
                labelled.samples = [sample._replace(labels={"daemon": self.daemon_id, **sample.labels})
                                    for sample in metric.samples]
                yield labelled


class ClusterGauges(Collector):
    """What the store says of the whole cluster (a status read before the scrape), the same on
    every daemon: no ``daemon`` label on the totals; the per-daemon lease counts name the daemon
    they count."""

    def __init__(self, status: dict[str, Any]) -> None:
        self.status = status

    def collect(self) -> Iterator[Metric]:
        daemons = self.status.get("daemons") or []
        live = [d for d in daemons if d["live"]]
        by_state = GaugeMetricFamily("hopline_cluster_daemons",
                                     "Daemons registered in the store, by liveness.", labels=["state"])
        by_state.add_metric(["live"], len(live))
        by_state.add_metric(["gone"], len(daemons) - len(live))
        yield by_state
        yield GaugeMetricFamily("hopline_cluster_expired_leases",
                                "Session leases expired and not yet adopted.",
                                value=self.status.get("expiredLeases", 0))
        leases = GaugeMetricFamily("hopline_cluster_leases", "Live session leases held by each daemon.",
                                   labels=["daemon"])
        for daemon in live:
            leases.add_metric([daemon["id"]], daemon["leases"])
        yield leases
