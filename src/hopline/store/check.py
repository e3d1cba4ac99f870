"""The store checked (SPEC T-3): at daemon startup, and by `hopline store check`.

**Startup** (:func:`require_usable`): the SQLite journal must be a database that passes
``PRAGMA quick_check``, and agree with the segment files beside it (a segment file that no stored
session owns means the journal lost what it knew: an emptied or replaced journal). A store that is
unusable or inconsistent raises :class:`StoreDamaged`, whose message is the one line ``hopline
serve`` prints: the file and the next step. Damaged *events* do not stop a start: every read
checks them and says ``data_corrupt``.

**The operator's check** (:func:`check_sqlite`): the same, plus every event read and checked,
each damaged one named by session and id, and what the segment files hold past each session's
commit point (:mod:`hopline.store.recovery`): what the next start restores, and every gap (ids
that could not be restored, recorded by an earlier start or found now), named by session and ids.
:func:`repair` restores what verifies past the commit points, then quarantines, never deletes: a damaged
row is copied whole into ``quarantined_events`` and marked (reads then say ``quarantined``), a
segment file no session owns and a journal that cannot be opened are moved into
``journal.quarantine/<time>/``; what could be read of such a journal is copied into a new one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from hopline.errors import StoreDamaged, StoreUnavailable
from hopline.store.event_groups import covering_row, newer_format, ungroup
from hopline.store.integrity import QUARANTINED, QUARANTINED_CRC, ROW_UNREADABLE
from hopline.store.locations import SEGMENTS_DIR, journal_quarantine
from hopline.store.private import private_dir
from hopline.store.recovery import Gap, Recovery, recorded_gaps, recover
from hopline.store.segments import SEGMENT_SUFFIX, read_rows, segment_name

SQLITE_HEADER = b"SQLite format 3\x00"
# A query's work, not a payload ceiling: the rows one step of the full check reads.
CHECK_PAGE_ROWS = 2048


@dataclasses.dataclass
class Damage:
    session_id: str
    event_id: int
    reason: str
    event_type: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"sessionId": self.session_id, "eventId": self.event_id, "reason": self.reason,
                "eventType": self.event_type}


@dataclasses.dataclass
class Report:
    journal: Path
    problem: str | None = None  # the store-level fault (unusable or inconsistent), one sentence
    orphan_segments: list[str] = dataclasses.field(default_factory=list)
    damaged: list[Damage] = dataclasses.field(default_factory=list)
    events_checked: int = 0
    repaired: list[str] = dataclasses.field(default_factory=list)
    # past the commit points: what the next start restores, and the ids that cannot be
    restorable: Recovery = dataclasses.field(default_factory=Recovery)
    gaps: list[Gap] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.problem is None and not self.damaged and not self.orphan_segments and not self.gaps

    def to_json(self) -> dict[str, Any]:
        return {"journal": str(self.journal), "ok": self.ok, "problem": self.problem,
                "orphanSegments": self.orphan_segments, "eventsChecked": self.events_checked,
                "damagedEvents": [d.to_json() for d in self.damaged],
                "pastCommitPoint": {"restorableEvents": self.restorable.restored_events,
                                    "restorablePrompts": self.restorable.restored_prompts,
                                    "sessions": self.restorable.sessions},
                "gaps": [g.to_json() for g in self.gaps], "repaired": self.repaired}


def _segment_files(segments_dir: Path) -> list[str]:
    if not segments_dir.is_dir():
        return []
    return sorted(p.name for p in segments_dir.iterdir() if p.name.endswith(SEGMENT_SUFFIX))


def sqlite_problem(path: Path) -> str | None:
    """An existing SQLite file's own fault, said after its name ("... is not an SQLite database"),
    or None: its header, that it opens, and ``PRAGMA quick_check``."""
    with open(path, "rb") as handle:
        if handle.read(len(SQLITE_HEADER)) != SQLITE_HEADER:
            return "is not an SQLite database (its header is damaged)"
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            found = [row[0] for row in db.execute("PRAGMA quick_check")]
        finally:
            db.close()
    except sqlite3.DatabaseError as exc:
        return f"cannot be read ({_one_line(str(exc))})"
    if found != ["ok"]:
        return f"fails PRAGMA quick_check: {len(found)} problem(s), first: {_one_line(str(found[0]))[:120]}"
    return None


def _one_line(text: str) -> str:
    """SQLite's own words, on the one line the daemon prints (quick_check's may span several)."""
    return " ".join(text.split())


def store_problem(journal: Path) -> tuple[str | None, list[str]]:
    """The journal's store-level fault (None when usable and consistent), and the orphan segment
    files (owned by no stored session)."""
    segments = _segment_files(journal.parent / SEGMENTS_DIR)
    if not journal.exists() or journal.stat().st_size == 0:
        if segments:
            return (f"the journal is {'missing' if not journal.exists() else 'empty (0 bytes)'} while "
                    f"{len(segments)} segment file(s) of its events remain beside it", segments)
        return None, []
    problem = sqlite_problem(journal)
    if problem is not None:
        return f"the journal {problem}", []
    try:
        db = sqlite3.connect(f"file:{journal}?mode=ro", uri=True)
        try:
            sessions = {segment_name(row[0]) + SEGMENT_SUFFIX
                        for row in db.execute("SELECT id FROM sessions")}
        finally:
            db.close()
    except sqlite3.DatabaseError as exc:
        return f"the journal cannot be read ({exc})", []
    orphans = [name for name in segments if name not in sessions]
    if orphans:
        return (f"{len(orphans)} segment file(s) beside the journal belong to no session it knows "
                "(the journal was replaced or emptied)", orphans)
    return None, []


def format_problem(journal: Path) -> str | None:
    """What to say of a journal a newer hopline wrote (see ``JOURNAL_FORMAT``), else None. Only its
    header is read: a file that cannot be read is :func:`store_problem`'s to say (and to check, once)."""
    if not journal.exists() or journal.stat().st_size == 0:
        return None
    try:
        db = sqlite3.connect(f"file:{journal}?mode=ro", uri=True)
        try:
            newer = newer_format(db)
        finally:
            db.close()
    except sqlite3.DatabaseError:
        return None
    return None if newer is None else f"the journal {journal} {newer}"


