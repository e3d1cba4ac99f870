"""Idempotency keys in the store (SPEC T-12): a keyed write's key, stored in the same transaction as
what the write created, with the answer its retries get.

One row per key: the request's fingerprint (a SHA-256 of its route and body: a retry must be the
same request), the session it concerns, the answer (status and JSON body), when it expires, and a
CRC-32 over all of it, checked on every read (T-3). The stored keys are counted in the ``counters``
row ``idempotency_keys``, moved in the same transaction as every insert and delete, so the
daemon reads the count with the key instead of counting a table of up to a million rows.

The SQL is written once, for SQLite's ``?`` parameters; PostgreSQL's run it with ``%s``
(:func:`_pg`). The SQLite journal calls the functions with ``sqlite3`` connections in its writer and
reader threads, the PostgreSQL journal the ``a``-prefixed ones with psycopg's async connections.
A key's row goes with its session (``forget_session``): a write retried after its session was
deleted finds no session, and runs nothing.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Any

from hopline.errors import KeyRecordDamaged, KeyTaken
from hopline.store.integrity import checksum

COUNTER = "idempotency_keys"

SQLITE_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS idempotency_keys (
    key TEXT PRIMARY KEY,
    fingerprint BLOB NOT NULL,
    session_id TEXT NOT NULL,
    status INTEGER NOT NULL,
    answer BLOB NOT NULL,
    expires_at REAL NOT NULL,
    crc INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS idempotency_keys_expiry ON idempotency_keys (expires_at);
CREATE INDEX IF NOT EXISTS idempotency_keys_session ON idempotency_keys (session_id);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO counters (name, value) VALUES ('{COUNTER}', 0);
"""

# PostgreSQL's migration 5 (store/postgres.py); its counters table is migration 1's.
PG_MIGRATION = f"""
CREATE TABLE idempotency_keys (
    key TEXT PRIMARY KEY,
    fingerprint BYTEA NOT NULL,
    session_id TEXT NOT NULL,
    status INTEGER NOT NULL,
    answer BYTEA NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL,
    crc BIGINT NOT NULL
);
CREATE INDEX idempotency_keys_expiry ON idempotency_keys (expires_at);
CREATE INDEX idempotency_keys_session ON idempotency_keys (session_id);
INSERT INTO counters (name, value) VALUES ('{COUNTER}', 0) ON CONFLICT (name) DO NOTHING;
"""

_COLUMNS = "key, fingerprint, session_id, status, answer, expires_at, crc"
_FIND = (f"SELECT {_COLUMNS}, (SELECT value FROM counters WHERE name = '{COUNTER}') FROM "
         f"(SELECT 1) AS one LEFT JOIN idempotency_keys ON key = ? AND expires_at > ?")
_DROP_EXPIRED = "DELETE FROM idempotency_keys WHERE key = ? AND expires_at <= ?"
_INSERT = (f"INSERT INTO idempotency_keys ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?) "
           "ON CONFLICT (key) DO NOTHING")
_COUNT = f"UPDATE counters SET value = value + ? WHERE name = '{COUNTER}'"
_PURGE = "DELETE FROM idempotency_keys WHERE expires_at <= ?"
_FORGET = "DELETE FROM idempotency_keys WHERE session_id = ?"


@dataclasses.dataclass(frozen=True, slots=True)
class KeyRecord:
    """A keyed write's row: ``fingerprint`` the request's SHA-256, ``answer`` the JSON body its
    retries get with ``status``; ``stored_at`` the time of the write (an expired row of the same key
    is replaced then), ``expires_at`` when a retry no longer finds it."""

    key: str
    fingerprint: bytes
    session_id: str
    status: int
    answer: bytes
    stored_at: float
    expires_at: float

    def crc(self) -> int:
        head = struct.pack("!HId", len(self.key.encode()), self.status, self.expires_at)
        return checksum(b"\0".join((head, self.key.encode(), self.fingerprint, self.session_id.encode(),
                                    self.answer)))

    def row(self) -> tuple[Any, ...]:
        return (self.key, self.fingerprint, self.session_id, self.status, self.answer, self.expires_at,
                self.crc())


@dataclasses.dataclass(frozen=True, slots=True)
class FoundKey:
    """What a keyed write reads first: the live row of its key (None: none), and the keys stored."""

    record: KeyRecord | None
    stored: int


def _found(row: tuple[Any, ...] | None) -> FoundKey:
    if row is None:  # no counters row: a store this hopline did not set up, read as empty
        return FoundKey(None, 0)
    stored = int(row[7] or 0)
    if row[0] is None:
        return FoundKey(None, stored)
    try:
        if not all(isinstance(row[i], bytes | memoryview) for i in (1, 4)):
            raise TypeError("a blob column holds another type")
        record = KeyRecord(str(row[0]), bytes(row[1]), str(row[2]), int(row[3]), bytes(row[4]), 0.0,
                           float(row[5]))
        whole = record.crc() == int(row[6])
    except (TypeError, ValueError):
        whole = False
    if not whole:
        raise KeyRecordDamaged()
    return FoundKey(record, stored)


def _pg(sql: str) -> str:
    return sql.replace("?", "%s")


# --- SQLite (sqlite3, in the journal's writer and reader threads) ---------------------------------

def find(db: Any, key: str, now: float) -> FoundKey:
    return _found(db.execute(_FIND, (key, now)).fetchone())


def store(db: Any, record: KeyRecord, *, strict: bool) -> None:
    """Insert ``record`` in the caller's transaction (an expired row of its key is replaced). When the
    key is live already: :class:`KeyTaken` with ``strict`` (the transaction must not commit what the
    write created), else nothing (an event commit is not failed for it)."""
    dropped = db.execute(_DROP_EXPIRED, (record.key, record.stored_at)).rowcount
    inserted = db.execute(_INSERT, record.row()).rowcount
    if inserted != 1 and strict:
        raise KeyTaken()
    if inserted - dropped:
        db.execute(_COUNT, (inserted - dropped,))


def purge(db: Any, now: float) -> int:
    """Delete the expired keys; how many."""
    deleted = int(db.execute(_PURGE, (now,)).rowcount)
    if deleted:
        db.execute(_COUNT, (-deleted,))
    return deleted


def forget_session(db: Any, session_id: str) -> None:
    deleted = db.execute(_FORGET, (session_id,)).rowcount
    if deleted:
        db.execute(_COUNT, (-deleted,))


# --- PostgreSQL (psycopg's async connections) ------------------------------------------------------

async def afind(conn: Any, key: str, now: float) -> FoundKey:
    cursor = await conn.execute(_pg(_FIND), (key, now))
    return _found(await cursor.fetchone())


async def astore(conn: Any, record: KeyRecord, *, strict: bool) -> None:
    dropped = (await conn.execute(_pg(_DROP_EXPIRED), (record.key, record.stored_at))).rowcount
    inserted = (await conn.execute(_pg(_INSERT), record.row())).rowcount
    if inserted != 1 and strict:
        raise KeyTaken()
    if inserted - dropped:
        await conn.execute(_pg(_COUNT), (inserted - dropped,))


async def apurge(conn: Any, now: float) -> int:
    deleted = int((await conn.execute(_pg(_PURGE), (now,))).rowcount)
    if deleted:
        await conn.execute(_pg(_COUNT), (-deleted,))
    return deleted


async def aforget_session(conn: Any, session_id: str) -> None:
    deleted = (await conn.execute(_pg(_FORGET), (session_id,))).rowcount
    if deleted:
        await conn.execute(_pg(_COUNT), (-deleted,))
