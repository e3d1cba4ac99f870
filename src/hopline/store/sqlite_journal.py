"""The SQLite :class:`~hopline.store.journal.EventJournal`: one writer thread, group commit.

One SQLite file under the daemon's data directory, WAL mode, ``synchronous=NORMAL`` (an
acknowledged event survives a daemon crash). An event's data larger than ``INLINE_MAX_BYTES`` (a
few hundred bytes) is appended to its session's segment file (``journal.segments/``, one
append-only file per session) and its row holds the offset and size (a commit's run of small such
events shares ONE row, ``store/event_groups.py``; reads expand it): SQLite writes a blob twice
(WAL, then the checkpoint) and slowly (about 2 ms per MiB here, each way; a 1 KiB row costs a
whole page rewrite per commit), a file append once; reads take a run of contiguous small events
in one ``pread``. The row commits after the
append, so a committed row's bytes are in the file; the segment files are flushed to disk before
each checkpoint (when SQLite syncs the WAL), so a row that reached the disk has its bytes there too.
A session's segment file goes with the session. The writer thread alone owns the write connection: every write
(event commits, sessions, prompts) is queued to it in call order; it takes everything queued at
once, runs it in ONE transaction, then settles the batch's futures on the event loop. A batch
whose transaction fails is rolled back and run again one write at a time, so only the failing
write fails. Checkpoints run in the writer between batches (``wal_autocheckpoint`` is off): when the
queue is empty and the WAL holds more than ``CHECKPOINT_BYTES``, or whatever the queue holds once
it passes four times that.

Reads run on their own connection (WAL lets them read while the writer writes) in one reader
thread, never on the event loop. Ids are allocated on the event loop, in memory (see the
interface); the writer only stores them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import orjson

from hopline.store import event_groups as groups
from hopline.store.integrity import ROW_UNREADABLE
from hopline.store.journal import (
    EventJournal,
    JournalRow,
    SessionRecord,
    StagedIds,
    StagedRow,
    prompt_id_of,
)
from hopline.store.locations import JOURNAL_FILE
from hopline.store.private import private_dir, private_file
from hopline.store.segments import SegmentWriter, read_rows
from hopline.vocabulary import TURN_END_TYPES

# Storage layout, not a limit (new files only: a journal made with other pages keeps them). Data
# over INLINE_MAX_BYTES lives in segment files, so a row is a key and a few integers, and a commit
# writes each page it dirtied whole to the WAL. 64-row transactions of 1 KiB events: 2.7-5.0 us of
# writer CPU per row with 4 KiB pages, 4.0-6.0 with the 32 KiB ones of when 1 MiB rows were inline.
PAGE_SIZE_BYTES = 4 * 1024
# Storage layout, not a limit: the WAL grows to about this before the writer checkpoints it (what
# SQLite's default autocheckpoint of 1000 pages gave with the former 32 KiB pages).
CHECKPOINT_BYTES = 32 * 1024 * 1024
# Storage layout, not a limit: larger event data goes to the session's segment file (each session's
# in one writev per transaction). Measured here, 1 KiB events in 64-row transactions: inline, the
# writer spent 7.2 us of CPU per row and wrote 138 MiB of WAL for 36 MiB of data (every commit
# rewrites its 32 KiB pages whole); external, 3.3 us and 44 MiB; in the daemon at 1 KiB, the
# writer thread went from 6.3 to 3.7 us per event (it shares 2 cores with the event loop). Small
# control events and word deltas stay in their rows.
INLINE_MAX_BYTES = 256
SEGMENTS_DIR = "journal.segments"
ROW_FIXED_BYTES = 48  # an estimate for the WAL's growth: a row's seq, type, pointer, CRC and header
# A query's work, not a payload ceiling: the ids one page looks up one by one past a damaged page.
PROBE_MAX_IDS = 4096

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
"""

JOURNAL_SCHEMA = _SCHEMA  # what `hopline store check --repair` makes a new journal with
_INSERT_EVENTS = "INSERT INTO events (session_id, seq, type, data, ext_offset, ext_bytes, crc) VALUES "
# Rows per INSERT: one statement is one sqlite3_step, one release of the GIL by the writer (executemany
# releases it per row, passing the GIL back and forth with the loop). 7 parameters a row, under 32766.
ROWS_PER_INSERT = 512
_EVENT_COLUMNS = "seq, type, data, ext_offset, ext_bytes, crc"

T = TypeVar("T")


@dataclasses.dataclass(eq=False)
class _Write:
    """One queued write: ``apply`` runs in the writer's transaction; its result or error settles
    ``future`` on ``loop`` (after ``settled``, the journal's own bookkeeping, when given)."""

    apply: Callable[[sqlite3.Connection], Any]
    future: asyncio.Future[Any]
    loop: asyncio.AbstractEventLoop
    settled: Callable[[BaseException | None], None] | None = None


class _Stop:
    """The writer's last item (queued by :meth:`SqliteJournal.close`)."""


