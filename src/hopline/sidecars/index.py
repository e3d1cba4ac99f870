"""The sidecar index's connection (SPEC S-2, X): SQLite in the store's root, or the PostgreSQL
store's tables when several daemons share one. One SQL text for both (``?`` placeholders), one
thread lock, and the write transaction that holds the index's write lock across processes."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import types
from pathlib import Path
from typing import Any

from hopline.sidecars.expiry import SESSIONS_SCHEMA
from hopline.store.private import private_dir, private_file

INDEX_FILE = "sidecars.sqlite3"  # the SQLite index, in the store's root

INDEX_SCHEMA = """
CREATE TABLE IF NOT EXISTS sidecars (
    id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    size INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    media_type TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS sidecars_session ON sidecars (session_id, sha256);
CREATE INDEX IF NOT EXISTS sidecars_expiry ON sidecars (expires_at);
CREATE TABLE IF NOT EXISTS write_tokens (
    token_sha256 TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS write_tokens_session ON write_tokens (session_id);
CREATE TABLE IF NOT EXISTS counters (
    name TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
""" + SESSIONS_SCHEMA


class SidecarIndex:
    """The index's one connection, safe for the threads of one daemon process."""

    def __init__(self, root: Path, *, dsn: str | None, statement_timeout_seconds: float,
                 durable: bool = True, deadline_seconds: float | None = None) -> None:
        self.lock = threading.RLock()
        self.dsn = dsn
        self.db: Any
        if dsn is None:
            db_path = root / INDEX_FILE
            private_dir(root)
            private_file(db_path)  # 0600 before SQLite opens it: its WAL and SHM take its mode
            self.db = sqlite3.connect(db_path, check_same_thread=False, isolation_level=None,
                                      timeout=30.0)
            self.db.execute("PRAGMA journal_mode=WAL")
            # FULL: a sidecar an event points to survives a power loss (HOPLINE_STORE_SYNC)
            self.db.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
            self.db.executescript(INDEX_SCHEMA)
            self.errors: tuple[type[Exception], ...] = (sqlite3.Error,)
        else:
            import psycopg

            from hopline.store.index import PgIndex

            # The schema is the store's migrations (hopline.store.postgres); a pool that reconnects.
            self.db = PgIndex(dsn, statement_timeout=statement_timeout_seconds, deadline=deadline_seconds)
            self.errors = (psycopg.Error,)

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        with self.lock:
            if self.dsn is None:
                return self.db.execute(sql, params)
            return self.db.execute(sql.replace("?", "%s"), params)

    def in_transaction(self) -> bool:
        return bool(self.db.in_transaction)

    def transaction(self) -> IndexTransaction:
        return IndexTransaction(self)

    def close(self) -> None:
        with self.lock:
            self.db.close()


class IndexTransaction:
    """The index's write transaction: holds the thread lock and the store's write lock (SQLite:
    ``BEGIN IMMEDIATE``; PostgreSQL: one advisory transaction lock shared by every daemon)."""

    def __init__(self, index: SidecarIndex) -> None:
        self.index = index
        self._pg: contextlib.ExitStack | None = None

    def __enter__(self) -> None:
        self.index.lock.acquire()
        try:
            if self.index.dsn is None:
                self.index.execute("BEGIN IMMEDIATE")
            else:
                from hopline.store.postgres import SIDECAR_WRITE_LOCK_KEY

                with contextlib.ExitStack() as stack:
                    stack.enter_context(self.index.db.transaction())
                    self.index.execute("SELECT pg_advisory_xact_lock(?)", (SIDECAR_WRITE_LOCK_KEY,))
                    self._pg = stack.pop_all()
        except BaseException:
            if self.index.dsn is None and self.index.in_transaction():
                self.index.execute("ROLLBACK")
            self.index.lock.release()
            raise

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: types.TracebackType | None) -> None:
        if self._pg is not None:  # PostgreSQL: the index's transaction commits or rolls back itself
            pg, self._pg = self._pg, None
            try:
                pg.__exit__(exc_type, exc, tb)
            finally:
                self.index.lock.release()
            return
        try:
            if exc_type is not None:
                if self.index.in_transaction():
                    self.index.execute("ROLLBACK")
                return
            try:
                self.index.execute("COMMIT")
            except self.index.errors:
                if self.index.in_transaction():
                    self.index.execute("ROLLBACK")
                raise
        finally:
            self.index.lock.release()
