"""The session journal (SPEC D-5): every session event is stored before it is published.

:class:`EventJournal` is the interface the daemon needs of its store (sessions, open prompts,
events); the bus and the session manager speak only to it. ``daemon.sqlite_journal`` implements it
on one SQLite file (a writer thread with group commit, reads on their own connection); the
scale-out issue adds a PostgreSQL implementation of exactly this interface.

:class:`Journal` below is the synchronous SQLite journal this interface replaces; it goes when
``daemon.sqlite_journal`` lands.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sqlite3
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import orjson

from hopline.vocabulary import TURN_END_TYPES

JOURNAL_FILE = "journal.sqlite3"
# Storage layout, not a limit. Events are up to MiBs: 32 KiB pages (set before the first table is
# created, so new files only), measured in isolation against the 4 KiB default: a 1 MiB insert
# ~4.3 -> ~3.2 ms, a batch of 1 KiB inserts ~0.017 -> ~0.005 ms per row, a 64 KiB insert unchanged
# (64 KiB pages were worse there: a 64 KiB row spills into a second page). wal_autocheckpoint stays
# at its default of 1000 pages (32 MiB of WAL with these pages): a higher value only looked faster
# while no checkpoint ran at all.
PAGE_SIZE_BYTES = 32 * 1024

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    agent_session_id TEXT,
    options BLOB NOT NULL,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    type TEXT NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS prompts (
    session_id TEXT NOT NULL,
    prompt_id TEXT NOT NULL,
    after_seq INTEGER NOT NULL,
    PRIMARY KEY (session_id, prompt_id)
) WITHOUT ROWID;
"""


@dataclasses.dataclass(frozen=True)
class SessionRecord:
    id: str
    agent_session_id: str | None
    options: dict[str, Any]
    created: float


@dataclasses.dataclass(frozen=True)
class JournalRow:
    seq: int
    type: str
    data: bytes  # the event's JSON, exactly as published


class EventJournal(Protocol):
    """What the daemon needs of its store. Every method that touches storage is ``async`` (or
    returns an awaitable): an implementation never blocks the event loop on I/O.

    **Order.** Writes (sessions, prompts, event commits) are applied in the order they are called:
    each is queued behind every write called before it, whatever the method. A read sees every
    write whose awaitable has resolved (and may see later ones).

    **Event ids** are per session, increasing from 1, and allocated by the journal alone, at
    :meth:`stage`, synchronously, in call order. :meth:`next_id` tells the id the next staged event
    of a session gets, without allocating it (the bus sizes an event's SSE form with it before
    staging). Both work on an *open* session only: one this journal created
    (:meth:`create_session`) or returned from :meth:`get_session` (which loads the session's last
    id), and not deleted since; on any other they raise ``LookupError``.

    **Commit.** :meth:`commit` hands every event staged so far, of every session, to the writer
    and returns a future resolved once they are durable (group commit: an implementation may join
    several commits in one transaction; a transaction is all or nothing). Futures resolve in call
    order. A failed transaction writes none of its events, and every commit in it gets the
    exception; its ids are given out again to the next staged events of a session when nothing was
    staged after them, else they stay a gap (ids never go back: always increasing, not always
    consecutive).

    **Close.** :meth:`close` commits what is staged, waits for every queued write, then releases
    the storage; nothing may be called after it.

    An implementation subclasses this protocol (it inherits :meth:`append_many`) and is checked
    against it by mypy.
    """

    # --- sessions -------------------------------------------------------------------------------

    async def create_session(self, session_id: str, options: dict[str, Any]) -> None:
        """Store a new session (no agent session id yet); it is open, its last id is 0.
        Raises when the id exists."""
        ...

    async def get_session(self, session_id: str) -> SessionRecord | None:
        """The stored session, or None. A returned session is open (its last id loaded)."""
        ...

    async def set_agent_session_id(self, session_id: str, agent_session_id: str) -> None:
        """Record the agent's id for the session (what a later ``session/load`` asks for)."""
        ...

    async def delete_session(self, session_id: str) -> None:
        """Remove the session, its events and its prompts in one transaction; what was staged
        for it and not committed is dropped. The session is no longer open."""
        ...

    async def list_sessions(self) -> list[SessionRecord]:
        """Every stored session, oldest first."""
        ...

    # --- prompts: accepted and not yet ended (a restart ends them, D-8) -------------------------

    async def open_prompt(self, session_id: str, prompt_id: str) -> None:
        """Record an accepted prompt, after the session's events committed so far, until
        :meth:`close_prompt`. Durable when the call returns (the daemon answers 202 after it)."""
        ...

    async def close_prompt(self, session_id: str, prompt_id: str) -> None:
        """The prompt's turn ended (its end event was committed before, by the write order)."""
        ...

    async def unended_prompts(self) -> list[tuple[str, str]]:
        """(session id, prompt id) of every open prompt with no turn end (``TURN_END_TYPES`` with
        its ``promptId``) journaled after it, by session then age. Open prompts that did end are
        closed on the way."""
        ...

    # --- events ---------------------------------------------------------------------------------

    def next_id(self, session_id: str) -> int:
        """The id the session's next staged event gets; allocates nothing, touches no storage."""
        ...

    def stage(self, session_id: str, event_type: str, data: bytes) -> int:
        """Allocate the session's next id to ``(event_type, data)`` and hold the event for the next
        :meth:`commit`; touches no storage. ``data`` is the event's JSON, stored as given."""
        ...

    def commit(self) -> asyncio.Future[None]:
        """Hand every staged event to the writer; the future resolves once all of them are durable
        (with nothing staged: once every earlier commit has resolved), or fails with the error of
        their transaction. Call it on the event loop; the future belongs to that loop."""
        ...

    async def append_many(self, session_id: str, events: Sequence[tuple[str, bytes]]) -> list[int]:
        """Stage ``(type, data)`` events of one session and commit; return their ids, in order,
        once they are durable (with whatever else was staged before)."""
        seqs = [self.stage(session_id, event_type, data) for event_type, data in events]
        await self.commit()
        return seqs

    async def read_page(self, session_id: str, after: int, *, upto: int | None = None,
                        max_bytes: int) -> list[JournalRow]:
        """Committed events with ``after < id <= upto`` (``upto`` None: the last committed), in id
        order, until their ``data`` bytes pass ``max_bytes``. At least one row when one exists, so
        a single event larger than ``max_bytes`` still makes progress."""
        ...

    async def last_id(self, session_id: str) -> int:
        """The id of the session's last committed event (0 for none or an unknown session)."""
        ...

    async def count(self, session_id: str, event_type: str) -> int:
        """How many committed events of the session have this type."""
        ...

    async def close(self) -> None:
        ...


