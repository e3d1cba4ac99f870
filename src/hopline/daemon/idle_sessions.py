"""The idle-session reaper: a session nobody uses keeps no agent running (SPEC C-4).

A session is idle when no prompt runs or waits, no permission request waits for an answer, nothing
subscribes to its events, no client named it in a request (every session route does), and no gate
run holds it (a dev session awaiting its gate). One idle for ``HOPLINE_SESSION_IDLE_SECONDS`` has its
agent stopped and leaves memory (:meth:`SessionManager.reap`): its journal stays, so its events and
transcript are read as before and ``POST /session/{id}/load`` gives it a new agent. 0 turns it off.

This is not :mod:`hopline.daemon.reaper` (an agent's process tree) nor the sidecar store's reaper
(expired sidecar bodies).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable

from hopline.daemon.bus import EventBus
from hopline.daemon.sessions.manager import SessionManager
from hopline.daemon.sessions.state import Activity, DaemonSession, SessionState

log = logging.getLogger("hopline.daemon.sessions")

# How often a sweep looks, as a share of the idle limit (a session goes at most a quarter late),
# and never less often than once a minute.
_SWEEPS_PER_LIMIT = 4
_MAX_PERIOD_SECONDS = 60.0


class IdleSessions:
    def __init__(self, manager: SessionManager, bus: EventBus, *, held: Callable[[str], bool]) -> None:
        self.manager = manager
        self.bus = bus
        self.held = held  # a gate run holds this session (it waits for the run, not for a client)
        self.limit = manager.budget.session_idle_seconds
        self.reaped = 0

    def idle_for(self, session: DaemonSession, now: float) -> float | None:
        """How long ``session`` has been idle, or None while it is in use (its clock then restarts)."""
        if session.state is not SessionState.READY or session.child is None:
            return None  # starting, loading, or no agent to stop
        if (session.activity is not Activity.IDLE or self.bus.subscriber_count(session.id)
                or self.held(session.id)):
            session.last_active = now
            return None
        return now - session.last_active

    async def sweep(self) -> int:
        """Reap every session idle past the limit; how many were."""
        now = time.monotonic()
        reaped = 0
        # A snapshot: reaping awaits, and other tasks create and delete sessions meanwhile (T-5).
        for session in list(self.manager.sessions.values()):
            idle = self.idle_for(session, now)
            if idle is None or idle < self.limit:
                continue
            if self.manager.cluster is not None and not self.manager.ownership.owns(session.id):
                continue  # another daemon runs its agent
            if await self.manager.reap(session, idle):
                reaped += 1
        self.reaped += reaped
        return reaped

    async def run(self) -> None:
        """Sweep until cancelled (the daemon's lifespan); nothing when the limit is 0."""
        if self.limit <= 0:
            return
        period = min(self.limit / _SWEEPS_PER_LIMIT, _MAX_PERIOD_SECONDS)
        while True:
            await asyncio.sleep(period)
            try:
                await self.sweep()
            except Exception as exc:  # a failing store or agent: said, and the next sweep tries again
                log.error("idle session sweep failed", extra={"exception": type(exc).__name__})

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        task = asyncio.create_task(self.run())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
