"""The sidecar index's PostgreSQL connections (SPEC X): a small psycopg pool that survives a
restart of the store.

One connection held for good would never recover: after ``pg_ctl restart`` psycopg reports that
connection's state as UNKNOWN, which reads as "in a transaction", so every later statement would
fail on every daemon. So each statement borrows a connection from a pool whose ``check``
callback tries it first (a dead one is replaced, not used); a transaction keeps one connection
from its ``BEGIN`` to its end, and a connection that broke inside one is discarded with it (the
transaction failed: nothing of it is retried on another connection). The outage is the only loss.

Sync connections: the sidecar store runs in the worker threads of one daemon.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator
from typing import Any

from hopline.errors import StoreUnavailable
from hopline.store.bounded import session_options, sync_deadline

INDEX_POOL_SIZE = 2  # one statement or transaction at a time (the store's lock), one spare


class PgIndex:
    def __init__(self, dsn: str, *, statement_timeout: float, name: str = "hopline sidecar index",
                 deadline: float | None = None) -> None:
        """``deadline``: the daemon's own bound on each statement (default: the statement timeout
        and a second), its socket shut down past it: a black-holed server never answers."""
        import psycopg
        from psycopg_pool import ConnectionPool

        options = session_options(name=name, statement_timeout=statement_timeout)
        self.deadline = deadline if deadline is not None else statement_timeout + 1.0
        self._pool = ConnectionPool(dsn, min_size=1, max_size=INDEX_POOL_SIZE, open=False,
                                    kwargs={"autocommit": True, "options": options,
                                            "connect_timeout": max(2, math.ceil(self.deadline))},
                                    check=self._check, timeout=statement_timeout + 1.0)
        try:
            self._pool.open(wait=True, timeout=statement_timeout + 1.0)
        except psycopg.Error as exc:
            self._pool.close()
            raise StoreUnavailable("the PostgreSQL store could not be reached "
                                   f"({type(exc).__name__})") from None
        self._local = threading.local()  # the connection of this thread's open transaction

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        """One statement (``%s`` placeholders): on the open transaction's connection, else on a
        checked connection from the pool. The cursor's rows are read already (client-side)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            with sync_deadline(conn, self.deadline):
                return conn.execute(sql, params)
        with self._pool.connection() as conn, sync_deadline(conn, self.deadline):
            return conn.execute(sql, params)

    def _check(self, conn: Any) -> None:
        """The pool's check of a connection before it is lent, within the deadline."""
        from psycopg_pool import ConnectionPool

        with sync_deadline(conn, self.deadline):
            ConnectionPool.check_connection(conn)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """BEGIN ... COMMIT on one connection (ROLLBACK on an exception; a broken connection is
        dropped by the pool when it comes back)."""
        with self._pool.connection() as conn:
            with sync_deadline(conn, self.deadline):  # each statement its own deadline, not the whole
                conn.execute("BEGIN")
            self._local.conn = conn
            try:
                yield
            except BaseException:
                self._local.conn = None
                with contextlib.suppress(Exception), sync_deadline(conn, self.deadline):
                    conn.execute("ROLLBACK")
                raise
            self._local.conn = None
            with sync_deadline(conn, self.deadline):
                conn.execute("COMMIT")

    def now(self) -> float:
        """The store's clock (``now()``, seconds since the epoch): the one clock of a shared index,
        whatever each daemon's own says."""
        row = self.execute("SELECT EXTRACT(EPOCH FROM now())::float8").fetchone()
        return float(row[0])

    @property
    def in_transaction(self) -> bool:
        return getattr(self._local, "conn", None) is not None

    def close(self) -> None:
        self._pool.close()