class Journal:
    def __init__(self, data_dir: Path, *, path: Path | None = None) -> None:
        """``path``: the journal file (``HOPLINE_STORE_URL=sqlite:///PATH``); default: under ``data_dir``."""
        self.path = path if path is not None else data_dir / JOURNAL_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute(f"PRAGMA page_size={PAGE_SIZE_BYTES}")  # no effect on an existing WAL file
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self._last: dict[str, int] = {}  # last committed id per session
        self._allocated: dict[str, int] = {}  # last id given to a staged event, per session
        self._staged: list[tuple[str, int, str, bytes]] = []  # (session id, id, type, data)

    def close(self) -> None:
        self._db.close()

    # --- sessions -------------------------------------------------------------------------------

    def create_session(self, session_id: str, options: dict[str, Any]) -> None:
        self._db.execute("INSERT INTO sessions (id, agent_session_id, options, created) "
                         "VALUES (?, NULL, ?, ?)", (session_id, orjson.dumps(options), time.time()))
        self._last[session_id] = 0

    def set_agent_session_id(self, session_id: str, agent_session_id: str) -> None:
        self._db.execute("UPDATE sessions SET agent_session_id = ? WHERE id = ?",
                         (agent_session_id, session_id))

    def get_session(self, session_id: str) -> SessionRecord | None:
        row = self._db.execute("SELECT id, agent_session_id, options, created FROM sessions WHERE id = ?",
                               (session_id,)).fetchone()
        if row is None:
            return None
        return SessionRecord(row[0], row[1], orjson.loads(row[2]), row[3])

    def delete_session(self, session_id: str) -> None:
        with self._db:
            self._db.execute("BEGIN")
            self._db.execute("DELETE FROM events WHERE session_id = ?", (session_id,))
            self._db.execute("DELETE FROM prompts WHERE session_id = ?", (session_id,))
            self._db.execute("DELETE FROM sessions WHERE id = ?", (session_id,))
        self._last.pop(session_id, None)
        self._allocated.pop(session_id, None)
        self._staged = [row for row in self._staged if row[0] != session_id]

    # --- prompts: accepted and not yet ended (a restart ends them, D-8) -------------------------

    def open_prompt(self, session_id: str, prompt_id: str) -> None:
        """Record an accepted prompt (before the client hears of it) until :meth:`close_prompt`."""
        self._db.execute("INSERT OR REPLACE INTO prompts (session_id, prompt_id, after_seq) VALUES (?, ?, ?)",
                         (session_id, prompt_id, self.last_id(session_id)))

    def close_prompt(self, session_id: str, prompt_id: str) -> None:
        self._db.execute("DELETE FROM prompts WHERE session_id = ? AND prompt_id = ?",
                         (session_id, prompt_id))

    def unended_prompts(self) -> list[tuple[str, str]]:
        """(session id, prompt id) of every open prompt with no turn end journaled after it."""
        out: list[tuple[str, str]] = []
        rows = self._db.execute(
            "SELECT session_id, prompt_id, after_seq FROM prompts ORDER BY session_id, after_seq").fetchall()
        for session_id, prompt_id, after in rows:
            ended = False
            for (data,) in self._db.execute(
                    "SELECT data FROM events WHERE session_id = ? AND seq > ? AND type IN (?, ?)",
                    (session_id, after, *TURN_END_TYPES)):
                with contextlib.suppress(orjson.JSONDecodeError):
                    if orjson.loads(data).get("promptId") == prompt_id:
                        ended = True
                        break
            if ended:
                self.close_prompt(session_id, prompt_id)
            else:
                out.append((str(session_id), str(prompt_id)))
        return out

    # --- events ---------------------------------------------------------------------------------

    def last_id(self, session_id: str) -> int:
        """The id of the session's last committed event (0 for none)."""
        last = self._last.get(session_id)
        if last is None:
            row = self._db.execute("SELECT MAX(seq) FROM events WHERE session_id = ?",
                                   (session_id,)).fetchone()
            last = int(row[0] or 0)
            self._last[session_id] = last
        return last

    def next_id(self, session_id: str) -> int:
        """The id the session's next staged event gets (nothing is allocated)."""
        return self._allocated.get(session_id, self.last_id(session_id)) + 1

    def stage(self, session_id: str, event_type: str, data: bytes) -> int:
        """Allocate the session's next id to an event and hold it until :meth:`commit`."""
        seq = self.next_id(session_id)
        self._allocated[session_id] = seq
        self._staged.append((session_id, seq, event_type, data))
        return seq

    def commit(self) -> None:
        """Write every staged event in ONE transaction. All of them are on disk when this returns,
        or none, and then their ids are released (the next staged event reuses them)."""
        rows, self._staged = self._staged, []
        self._allocated.clear()
        if not rows:
            return
        self._write(rows)
        for session_id, seq, _, _ in rows:
            self._last[session_id] = seq

    def _write(self, rows: Sequence[tuple[str, int, str, bytes]]) -> None:
        self._db.execute("BEGIN")
        try:
            self._db.executemany("INSERT INTO events (session_id, seq, type, data) VALUES (?, ?, ?, ?)", rows)
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    def append(self, session_id: str, event_type: str, data: bytes) -> int:
        """Write one event (with anything staged before it); return its id. Committed on return."""
        seq = self.stage(session_id, event_type, data)
        self.commit()
        return seq

    def append_many(self, session_id: str, events: Sequence[tuple[str, bytes]]) -> list[int]:
        """Write ``(type, data)`` events in ONE transaction; return their ids, in order. All of them
        are committed before returning, or none (the ids are then not consumed)."""
        seqs = [self.stage(session_id, event_type, data) for event_type, data in events]
        self.commit()
        return seqs

    def count(self, session_id: str, event_type: str) -> int:
        row = self._db.execute("SELECT COUNT(*) FROM events WHERE session_id = ? AND type = ?",
                               (session_id, event_type)).fetchone()
        return int(row[0])

    def read_page(self, session_id: str, after: int, *, upto: int | None = None,
                  max_bytes: int) -> list[JournalRow]:
        """Events with ``after < id <= upto``, in order, until their bytes pass ``max_bytes``.

        At least one row is returned when one exists, so a single event larger than ``max_bytes``
        still makes progress; the caller decides what to do with it.
        """
        rows: list[JournalRow] = []
        total = 0
        for row in self._iter(session_id, after, upto):
            if rows and total + len(row.data) > max_bytes:
                break
            rows.append(row)
            total += len(row.data)
        return rows

    def _iter(self, session_id: str, after: int, upto: int | None) -> Iterator[JournalRow]:
        bound = upto if upto is not None else self.last_id(session_id)
        cursor = self._db.execute(
            "SELECT seq, type, data FROM events WHERE session_id = ? AND seq > ? AND seq <= ? ORDER BY seq",
            (session_id, after, bound))
        try:
            for seq, event_type, data in cursor:
                yield JournalRow(int(seq), str(event_type), bytes(data))
        finally:
            cursor.close()
