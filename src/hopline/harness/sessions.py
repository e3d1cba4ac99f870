"""Session persistence for `hopline agent` (SPEC H-10, D-6).

One SQLite file (``sessions.sqlite3``) under the data directory holds, per session, its profile,
workspace, options, the conversation (OpenAI-shape messages) and the ordered log of every
``session/update`` sent, each stored as the exact JSON bytes of its ``update`` object. Several agent
processes may share the directory (the daemon spawns one child per session), so the database runs
in WAL mode with a busy timeout.

Paging (:func:`page_updates`) is pure: it takes encoded updates and the two bulk-replay ceilings of
the budget and returns how many fit in one answer. An update larger than the byte ceiling on its
own is never dropped: it is returned alone in its page (flagged), because dropping or refusing it
would lose history that was already accepted.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import sqlite3
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from hopline.budget import DATA_DIR_ENV
from hopline.errors import StoreError
from hopline.store.private import private_dir, private_file

DB_FILE = "sessions.sqlite3"
# Waiting for another agent process's write lock, not a payload ceiling.
_BUSY_TIMEOUT_SECONDS = 30.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    profile TEXT NOT NULL,
    cwd TEXT NOT NULL,
    options TEXT NOT NULL,
    conversation TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS updates (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    body BLOB NOT NULL,
    PRIMARY KEY (session_id, seq)
);
"""


def default_data_dir(environ: dict[str, str] | None = None) -> Path:
    """``HOPLINE_DATA_DIR``, else ``$XDG_DATA_HOME/hopline``, else ``~/.local/share/hopline``."""
    env = os.environ if environ is None else environ
    explicit = env.get(DATA_DIR_ENV, "").strip()
    if explicit:
        return Path(explicit)
    xdg = env.get("XDG_DATA_HOME", "").strip()
    base = Path(xdg) if xdg else Path.home() / ".local" / "share"
    return base / "hopline"


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclasses.dataclass
class AgentSessionRecord:
    """Our own agent's stored session: its conversation (the daemon's journal row is
    :class:`hopline.store.journal.SessionRecord`)."""

    id: str
    profile: str
    cwd: str
    options: dict[str, Any]
    conversation: list[dict[str, Any]]
    created_at: str
    updated_at: str


class SessionNotFound(StoreError, KeyError):
    pass


class SessionStore:
    """Sessions and their update logs in one SQLite file."""

    def __init__(self, data_dir: Path) -> None:
        private_dir(data_dir)
        self.path = private_file(data_dir / DB_FILE)  # 0600 before SQLite opens it (WAL, SHM alike)
        self._db = sqlite3.connect(self.path, timeout=_BUSY_TIMEOUT_SECONDS, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    # --- sessions -----------------------------------------------------------------------------

    def create(self, profile: str, cwd: str, options: dict[str, Any]) -> AgentSessionRecord:
        now = _now()
        record = AgentSessionRecord(uuid.uuid4().hex, profile, cwd, dict(options), [], now, now)
        self._db.execute(
            "INSERT INTO sessions (id, profile, cwd, options, conversation, created_at, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (record.id, profile, cwd, orjson.dumps(options).decode(), "[]", now, now),
        )
        return record

    def get(self, session_id: str) -> AgentSessionRecord:
        row = self._db.execute(
            "SELECT id, profile, cwd, options, conversation, created_at, updated_at FROM sessions"
            " WHERE id = ?",
            (session_id,),
        ).fetchone()
        if row is None:
            raise SessionNotFound(session_id)
        return AgentSessionRecord(row[0], row[1], row[2], orjson.loads(row[3]), orjson.loads(row[4]),
                             row[5], row[6])

    def save_conversation(self, session_id: str, conversation: list[dict[str, Any]]) -> None:
        self._db.execute(
            "UPDATE sessions SET conversation = ?, updated_at = ? WHERE id = ?",
            (orjson.dumps(conversation).decode(), _now(), session_id),
        )

    # --- the update log -----------------------------------------------------------------------

    def append_update(self, session_id: str, update: dict[str, Any]) -> bytes:
        """Append one update (its exact JSON bytes) to the session's log; returns those bytes."""
        body = orjson.dumps(update)
        with self._db:  # one transaction: seq allocation and insert
            self._db.execute("BEGIN IMMEDIATE")
            row = self._db.execute(
                "SELECT COALESCE(MAX(seq), -1) + 1 FROM updates WHERE session_id = ?", (session_id,)
            ).fetchone()
            self._db.execute(
                "INSERT INTO updates (session_id, seq, body) VALUES (?, ?, ?)", (session_id, row[0], body)
            )
            self._db.execute("UPDATE sessions SET updated_at = ? WHERE id = ?", (_now(), session_id))
        return body

    def update_count(self, session_id: str) -> int:
        row = self._db.execute("SELECT COUNT(*) FROM updates WHERE session_id = ?", (session_id,)).fetchone()
        return int(row[0])

    def read_updates(self, session_id: str, start: int = 0, limit: int | None = None) -> list[bytes]:
        """Encoded updates from position ``start`` (0-based), in order."""
        rows = self._db.execute(
            "SELECT body FROM updates WHERE session_id = ? AND seq >= ? ORDER BY seq LIMIT ?",
            (session_id, start, -1 if limit is None else limit),
        ).fetchall()
        return [bytes(r[0]) for r in rows]


# --- paging (pure) ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Page:
    """``count`` updates from ``start``; ``has_more`` when the log goes on after them."""

    start: int
    count: int
    encoded_bytes: int  # bytes of the JSON array of these updates
    has_more: bool
    oversized: bool = False  # one update alone, larger than the byte ceiling

    @property
    def next_start(self) -> int:
        return self.start + self.count


def array_bytes(encoded: Sequence[bytes]) -> int:
    """Bytes of ``[a,b,...]`` built from already-encoded elements (orjson writes no spaces)."""
    return 2 + sum(len(e) for e in encoded) + max(len(encoded) - 1, 0)


def page_updates(
    encoded: Sequence[bytes], start: int, *, max_updates: int, max_bytes: int, envelope_bytes: int,
    total: int | None = None,
) -> Page:
    """The longest prefix of ``encoded`` whose answer stays within both ceilings.

    ``envelope_bytes`` is what the answer adds around the updates array (keys, flags, cursor);
    ``encoded`` holds the candidates from ``start`` on (at most ``max_updates + 1`` are needed to
    know whether more follow; ``total`` says how many exist in all when known).
    """
    budget = max_bytes - envelope_bytes - 2  # the array's brackets
    used = 0
    count = 0
    for item in encoded[:max_updates]:
        cost = len(item) + (1 if count else 0)
        if used + cost > budget:
            break
        used += cost
        count += 1
    oversized = False
    if count == 0 and encoded and max_updates > 0:
        # Never drop an update: one larger than the ceiling goes alone in its own page.
        count = 1
        used = len(encoded[0])
        oversized = True
    remaining = (total - start) if total is not None else len(encoded)
    return Page(start=start, count=count, encoded_bytes=used + 2, has_more=remaining > count,
                oversized=oversized)


def join_array(encoded: Sequence[bytes]) -> bytes:
    return b"[" + b",".join(encoded) + b"]"