def require_usable(journal: Path, data_dir: Path) -> None:
    """At startup: the data dir made private, then the journal checked; :class:`StoreDamaged`
    with the one line to print when it cannot be used."""
    private_dir(data_dir)
    newer = format_problem(journal)
    if newer is not None:
        raise StoreDamaged(newer)
    problem, _ = store_problem(journal)
    if problem is not None:
        raise StoreDamaged(f"the store {journal} cannot be used: {problem}. Next: run `hopline store check "
                           f"--data-dir {data_dir}` to see the damage, then `hopline store check --repair "
                           f"--data-dir {data_dir}` to quarantine it (nothing is deleted)")


def check_sqlite(journal: Path) -> Report:
    """The store-level check, then every event read and checked (when the journal opens)."""
    report = Report(journal)
    newer = format_problem(journal)
    if newer is not None:  # not damage: its rows are not this hopline's to read
        report.problem = newer
        return report
    report.problem, report.orphan_segments = store_problem(journal)
    if not journal.exists() or journal.stat().st_size == 0:
        return report
    with contextlib.suppress(sqlite3.DatabaseError):
        db = sqlite3.connect(f"file:{journal}?mode=ro", uri=True)
        try:
            _check_events(db, journal.parent / SEGMENTS_DIR, report)
            report.restorable = recover(db, journal.parent / SEGMENTS_DIR, quarantine=None)
            report.gaps = recorded_gaps(db) + report.restorable.gaps
        finally:
            db.close()
    return report


def _session_ids(db: sqlite3.Connection) -> list[str]:
    ids: set[str] = set()
    for table, column in (("sessions", "id"), ("events", "DISTINCT session_id")):
        with contextlib.suppress(sqlite3.DatabaseError):
            ids.update(str(row[0]) for row in db.execute(f"SELECT {column} FROM {table}"))
    return sorted(ids)


def _check_events(db: sqlite3.Connection, segments_dir: Path, report: Report) -> None:
    for session_id in _session_ids(db):
        for seq, event_type, corrupt in _session_rows(db, segments_dir, session_id):
            report.events_checked += 1
            if corrupt is not None:
                report.damaged.append(Damage(session_id, seq, corrupt, event_type))


def _session_rows(db: sqlite3.Connection, segments_dir: Path,
                  session_id: str) -> list[tuple[int, str, str | None]]:
    """(id, type, damage reason or None) of every event of the session; past a damaged page, the
    ids up to the highest readable one are looked up one by one."""
    def make(seq: int, event_type: str, _data: bytes, corrupt: str | None) -> tuple[int, str, str | None]:
        return seq, event_type, corrupt

    columns = "seq, type, data, ext_offset, ext_bytes, crc"
    out: list[tuple[int, str, str | None]] = []
    after = 0
    while True:
        try:
            rows = db.execute(f"SELECT {columns} FROM events WHERE session_id = ? AND seq > ? ORDER BY seq "
                              "LIMIT ?", (session_id, after, CHECK_PAGE_ROWS)).fetchall()
        except sqlite3.DatabaseError:
            return out + _probe(db, segments_dir, session_id, after, make)
        if not rows:
            return out
        out.extend(read_rows(segments_dir, session_id, rows, make))
        after = int(rows[-1][0])


