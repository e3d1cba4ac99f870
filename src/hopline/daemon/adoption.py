"""Adoption on lease expiry (SPEC X): a session whose owner died is adopted without waiting for a
write.

Every daemon sweeps once per lease period (the heartbeat's clock: the store's ``now()``). An
expired lease is adopted by this daemon when the session still matters to someone: a reader
subscribed here, or a prompt the store holds open (its turn must end, ``owner_lost``). The
adoption itself is the one compare-and-set of :meth:`SessionManager.ensure_owner`, so of the
daemons sweeping together exactly one wins; the others carry on reading. A sweep that finds the
store away tries again at the next period.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from hopline.daemon.errors import SessionError
from hopline.store.bounded import store_errors

if TYPE_CHECKING:
    from hopline.daemon.bus import EventBus
    from hopline.daemon.cluster import Cluster
    from hopline.daemon.sessions.manager import SessionManager

log = logging.getLogger("hopline.daemon.cluster")


async def sweep_expired(manager: SessionManager, cluster: Cluster, bus: EventBus) -> int:
    """Adopt the expired leases that matter (see the module); the number adopted here."""
    subscribed = [sid for sid in list(manager.sessions) if bus.subscriber_count(sid) > 0
                  and not manager.ownership.owns(sid)]
    rows = await cluster.fetch(
        "SELECT l.session_id FROM leases l WHERE l.expires_at <= now() AND l.owner <> %s "
        "AND (l.session_id = ANY(%s) OR EXISTS (SELECT 1 FROM prompts p WHERE p.session_id = l.session_id)) "
        "ORDER BY l.session_id", (cluster.daemon_id, subscribed))
    adopted = 0
    for (session_id,) in rows:
        try:
            session = await manager.get(str(session_id))
            if await manager.ensure_owner(session) is None and manager.ownership.owns(session.id):
                adopted += 1
        except SessionError:  # deleted meanwhile, or not a session (a gate run's stream)
            continue
        except store_errors():  # another daemon's transaction holds it, or the store is away
            continue
    if adopted:
        log.warning("expired leases adopted without a write", extra={"sessions": adopted})
    return adopted


async def run_sweeps(manager: SessionManager, cluster: Cluster, bus: EventBus) -> None:
    """:func:`sweep_expired` once per lease period, until cancelled."""
    while True:
        await asyncio.sleep(cluster.lease_seconds)
        try:
            await sweep_expired(manager, cluster, bus)
        except asyncio.CancelledError:
            raise
        except store_errors() as exc:
            log.warning("adoption sweep failed; tried again next period", extra={"error": type(exc).__name__})
