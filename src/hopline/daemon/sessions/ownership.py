"""Several daemons on one store (SPEC X): which sessions this daemon owns (holds the lease of),
the journal's fencing when a lease is gone, and the one decision before a write: adopt, or forward.

One :class:`Ownership` per daemon. Every change to the owned set goes through it (a create's
claim, a gate run's stream, a release, a lost lease); the bus asks :meth:`Ownership.owns`. With one
daemon (no cluster) nothing is leased and :meth:`Ownership.ensure_owner` always answers "here".
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable

from hopline.budget import HOP_CLUSTER
from hopline.daemon.cluster import Cluster, Owner
from hopline.daemon.errors import SessionError
from hopline.daemon.sessions.state import DaemonSession

log = logging.getLogger("hopline.daemon.sessions")

Adopt = Callable[[DaemonSession, "Owner | None"], Awaitable[None]]


class Ownership:
    def __init__(self, cluster: Cluster | None) -> None:
        self.cluster = cluster
        self._owned: set[str] = set()  # sessions (and gate streams) whose lease this daemon holds
        self._stepped: set[str] = set()  # owned sessions not acted on while the lease is at risk
        self._on_lost: list[Callable[[tuple[str, ...]], None]] = []

    def step_down(self, session_ids: set[str]) -> set[str]:
        """The lease is at risk (SPEC T-11): these sessions, of the owned ones, are not acted on
        until a renewal succeeds (:meth:`resume`); the ones stepped down."""
        stepped = self._owned & session_ids
        self._owned -= stepped
        self._stepped |= stepped
        return stepped

    def resume(self, renewed: set[str]) -> tuple[set[str], set[str]]:
        """A renewal succeeded again: the stepped-down sessions whose lease this daemon still holds
        are owned again; the others were taken. ``(kept, lost)``."""
        kept, lost = self._stepped & renewed, self._stepped - renewed
        self._owned |= kept
        self._stepped = set()
        return kept, lost

    def owns(self, session_id: str) -> bool:
        return session_id in self._owned

    def owned(self) -> set[str]:
        """A snapshot of the owned set (safe to iterate across awaits)."""
        return set(self._owned)

    async def claim_new(self, session_id: str) -> None:
        """A session (or stream) this daemon creates is its own: its lease, taken now."""
        if self.cluster is not None:
            await self.cluster.claim_new(session_id)
            self._owned.add(session_id)

    async def release(self, session_id: str) -> None:
        """Give a stream's lease up (the store away: it expires by itself)."""
        self._owned.discard(session_id)
        if self.cluster is not None:
            with contextlib.suppress(Exception):  # the store is away: the lease expires by itself
                await self.cluster.release(session_id)

    def forget(self, session_id: str) -> None:
        """The session is gone (deleted with its lease, or its lease was taken)."""
        self._owned.discard(session_id)

    def on_lost(self, stop: Callable[[tuple[str, ...]], None]) -> None:
        """Call ``stop`` with the sessions whose lease this daemon lost (the journal fenced them)."""
        self._on_lost.append(stop)

    def fenced(self, session_ids: tuple[str, ...]) -> None:
        """The journal refused events of these sessions (their lease is gone): stop them."""
        for stop in list(self._on_lost):
            stop(session_ids)

    async def renew_own(self, session_id: str) -> bool:
        """A write refused for a lease that merely expired (the store was away longer than it):
        renewed when nobody took it, and the write may be tried again once."""
        return self.cluster is not None and await self.cluster.renew_own(session_id)

    async def stale_write(self, session_id: str) -> SessionError:
        """The 409 for a write that came under a lease this daemon no longer holds (it names the
        current owner); the session's children stop here."""
        assert self.cluster is not None
        self.cluster.stale_refused += 1
        self.fenced((session_id,))
        owner = await self.cluster.owner_of(session_id)
        return SessionError(409, "not_owner", "this daemon no longer holds the session's lease (another "
                            "daemon adopted it); the write was not run: retry it", hop=HOP_CLUSTER,
                            owner=owner.daemon_id if owner is not None else None)

    async def still_holds(self, session_id: str) -> bool:
        """Checked again just before a prompt reaches the child: the lease is still this daemon's
        (at its epoch); a lost lease stops the session. A store that cannot tell raises
        :class:`~hopline.store.postgres.StoreUnavailable`."""
        if self.cluster is None or await self.cluster.still_holds(session_id) \
                or await self.cluster.renew_own(session_id):
            return True
        self.cluster.stale_refused += 1
        self.fenced((session_id,))
        return False

    async def ensure_owner(self, session: DaemonSession, adopt: Adopt) -> Owner | None:
        """Before a write: None when this daemon owns the session (adopting it first, with
        ``adopt``, when its owner's lease expired: one daemon wins the compare-and-set), else the
        live owner to forward it to."""
        cluster = self.cluster
        # Owned and not being adopted right now: a write during an adoption's restore (the sweep's,
        # or another write's) waits for it below, instead of finding the session still loading.
        if cluster is None or (session.id in self._owned and not session.adopt_lock.locked()):
            return None
        async with session.adopt_lock:
            if session.id in self._owned:
                return None
            owner = await cluster.owner_of(session.id)
            if owner is not None and owner.live and owner.daemon_id != cluster.daemon_id:
                return owner
            if not await cluster.try_adopt(session.id):
                return await cluster.owner_of(session.id)  # another daemon won the race: forward
            self._owned.add(session.id)
            cluster.adopted += 1
            log.warning("session adopted", extra={"previousOwnerLive": bool(owner and owner.live)})
            # A failed restore keeps the lease (nothing else could run the session meanwhile): the
            # next write, or POST /load, tries the restore again.
            await adopt(session, owner)
        return None