def _probe(db: sqlite3.Connection, segments_dir: Path, session_id: str, after: int, make: Any) -> list[Any]:
    top = after
    with contextlib.suppress(sqlite3.DatabaseError):
        (found,) = db.execute("SELECT MAX(seq) FROM events WHERE session_id = ?", (session_id,)).fetchone()
        top = int(found or after)
    out = []
    seq = after + 1
    while seq <= top:
        try:
            row = covering_row(db, session_id, seq)
        except sqlite3.DatabaseError:
            out.append(make(seq, "", b"", ROW_UNREADABLE))
            seq += 1
            continue
        if row is None:
            seq += 1
            continue
        out.extend(read_rows(segments_dir, session_id, [row], make, after=seq - 1))
        seq = int(row[0]) + 1  # past its group
    return out


def repair(journal: Path, schema: str) -> Report:
    """Quarantine what :func:`check_sqlite` finds (nothing is deleted), then check again;
    ``schema`` makes a new journal when the old one cannot be used."""
    report = check_sqlite(journal)
    if format_problem(journal) is not None:
        return report  # a newer hopline's journal: nothing is changed
    quarantine = journal_quarantine(journal)
    done: list[str] = []
    if report.problem is None and report.restorable.sessions:
        done += _restore(journal, quarantine)
    if report.problem is not None and not report.orphan_segments and journal.exists():
        done += _quarantine_journal(journal, quarantine, schema)
        report.orphan_segments = store_problem(journal)[1]
    for name in report.orphan_segments:
        private_dir(quarantine / "segments")
        os.replace(journal.parent / SEGMENTS_DIR / name, quarantine / "segments" / name)
        done.append(f"moved the orphan segment file {name} to {quarantine / 'segments'}")
    if report.damaged and journal.exists():
        done += _quarantine_rows(journal, report.damaged)
    after = check_sqlite(journal)
    after.repaired = done
    after.damaged = [d for d in after.damaged if d.reason != QUARANTINED] + [
        d for d in after.damaged if d.reason == QUARANTINED]
    return after


def _restore(journal: Path, quarantine: Path) -> list[str]:
    """What verifies past the sessions' commit points restored, as a daemon's start does."""
    db = sqlite3.connect(journal, isolation_level=None)
    try:
        restored = recover(db, journal.parent / SEGMENTS_DIR, quarantine=quarantine)
    finally:
        db.close()
    return [f"restored {restored.restored_events} event(s) and {restored.restored_prompts} prompt change(s) "
            "past the commit point from the segment files", *restored.quarantined]


def move_sqlite_file(path: Path, quarantine: Path) -> tuple[Path, list[str]]:
    """Move an SQLite file and its WAL and SHM into ``quarantine``: where it went, and what moved."""
    private_dir(quarantine)
    moved = quarantine / path.name
    done = []
    for suffix in ("", "-wal", "-shm"):
        source = Path(str(path) + suffix)
        if source.exists():
            os.replace(source, Path(str(moved) + suffix))
            done.append(f"moved {source.name} to {quarantine}")
    return moved, done


def _quarantine_journal(journal: Path, quarantine: Path, schema: str) -> list[str]:
    """Move the unusable journal (and its WAL, SHM) aside; copy what reads of it into a new one."""
    moved, done = move_sqlite_file(journal, quarantine)
    copied = _salvage(moved, journal, schema)
    done.append(f"copied {copied} readable event(s) into a new {journal.name}")
    return done


