"""Several daemons (SPEC X): a write to a session goes to the daemon that owns it. One rule for
every write route: :meth:`OwnerWrites.here` returns when this daemon owns the session (adopting it
if its owner died) and otherwise raises :class:`Forwarded` with the owner's answer, which the app
sends as it is. Called in the route, after the body was validated (an invalid body adopts nothing)."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import Response

from hopline.budget import HOP_CLUSTER, HoplineError
from hopline.daemon.cluster import FORWARDED_SCOPE_KEY, Cluster
from hopline.daemon.errors import SessionError
from hopline.daemon.sessions.manager import SessionManager
from hopline.daemon.sessions.state import DaemonSession

FORWARD_ATTEMPTS = 3  # an owner that falls silent while we forward is adopted, then served here


class Forwarded(HoplineError):
    """Not an error: the owner answered the forwarded write; this is its answer for the client."""

    def __init__(self, response: Response) -> None:
        super().__init__("answered by the session's owner")
        self.response = response


class OwnerWrites:
    def __init__(self, manager: SessionManager, cluster: Cluster | None) -> None:
        self.manager = manager
        self.cluster = cluster

    async def here(self, request: Request, session: DaemonSession, *, spawn: bool = True) -> None:
        """Return when this daemon owns ``session``; else raise :class:`Forwarded`. A forwarded
        request is never forwarded again: if the lease moved meanwhile, the sender hears 409 and
        retries. ``spawn``: an adoption restores the agent (a delete needs none)."""
        cluster = self.cluster
        if cluster is None:
            return
        for _ in range(FORWARD_ATTEMPTS):
            owner = await self.manager.ensure_owner(session, spawn=spawn)
            if owner is None:
                return
            if request.scope.get(FORWARDED_SCOPE_KEY):
                raise SessionError(409, "owner_changed", "the session's owner changed while this write was "
                                   "forwarded; retry it", hop=HOP_CLUSTER)
            answer = await cluster.forward(owner, request)
            if answer is not None:
                raise Forwarded(answer)
        raise SessionError(503, "owner_changing", "the session's owner keeps changing; retry",
                           hop=HOP_CLUSTER)
