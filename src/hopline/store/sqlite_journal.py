"""The SQLite :class:`~hopline.store.journal.EventJournal`: one writer thread, group commit.

One SQLite file under the daemon's data directory, WAL mode, durable when acknowledged (the writer
thread and ``HOPLINE_STORE_SYNC``: :mod:`hopline.store.sqlite_writer`). An event's data larger than
``INLINE_MAX_BYTES`` (a few hundred bytes) is appended to its session's segment file
(``journal.segments/``, one append-only file per session) and its row holds the offset and size (a
commit's run of small such events shares ONE row, ``store/event_groups.py``; reads expand it):
SQLite writes a blob twice (WAL, then the checkpoint) and slowly (a 1 KiB row costs a whole page
rewrite per commit), a file append once; reads take a run of
contiguous small events in one ``pread``. Every write that touches a session also appends one
self-describing record to its segment file (its events, small ones included, or a prompt opened
or closed: :mod:`hopline.store.records`) and moves the session's ``segment_end`` in the same
transaction: a journal that lost its last commits gets them back from the records at its next
start (:mod:`hopline.store.recovery`), and ids continue past every id any row, record or recorded
gap holds. A session's segment file goes with the session.

Reads run on their own connection (WAL lets them read while the writer writes) in one reader
thread, never on the event loop. Ids are allocated on the event loop, in memory (see the
interface); the writer only stores them.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import orjson

from hopline.store import event_groups as groups
from hopline.store import idempotency as keys
from hopline.store import records
from hopline.store.idempotency import FoundKey, KeyRecord
from hopline.store.integrity import ROW_UNREADABLE, checksum
from hopline.store.journal import (
    EventJournal,
    JournalRow,
    SessionRecord,
    StagedIds,
    StagedRow,
    prompt_id_of,
)
from hopline.store.locations import JOURNAL_FILE, SEGMENTS_DIR, SYNC_FULL, journal_quarantine
from hopline.store.private import private_dir, private_file
from hopline.store.recovery import LOST_EVENTS_SCHEMA, Recovery, last_known_id, recorded_gaps, recover
from hopline.store.segments import SegmentWriter, read_rows
from hopline.store.sqlite_writer import SqliteWriter
from hopline.vocabulary import TURN_END_TYPES

log = logging.getLogger("hopline.store")

# Storage layout, not a limit (new files only: a journal made with other pages keeps them). Data
# over INLINE_MAX_BYTES lives in segment files, so a row is a key and a few integers, and a commit
# writes each page it dirtied whole to the WAL: small pages keep that rewrite small.
PAGE_SIZE_BYTES = 4 * 1024
# Storage layout, not a limit: larger event data goes to the session's segment file (each session's
# in one writev per transaction): inline, every commit would rewrite the pages holding the data
# whole, writing several times the data's bytes to the WAL and costing the writer thread (which
# shares the cores with the event loop) CPU per row. Small control events and word deltas stay in
# their rows.
INLINE_MAX_BYTES = 256
# Storage layout, not a limit: each connection's page cache (the writer's, the reader's). Writes go to
# the right edges of the tables' trees and reads to recent pages, behind the kernel's own cache;
# SQLite's default (2 MiB a connection) filled as the journal grew and stayed: about 80 bytes of RSS
# per prompt over 20,000 echo prompts (bench/memory.py), never given back.
CACHE_BYTES = 256 * 1024
ROW_FIXED_BYTES = 48  # an estimate for the WAL's growth: a row's seq, type, pointer, CRC and header
# A query's work, not a payload ceiling: the ids one page looks up one by one past a damaged page.
PROBE_MAX_IDS = 4096

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    agent_session_id TEXT,
    options BLOB NOT NULL,
    created REAL NOT NULL,
    segment_end INTEGER
);
CREATE TABLE IF NOT EXISTS events (
    session_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    type TEXT NOT NULL,
    data BLOB NOT NULL,
    ext_offset INTEGER,
    ext_bytes INTEGER,
    crc INTEGER,
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS prompts (
    session_id TEXT NOT NULL,
    prompt_id TEXT NOT NULL,
    after_seq INTEGER NOT NULL,
    PRIMARY KEY (session_id, prompt_id)
) WITHOUT ROWID;
""" + LOST_EVENTS_SCHEMA + keys.SQLITE_SCHEMA

