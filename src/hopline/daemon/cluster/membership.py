"""This daemon as a member of the cluster (SPEC X): registered, heartbeating, listening; the one
object the rest of the daemon holds (:class:`Cluster`), over its leases and its forwarding."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from hopline.budget import Budget
from hopline.daemon.cluster.failover import Failover
from hopline.daemon.cluster.forward import Forwarder
from hopline.daemon.cluster.leases import Leases, Owner
from hopline.daemon.cluster.stepdown import StepDown
from hopline.store.bounded import session_options, tcp_options
from hopline.store.postgres import EVENTS_CHANNEL, aconnect

log = logging.getLogger("hopline.daemon.cluster")


class Cluster:
    """The lease operations are :class:`Leases`' (its SQL), the forwarding :class:`Forwarder`'s;
    this class runs the heartbeat and the listener and keeps the counters ``/daemon/status`` shows."""

    def __init__(self, dsn: str, budget: Budget, *, daemon_id: str, advertise_url: str, token: str) -> None:
        if not token:
            raise ValueError("the cluster token must not be empty")
        self._dsn = dsn
        self.budget = budget
        self.daemon_id = daemon_id
        self.advertise_url = advertise_url.rstrip("/")
        self.lease_seconds = budget.owner_lease_seconds
        self.leases = Leases(dsn, budget, daemon_id=daemon_id, advertise_url=self.advertise_url)
        self.forwarder = Forwarder(budget, daemon_id=daemon_id, token=token, owner_of=self.leases.owner_of)
        self._tasks: list[asyncio.Task[None]] = []
        self.step_down: StepDown | None = None  # made at start
        self.failover: Failover | None = None  # the daemon's, for the status
        self.adopted = 0
        self.leases_lost = 0
        self.stale_refused = 0  # writes refused because the lease they came under was gone
        # The same dict as the leases': the fencing token each session's lease was taken with.
        self.epochs: dict[str, int] = self.leases.epochs
        # The lease operations, as the sessions and the routes call them.
        self.fetch = self.leases.fetch
        self.claim_new = self.leases.claim_new
        self.release = self.leases.release
        self.still_holds = self.leases.still_holds
        self.renew_own = self.leases.renew_own
        self.try_adopt = self.leases.try_adopt
        self.owner_of = self.leases.owner_of

    @property
    def forwarded(self) -> int:
        return self.forwarder.forwarded

    async def forward(self, owner: Owner, request: Request) -> Response | None:
        """See :meth:`Forwarder.forward`: None when the owner's lease expired while it was silent."""
        return await self.forwarder.forward(owner, request)

    # --- lifecycle --------------------------------------------------------------------------------

    async def start(self, *, on_commit: Callable[[str, int], None], held: Callable[[], set[str]],
                    on_lost: Callable[[set[str]], Awaitable[None]], on_listen: Callable[[], None],
                    step_down: Callable[[], None], on_resume: Callable[[set[str]], Awaitable[set[str]]],
                    on_server: Callable[[tuple[Any, ...]], None]) -> None:
        """Register this daemon, then heartbeat (``held``: the sessions this daemon runs a child
        for; ``on_lost`` gets those whose lease it no longer holds; ``step_down`` is called when
        the lease is at risk, ``on_resume`` with the leases still held once a renewal succeeds
        again, answering those it lost meanwhile; ``on_server`` with the server each heartbeat
        reached) and listen (``on_commit`` per
        notification; ``on_listen`` once listening, again after a reconnect: catch up)."""
        await self.leases.register()
        self.step_down = StepDown(self.lease_seconds, self.budget.owner_lease_margin, step_down)
        self.step_down.started()
        self.forwarder.open()
        self._tasks = [asyncio.create_task(self._heartbeat(held, on_lost, on_resume, on_server)),
                       asyncio.create_task(self._listen(on_commit, on_listen))]

    async def stop(self) -> None:
        """Stop heartbeating; the leases this daemon holds expire at once (another daemon adopts
        its sessions on their next write) and the daemon is marked stopped."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
        if self.step_down is not None:
            self.step_down.stop()
        with contextlib.suppress(Exception):
            await self.leases.give_up_all()
        await self.close_connections()
        await self.forwarder.close()

    async def close_connections(self) -> None:
        await self.leases.close()

    async def _heartbeat(self, held: Callable[[], set[str]], on_lost: Callable[[set[str]], Awaitable[None]],
                         on_resume: Callable[[set[str]], Awaitable[set[str]]],
                         on_server: Callable[[tuple[Any, ...]], None]) -> None:
        period = self.lease_seconds / 3
        assert self.step_down is not None
        while True:
            try:
                on_server(await self.leases.beat())
                running = held()  # read before the renewal: a lease taken after it is not "lost"
                sent = time.monotonic()  # the lease counts from the renewal's send (SPEC T-11)
                renewed = await self.leases.renew()
                lost = running - renewed
                if self.step_down.renewed(sent):
                    lost |= await on_resume(renewed)  # stopped already (it stepped down): counted here
                if lost:
                    self.leases_lost += len(lost)
                    log.warning("leases taken by another daemon; their children stop",
                                extra={"sessions": len(lost)})
                    await on_lost(lost)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the store is away: try again; the journal fences meanwhile
                log.warning("cluster heartbeat failed", extra={"error": type(exc).__name__})
            await asyncio.sleep(period)

    async def _listen(self, on_commit: Callable[[str, int], None], on_listen: Callable[[], None]) -> None:
        """One ``LISTEN`` connection: each notification (``"<session id> <last id>"``, never a
        payload) wakes this daemon's readers of that session, who read the rows from the journal."""
        while True:
            try:
                name = f"hopline {self.daemon_id} listen"
                conn = await aconnect(self._dsn, options=session_options(name=name),
                                      **tcp_options(self.budget))
                try:
                    await conn.execute(f"LISTEN {EVENTS_CHANNEL}")
                    on_listen()
                    async for notify in conn.notifies():
                        session_id, _, last = notify.payload.partition(" ")
                        if last.isdigit():
                            on_commit(session_id, int(last))
                finally:
                    with contextlib.suppress(Exception):
                        await conn.close()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("cluster listener lost its connection", extra={"error": type(exc).__name__})
                await asyncio.sleep(min(1.0, self.lease_seconds / 3))

    async def status(self) -> dict[str, Any]:
        """The daemons (live: heartbeat within a lease), their leases and sessions, for
        ``/daemon/status``."""
        daemons = await self.leases.daemons()
        expired = await self.leases.expired_count()
        return {
            "daemon": self.daemon_id, "advertiseUrl": self.advertise_url, "leaseSeconds": self.lease_seconds,
            "forwardedWrites": self.forwarded, "adoptedSessions": self.adopted,
            "leasesLost": self.leases_lost, "staleWritesRefused": self.stale_refused,
            "expiredLeases": expired, "daemons": daemons, **self.lease_status(),
        }

    def lease_status(self) -> dict[str, Any]:
        """This daemon's own view of its lease (no store read): stepped down or not, how often,
        and how old its last successful renewal is."""
        clock = self.step_down
        age = clock.age() if clock is not None else None
        return {"steppedDown": bool(clock and clock.stepped_down), "stepDowns": clock.count if clock else 0,
                "lastRenewalAgeSeconds": round(age, 3) if age is not None else None,
                "failover": self.failover.status() if self.failover is not None else None}
