"""A new server behind the store (SPEC T-10): a failover, or a restart. A store promoted from an
asynchronous replica may lack events that readers were given; the daemons still hold some of them.

Every daemon watches the server it reaches (the heartbeat reads ``pg_postmaster_start_time()`` and,
where the role may read it, the system identifier) and notes each reconnect of its journal's
writer. On a change it looks, for every session it knows, at the ids up to the last one it knows
was stored (the events its ring and readers got, the ones it committed):

* the ids the store lacks there that it still holds are written back, with their own ids and
  bytes (:meth:`~hopline.store.pg_history.PgHistory.write_back`; an id a row already covers is
  left alone);
* its journal never gives one of those ids again (``ensure_above``);
* after a settling pause (the other daemons write back what they hold meanwhile), the ids still
  missing are a loss: counted (the session's ``lostEvents``; a prompt in flight here ends
  ``degraded``), logged by count, and told to this daemon's readers of the session
  (``frame_dropped``, ``lost_past_commit_point``, naming the ids). Readers elsewhere hear of them from
  their own daemon, and a replay or a catch-up that reaches the gap says it too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hopline.daemon.bus import EventBus
    from hopline.store.pg_journal import PgJournal

log = logging.getLogger("hopline.daemon.cluster")


class Failover:
    def __init__(self, bus: EventBus, journal: PgJournal, *, settle_seconds: float,
                 last_committed: Callable[[str], int],
                 on_lost: Callable[[str, int], None] = lambda _session_id, _events: None) -> None:
        self.bus = bus
        self.journal = journal
        self.settle_seconds = settle_seconds
        self.last_committed = last_committed  # the journal's: the last id this daemon committed
        self.on_lost = on_lost  # the session and how many of its events were lost (the manager counts)
        self.server: tuple[Any, ...] | None = None
        self.server_changes = 0
        self.reconciles = 0
        self.written_back = 0
        self.lost_events = 0
        self._told: dict[str, set[tuple[int, int]]] = {}  # the runs said lost, per session
        self._task: asyncio.Task[None] | None = None
        self._again = False

    def status(self) -> dict[str, Any]:
        return {"serverChanges": self.server_changes, "reconciles": self.reconciles,
                "writtenBack": self.written_back, "lostEvents": self.lost_events}

    def seen(self, server: tuple[Any, ...]) -> None:
        """The heartbeat's view of the server; another one than before starts a reconcile."""
        if self.server is not None and server != self.server:
            self.server_changes += 1
            log.warning("the store's server changed (a failover or a restart): comparing what this "
                        "daemon holds with it")
            self.start()
        self.server = server

    def start(self) -> None:
        """Reconcile now (once more after the running one, if one runs)."""
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        task = self._task
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            self._again = False
            try:
                await self.journal.renew_reads()
                await self.reconcile()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the store went away again: the next change or reconnect retries
                log.warning("reconciling with the store failed", extra={"error": type(exc).__name__})
            if not self._again:
                return

    async def reconcile(self) -> int:
        """Write back what this daemon holds that the store lacks, then tell what no daemon held;
        the number of events lost. Per session it looks at every id up to the last one it knows
        stored (one index scan of the session's rows)."""
        self.reconciles += 1
        pending: dict[str, tuple[int, int]] = {}
        known = self.bus.known()
        for session_id in [sid for sid in self._told if sid not in known]:  # sessions gone here
            del self._told[session_id]
        for session_id in known:  # a snapshot
            highest = max(known[session_id], self.last_committed(session_id))
            self.journal.ensure_above(session_id, highest)
            gaps = await self.journal.gaps(session_id, 0, highest)
            if not gaps:
                continue
            held = [(e.id, e.type, e.data) for e in self.bus.held(session_id, 0)
                    if e.id is not None and any(first <= e.id <= last for first, last in gaps)]
            written = await self.journal.write_back(session_id, held)
            self.written_back += written
            pending[session_id] = (0, highest)
            log.warning("events the store lacks written back", extra={
                "events": written, "missing": sum(last - first + 1 for first, last in gaps)})
        if not pending:
            return 0
        await asyncio.sleep(self.settle_seconds)  # the other daemons write back what they hold
        lost = 0
        for session_id, (after, highest) in pending.items():
            told = self._told.setdefault(session_id, set())
            for run in await self.journal.gaps(session_id, after, highest):
                if run in told:  # said by an earlier reconcile (a reconnect, then the server's change)
                    continue
                told.add(run)
                self.bus.tell_lost(session_id, *run)
                self.on_lost(session_id, run[1] - run[0] + 1)
                lost += run[1] - run[0] + 1
        if lost:
            self.lost_events += lost
            log.error("events lost in a store failover: no daemon held them", extra={"events": lost})
        return lost
