"""Recovery past the commit point (SPEC T-10, T-1): what the segment files hold and the journal lost.

Each session's row holds the end of its last committed segment record (``segment_end``,
:mod:`hopline.store.records`). A journal that lost its last commits (a WAL torn by a power loss
under ``synchronous=NORMAL``, or damaged) has segment files longer than that. At every start, and
in `hopline store check`, each file's length is compared with its commit point, and the records
past it are read:

* a record that verifies (its header's CRC, its length, every event's CRC) is restored: its events
  as rows with their own ids and bytes, its prompt opened or closed;
* a stretch that does not is quarantined (copied under ``journal.quarantine/``; at the end of the
  file, then cut off), never served; the event ids it held (from its own header, or between the
  records around it) are a *gap*, recorded in ``lost_events``: the next ids continue past them, a
  reader resuming inside one is told (``frame_dropped``), and `hopline store check` names it.

Ids continue past the highest id any row, restored record or gap holds: an id a client was given
never names other content.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from hopline.store import records
from hopline.store.private import private_dir, private_file
from hopline.store.segments import segment_path

log = logging.getLogger("hopline.store")

LOST_EVENTS_SCHEMA = """
CREATE TABLE IF NOT EXISTS lost_events (
    session_id TEXT NOT NULL,
    first_seq INTEGER NOT NULL,
    last_seq INTEGER,
    reason TEXT NOT NULL,
    found_at REAL NOT NULL,
    PRIMARY KEY (session_id, first_seq)
) WITHOUT ROWID;
"""
TORN = "torn"  # the file ends inside a record: what it held never reached the disk whole
DAMAGED = "damaged"  # bytes that are not a whole record (a header or data failing its CRC)
_COPY_BYTES = 1 << 20


@dataclasses.dataclass(frozen=True)
class Gap:
    """Event ids past the commit point that could not be restored; ``last`` None when their
    number is not known (a record whose header did not survive, with nothing after it)."""

    session_id: str
    first: int
    last: int | None
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"sessionId": self.session_id, "firstId": self.first, "lastId": self.last,
                "reason": self.reason}

    def said(self) -> str:
        ids = (f"events {self.first} to {self.last}" if self.last is not None and self.last > self.first
               else f"event {self.first}" if self.last is not None
               else f"the events from {self.first} on (how many is not known)")
        return f"session {self.session_id}: {ids} lost past the commit point ({self.reason})"


@dataclasses.dataclass
class Recovery:
    restored_events: int = 0
    restored_prompts: int = 0
    sessions: int = 0  # sessions whose segment file held records past the commit point
    gaps: list[Gap] = dataclasses.field(default_factory=list)
    quarantined: list[str] = dataclasses.field(default_factory=list)  # what was moved where

    def to_json(self) -> dict[str, Any]:
        return {"restoredEvents": self.restored_events, "restoredPrompts": self.restored_prompts,
                "sessions": self.sessions, "gaps": [g.to_json() for g in self.gaps]}


@dataclasses.dataclass
class _Bad:
    offset: int
    end: int
    reason: str
    ids: tuple[int, int] | None  # from its own header, when that verified


def recover(db: sqlite3.Connection, segments_dir: Path, *, quarantine: Path | None) -> Recovery:
    """Compare every session's segment file with its commit point and restore what verifies past
    it (see the module). ``quarantine`` None: a dry run (`store check`), nothing is written; else
    ``db`` is the journal's write connection, outside any transaction."""
    found = Recovery()
    try:
        sessions = db.execute("SELECT id, segment_end FROM sessions").fetchall()
    except sqlite3.DatabaseError:  # a journal of another format, or unreadable: store check's to say
        return found
    for session_id, committed in sessions:
        path = segment_path(segments_dir, str(session_id))
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            continue
        if committed is None:  # written before segment records: its whole file was committed
            if quarantine is not None:
                db.execute("UPDATE sessions SET segment_end = ? WHERE id = ?", (size, session_id))
            continue
        if size > int(committed):
            _recover_session(db, str(session_id), path, int(committed), size, quarantine, found)
    return found


def _recover_session(db: sqlite3.Connection, session_id: str, path: Path, committed: int, size: int,
                     quarantine: Path | None, found: Recovery) -> None:
    found.sessions += 1
    fd = os.open(path, os.O_RDONLY)
    try:
        walked = _walk(fd, committed, size)
        last = last_known_id(db, session_id)
        gaps = _gaps(session_id, walked, last)
        if quarantine is None:
            for item in walked:
                if isinstance(item, records.Record):
                    found.restored_events += sum(1 for e in item.events if e.seq > last)
                    found.restored_prompts += item.kind != records.EVENTS
            found.gaps += gaps
            return
        moved = [_quarantine_copy(fd, path, item, quarantine) for item in walked if isinstance(item, _Bad)]
    finally:
        os.close(fd)
    end = size
    if walked and isinstance(walked[-1], _Bad):
        end = walked[-1].offset  # a bad tail is cut off: the next record goes where it started
    db.execute("BEGIN IMMEDIATE")
    try:
        for item in walked:
            if isinstance(item, records.Record):
                _restore(db, session_id, path, item, last, found)
        db.executemany("INSERT OR REPLACE INTO lost_events (session_id, first_seq, last_seq, reason, "
                       "found_at) VALUES (?, ?, ?, ?, ?)",
                       [(g.session_id, g.first, g.last, g.reason, time.time()) for g in gaps])
        db.execute("UPDATE sessions SET segment_end = ? WHERE id = ?", (end, session_id))
        db.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            db.execute("ROLLBACK")
        raise
    if end < size:
        os.truncate(path, end)
    found.gaps += gaps
    found.quarantined += moved


