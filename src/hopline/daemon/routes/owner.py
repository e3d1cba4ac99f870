"""Several daemons (SPEC X): a write to a session goes to the daemon that owns it. One rule for
every write route: :meth:`OwnerWrites.forward` returns ``None`` when this daemon owns the session
(adopting it if its owner died), and otherwise the owner's answer, which the route returns as it
is. Called in the route, after the body was validated (an invalid body adopts nothing)::

    if (answer := await owner.forward(request, session)) is not None:
        return answer
"""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import Response

from hopline.budget import HOP_CLUSTER
from hopline.daemon.cluster import FORWARDED_SCOPE_KEY, Cluster
from hopline.daemon.errors import SessionError
from hopline.daemon.sessions.manager import SessionManager
from hopline.daemon.sessions.state import DaemonSession

FORWARD_ATTEMPTS = 3  # an owner that falls silent while we forward is adopted, then served here


class OwnerWrites:
    def __init__(self, manager: SessionManager, cluster: Cluster | None) -> None:
        self.manager = manager
        self.cluster = cluster

    async def forward(self, request: Request, session: DaemonSession, *,
                      spawn: bool = True) -> Response | None:
        """``None`` when this daemon owns ``session``; else the owner's answer to the forwarded
        write. A forwarded request is never forwarded again: if the lease moved meanwhile, the
        sender hears 409 and retries. ``spawn``: an adoption restores the agent (a delete needs none)."""
        cluster = self.cluster
        if cluster is None:
            return None
        for _ in range(FORWARD_ATTEMPTS):
            owner = await self.manager.ensure_owner(session, spawn=spawn)
            if owner is None:
                return None
            if request.scope.get(FORWARDED_SCOPE_KEY):  # a stale forward: never served here
                cluster.stale_refused += 1
                raise SessionError(409, "owner_changed", "the session's owner changed while this write was "
                                   "forwarded; retry it", hop=HOP_CLUSTER, owner=owner.daemon_id)
            answer = await cluster.forward(owner, request)
            if answer is not None:
                return answer
        raise SessionError(503, "owner_changing", "the session's owner keeps changing; retry",
                           hop=HOP_CLUSTER)