def _quarantine_rows(journal: Path, damaged: list[Damage]) -> list[str]:
    db = sqlite3.connect(journal, isolation_level=None)
    try:
        db.execute("CREATE TABLE IF NOT EXISTS quarantined_events (session_id TEXT NOT NULL, seq INTEGER "
                   "NOT NULL, type TEXT, data BLOB, ext_offset INTEGER, ext_bytes INTEGER, crc INTEGER, "
                   "reason TEXT NOT NULL, quarantined_at REAL NOT NULL, PRIMARY KEY (session_id, seq))")
        db.execute("BEGIN IMMEDIATE")
        count = 0
        for item in damaged:
            if item.reason in (QUARANTINED, ROW_UNREADABLE):
                continue
            # A grouped event gets a row of its own first; a group whose index is damaged is kept
            # whole in quarantined_events, its ids marked.
            count += ungroup(db, item.session_id, item.event_id, item.reason)
            db.execute("INSERT OR REPLACE INTO quarantined_events SELECT session_id, seq, type, data, "
                       "ext_offset, ext_bytes, crc, ?, ? FROM events WHERE session_id = ? AND seq = ? "
                       "AND crc IS NOT ?", (item.reason, time.time(), item.session_id, item.event_id,
                                            QUARANTINED_CRC))
            marked = db.execute("UPDATE events SET data = x'', ext_offset = NULL, ext_bytes = NULL, crc = ? "
                                "WHERE session_id = ? AND seq = ? AND crc IS NOT ?",
                                (QUARANTINED_CRC, item.session_id, item.event_id, QUARANTINED_CRC))
            count += marked.rowcount
        db.execute("COMMIT")
    finally:
        db.close()
    return [f"quarantined {count} damaged event row(s) into the quarantined_events table"] if count else []


def _salvage(old: Path, new: Path, schema: str) -> int:
    """Copy every readable session, prompt and event of ``old`` into a new journal at ``new``;
    an event id that cannot be read is stored marked (reads say ``quarantined``)."""
    from hopline.store.private import private_file

    private_file(new)
    target = sqlite3.connect(new, isolation_level=None)
    copied = 0
    try:
        target.executescript(schema)
        target.execute("BEGIN IMMEDIATE")
        try:
            source = sqlite3.connect(f"file:{old}?mode=ro", uri=True)
        except sqlite3.DatabaseError:
            target.execute("COMMIT")
            return 0
        try:
            for table in ("sessions", "prompts", "lost_events"):
                with contextlib.suppress(sqlite3.DatabaseError):
                    # the columns both have (a journal of an older format lacks some: NULL)
                    names = ", ".join(_columns(source, table) & _columns(target, table))
                    rows = source.execute(f"SELECT {names} FROM {table}").fetchall()
                    if rows:
                        marks = ",".join("?" * len(rows[0]))
                        target.executemany(f"INSERT OR IGNORE INTO {table} ({names}) VALUES ({marks})", rows)
            for session_id in _session_ids(source):
                for seq, _, corrupt in _session_rows(source, old.parent / "none", session_id):
                    row = None
                    if corrupt != ROW_UNREADABLE:
                        with contextlib.suppress(sqlite3.DatabaseError):
                            row = covering_row(source, session_id, seq)  # a group's: copied once
                    if row is None:
                        row = (seq, "", b"", None, None, QUARANTINED_CRC)
                    else:
                        copied += 1
                    target.execute("INSERT OR IGNORE INTO events (session_id, seq, type, data, ext_offset, "
                                   "ext_bytes, crc) VALUES (?, ?, ?, ?, ?, ?, ?)", (session_id, *row))
        finally:
            source.close()
        target.execute("COMMIT")
    finally:
        target.close()
    return copied


def _columns(db: sqlite3.Connection, table: str) -> set[str]:
    return {str(row[1]) for row in db.execute(f"PRAGMA table_info({table})")}


# A query's work, not a payload ceiling: the newest events PostgreSQL's startup check reads.
PG_CHECK_EVENTS = 256


def check_recent_events(dsn: str) -> int:
    """PostgreSQL at startup (bounded): the newest events read back and checked; the damaged ones
    are counted and logged (each read says them too). Raises :class:`StoreUnavailable` when the
    store does not answer."""
    import logging

    import psycopg

    from hopline.store.event_groups import inline_events
    from hopline.store.postgres import connect

    try:
        with connect(dsn) as conn:
            rows = conn.execute("SELECT seq, type, data, crc, parts FROM events ORDER BY ctid DESC LIMIT %s",
                                (PG_CHECK_EVENTS,)).fetchall()
    except psycopg.Error as exc:
        raise StoreUnavailable(
            f"the PostgreSQL store failed its startup check ({type(exc).__name__})") from None
    events = inline_events(rows)  # a group row's events each checked
    damaged = sum(1 for event in events if event.corrupt is not None)
    if damaged:
        logging.getLogger("hopline.store").error("damaged events in the store", extra={
            "damagedEvents": damaged, "checkedEvents": len(events)})
    return damaged
