"""The PostgreSQL store's schema and connections (SPEC X).

The schema is a list of versioned migrations, applied in order at start-up by :func:`migrate`, each
in its own transaction and recorded in ``schema_migrations``; every daemon runs it, under one
advisory lock, so two daemons starting together apply each version exactly once and a daemon that
finds them applied does nothing (idempotent). A store whose schema is newer than this daemon knows
is refused (an older daemon must not write to it).

psycopg 3, for both sides of the daemon: its async connections serve the journal and LISTEN/NOTIFY
on the event loop, its sync connections serve the sidecar index from the worker threads the
sidecar store already runs in (one driver, one error tree, one set of type adapters).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from typing import Any

from hopline.errors import StoreUnavailable
from hopline.store.idempotency import PG_MIGRATION as IDEMPOTENCY_KEYS
from hopline.store.locations import StoreSettingError

log = logging.getLogger("hopline.store")

# pg_advisory_lock keys (64-bit): fixed, so every daemon takes the same one.
MIGRATION_LOCK_KEY = 0x686F706C696E6501  # "hopline" + 1
SIDECAR_WRITE_LOCK_KEY = 0x686F706C696E6502  # serializes sidecar quota checks across daemons
EVENTS_CHANNEL = "hopline_events"  # NOTIFY payload: "<session id> <last id>", never an event

MIGRATIONS: tuple[tuple[int, str, str], ...] = (
    (1, "journal, leases, daemons, sidecar index", """
CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    agent_session_id TEXT,
    options BYTEA NOT NULL,
    created DOUBLE PRECISION NOT NULL
);
CREATE TABLE events (
    session_id TEXT NOT NULL,
    seq BIGINT NOT NULL,
    type TEXT NOT NULL,
    data BYTEA NOT NULL,
    PRIMARY KEY (session_id, seq)
);
CREATE TABLE prompts (
    session_id TEXT NOT NULL,
    prompt_id TEXT NOT NULL,
    after_seq BIGINT NOT NULL,
    PRIMARY KEY (session_id, prompt_id)
);
CREATE TABLE daemons (
    id TEXT PRIMARY KEY,
    advertise_url TEXT NOT NULL,
    started_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    heartbeat_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    stopped BOOLEAN NOT NULL DEFAULT FALSE
);
CREATE TABLE leases (
    session_id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    epoch BIGINT NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL
);
CREATE INDEX leases_owner ON leases (owner);
CREATE TABLE sidecars (
    id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    size BIGINT NOT NULL,
    sha256 TEXT NOT NULL,
    media_type TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX sidecars_session ON sidecars (session_id, sha256);
CREATE INDEX sidecars_expiry ON sidecars (expires_at);
CREATE TABLE write_tokens (
    token_sha256 TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX write_tokens_session ON write_tokens (session_id);
CREATE TABLE counters (
    name TEXT PRIMARY KEY,
    value BIGINT NOT NULL
);
"""),
    # SPEC T-3: every stored event's bytes carry a CRC-32, checked on read (NULL: written before).
    (2, "event checksums", """
ALTER TABLE events ADD COLUMN crc BIGINT;
"""),
    # A commit's run of small events of a session is one row (store/event_groups.py):
    # their bytes end to end in data, the index of their sizes and CRCs here (NULL: one event).
    (3, "event row groups", """
ALTER TABLE events ADD COLUMN parts BYTEA;
"""),
    # PostgreSQL's default pglz compression of every stored row costs most of its CPU in a relay of
    # small frames; lz4 far less. A server built without lz4 keeps pglz.
    (4, "event data compressed with lz4", """
DO $$ BEGIN
    ALTER TABLE events ALTER COLUMN data SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported THEN NULL;
END $$;
"""),
    # SPEC T-12: a keyed write's key, stored with what it created (store/idempotency.py).
    (5, "idempotency keys", IDEMPOTENCY_KEYS),
    # SPEC T-11: the cluster credential's hash, proven by every daemon before it joins (never the
    # credential itself).
    (6, "the cluster credential's hash", """
CREATE TABLE cluster_credential (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    token_sha256 TEXT NOT NULL,
    set_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
"""),
    # A sidecar expires from its session's last activity on the store's clock, never while
    # the session lives (sidecars/expiry.py); the sidecar rows' expires_at does not decide it.
    (7, "sidecar sessions' last activity", """
CREATE TABLE sidecar_sessions (
    session_id TEXT PRIMARY KEY,
    active_at DOUBLE PRECISION NOT NULL
);
"""),
)
SCHEMA_VERSION = MIGRATIONS[-1][0]


class SchemaTooNew(StoreUnavailable):
    def __init__(self, found: int) -> None:
        super().__init__(f"the store's schema is at version {found}; this hopline knows up to "
                         f"{SCHEMA_VERSION}: upgrade this daemon")
        self.found = found


# PostgreSQL 14: a column's compression method (migration 4, the writer's staging table).
OLDEST_SERVER = 140000


class ServerTooOld(StoreUnavailable):
    def __init__(self, found: int) -> None:
        super().__init__(f"the PostgreSQL server is version {found // 10000}; hopline needs "
                         f"{OLDEST_SERVER // 10000} or later (per-column compression, migration 4)")
        self.found = found


def require_supported_server(version: int) -> None:
    """Raise :class:`ServerTooOld` for a server older than ``OLDEST_SERVER`` (``server_version_num``)."""
    if version < OLDEST_SERVER:
        raise ServerTooOld(version)


def connect(dsn: str, **kwargs: Any) -> Any:
    """A sync connection (autocommit: transactions are explicit), or :class:`StoreUnavailable`."""
    import psycopg

    try:
        return psycopg.connect(dsn, autocommit=True, **kwargs)
    except psycopg.Error as exc:
        raise StoreUnavailable(f"the PostgreSQL store could not be reached ({type(exc).__name__})") from None


async def aconnect(dsn: str, **kwargs: Any) -> Any:
    """An async connection (autocommit: transactions are explicit), or :class:`StoreUnavailable`."""
    import psycopg

    try:
        return await psycopg.AsyncConnection.connect(dsn, autocommit=True, **kwargs)
    except psycopg.Error as exc:
        raise StoreUnavailable(f"the PostgreSQL store could not be reached ({type(exc).__name__})") from None


class TokenMismatch(StoreSettingError):
    """This daemon's cluster credential is not the one the store's daemons use (a bad setting)."""


def token_digest(token: str) -> str:
    """What the store keeps of the cluster credential: a digest of it, labelled (never the credential)."""
    return hashlib.sha256(b"hopline cluster credential\0" + token.encode()).hexdigest()


def prove_token(dsn: str, token: str) -> None:
    """The first daemon on a store records the cluster credential's digest; every later one must
    bring the same credential, else :class:`TokenMismatch` (its forwarded writes would all be
    refused as unauthorized, which clients would take for their own fault)."""
    digest = token_digest(token)
    with connect(dsn) as conn:
        conn.execute("INSERT INTO cluster_credential (id, token_sha256) VALUES (1, %s) "
                     "ON CONFLICT (id) DO NOTHING", (digest,))
        row = conn.execute("SELECT token_sha256 FROM cluster_credential WHERE id = 1").fetchone()
    if row is None or not hmac.compare_digest(str(row[0]), digest):
        raise TokenMismatch("HOPLINE_CLUSTER_TOKEN is not the credential the other daemons of this store use "
                            "(the store keeps a digest of theirs): set the same one on every daemon; "
                            "docs/scale-out.md says how to rotate it")


def migrate(dsn: str) -> list[int]:
    """Apply every migration the store lacks, under the advisory lock; return the versions applied
    (none when it was up to date). Raises :class:`SchemaTooNew` for a newer store and
    :class:`ServerTooOld` for a server older than 14."""
    applied: list[int] = []
    with connect(dsn) as conn:
        require_supported_server(conn.info.server_version)
        conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
        try:
            conn.execute("CREATE TABLE IF NOT EXISTS schema_migrations ("
                         "version INTEGER PRIMARY KEY, name TEXT NOT NULL, "
                         "applied_at TIMESTAMPTZ NOT NULL DEFAULT now())")
            done = {row[0] for row in conn.execute("SELECT version FROM schema_migrations").fetchall()}
            newest = max(done, default=0)
            if newest > SCHEMA_VERSION:
                raise SchemaTooNew(newest)
            for version, name, sql in MIGRATIONS:
                if version in done:
                    continue
                with conn.transaction():
                    conn.execute(sql)
                    conn.execute("INSERT INTO schema_migrations (version, name) VALUES (%s, %s)",
                                 (version, name))
                applied.append(version)
                log.info("store migration applied", extra={"version": version})
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))
    return applied
