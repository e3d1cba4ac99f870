"""A PostgreSQL connection whose every wait has a deadline (SPEC X): the lease and heartbeat
connections of a daemon.

One frozen daemon must not freeze another. PostgreSQL bounds the server's side of each statement
(``lock_timeout``: a wait on a row lock, ``statement_timeout``: the whole statement), and the daemon
bounds its own wait for the answer (the statement timeout and one second more: a store that does not
answer at all, or a connection that hangs). Past any of them the statement fails as
:class:`StoreUnavailable` (or :class:`StoreBusy` for a lock another transaction holds), which the
daemon's routes answer as hopline's JSON 503 with ``Retry-After``; the connection is then dropped and
the next statement opens a new one (a connection psycopg reports in the UNKNOWN state is broken).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from hopline.store.postgres import StoreUnavailable, aconnect

T = TypeVar("T")


class StoreBusy(StoreUnavailable):
    """A row this statement needs is locked by another daemon's transaction (perhaps a frozen one,
    which PostgreSQL ends once it stays idle past ``HOPLINE_STORE_IDLE_TRANSACTION_SECONDS``)."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def retry_after_of(exc: BaseException, default: float = 1.0) -> int:
    """The whole seconds a client should wait before retrying after ``exc`` (at least 1)."""
    return max(1, math.ceil(float(getattr(exc, "retry_after", default))))


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


def store_errors() -> tuple[type[BaseException], ...]:
    """What a store that is away raises: ours, psycopg's (its pool's ``PoolTimeout`` among them)."""
    import psycopg

    return (StoreUnavailable, psycopg.Error)


class BoundedConnection:
    """One async connection, one statement (or one transaction) at a time, each within a deadline."""

    def __init__(self, dsn: str, *, name: str, lock_timeout: float, statement_timeout: float) -> None:
        self._dsn = dsn
        self._options = session_options(name=name, lock_timeout=lock_timeout,
                                        statement_timeout=statement_timeout)
        self.lock_timeout = lock_timeout
        self.statement_timeout = statement_timeout
        self.deadline = statement_timeout + 1.0
        self._conn: Any = None
        self._lock = asyncio.Lock()

    async def run(self, work: Callable[[Any], Awaitable[T]]) -> T:
        """``work(connection)`` within the deadline (the wait for this connection included); a
        failure of the store raises :class:`StoreUnavailable` and drops the connection."""
        import psycopg

        try:
            async with asyncio.timeout(self.deadline):
                async with self._lock:
                    return await self._run_once_more_if_dropped(work)
        except TimeoutError:
            await self._drop()
            raise StoreUnavailable(f"the PostgreSQL store did not answer within {self.deadline:g} s "
                                   "(HOPLINE_STORE_STATEMENT_TIMEOUT_SECONDS)") from None
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
                self._conn = await aconnect(self._dsn, options=self._options)
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