def _walk(fd: int, start: int, size: int) -> list[records.Record | _Bad]:
    """The records from ``start`` to the end of the file, each damaged or torn stretch as one
    :class:`_Bad` (up to the next whole record, or the end)."""
    out: list[records.Record | _Bad] = []
    at = start
    while at < size:
        record = records.read_record(fd, at, size)
        if isinstance(record, records.Record):
            out.append(record)
            at = record.end
            continue
        following = records.find_next(fd, at, size)
        end = following.offset if following is not None else size
        out.append(_Bad(at, end, record, records.header_ids(fd, at, size)))
        if following is None:
            break
        at = following.offset
    return out


def _gaps(session_id: str, walked: list[records.Record | _Bad], last: int) -> list[Gap]:
    """The ids each bad stretch held: past the highest id before it, up to the first id after it
    (or its own header's last id); unknown when neither says."""
    gaps: list[Gap] = []
    highest = last
    for index, item in enumerate(walked):
        if isinstance(item, records.Record):
            if item.ids is not None:
                highest = max(highest, item.ids[1])
            continue
        following = next((r.ids[0] for r in walked[index + 1:]
                          if isinstance(r, records.Record) and r.ids is not None), None)
        top = following - 1 if following is not None else None
        if item.ids is not None:
            top = max(top or 0, item.ids[1])
        if top is None:
            gaps.append(Gap(session_id, highest + 1, None, item.reason))
        elif top > highest:
            gaps.append(Gap(session_id, highest + 1, top, item.reason))
            highest = top
    return gaps


def _restore(db: sqlite3.Connection, session_id: str, path: Path, record: records.Record, last: int,
             found: Recovery) -> None:
    if record.kind == records.PROMPT_OPEN:
        db.execute("INSERT OR REPLACE INTO prompts (session_id, prompt_id, after_seq) VALUES (?, ?, ?)",
                   (session_id, record.prompt_id, record.after_seq))
        found.restored_prompts += 1
        return
    if record.kind == records.PROMPT_CLOSE:
        db.execute("DELETE FROM prompts WHERE session_id = ? AND prompt_id = ?",
                   (session_id, record.prompt_id))
        found.restored_prompts += 1
        return
    rows: list[tuple[Any, ...]] = []
    with open(path, "rb") as handle:
        for event in record.events:
            if event.seq <= last:
                continue
            if event.external:
                rows.append((session_id, event.seq, event.type, b"", event.offset, event.size, event.crc))
            else:
                handle.seek(event.offset)
                data = handle.read(event.size)
                rows.append((session_id, event.seq, event.type, data, None, None, event.crc))
    db.executemany("INSERT OR IGNORE INTO events (session_id, seq, type, data, ext_offset, ext_bytes, crc) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
    found.restored_events += len(rows)


def last_known_id(db: sqlite3.Connection, session_id: str) -> int:
    """The highest id the session's rows or recorded gaps hold (0 for none): ids continue past it."""
    (seq,) = db.execute("SELECT MAX(seq) FROM events WHERE session_id = ?", (session_id,)).fetchone()
    try:
        (lost,) = db.execute("SELECT MAX(COALESCE(last_seq, first_seq - 1)) FROM lost_events "
                             "WHERE session_id = ?", (session_id,)).fetchone()
    except sqlite3.OperationalError:  # a journal from before recovery (read-only: no table yet)
        lost = None
    return max(int(seq or 0), int(lost or 0))


def recorded_gaps(db: sqlite3.Connection, session_id: str | None = None) -> list[Gap]:
    """The gaps recoveries recorded (of one session, or all), by session then id."""
    where, params = ("WHERE session_id = ? ", (session_id,)) if session_id is not None else ("", ())
    try:
        rows = db.execute(f"SELECT session_id, first_seq, last_seq, reason FROM lost_events {where}"
                          "ORDER BY session_id, first_seq", params).fetchall()
    except sqlite3.OperationalError:
        return []
    return [Gap(str(r[0]), int(r[1]), None if r[2] is None else int(r[2]), str(r[3])) for r in rows]


def _quarantine_copy(fd: int, path: Path, bad: _Bad, quarantine: Path) -> str:
    """Copy a bad stretch's bytes into ``quarantine`` (synced) before anything points past it."""
    private_dir(quarantine)
    target = quarantine / f"{path.stem}.{bad.offset}-{bad.end}.{bad.reason}"
    private_file(target)
    out = os.open(target, os.O_WRONLY | os.O_TRUNC)
    try:
        at = bad.offset
        while at < bad.end:
            chunk = os.pread(fd, min(_COPY_BYTES, bad.end - at), at)
            if not chunk:
                break
            os.write(out, chunk)
            at += len(chunk)
        os.fsync(out)
    finally:
        os.close(out)
    return f"moved {bad.end - bad.offset} byte(s) of a {bad.reason} segment record to {target}"