class SqliteJournal(StagedIds, EventJournal):
    def __init__(self, data_dir: Path, *, path: Path | None = None) -> None:
        """``path``: the journal file (``HOPLINE_STORE_URL=sqlite:///PATH``); default: under ``data_dir``."""
        self.path = path if path is not None else data_dir / JOURNAL_FILE
        self.segments_dir = self.path.parent / SEGMENTS_DIR  # beside the journal file, wherever it is
        private_dir(self.path.parent, tighten=path is None)  # the data dir is ours; a named one's parent not
        private_file(self.path)  # 0600 before SQLite opens it: its WAL and SHM take the file's mode
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        db.execute(f"PRAGMA page_size={PAGE_SIZE_BYTES}")  # no effect on an existing WAL file
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA wal_autocheckpoint=0")  # the writer checkpoints between batches
        db.executescript(_SCHEMA)
        groups.claim_format(db, self.path)  # a newer hopline's journal is refused
        columns = {row[1] for row in db.execute("PRAGMA table_info(events)")}
        for column in ("ext_offset", "ext_bytes", "crc"):  # a journal from before segments, checksums
            if column not in columns:
                db.execute(f"ALTER TABLE events ADD COLUMN {column} INTEGER")
        self._db = db  # the writer thread's alone from here on
        self._segments = SegmentWriter(self.segments_dir)  # the writer thread's too
        self._unlink_after_commit: list[str] = []
        self._queue: queue.SimpleQueue[_Write | _Stop] = queue.SimpleQueue()
        self._writer = threading.Thread(target=self._write_loop, name="hopline-journal-writer", daemon=True)
        self._writer.start()
        self._reader_db: sqlite3.Connection | None = None
        self._reads = ThreadPoolExecutor(1, thread_name_prefix="hopline-journal-reader",
                                         initializer=self._open_reader)
        self._wal_bytes = 0  # written since the last checkpoint (writer thread)
        self.transactions = 0  # committed by the writer (group commit: fewer than the commits)
        self.checkpoints = 0
        # Event loop only: the last committed id and the last allocated id of each open session.
        self._last: dict[str, int] = {}
        self._allocated: dict[str, int] = {}
        self._staged: list[StagedRow] = []
        self._closed = False

    # --- the writer thread ------------------------------------------------------------------------

    def _write_loop(self) -> None:
        stop = False
        while not stop:
            batch: list[_Write] = []
            item = self._queue.get()
            while True:
                if isinstance(item, _Stop):
                    stop = True
                else:
                    batch.append(item)
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            if batch:
                self._settle(batch, self._apply(batch))
            self._maybe_checkpoint(force=stop)
        self._segments.close()
        self._db.close()

    def _apply(self, batch: Sequence[_Write]) -> list[tuple[Any, BaseException | None]]:
        """Run ``batch`` in one transaction; when it fails, each write alone in its own."""
        db = self._db
        try:
            db.execute("BEGIN IMMEDIATE")
            results = [write.apply(db) for write in batch]
            db.execute("COMMIT")
        except Exception as exc:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            self._unlink_after_commit.clear()
            if len(batch) == 1:
                return [(None, exc)]
            return [self._apply([write])[0] for write in batch]
        for session_id in self._unlink_after_commit:
            self._segments.remove(session_id)
        self._unlink_after_commit.clear()
        self.transactions += 1
        return [(result, None) for result in results]

    def _settle(self, batch: Sequence[_Write], results: Sequence[tuple[Any, BaseException | None]]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Write, Any, BaseException | None]]] = {}
        for write, (result, error) in zip(batch, results, strict=True):
            by_loop.setdefault(write.loop, []).append((write, result, error))
        for loop, settled in by_loop.items():
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                loop.call_soon_threadsafe(_resolve_all, settled)

    def _maybe_checkpoint(self, *, force: bool) -> None:
        if self._wal_bytes == 0 or not (force or self._wal_bytes >= 4 * CHECKPOINT_BYTES
                                        or (self._wal_bytes >= CHECKPOINT_BYTES and self._queue.empty())):
            return
        with contextlib.suppress(sqlite3.Error, OSError):
            self._segments.sync()  # the rows the checkpoint makes durable have their bytes on disk
            self._db.execute("PRAGMA wal_checkpoint(PASSIVE)")
            self._wal_bytes = 0
            self.checkpoints += 1

    def submit_write(self, apply: Callable[[sqlite3.Connection], T], *,
                     settled: Callable[[BaseException | None], None] | None = None) -> asyncio.Future[T]:
        """Queue ``apply`` for the writer thread, the journal's one write path: it runs inside the
        writer's next transaction, beside whatever else is queued by then (group commit), and the
        future settles once that transaction commits (with ``apply``'s result) or fails."""
        if self._closed:
            raise RuntimeError("the journal is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._queue.put(_Write(apply, future, loop, settled))
        return future

    # --- the reader thread ------------------------------------------------------------------------

    def _open_reader(self) -> None:
        self._reader_db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)

    async def _read(self, query: Callable[[sqlite3.Connection], T]) -> T:
        def run() -> T:
            assert self._reader_db is not None
            return query(self._reader_db)
        return await asyncio.get_running_loop().run_in_executor(self._reads, run)

    # --- sessions -------------------------------------------------------------------------------

    async def create_session(self, session_id: str, options: dict[str, Any]) -> None:
        row = (session_id, orjson.dumps(options), time.time())
        await self.submit_write(lambda db: db.execute(
            "INSERT INTO sessions (id, agent_session_id, options, created) VALUES (?, NULL, ?, ?)", row))
        self._last[session_id] = 0
        self._allocated.setdefault(session_id, 0)

    async def get_session(self, session_id: str) -> SessionRecord | None:
        def query(db: sqlite3.Connection) -> tuple[SessionRecord, int] | None:
            row = db.execute("SELECT id, agent_session_id, options, created FROM sessions WHERE id = ?",
                             (session_id,)).fetchone()
            if row is None:
                return None
            (last,) = db.execute("SELECT MAX(seq) FROM events WHERE session_id = ?", (session_id,)).fetchone()
            return SessionRecord(row[0], row[1], orjson.loads(row[2]), row[3]), int(last or 0)
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
            db.execute("DELETE FROM sessions WHERE id = ?", (session_id,))
            self._unlink_after_commit.append(session_id)
        await self.submit_write(delete)

    async def list_sessions(self) -> list[SessionRecord]:
        rows = await self._read(lambda db: db.execute(
            "SELECT id, agent_session_id, options, created FROM sessions ORDER BY created, id").fetchall())
        return [SessionRecord(r[0], r[1], orjson.loads(r[2]), r[3]) for r in rows]

    # --- prompts --------------------------------------------------------------------------------

    async def open_prompt(self, session_id: str, prompt_id: str) -> None:
        await self.submit_write(lambda db: db.execute(
            "INSERT OR REPLACE INTO prompts (session_id, prompt_id, after_seq) "
            "VALUES (?, ?, (SELECT COALESCE(MAX(seq), 0) FROM events WHERE session_id = ?))",
            (session_id, prompt_id, session_id)))

    async def close_prompt(self, session_id: str, prompt_id: str) -> None:
        await self.submit_write(lambda db: db.execute(
            "DELETE FROM prompts WHERE session_id = ? AND prompt_id = ?", (session_id, prompt_id)))

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

    def commit(self) -> asyncio.Future[None]:
        rows, self._staged = self._staged, []
        if not rows:
            return self.submit_write(lambda db: None)

        def insert(db: sqlite3.Connection) -> None:
            self._insert_events(db, rows)

        def settled(error: BaseException | None) -> None:
            self._settle_ids(rows, error)
        return self.submit_write(insert, settled=settled)  # the writer counts its WAL bytes

    def _insert_events(self, db: sqlite3.Connection, rows: Sequence[StagedRow]) -> None:
        """In the writer: large data to the segment files first (one write per session, in row
        order), then the rows, a run of small external events as one group row."""
        external: dict[str, list[bytes]] = {}
        for session_id, _, _, data in rows:
            if len(data) > INLINE_MAX_BYTES:
                datas = external.get(session_id)
                if datas is None:
                    datas = external[session_id] = []
                datas.append(data)
        offsets = {session_id: self._segments.append(session_id, datas)
                   for session_id, datas in external.items()}
        params: list[Any] = []
        extend = params.extend
        # What the WAL grows by, for the checkpoint: at least one page (SQLite writes each dirtied
        # page whole), and each row: its key, its integers, its data (inline, or a group's index).
        wal = PAGE_SIZE_BYTES
        for row in groups.journal_rows(rows, offsets, INLINE_MAX_BYTES):
            wal += len(row[0]) + ROW_FIXED_BYTES + len(row[3])
            extend(row)
        self._wal_bytes += wal  # a transaction rolled back counts too: a checkpoint comes sooner
        width = 7 * ROWS_PER_INSERT
        for start in range(0, len(params), width):
            chunk = params[start:start + width]
            db.execute(_insert_statement(len(chunk) // 7), chunk)

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
        (found,) = await self._read(lambda db: db.execute(
            "SELECT MAX(seq) FROM events WHERE session_id = ?", (session_id,)).fetchone())
        return int(found or 0)

    async def count(self, session_id: str, event_type: str) -> int:
        (found,) = await self._read(lambda db: db.execute(
            f"SELECT SUM({groups.ROW_EVENTS_SQL}) FROM events WHERE session_id = ? AND type = ?",
            (session_id, event_type)).fetchone())
        return int(found or 0)

    async def open(self) -> SqliteJournal:
        return self  # opened by the constructor (the writer thread, the reader connection)

    async def close(self) -> None:
        if self._closed:
            return
        await self.commit()
        self._closed = True
        self._queue.put(_Stop())
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._writer.join)
        await loop.run_in_executor(self._reads, self._close_reader)
        self._reads.shutdown(wait=True)

    def _close_reader(self) -> None:
        if self._reader_db is not None:
            self._reader_db.close()
            self._reader_db = None


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


def _resolve_all(settled: Sequence[tuple[_Write, Any, BaseException | None]]) -> None:
    for write, result, error in settled:
        if write.settled is not None:
            write.settled(error)
        if write.future.done():  # cancelled by its awaiter: the write happened all the same
            continue
        if error is None:
            write.future.set_result(result)
        else:
            write.future.set_exception(error)