JOURNAL_SCHEMA = _SCHEMA  # what `hopline store check --repair` makes a new journal with
_INSERT_EVENTS = "INSERT INTO events (session_id, seq, type, data, ext_offset, ext_bytes, crc) VALUES "
# Rows per INSERT: one statement is one sqlite3_step, one release of the GIL by the writer (executemany
# releases it per row, passing the GIL back and forth with the loop). 7 parameters a row, under 32766.
ROWS_PER_INSERT = 512
_EVENT_COLUMNS = "seq, type, data, ext_offset, ext_bytes, crc"

T = TypeVar("T")


class SqliteJournal(StagedIds, EventJournal):
    def __init__(self, data_dir: Path, *, path: Path | None = None, sync: str = SYNC_FULL) -> None:
        """``path``: the journal file (``HOPLINE_STORE_URL=sqlite:///PATH``); default: under
        ``data_dir``. ``sync``: ``HOPLINE_STORE_SYNC`` (``full``, or ``normal``)."""
        self.path = path if path is not None else data_dir / JOURNAL_FILE
        self.segments_dir = self.path.parent / SEGMENTS_DIR  # beside the journal file, wherever it is
        private_dir(self.path.parent, tighten=path is None)  # the data dir is ours; a named one's parent not
        private_file(self.path)  # 0600 before SQLite opens it: its WAL and SHM take the file's mode
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        db.execute(f"PRAGMA page_size={PAGE_SIZE_BYTES}")  # no effect on an existing WAL file
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA cache_size=-{CACHE_BYTES // 1024}")
        db.executescript(_SCHEMA)
        groups.claim_format(db, self.path)  # a newer hopline's journal is refused
        _add_columns(db, "events", ("ext_offset", "ext_bytes", "crc"))  # from before segments, checksums
        _add_columns(db, "sessions", ("segment_end",))  # from before segment records
        # What a lost commit left in the segment files, restored before anything is written.
        self.recovery = recover(db, self.segments_dir, quarantine=journal_quarantine(self.path))
        _log_recovery(self.recovery)
        self._segments = SegmentWriter(self.segments_dir)
        self._writer = SqliteWriter(db, self._segments, durable=sync == SYNC_FULL)
        self._reader_db: sqlite3.Connection | None = None
        self._reads = ThreadPoolExecutor(1, thread_name_prefix="hopline-journal-reader",
                                         initializer=self._open_reader)
        # Event loop only: the last committed id and the last allocated id of each open session.
        self._last: dict[str, int] = {}
        self._allocated: dict[str, int] = {}
        self._staged: list[StagedRow] = []
        self._closed = False

    @property
    def transactions(self) -> int:
        """Transactions the writer committed (group commit: fewer than the commits)."""
        return self._writer.transactions

    @property
    def checkpoints(self) -> int:
        return self._writer.checkpoints

    def submit_write(self, apply: Callable[[sqlite3.Connection], T], *,
                     settled: Callable[[BaseException | None], None] | None = None) -> asyncio.Future[T]:
        """Queue ``apply`` for the writer thread, the journal's one write path (see
        :meth:`SqliteWriter.submit_write`)."""
        return self._writer.submit_write(apply, settled=settled)

    # --- the reader thread ------------------------------------------------------------------------

    def _open_reader(self) -> None:
        self._reader_db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._reader_db.execute(f"PRAGMA cache_size=-{CACHE_BYTES // 1024}")

    async def _read(self, query: Callable[[sqlite3.Connection], T]) -> T:
        def run() -> T:
            assert self._reader_db is not None
            return query(self._reader_db)
        return await asyncio.get_running_loop().run_in_executor(self._reads, run)

    # --- sessions -------------------------------------------------------------------------------

    async def create_session(self, session_id: str, options: dict[str, Any],
                             key: KeyRecord | None = None) -> None:
        row = (session_id, orjson.dumps(options), time.time())
        await self.submit_write(lambda db: _keyed(db, key, db.execute(
            "INSERT INTO sessions (id, agent_session_id, options, created, segment_end) "
            "VALUES (?, NULL, ?, ?, 0)", row)))
        self._last[session_id] = 0
        self._allocated.setdefault(session_id, 0)

    async def get_session(self, session_id: str) -> SessionRecord | None:
        def query(db: sqlite3.Connection) -> tuple[SessionRecord, int] | None:
            row = db.execute("SELECT id, agent_session_id, options, created FROM sessions WHERE id = ?",
                             (session_id,)).fetchone()
            if row is None:
                return None
            # past every id a row or a recorded gap holds: an id given out is never given again
            return SessionRecord(row[0], row[1], orjson.loads(row[2]), row[3]), last_known_id(db, session_id)
        found = await self._read(query)
        if found is None:
            return None
        record, last = found
        self._last[session_id] = max(self._last.get(session_id, 0), last)
        self._allocated[session_id] = max(self._allocated.get(session_id, 0), last)
        return record

    async def set_agent_session_id(self, session_id: str, agent_session_id: str) -> None:
        await self.submit_write(lambda db: db.execute("UPDATE sessions SET agent_session_id = ? WHERE id = ?",
                                                 (agent_session_id, session_id)))

    async def delete_session(self, session_id: str) -> None:
        self._last.pop(session_id, None)
        self._allocated.pop(session_id, None)
        self._staged = [row for row in self._staged if row[0] != session_id]

        def delete(db: sqlite3.Connection) -> None:
            db.execute("DELETE FROM events WHERE session_id = ?", (session_id,))
            db.execute("DELETE FROM prompts WHERE session_id = ?", (session_id,))
            db.execute("DELETE FROM lost_events WHERE session_id = ?", (session_id,))
            db.execute("DELETE FROM sessions WHERE id = ?", (session_id,))
            keys.forget_session(db, session_id)
            self._writer.unlink_after_commit(session_id)
        await self.submit_write(delete)

    async def list_sessions(self) -> list[SessionRecord]:
        rows = await self._read(lambda db: db.execute(
            "SELECT id, agent_session_id, options, created FROM sessions ORDER BY created, id").fetchall())
        return [SessionRecord(r[0], r[1], orjson.loads(r[2]), r[3]) for r in rows]

    # --- prompts --------------------------------------------------------------------------------

    async def open_prompt(self, session_id: str, prompt_id: str, key: KeyRecord | None = None) -> None:
        def open_it(db: sqlite3.Connection) -> None:
            (after,) = db.execute("SELECT COALESCE(MAX(seq), 0) FROM events WHERE session_id = ?",
                                  (session_id,)).fetchone()
            db.execute("INSERT OR REPLACE INTO prompts (session_id, prompt_id, after_seq) VALUES (?, ?, ?)",
                       (session_id, prompt_id, after))
            opened = records.prompt_record(records.PROMPT_OPEN, prompt_id, after)
            self._append_record(db, session_id, [opened])
            _keyed(db, key, None)
        await self.submit_write(open_it)

    async def close_prompt(self, session_id: str, prompt_id: str) -> None:
        def close_it(db: sqlite3.Connection) -> None:
            db.execute("DELETE FROM prompts WHERE session_id = ? AND prompt_id = ?", (session_id, prompt_id))
            self._append_record(db, session_id, [records.prompt_record(records.PROMPT_CLOSE, prompt_id, 0)])
        await self.submit_write(close_it)

    def _append_record(self, db: sqlite3.Connection, session_id: str, parts: Sequence[bytes], *,
                       required: bool = False) -> int | None:
        """In the writer: one record at the end of the session's segment file, and the session's
        commit point moved past it in the same transaction; returns where the record starts. A
        record whose rows hold everything it says (small events, a prompt) is a copy kept for a
        journal that loses its last commits: when the file cannot take it (no inode for a new
        file, an I/O error) the rows commit without it (None); one whose rows point into it is
        ``required``, and its failure fails the write."""
        try:
            start = self._segments.append(session_id, parts)
        except OSError:
            if required:
                raise
            return None
        db.execute("UPDATE sessions SET segment_end = ? WHERE id = ?",
                   (start + sum(len(part) for part in parts), session_id))
        return start

    async def unended_prompts(self, session_id: str | None = None) -> list[tuple[str, str]]:
        where, params = ("WHERE session_id = ? ", (session_id,)) if session_id is not None else ("", ())

        def query(db: sqlite3.Connection) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
            unended: list[tuple[str, str]] = []
            ended: list[tuple[str, str]] = []
            rows = db.execute(f"SELECT session_id, prompt_id, after_seq FROM prompts {where}"
                              "ORDER BY session_id, after_seq", params).fetchall()
            for session_id, prompt_id, after in rows:
                pair = (str(session_id), str(prompt_id))
                ends = db.execute(f"SELECT {_EVENT_COLUMNS} FROM events WHERE session_id = ? AND seq > ? "
                                  "AND type IN (?, ?)", (session_id, after, *TURN_END_TYPES)).fetchall()
                found = read_rows(self._segments.root, str(session_id), ends, JournalRow, after=after)
                (ended if any(prompt_id_of(r.data) == prompt_id for r in found) else unended).append(pair)
            return unended, ended
        unended, ended = await self._read(query)
        for session_id, prompt_id in ended:
            await self.close_prompt(session_id, prompt_id)
        return unended

    # --- events ---------------------------------------------------------------------------------

    def _last_allocated(self, session_id: str) -> int:
        allocated = self._allocated.get(session_id)
        if allocated is None:
            raise LookupError("the session is not open in this journal (create_session or get_session)")
        return allocated

    def commit(self, key: KeyRecord | None = None) -> asyncio.Future[None]:
        rows, self._staged = self._staged, []
        if not rows:
            return self.submit_write(lambda db: _keyed(db, key, None, strict=False))

        def insert(db: sqlite3.Connection) -> None:
            self._insert_events(db, rows)
            _keyed(db, key, None, strict=False)

        def settled(error: BaseException | None) -> None:
            self._settle_ids(rows, error)
        return self.submit_write(insert, settled=settled)  # the writer counts its WAL bytes

    def _insert_events(self, db: sqlite3.Connection, rows: Sequence[StagedRow]) -> None:
        """In the writer: each session's record to its segment file first (one write per session:
        the header, the large data in row order, then copies of the small), then the rows, a run of
        small external events as one group row."""
        crcs = [checksum(data) for _, _, _, data in rows]
        by_session: dict[str, list[int]] = {}
        for index, staged in enumerate(rows):
            indexes = by_session.get(staged[0])
            if indexes is None:
                indexes = by_session[staged[0]] = []
            indexes.append(index)
        offsets: dict[str, int] = {}
        inline: set[str] = set()  # sessions whose rows hold all their data (see _append_events)
        for session_id, indexes in by_session.items():
            start = self._append_events(db, session_id, rows, crcs, indexes)
            if start is None:
                inline.add(session_id)
            else:
                offsets[session_id] = start
        params: list[Any] = []
        extend = params.extend
        # What the WAL grows by, for the checkpoint: at least one page (SQLite writes each dirtied
        # page whole), and each row: its key, its integers, its data (inline, or a group's index).
        wal = PAGE_SIZE_BYTES
        for row in groups.journal_rows(rows, offsets, INLINE_MAX_BYTES, crcs, inline):
            wal += len(row[0]) + ROW_FIXED_BYTES + len(row[3])
            extend(row)
        self._writer.wal_bytes += wal  # a transaction rolled back counts too: a checkpoint comes sooner
        width = 7 * ROWS_PER_INSERT
        for start in range(0, len(params), width):
            chunk = params[start:start + width]
            db.execute(_insert_statement(len(chunk) // 7), chunk)

    def _append_events(self, db: sqlite3.Connection, session_id: str, rows: Sequence[StagedRow],
                       crcs: Sequence[int], indexes: Sequence[int]) -> int | None:
        """The session's record of ``rows[i] for i in indexes``; returns where its external data
        start (the rows' offsets count from there), or None when the file did not take the record
        and the rows hold all their data: a turn's end over the inline size is stored in its row
        then, so the turn ends now (``turn_error`` ``storage``) instead of waiting on the disk."""
        external = [i for i in indexes if len(rows[i][3]) > INLINE_MAX_BYTES]
        order = external + [i for i in indexes if len(rows[i][3]) <= INLINE_MAX_BYTES]
        datas = [rows[i][3] for i in order]
        header = records.events_record([rows[i][1] for i in order], [rows[i][2] for i in order],
                                       [len(data) for data in datas], [crcs[i] for i in order], len(external))
        turn_ends_only = all(rows[i][2] in TURN_END_TYPES for i in external)
        start = self._append_record(db, session_id, [header, *datas], required=not turn_ends_only)
        return None if start is None else len(header) + start

    def _settle_ids(self, rows: Sequence[StagedRow], error: BaseException | None) -> None:
        """On the event loop, when a commit is settled: move the sessions' last committed id, or
        give a failed commit's ids back when nothing was staged after them."""
        if error is None:
            # A session's rows are staged in id order: its last row holds its highest id.
            committed = self._last
            for session_id, seq in {row[0]: row[1] for row in rows}.items():
                if session_id in committed and seq > committed[session_id]:
                    committed[session_id] = seq
            return
        first: dict[str, int] = {}
        last: dict[str, int] = {}
        for session_id, seq, _, _ in rows:
            first.setdefault(session_id, seq)
            last[session_id] = seq
        for session_id, seq in last.items():
            if self._allocated.get(session_id) == seq:
                self._allocated[session_id] = first[session_id] - 1

    async def read_page(self, session_id: str, after: int, *, upto: int | None = None,
                        max_bytes: int) -> list[JournalRow]:
        # A damaged page stops a range scan: past the last row read, the ids up to the last
        # committed one are looked up one by one, each unreadable one said (never a silent gap).
        bound = upto if upto is not None else self._last.get(session_id, 2**63 - 1)

        def query(db: sqlite3.Connection) -> list[JournalRow]:
            page: list[tuple[Any, ...]] = []
            total = 0
            try:
                # A group is keyed by its last id: one that starts by the bound may end past it.
                ends_by = min(bound, 2**62) + groups.GROUP_MAX_EVENTS
                cursor = db.execute(f"SELECT {_EVENT_COLUMNS} FROM events WHERE session_id = ? AND seq > ? "
                                    "AND seq < ? ORDER BY seq", (session_id, after, ends_by))
                try:
                    for row in cursor:
                        size = len(row[2]) if row[3] is None else int(row[4])
                        if (page and total + size > max_bytes) or groups.first_of(row) > bound:
                            break
                        page.append(row)
                        total += size
                finally:
                    cursor.close()
            except sqlite3.DatabaseError:
                if bound >= 2**62:
                    raise
                rows = read_rows(self.segments_dir, session_id, page, JournalRow, after=after, upto=bound)
                rows += probe_rows(db, self.segments_dir, session_id, page[-1][0] if page else after,
                                   bound, max_bytes - total)
                return groups.within_bytes(rows, max_bytes)
            rows = read_rows(self.segments_dir, session_id, page, JournalRow, after=after, upto=bound)
            return groups.within_bytes(rows, max_bytes)
        return await self._read(query)

    async def last_id(self, session_id: str) -> int:
        last = self._last.get(session_id)
        if last is not None:
            return last
        return await self._read(lambda db: last_known_id(db, session_id))

    async def count(self, session_id: str, event_type: str) -> int:
        (found,) = await self._read(lambda db: db.execute(
            f"SELECT SUM({groups.ROW_EVENTS_SQL}) FROM events WHERE session_id = ? AND type = ?",
            (session_id, event_type)).fetchone())
        return int(found or 0)

    async def find_key(self, key: str, now: float) -> FoundKey:
        return await self._read(lambda db: keys.find(db, key, now))

    async def purge_keys(self, now: float) -> int:
        return await self.submit_write(lambda db: keys.purge(db, now))

    async def open(self) -> SqliteJournal:
        return self  # opened by the constructor (the writer thread, the reader connection)

    async def gaps(self, session_id: str, after: int, upto: int) -> list[tuple[int, int]]:
        found = await self._read(lambda db: recorded_gaps(db, session_id))
        return [(gap.first, gap.last) for gap in found
                if gap.last is not None and gap.last > after and gap.first <= upto]

    async def close(self) -> None:
        if self._closed:
            return
        await self.commit()
        self._closed = True
        await self._writer.stop()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._reads, self._close_reader)
        self._reads.shutdown(wait=True)

    def _close_reader(self) -> None:
        if self._reader_db is not None:
            self._reader_db.close()
            self._reader_db = None


def _keyed(db: sqlite3.Connection, key: KeyRecord | None, _: object, *, strict: bool = True) -> None:
    """In the writer, after the statement that is the write: its key, in its transaction."""
    if key is not None:
        keys.store(db, key, strict=strict)


@functools.lru_cache(maxsize=ROWS_PER_INSERT)
def _insert_statement(rows: int) -> str:
    return _INSERT_EVENTS + ",".join(["(?, ?, ?, ?, ?, ?, ?)"] * rows)


def probe_rows(db: sqlite3.Connection, root: Path, session_id: str, after: int, upto: int,
               max_bytes: int) -> list[JournalRow]:
    """The rows ``after < id <= upto`` looked up one id at a time (a range scan hit a damaged
    page): each that reads is checked as usual, each that fails to read is returned as
    ``row_unreadable``; an id with no row is a gap ids may have (a failed commit), not damage."""
    out: list[JournalRow] = []
    total = 0
    seq, stop = after + 1, min(upto, after + PROBE_MAX_IDS)
    while seq <= stop:
        try:
            found = groups.covering_row(db, session_id, seq)
        except sqlite3.DatabaseError:
            out.append(JournalRow(seq, "", b"", ROW_UNREADABLE))
            seq += 1
            continue
        if found is None:
            seq += 1
            continue
        size = len(found[2]) if found[3] is None else int(found[4])
        if out and total + size > max_bytes:
            break
        out.extend(read_rows(root, session_id, [found], JournalRow, after=seq - 1, upto=upto))
        total += size
        seq = int(found[0]) + 1  # past its group
    return groups.within_bytes(out, max_bytes)


def _add_columns(db: sqlite3.Connection, table: str, names: Sequence[str]) -> None:
    """The columns a journal written by an older hopline lacks (NULL in its rows)."""
    columns = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
    for column in names:
        if column not in columns:
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column} INTEGER")


def _log_recovery(recovery: Recovery) -> None:
    """What a start restored past the commit point, and each gap (counts and ids, never content)."""
    if recovery.sessions:
        log.warning("events past the journal's commit point restored from the segment files", extra={
            "restoredEvents": recovery.restored_events, "restoredPrompts": recovery.restored_prompts,
            "sessions": recovery.sessions, "gaps": len(recovery.gaps)})
    for gap in recovery.gaps:
        log.error("events lost past the journal's commit point", extra={
            "firstEventId": gap.first, "lastEventId": gap.last, "reason": gap.reason})
