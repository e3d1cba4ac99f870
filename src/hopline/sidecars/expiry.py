"""When a sidecar goes (SPEC S-2, T-10): never while its session lives, and no clock step decides it.

A sidecar expires ``HOPLINE_SIDECAR_TTL_SECONDS`` after its session's last activity: a sidecar
written for it, or a round of the reaper that found it live (an agent running it on this daemon,
or a client reading its stream; on a shared store also a live lease on another daemon). Each
session's last activity is a row of ``sidecar_sessions``, a time on the index's clock:

* SQLite: :class:`RunningClock`, the seconds daemons have run on this index, counted on the
  monotonic clock and persisted by the reaper: an age grows only while a daemon runs, and a step of
  the wall clock (NTP, a VM resumed, an operator) moves nothing;
* PostgreSQL: the database's ``now()``, one clock for every daemon, as the leases use.

:class:`Reaper` runs every ``HOPLINE_SIDECAR_REAP_INTERVAL_SECONDS``; a round that finds the wall
clock (or the index's) moved by more than its period against the monotonic clock does nothing but
say so in the log: a clock that jumps is not trusted to decide what to delete.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

log = logging.getLogger("hopline.sidecars")

SESSIONS_SCHEMA = """
CREATE TABLE IF NOT EXISTS sidecar_sessions (
    session_id TEXT PRIMARY KEY,
    active_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS index_clock (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    seconds REAL NOT NULL
);
"""
# A session's activity at ``?`` (the index's clock): one statement for SQLite and PostgreSQL.
TOUCH = ("INSERT INTO sidecar_sessions (session_id, active_at) VALUES (?, ?) "
         "ON CONFLICT (session_id) DO UPDATE SET active_at = excluded.active_at")
# Sessions whose sidecars were written before activity was kept: their time counts from now.
ADOPT = ("INSERT INTO sidecar_sessions (session_id, active_at) SELECT DISTINCT session_id, ? FROM sidecars "
         "WHERE true ON CONFLICT (session_id) DO NOTHING")
# A shared store: a session another daemon holds a live lease on is live (PostgreSQL's leases).
LIVE_ELSEWHERE = " AND session_id NOT IN (SELECT session_id FROM leases WHERE expires_at > now())"


class _Index(Protocol):
    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> Any: ...


class RunningClock:
    """The SQLite index's clock: the seconds daemons have run on it. It starts where the last
    daemon's reaper left it (:meth:`persist`) and runs on this process's monotonic clock."""

    def __init__(self, index: _Index) -> None:
        self._index = index
        row = index.execute("SELECT seconds FROM index_clock WHERE id = 0").fetchone()
        self._base = float(row[0]) if row else 0.0
        self._started = time.monotonic()

    def __call__(self) -> float:
        return self._base + time.monotonic() - self._started

    def persist(self) -> None:
        """Store the time reached, so the next daemon's clock goes on from it (a crash loses at
        most the time since: ages come out younger, never older)."""
        self._index.execute("INSERT INTO index_clock (id, seconds) VALUES (0, ?) "
                            "ON CONFLICT (id) DO UPDATE SET seconds = MAX(seconds, excluded.seconds)",
                            (self(),))


class _Store(Protocol):
    clock: Callable[[], float]

    def reap_expired(self, now: float | None = None, *, live: Iterable[str] = ()) -> int: ...


class Reaper:
    """The store's reaper: every ``interval`` seconds, the live sessions touched and the expired
    sidecars removed; a round in which a clock stepped is refused and logged."""

    def __init__(self, store: _Store, interval: float, live: Callable[[], Iterable[str]]) -> None:
        self.store = store
        self.interval = interval
        self.live = live
        self.rounds = 0
        self.refused = 0  # rounds skipped for a clock step
        self._marks = self._now()

    def _now(self) -> tuple[float, float, float]:
        return time.monotonic(), time.time(), self.store.clock()

    def round(self, live: Iterable[str]) -> int:
        """One round (in a worker thread), ``live`` the sessions live now: how many sidecars it removed."""
        self.rounds += 1
        marks = self._now()
        elapsed = marks[0] - self._marks[0]
        step = max(abs(marks[1] - self._marks[1] - elapsed), abs(marks[2] - self._marks[2] - elapsed))
        self._marks = marks
        if step > self.interval:
            self.refused += 1
            log.warning("a clock stepped between two rounds of the sidecar reaper: the round removes "
                        "nothing", extra={"stepSeconds": round(step, 3), "periodSeconds": self.interval})
            return 0
        return self.store.reap_expired(live=live)

    def status(self) -> dict[str, float]:
        """For ``/daemon/status``: the rounds run, those refused for a clock step, the period."""
        return {"rounds": self.rounds, "refusedRounds": self.refused, "periodSeconds": self.interval}

    async def run(self) -> None:
        """A round every ``interval`` seconds until cancelled (errors are logged)."""
        while True:
            await asyncio.sleep(self.interval)
            try:
                live = list(self.live())  # read on the event loop, where the sessions change
                await asyncio.to_thread(self.round, live)
            except Exception as exc:  # keep reaping on the next round
                log.warning("sidecar reaper failed", extra={"error": type(exc).__name__})
