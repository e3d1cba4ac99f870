"""The cluster in Prometheus text (SPEC X): this daemon's own series labelled with its id, and the
store's view of the whole cluster."""

from __future__ import annotations

from typing import Any


def with_daemon_label(exposition: str, daemon_id: str) -> str:
    """A Prometheus text exposition with ``daemon="<id>"`` on every sample: its series are this
    daemon's own (its pipe, its gateway); comment lines are kept as they are."""
    label = f'daemon="{daemon_id}"'
    out: list[str] = []
    for line in exposition.splitlines():
        if not line or line.startswith("#"):
            out.append(line)
        elif "{" in line.split(" ", 1)[0]:
            name, _, rest = line.partition("{")
            out.append(f"{name}{{{label},{rest}" if not rest.startswith("}") else f"{name}{{{label}{rest}")
        else:
            name, _, rest = line.partition(" ")
            out.append(f"{name}{{{label}}} {rest}")
    return "\n".join(out) + "\n"


def cluster_metrics(status: dict[str, Any]) -> str:
    """What the store says of the whole cluster, the same on every daemon: no ``daemon`` label on
    the totals; the per-daemon lease counts name the daemon they count."""
    daemons = status.get("daemons") or []
    lines = ["# HELP hopline_cluster_daemons Daemons registered in the store, by liveness.",
             "# TYPE hopline_cluster_daemons gauge",
             f'hopline_cluster_daemons{{state="live"}} {sum(1 for d in daemons if d["live"])}',
             f'hopline_cluster_daemons{{state="gone"}} {sum(1 for d in daemons if not d["live"])}',
             "# HELP hopline_cluster_expired_leases Session leases expired and not yet adopted.",
             "# TYPE hopline_cluster_expired_leases gauge",
             f"hopline_cluster_expired_leases {status.get('expiredLeases', 0)}",
             "# HELP hopline_cluster_leases Live session leases held by each daemon.",
             "# TYPE hopline_cluster_leases gauge"]
    lines += [f'hopline_cluster_leases{{daemon="{d["id"]}"}} {d["leases"]}' for d in daemons if d["live"]]
    return "\n".join(lines) + "\n"
