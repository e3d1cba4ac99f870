"""The PostgreSQL journal's reads, each within the request deadline (SPEC T-11), and what a failover
needs of it (SPEC T-10): a store promoted from an asynchronous replica may lack events that readers
were given. The daemons write back what they still hold, under the events' own ids; ids no daemon
holds are a loss the daemons tell (never reused).

A mixin of :class:`~hopline.store.pg_journal.PgJournal`: its writes go through the journal's
writer (in order with its commits, within the request deadline), its reads through its pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from hopline.budget import CEILINGS_BY_KEY, Budget
from hopline.store import bounded
from hopline.store.integrity import checksum
from hopline.store.pg_statements import COVERED_UP_TO, MISSING_RUNS, WRITE_BACK
from hopline.store.postgres import EVENTS_CHANNEL

T = TypeVar("T")


DEADLINE_SETTING = CEILINGS_BY_KEY["store_request_deadline_seconds"].name


class PgHistory:
    _open: dict[str, int]  # open session -> the last id this daemon knows committed
    _allocated: dict[str, int]  # session -> the last id staged
    _pool: Any  # the reads' connection pool

    budget: Budget
    _pool_renewed_at = 0.0  # monotonic: when the read pool was last made anew

    async def _statement(self, apply: Callable[[Any], Any]) -> Any:
        raise NotImplementedError

    async def _read(self, work: Callable[[Any], Awaitable[T]]) -> T:
        """``work`` on a pooled connection, all within the request deadline (:func:`.bounded.within`).
        A pool that lends no connection in half of it (after an outage it tries the server less and
        less often) is made anew, at most once a deadline, and the rest of it is spent on the new
        pool (or on one a failover made meanwhile)."""
        from psycopg_pool import PoolTimeout

        deadline = self.budget.store_request_deadline_seconds
        loop = asyncio.get_running_loop()
        end = loop.time() + deadline
        for wait in (deadline / 2, None):
            pool = self._pool
            try:
                async with pool.connection(timeout=wait or max(0.01, end - loop.time())) as conn:
                    hang_up = functools.partial(bounded.hang_up, conn)
                    return await bounded.within(max(0.0, end - loop.time()), work(conn), hang_up,
                                                setting=DEADLINE_SETTING)
            except PoolTimeout:
                if wait is None:
                    raise
                if self._pool is pool:  # not made anew while this read waited
                    if time.monotonic() < self._pool_renewed_at + deadline:
                        raise
                    await self.renew_reads()
        raise AssertionError("unreachable: the second attempt returns or raises")

    async def _one(self, sql: str, params: tuple[Any, ...]) -> int:
        """The integer one read answers (0 for none)."""
        async def query(conn: Any) -> Any:
            cursor = await conn.execute(sql, params)
            return await cursor.fetchone()

        row = await self._read(query)
        return int(row[0]) if row else 0

    def _new_pool(self) -> Any:
        raise NotImplementedError

    async def renew_reads(self) -> None:
        """The store came back (a restart, a failover): reads get a new pool at once, instead of
        waiting out the old one's reconnect backoff (it tried the absent server less and less often)."""
        old, self._pool = self._pool, self._new_pool()
        self._pool_renewed_at = time.monotonic()
        await self._pool.open()
        with contextlib.suppress(Exception):
            await old.close(timeout=1.0)

    def last_committed(self, session_id: str) -> int:
        """The last id this daemon knows committed for the session (0: none known)."""
        return self._open.get(session_id, 0)

    def ensure_above(self, session_id: str, floor: int) -> None:
        """The session's next id is above ``floor`` (an id this daemon knows was given): a store
        that failed over may have lost it, it is never given again."""
        if session_id in self._open:
            self._open[session_id] = max(self._open[session_id], floor)
        if session_id in self._allocated:
            self._allocated[session_id] = max(self._allocated[session_id], floor)

    async def write_back(self, session_id: str, events: Sequence[tuple[int, str, bytes]]) -> int:
        """Store ``(id, type, data)`` events this daemon still holds, each under its own id, where no
        row covers that id yet; the readers of every daemon are woken. How many were stored."""
        async def apply(conn: Any) -> int:
            stored = 0
            for seq, event_type, data in events:
                row = {"session": session_id, "seq": seq, "type": event_type, "data": data,
                       "crc": checksum(data)}
                cursor = await conn.execute(WRITE_BACK, row)
                stored += max(0, cursor.rowcount)
            if stored:
                await conn.execute("SELECT pg_notify(%s, %s || ' ' || (SELECT MAX(seq) FROM events "
                                   "WHERE session_id = %s))", (EVENTS_CHANNEL, session_id, session_id))
            return stored

        if not events:
            return 0
        written: int = await self._statement(apply)
        return written

    async def all_stored(self, rows: Sequence[tuple[Any, ...]]) -> bool:
        """Every one of these rows (``inline_rows``: session, key id, type, data, CRC, parts) is in
        the store as written: a commit whose answer a lost connection took, retried, finds them."""
        async def query(conn: Any) -> Any:
            cursor = await conn.execute(
                "SELECT count(*) FROM events e JOIN unnest(%s::text[], %s::bigint[], %s::bigint[]) "
                "AS w(s, q, c) ON e.session_id = w.s AND e.seq = w.q AND e.crc = w.c",
                ([row[0] for row in rows], [row[1] for row in rows], [row[4] for row in rows]))
            return await cursor.fetchone()

        found = await self._read(query)
        return bool(rows) and found is not None and int(found[0]) == len(rows)

    async def gaps(self, session_id: str, after: int, upto: int) -> list[tuple[int, int]]:
        """The runs ``(first, last)`` of ids in ``(after, upto]`` that no row of the store holds: its
        rows are the journal, so an id without one was lost (a failover to a replica that lacked
        it) or never committed (a failed commit's, told to the live readers then)."""
        async def query(conn: Any) -> tuple[list[Any], Any]:
            cursor = await conn.execute(MISSING_RUNS, {"session": session_id, "after": after, "upto": upto})
            runs = list(await cursor.fetchall())
            cursor = await conn.execute(COVERED_UP_TO, {"session": session_id, "upto": upto})
            return runs, await cursor.fetchone()

        runs, last = await self._read(query)
        gaps = [(int(first), min(int(last_id), upto)) for first, last_id in runs if int(first) <= upto]
        stored_up_to = max(after, int(last[0]) if last else 0)
        if stored_up_to < upto and not any(first <= stored_up_to + 1 <= end for first, end in gaps):
            gaps.append((stored_up_to + 1, upto))
        return gaps
