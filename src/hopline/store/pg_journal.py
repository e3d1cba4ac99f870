"""The journal on PostgreSQL (SPEC D-5, X): :class:`~hopline.store.journal.EventJournal` for
several daemons sharing one store.

One writer task on one connection applies every write in call order (sessions, prompts, event
commits); consecutive commits join one transaction (group commit): its rows are first copied
(binary ``COPY``) into a temporary table of the writer's connection, then, after the fencing read,
moved to ``events`` by one ``INSERT ... SELECT``. Reads go through a small pool
(``HOPLINE_STORE_MAX_CONNECTIONS``). Nothing blocks the event loop: psycopg's async connections.

Each committed transaction notifies ``hopline_events`` with ``"<session id> <last id>"`` per
session it wrote (never an event's payload): the daemons' readers wake on it and read the rows.

**Fencing.** With ``owner`` (this daemon's id), a commit writes a session's events only while this
daemon holds the session's lease: the transaction reads the lease rows ``FOR SHARE``, so an adopting
daemon's compare-and-set waits for it, and once the lease is taken every later commit of the old
owner for that session fails with :class:`LeaseLost` (its events are not written, not published).
Ids therefore never fork: the adopter reads the last id after its compare-and-set.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from hopline.budget import Budget
from hopline.errors import LeaseLost, StoreError
from hopline.store import bounded
from hopline.store import idempotency as keys
from hopline.store import pg_statements as sql
from hopline.store.bounded import connection_lost, is_broken, session_options, tcp_options
from hopline.store.event_groups import GROUP_MAX_EVENTS, inline_events, inline_rows, within_bytes
from hopline.store.idempotency import FoundKey, KeyRecord
from hopline.store.journal import (
    EventJournal,
    JournalRow,
    SessionRecord,
    StagedIds,
    StagedRow,
    prompt_id_of,
)
from hopline.store.pg_history import DEADLINE_SETTING, PgHistory
from hopline.store.postgres import EVENTS_CHANNEL, StoreUnavailable, aconnect
from hopline.vocabulary import TURN_END_TYPES

log = logging.getLogger("hopline.store.journal")

_RECONNECT_PAUSE_SECONDS = 0.2  # between reconnect attempts while the store is away


@dataclasses.dataclass
class _Write:
    """One queued write: ``rows`` for a commit (and its idempotency ``key``), else ``apply`` (a
    statement on the writer's connection); ``future`` resolves when it is durable."""

    future: asyncio.Future[Any]
    rows: list[StagedRow] | None = None
    apply: Callable[[Any], Any] | None = None
    key: KeyRecord | None = None


class PgJournal(StagedIds, PgHistory, EventJournal):
    def __init__(self, dsn: str, budget: Budget, *, owner: str | None = None,
                 on_fenced: Callable[[tuple[str, ...]], None] | None = None) -> None:
        self._dsn = dsn
        self.budget = budget
        self.owner = owner
        self.on_fenced = on_fenced
        # Several daemons: the epoch of each lease this daemon holds (the cluster's fencing tokens).
        self.epochs: Mapping[str, int] | None = None
        self._open: dict[str, int] = {}  # open session -> last committed id (as this daemon knows it)
        self._allocated: dict[str, int] = {}
        self._staged: list[StagedRow] = []
        self._writes: collections.deque[_Write] = collections.deque()
        self._wake = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._conn: Any = None
        self._pool: Any = None
        self._closed = False
        # Called after the writer reconnected (the store restarted, or failed over to another server).
        self.on_reconnect: Callable[[], None] | None = None

    # PgHistory is not compiled: mypyc would bind the protocol's bodies unless these name its own.
    async def gaps(self, session_id: str, after: int, upto: int) -> list[tuple[int, int]]:
        return await PgHistory.gaps(self, session_id, after, upto)

    def ensure_above(self, session_id: str, floor: int) -> None:
        PgHistory.ensure_above(self, session_id, floor)

    async def open(self) -> PgJournal:
        self._conn = await self._connect_writer()
        self._pool = self._new_pool()
        await self._pool.open()
        self._writer = asyncio.create_task(self._run_writer())
        return self

    def _new_pool(self) -> Any:  # checked: a connection the store dropped is replaced before a read
        from psycopg_pool import AsyncConnectionPool
        return AsyncConnectionPool(self._dsn, min_size=1, max_size=self.budget.store_max_connections,
                                   kwargs={"autocommit": True, **tcp_options(self.budget)}, open=False,
                                   check=bounded.bounded_check(self.budget.store_request_deadline_seconds,
                                                               DEADLINE_SETTING),
                                   timeout=self.budget.store_statement_timeout_seconds + 1.0)

    # --- the writer -----------------------------------------------------------------------------

    def _queue(self, write: _Write) -> asyncio.Future[Any]:
        if self._closed:
            raise RuntimeError("the journal is closed")
        self._writes.append(write)
        self._wake.set()
        return write.future

    async def _statement(self, apply: Callable[[Any], Any]) -> Any:
        """``apply`` run by the writer, its result once committed, within the request deadline (T-11:
        not behind a commit retried through an outage either); given up, it is not run, or rolled back."""
        future = self._queue(_Write(asyncio.get_running_loop().create_future(), apply=apply))
        deadline = self.budget.store_request_deadline_seconds
        try:
            return await asyncio.wait_for(asyncio.shield(future), deadline)
        except TimeoutError:
            future.cancel()
            raise StoreUnavailable(f"the PostgreSQL store did not answer within {deadline:g} s "
                                   f"({DEADLINE_SETTING})") from None

    async def _run_writer(self) -> None:
        while True:
            if not self._writes:
                if self._closed:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            first = self._writes.popleft()
            if first.rows is None:
                if not first.future.done():  # given up by its caller: never run
                    await self._run_statement(first)
                continue
            group = [first]
            while self._writes and self._writes[0].rows is not None:
                group.append(self._writes.popleft())
            await self._run_commits(group)

    async def _connect_writer(self) -> Any:
        """The writer's connection. PostgreSQL ends its transaction if this daemon leaves it idle
        (frozen mid-commit) past ``store_idle_transaction_seconds``: its lease-row locks go, so
        another daemon can adopt the sessions and its half-done commit is never written."""
        options = session_options(name=f"hopline {self.owner or 'single'} journal",
                                  idle_transaction=self.budget.store_idle_transaction_seconds)
        conn = await aconnect(self._dsn, options=options, **tcp_options(self.budget))
        try:
            async with conn.transaction():
                await conn.execute(sql.STAGING_TABLE)  # this connection's own, gone with it
        except Exception:
            with contextlib.suppress(Exception):
                await conn.close()
            raise
        return conn

    async def _reconnect_if_broken(self) -> None:
        if is_broken(self._conn):  # UNKNOWN (the server dropped it) counts as broken
            with contextlib.suppress(Exception):
                self._conn = await self._connect_writer()
                self._reconnected()

    async def _run_statement(self, write: _Write) -> None:
        assert write.apply is not None
        try:
            async with self._conn.transaction():
                result = await write.apply(self._conn)
                if write.future.done():  # its caller gave up meanwhile: rolled back, as it was told
                    raise _GivenUp()
        except _GivenUp:
            return
        except Exception as exc:
            _fail(write.future, exc)
            await self._reconnect_if_broken()
            return
        if not write.future.done():
            write.future.set_result(result)

    async def _run_commits(self, group: list[_Write]) -> None:
        """Commit the group; a commit that failed because the connection broke (the store
        restarted, or ended a transaction this daemon left idle) is retried on a new connection
        until ``store_outage_retry_seconds`` pass: meanwhile its events wait in the journal queue
        (full, it holds the pipe readers back) instead of being dropped. The retry runs the
        fencing read again: a lease taken meanwhile refuses it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.budget.store_outage_retry_seconds
        attempt = 0
        while True:
            try:
                await self._commit_group(group)
                return
            except Exception as exc:
                # Its rows already stored as written: a lost connection took the answer, not the
                # commit (on a retry, or on the first try when the writer saw the loss first).
                if type(exc).__name__ == "UniqueViolation" and await self.all_stored(
                        [row for write in group for row in inline_rows(write.rows or ())]):
                    self._settle(group, set())
                    return
                if not (connection_lost(exc) and is_broken(self._conn)) or loop.time() >= deadline \
                        or self._closed:
                    self._fail_group(group, exc)
                    await self._reconnect_if_broken()
                    return
                attempt += 1
                if attempt == 1:
                    log.warning("journal commit failed on a lost connection; retried once reconnected",
                                extra={"error": type(exc).__name__,
                                       "events": sum(len(w.rows or ()) for w in group)})
                await self._reconnect_until(deadline)

    async def _reconnect_until(self, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        while is_broken(self._conn) and loop.time() < deadline and not self._closed:
            with contextlib.suppress(Exception):
                self._conn = await self._connect_writer()
                self._reconnected()
                return
            await asyncio.sleep(min(_RECONNECT_PAUSE_SECONDS, max(0.0, deadline - loop.time())))

    def _reconnected(self) -> None:
        if self.on_reconnect is not None:
            self.on_reconnect()

    def _fail_group(self, group: list[_Write], exc: BaseException) -> None:
        for write in reversed(group):
            self._release(write.rows or [])
            _fail(write.future, exc)
        log.warning("journal commit failed", extra={"error": type(exc).__name__,
                                                    "events": sum(len(w.rows or ()) for w in group)})

    async def _commit_group(self, group: list[_Write]) -> None:
        sessions = sorted({row[0] for write in group for row in write.rows or ()})
        fenced: set[str] = set()
        async with self._conn.transaction():
            if sessions:
                # First, before any lock: COPY into this connection's temp table (a COPY waiting for
                # a frozen daemon's data is ended by no timeout, and here holds nothing another
                # daemon waits for), and binary COPY costs a fraction of an INSERT ... unnest's text
                # arrays per row. A run of small events is one row (event_groups), so a row's cost
                # is paid per commit's run, not per event.
                async with self._conn.cursor().copy(sql.STAGING_COPY) as copy:
                    copy.set_types(sql.STAGING_TYPES)
                    for place, write in enumerate(group):
                        for row in inline_rows(write.rows or ()):  # CRCs checked on every read (T-3)
                            await copy.write_row((place, *row))
                # One statement, not a pipelined batch: its end is a protocol sync, so a daemon
                # frozen after it leaves a transaction PostgreSQL sees idle, and ends.
                if self.owner is None:
                    await self._conn.execute(sql.MOVE, {"channel": EVENTS_CHANNEL})
                else:
                    cursor = await self._conn.execute(sql.MOVE_FENCED, {
                        "sessions": sessions, "owner": self.owner, "channel": EVENTS_CHANNEL})
                    # a name of its own: compiled (mypyc), a variable keeps its first type
                    answer = await cursor.fetchone()
                    fenced = set(sessions) - set(answer[0] if answer is not None else ())
            for write in group:  # a write's key with its events, not when they were fenced
                if write.key is not None and not fenced.intersection(row[0] for row in write.rows or ()):
                    await keys.astore(self._conn, write.key, strict=False)
        self._settle(group, fenced)

    def _settle(self, group: list[_Write], fenced: set[str]) -> None:
        """A committed group: each write of a session whose lease was taken fails (LeaseLost)."""
        for write in group:
            if not fenced.intersection(row[0] for row in write.rows or ()):
                for session_id, seq, _, _ in write.rows or ():
                    if session_id in self._open:
                        self._open[session_id] = max(self._open[session_id], seq)
                if not write.future.done():
                    write.future.set_result(None)
            else:
                lost = sorted(fenced.intersection(row[0] for row in write.rows or ()))
                self._release(write.rows or [])
                _fail(write.future, LeaseLost(lost))
        if fenced:
            log.warning("events of sessions whose lease was taken were not written",
                        extra={"sessions": len(fenced)})
            if self.on_fenced is not None:
                self.on_fenced(tuple(sorted(fenced)))

    def _release(self, rows: Sequence[StagedRow]) -> None:
        """A failed commit's ids go back to their session when nothing was staged after them."""
        first: dict[str, int] = {}
        last: dict[str, int] = {}
        for session_id, seq, _, _ in rows:
            first[session_id] = min(seq, first.get(session_id, seq))
            last[session_id] = max(seq, last.get(session_id, seq))
        for session_id, top in last.items():
            if self._allocated.get(session_id) == top:
                committed = self._open.get(session_id, 0)
                self._allocated[session_id] = max(first[session_id] - 1, committed)
                if self._allocated[session_id] == committed:
                    del self._allocated[session_id]

    # --- sessions -------------------------------------------------------------------------------

    async def create_session(self, session_id: str, options: dict[str, Any],
                             key: KeyRecord | None = None) -> None:
        async def apply(conn: Any) -> None:
            await conn.execute("INSERT INTO sessions (id, agent_session_id, options, created) "
                               "VALUES (%s, NULL, %s, %s)", (session_id, orjson.dumps(options), time.time()))
            if key is not None:
                await keys.astore(conn, key, strict=True)

        await self._statement(apply)
        self._open[session_id] = 0

    async def get_session(self, session_id: str) -> SessionRecord | None:
        async def query(conn: Any) -> Any:
            cursor = await conn.execute(
                "SELECT id, agent_session_id, options, created, "
                "(SELECT COALESCE(MAX(seq), 0) FROM events WHERE session_id = %s) "
                "FROM sessions WHERE id = %s",
                (session_id, session_id))
            return await cursor.fetchone()

        row = await self._read(query)
        if row is None:
            return None
        if session_id not in self._allocated:  # nothing of ours in flight: the store's last id holds,
            # unless this daemon knows of a later one (a store that failed over lost it: never reused)
            self._open[session_id] = max(int(row[4]), self._open.get(session_id, 0))
        return SessionRecord(str(row[0]), row[1], orjson.loads(bytes(row[2])), float(row[3]))

    async def set_agent_session_id(self, session_id: str, agent_session_id: str) -> None:
        async def apply(conn: Any) -> None:
            await conn.execute("UPDATE sessions SET agent_session_id = %s WHERE id = %s",
                               (agent_session_id, session_id))

        await self._statement(apply)

    async def delete_session(self, session_id: str) -> None:
        self._staged = [row for row in self._staged if row[0] != session_id]
        self._open.pop(session_id, None)
        self._allocated.pop(session_id, None)

        async def apply(conn: Any) -> None:
            for table, column in (("events", "session_id"), ("prompts", "session_id"),
                                  ("leases", "session_id"), ("sessions", "id")):
                await conn.execute(f"DELETE FROM {table} WHERE {column} = %s", (session_id,))
            await keys.aforget_session(conn, session_id)

        await self._statement(apply)

    async def list_sessions(self) -> list[SessionRecord]:
        async def query(conn: Any) -> list[Any]:
            cursor = await conn.execute(
                "SELECT id, agent_session_id, options, created FROM sessions ORDER BY created, id")
            return list(await cursor.fetchall())

        rows = await self._read(query)
        return [SessionRecord(str(r[0]), r[1], orjson.loads(bytes(r[2])), float(r[3])) for r in rows]

    # --- prompts --------------------------------------------------------------------------------

    async def open_prompt(self, session_id: str, prompt_id: str, key: KeyRecord | None = None) -> None:
        """With several daemons the prompt opens only in a transaction that finds this daemon's
        lease live at the epoch it took it (compare-and-set on the fencing token; the row is read
        ``FOR SHARE``, so no adoption lands in between): else :class:`LeaseLost` and no row."""
        async def apply(conn: Any) -> None:
            if self.owner is not None and self.epochs is not None:
                epoch = self.epochs.get(session_id, -1)
                cursor = await conn.execute(
                    "SELECT 1 FROM leases WHERE session_id = %s AND owner = %s AND epoch = %s "
                    "AND expires_at > now() FOR SHARE", (session_id, self.owner, epoch))
                if await cursor.fetchone() is None:
                    raise LeaseLost([session_id])
            await conn.execute(
                "INSERT INTO prompts (session_id, prompt_id, after_seq) "
                "SELECT %s, %s, COALESCE(MAX(seq), 0) FROM events WHERE session_id = %s "
                "ON CONFLICT (session_id, prompt_id) DO UPDATE SET after_seq = excluded.after_seq",
                (session_id, prompt_id, session_id))
            if key is not None:
                await keys.astore(conn, key, strict=True)

        await self._statement(apply)

    async def close_prompt(self, session_id: str, prompt_id: str) -> None:
        async def apply(conn: Any) -> None:
            await conn.execute("DELETE FROM prompts WHERE session_id = %s AND prompt_id = %s",
                               (session_id, prompt_id))

        await self._statement(apply)

    async def unended_prompts(self, session_id: str | None = None) -> list[tuple[str, str]]:
        where, params = ("WHERE session_id = %s", (session_id,)) if session_id is not None else ("", ())

        async def query(conn: Any) -> list[tuple[str, str, bool]]:
            cursor = await conn.execute(
                f"SELECT session_id, prompt_id, after_seq FROM prompts {where} "
                "ORDER BY session_id, after_seq",
                params)
            found: list[tuple[str, str, bool]] = []
            for sid, prompt_id, after in await cursor.fetchall():
                cursor = await conn.execute(
                    "SELECT seq, type, data, crc, parts FROM events WHERE session_id = %s AND seq > %s "
                    "AND type = ANY(%s)", (sid, after, sorted(TURN_END_TYPES)))
                ends = inline_events(await cursor.fetchall(), after)
                ended = any(prompt_id_of(end.data) == prompt_id for end in ends if end.corrupt is None)
                found.append((str(sid), str(prompt_id), ended))
            return found

        out: list[tuple[str, str]] = []
        for sid, prompt_id, ended in await self._read(query):
            if ended:
                await self.close_prompt(sid, prompt_id)
            else:
                out.append((sid, prompt_id))
        return out

    # --- events ---------------------------------------------------------------------------------

    def _last_allocated(self, session_id: str) -> int:
        if session_id not in self._open:
            raise LookupError("not an open session of this journal")
        return self._allocated.get(session_id, self._open[session_id])

    def commit(self, key: KeyRecord | None = None) -> asyncio.Future[None]:
        rows, self._staged = self._staged, []
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        return self._queue(_Write(future, rows=rows, key=key))

    async def read_page(self, session_id: str, after: int, *, upto: int | None = None,
                        max_bytes: int) -> list[JournalRow]:
        bound = upto if upto is not None else 2**62

        async def query(conn: Any) -> list[Any]:
            # A group is keyed by its last id: one that starts by the bound may end past it.
            ends_by = min(bound, 2**62) + GROUP_MAX_EVENTS
            cursor = await conn.execute(
                f"SELECT seq, octet_length(data), {sql.FIRST_ID} FROM events WHERE session_id = %s "
                "AND seq > %s AND seq < %s ORDER BY seq LIMIT %s",
                (session_id, after, ends_by, sql.SIZING_ROWS))
            sizes = await cursor.fetchall()
            if not sizes:
                return []
            total, cut = 0, int(sizes[0][0])
            for seq, size, first in sizes:
                if (total and total + int(size) > max_bytes) or int(first) > bound:
                    break
                total += int(size)
                cut = int(seq)
            cursor = await conn.execute(
                "SELECT seq, type, data, crc, parts FROM events WHERE session_id = %s AND seq > %s "
                "AND seq <= %s ORDER BY seq", (session_id, after, cut))
            return list(await cursor.fetchall())

        return within_bytes(inline_events(await self._read(query), after, bound), max_bytes)

    async def last_id(self, session_id: str) -> int:
        return await self._one("SELECT COALESCE(MAX(seq), 0) FROM events WHERE session_id = %s",
                               (session_id,))

    async def count(self, session_id: str, event_type: str) -> int:
        return await self._one(f"SELECT COALESCE(SUM({sql.ROW_EVENTS}), 0) FROM events "
                               "WHERE session_id = %s AND type = %s", (session_id, event_type))

    async def find_key(self, key: str, now: float) -> FoundKey:
        return await self._read(lambda conn: keys.afind(conn, key, now))

    async def purge_keys(self, now: float) -> int:
        return int(await self._statement(lambda conn: keys.apurge(conn, now)))

    async def close(self) -> None:
        if self._closed:
            return
        if self._staged:
            with contextlib.suppress(Exception):
                await self.commit()
        self._closed = True
        self._wake.set()
        if self._writer is not None:
            with contextlib.suppress(BaseException):
                await self._writer
        if self._pool is not None:
            await self._pool.close()
        if self._conn is not None:
            await self._conn.close()


class _GivenUp(StoreError):
    """A statement whose caller stopped waiting: its transaction is rolled back."""


def _fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
        future.exception()  # retrieved here too: a caller that dropped it logs no warning

