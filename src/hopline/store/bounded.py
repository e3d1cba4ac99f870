"""A PostgreSQL connection whose every wait has a deadline (SPEC X): the lease and heartbeat
connections of a daemon.

One frozen daemon must not freeze another. PostgreSQL bounds the server's side of each statement
(``lock_timeout``: a wait on a row lock, ``statement_timeout``: the whole statement), and the daemon
bounds its own wait for the answer (``deadline``: a store that does not answer at all, a connection
that hangs, a partition that drops packets, where no server-side timeout ever fires). Past any of
them the statement fails as :class:`StoreUnavailable` (or :class:`StoreBusy` for a lock another
transaction holds), which the daemon's routes answer as hopline's JSON 503 with ``Retry-After``.
Past the daemon's own deadline the connection's socket is closed at once (:func:`within`: psycopg
would otherwise spend up to ten seconds asking a server that does not answer to cancel the query);
the next statement opens a new connection (one psycopg reports in the UNKNOWN state is broken).
Every connection also has TCP keepalives and ``tcp_user_timeout`` (:func:`tcp_options`), so the
kernel gives up on a peer that stopped acknowledging.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import os
import socket
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

from hopline.budget import CEILINGS_BY_KEY, Budget
from hopline.errors import StoreBusy, StoreUnavailable
from hopline.store.postgres import aconnect

T = TypeVar("T")

STATEMENT_TIMEOUT_SETTING = CEILINGS_BY_KEY["store_statement_timeout_seconds"].name


def retry_after_of(exc: BaseException, default: float = 1.0) -> int:
    """The whole seconds a client should wait before retrying after ``exc`` (at least 1)."""
    return max(1, math.ceil(float(getattr(exc, "retry_after", default))))


def connection_lost(exc: BaseException) -> bool:
    """A failure of the connection itself (the server went away), not of the statement."""
    import psycopg

    return isinstance(exc, psycopg.OperationalError)


def is_broken(conn: Any) -> bool:
    """True for a connection no statement should use again: closed, broken, or in psycopg's UNKNOWN
    transaction state (what a connection the server dropped reports; not "in a transaction")."""
    if conn is None or conn.closed or conn.broken:
        return True
    from psycopg import pq

    return bool(conn.info.transaction_status == pq.TransactionStatus.UNKNOWN)


def session_options(*, name: str, lock_timeout: float | None = None, statement_timeout: float | None = None,
                    idle_transaction: float | None = None) -> str:
    """libpq ``options`` setting these server parameters for the connection's whole life (so a
    reconnect keeps them); ``name`` becomes its ``application_name`` (what an operator sees in
    ``pg_stat_activity``; never a session id)."""
    parts = [f"-c application_name={name.replace(' ', '_')}"]
    for key, seconds in (("lock_timeout", lock_timeout), ("statement_timeout", statement_timeout),
                         ("idle_in_transaction_session_timeout", idle_transaction)):
        if seconds is not None:
            parts.append(f"-c {key}={max(1, int(seconds * 1000))}")
    return " ".join(parts)


def tcp_options(budget: Budget) -> dict[str, Any]:
    """libpq's TCP settings for a daemon's connections: keepalives probe an idle connection, and
    ``tcp_user_timeout`` drops one whose sent data goes unacknowledged (a partition), both within
    the lease's margin; a connection attempt gives up after the request deadline (libpq counts
    whole seconds, two at least)."""
    margin = budget.owner_lease_seconds * budget.owner_lease_margin
    probe = max(1, int(margin))
    return {"keepalives": 1, "keepalives_idle": probe, "keepalives_interval": probe, "keepalives_count": 2,
            "tcp_user_timeout": max(1000, int(margin * 1000)),
            "connect_timeout": max(2, math.ceil(budget.store_request_deadline_seconds))}


async def within(seconds: float, work: Awaitable[T], hang_up: Callable[[], None], *, setting: str) -> T:
    """``work`` (statements on one connection) within ``seconds``, else :class:`StoreUnavailable`
    naming ``setting``. Past the deadline, or when the caller is cancelled, ``hang_up`` closes the
    connection's socket before ``work`` is cancelled: psycopg cancels a running query by asking the
    server (up to ten seconds against one that does not answer); a closed socket ends it at once."""
    task = asyncio.ensure_future(work)
    try:
        done, _ = await asyncio.wait({task}, timeout=seconds)
    except BaseException:
        await _abandon(task, hang_up)
        raise
    if done:
        return task.result()
    await _abandon(task, hang_up)
    raise StoreUnavailable(f"the PostgreSQL store did not answer within {seconds:g} s ({setting})")


async def awaited_within(future: asyncio.Future[T], seconds: float) -> T:
    """``future`` (a commit) awaited for ``seconds`` at most, else :class:`StoreUnavailable` naming
    the request deadline; the future itself goes on (shielded)."""
    try:
        return await asyncio.wait_for(asyncio.shield(future), seconds)
    except TimeoutError:
        raise StoreUnavailable(f"the store did not commit within {seconds:g} s "
                               "(HOPLINE_STORE_REQUEST_DEADLINE_SECONDS)") from None


async def _abandon(task: asyncio.Future[Any], hang_up: Callable[[], None]) -> None:
    if task.done():
        return
    with contextlib.suppress(Exception):
        hang_up()
    task.cancel()
    await asyncio.wait({task}, timeout=1.0)  # ends at once on a closed socket; bounded regardless
    if task.done() and not task.cancelled():
        task.exception()  # retrieved: its failure is the deadline's, said by the caller


def bounded_check(seconds: float, setting: str) -> Callable[[Any], Awaitable[None]]:
    """A connection pool's check of a connection before it is lent (a store that restarted dropped
    it), itself within ``seconds``: the pool's own check has no deadline, and a black-holed server
    never answers it."""
    from psycopg_pool import AsyncConnectionPool

    async def check(conn: Any) -> None:
        await within(seconds, AsyncConnectionPool.check_connection(conn), functools.partial(hang_up, conn),
                     setting=setting)

    return check


@contextlib.contextmanager
def sync_deadline(conn: Any, seconds: float) -> Iterator[None]:
    """A sync connection's statements within ``seconds``: past them its socket is shut down from a
    timer thread, which wakes the blocked read; the statement fails (psycopg's OperationalError)
    instead of waiting on a server that does not answer."""
    timer = threading.Timer(seconds, shut_down, (conn,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def shut_down(conn: Any) -> None:
    """Shut a connection's socket down (both ways): whatever waits on it wakes and fails."""
    with contextlib.suppress(Exception):
        fd = conn.pgconn.socket
        with socket.socket(fileno=os.dup(fd)) as sock:
            sock.shutdown(socket.SHUT_RDWR)


def hang_up(conn: Any) -> None:
    """Close a psycopg connection's socket now, without a word to the server (it may not answer)."""
    if conn is not None and not conn.closed:
        conn.pgconn.finish()


def store_errors() -> tuple[type[BaseException], ...]:
    """What a store that is away raises: ours, psycopg's (its pool's ``PoolTimeout`` among them)."""
    import psycopg

    return (StoreUnavailable, psycopg.Error)


class BoundedConnection:
    """One async connection, one statement (or one transaction) at a time, each within a deadline."""

    def __init__(self, dsn: str, *, name: str, lock_timeout: float, statement_timeout: float,
                 deadline: float | None = None, deadline_setting: str = STATEMENT_TIMEOUT_SETTING,
                 tcp: dict[str, Any] | None = None) -> None:
        """``deadline``: the daemon's own bound on each call, the wait for the connection included
        (default: the statement timeout and one second), named by ``deadline_setting`` when passed;
        ``tcp``: libpq's TCP settings (:func:`tcp_options`)."""
        self._dsn = dsn
        self._options = session_options(name=name, lock_timeout=lock_timeout,
                                        statement_timeout=statement_timeout)
        self._tcp = dict(tcp or {})
        self.lock_timeout = lock_timeout
        self.statement_timeout = statement_timeout
        self.deadline = deadline if deadline is not None else statement_timeout + 1.0
        self.deadline_setting = deadline_setting
        self._conn: Any = None
        self._lock = asyncio.Lock()

    async def run(self, work: Callable[[Any], Awaitable[T]]) -> T:
        """``work(connection)`` within the deadline (the wait for this connection included); a
        failure of the store raises :class:`StoreUnavailable` and drops the connection."""
        import psycopg

        loop = asyncio.get_running_loop()
        end = loop.time() + self.deadline
        try:
            try:
                async with asyncio.timeout_at(end):
                    await self._lock.acquire()
            except TimeoutError:
                raise StoreUnavailable(f"the PostgreSQL store did not answer within {self.deadline:g} s "
                                       f"({self.deadline_setting})") from None
            try:
                return await within(max(0.0, end - loop.time()), self._run_once_more_if_dropped(work),
                                    self._hang_up, setting=self.deadline_setting)
            except StoreUnavailable:
                await self._drop()
                raise
            finally:
                self._lock.release()
        except psycopg.errors.LockNotAvailable:
            raise StoreBusy("a row this needs is locked by another daemon's transaction",
                            self.lock_timeout) from None
        except psycopg.errors.QueryCanceled:
            raise StoreUnavailable(f"the PostgreSQL store did not finish within {self.statement_timeout:g} s "
                                   "(HOPLINE_STORE_STATEMENT_TIMEOUT_SECONDS)") from None
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(f"the PostgreSQL store could not be used ({type(exc).__name__})") from None

    async def _run_once_more_if_dropped(self, work: Callable[[Any], Awaitable[T]]) -> T:
        """``work`` on the connection; when a connection kept from before fails because the server
        dropped it meanwhile (a restart), once more on a new one, as a pool's check would: the first
        statement after a restart is not refused for a connection nobody could know was gone.
        (The statements run here are single reads or compare-and-sets of this daemon's own rows.)"""
        import psycopg

        for kept in (True, False):
            if is_broken(self._conn):
                await self._drop()
                self._conn = await aconnect(self._dsn, options=self._options, **self._tcp)
                kept = False
            try:
                return await work(self._conn)
            except psycopg.OperationalError:
                dropped = is_broken(self._conn)
                if dropped or not _idle(self._conn):
                    await self._drop()
                if not (kept and dropped):
                    raise
            except BaseException:
                if is_broken(self._conn) or not _idle(self._conn):
                    await self._drop()
                raise
        raise AssertionError("unreachable: the second attempt returns or raises")

    async def fetch(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        async def work(conn: Any) -> list[tuple[Any, ...]]:
            cursor = await conn.execute(sql, params)
            return list(await cursor.fetchall()) if cursor.description is not None else []

        return await self.run(work)

    def _hang_up(self) -> None:
        hang_up(self._conn)

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), 1.0)

    async def close(self) -> None:
        await self._drop()


def _idle(conn: Any) -> bool:
    """The connection is between transactions (a cancelled statement can leave it mid-way)."""
    if conn is None or conn.closed:
        return False
    from psycopg import pq

    return bool(conn.info.transaction_status == pq.TransactionStatus.IDLE)
