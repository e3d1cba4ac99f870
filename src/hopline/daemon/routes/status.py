"""``/health``, ``/daemon/status`` and ``/metrics``."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter
from fastapi.responses import Response

from hopline.budget import check_coherence, limits_json
from hopline.compiled import STATE as COMPILED
from hopline.daemon.cluster import ClusterGauges, DaemonLabelled
from hopline.daemon.parts import DaemonParts
from hopline.daemon.routes.sessions import ERRORS
from hopline.daemon.storage_faults import cluster_status_or_unavailable

if TYPE_CHECKING:
    from prometheus_client.registry import Collector


def status_router(parts: DaemonParts, route_class: Any) -> APIRouter:
    budget, manager, bus, gates = parts.budget, parts.manager, parts.bus, parts.gates
    instruments, store, cluster, gateway = parts.instruments, parts.store, parts.cluster, parts.gateway
    reaper = parts.reaper
    router = APIRouter(route_class=route_class)

    @router.get("/daemon/status", responses=ERRORS)
    async def status() -> dict[str, Any]:
        sessions = await manager.status()
        dev_states = gates.dev_states()
        for row in sessions:  # a dev session attached to a gate run shows its dev state
            if row["sessionId"] in dev_states:
                row["devState"] = dev_states[row["sessionId"]]
        return {
            "sessions": sessions,
            "gates": gates.status(),
            # uvloop under `hopline serve` (uvicorn[standard]), asyncio's own loop elsewhere
            "eventLoop": type(asyncio.get_running_loop()).__module__.split(".")[0],
            # the relay's hot path compiled (mypyc) or its source, and why (hopline/compiled.py)
            "compiled": COMPILED.to_json(),
            "journal": {"queuedEvents": bus.queued_events, "queuedBytes": bus.queued_bytes,
                        "failedEvents": bus.journal_failed, "missingEventsTold": bus.missing_told,
                        **bus.corrupt.status()},
            **instruments.status(),
            "sse": {"evictions": bus.evictions, "oversizeDropped": bus.oversize_dropped},
            "delivery": manager.delivery_status(),
            "warmChildren": manager.pool.status() if manager.pool is not None else None,
            # off the loop: a shared index's statements may wait on the store (to their deadline)
            "sidecars": ({**(await asyncio.to_thread(store.stats)),
                          "reaper": reaper.status() if reaper is not None else None}
                         if store is not None else None),
            "budget": limits_json(budget, check_coherence(budget), parts.settings),
            "cluster": await cluster_status_or_unavailable(cluster) if cluster is not None else None,
        }

    @router.get("/metrics", responses=ERRORS)
    async def metrics() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

        own: list[Collector] = [instruments.metrics.registry]
        if gateway is not None:
            own.append(gateway.state.metrics.registry)
        scrape = CollectorRegistry()
        if cluster is None:
            for registry in own:
                scrape.register(registry)
        else:  # every series above is this daemon's own: labelled with its id
            scrape.register(DaemonLabelled(own, cluster.daemon_id))
            scrape.register(ClusterGauges(await cluster_status_or_unavailable(cluster)))
        return Response(generate_latest(scrape), media_type=CONTENT_TYPE_LATEST)

    return router
