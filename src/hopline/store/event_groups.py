"""Row groups of both journals (SPEC D-5, T-3): a run of small events in one row.

A commit of a pipe read of 1 KiB frames is dozens of events of one session, their bytes already
end to end in the session's segment file. One ``events`` row per event would cost an insert and
the writer's row building per event, more than the event's bytes; a run of them is stored as ONE
row instead:

* ``seq``: the run's LAST id (so ``MAX(seq)`` is still the session's last id); its ids are
  consecutive, ``seq - n + 1 .. seq``;
* ``type``: the type every event of the run has;
* ``data``: the run's index, ``n`` sizes then ``n`` CRC-32s (unsigned 32 bits, little-endian);
* ``ext_offset`` / ``ext_bytes``: where the run's bytes start in the segment file, and their sum;
* ``crc``: the CRC-32 of the index itself, so a damaged index is caught like damaged bytes.

PostgreSQL keeps data in its rows: a group row there holds its events' bytes end to end in
``data``, the index in ``parts`` (NULL for a plain row), the index's CRC-32 in ``crc``; runs take
events of any size under ``GROUP_EVENT_MAX_BYTES`` (:func:`inline_rows`, :func:`inline_events`).

In SQLite a group is told from the other rows by an ``ext_offset`` together with a non-empty ``data`` (an
external event's row has empty ``data``, an inline one no ``ext_offset``). Each event of a group
is checked against its own CRC when read, and a damaged one is said alone. Reads expand a group
into its events (:func:`expand`); a journal written before groups has none and reads as before.
"""

from __future__ import annotations

import sqlite3
import struct
import time
from collections.abc import Iterator, Sequence, Set
from typing import Any, Protocol, TypeVar

from hopline.errors import StoreError
from hopline.store.integrity import CHECKSUM_MISMATCH, QUARANTINED_CRC, checksum, verified
from hopline.store.journal import JournalRow

# Storage layout, not limits: a group holds 2 to GROUP_MAX_EVENTS events, each smaller than
# GROUP_EVENT_MAX_BYTES (a larger one is a row of its own, read alone), GROUP_MAX_BYTES in all (a
# page of reads takes a group whole, then is trimmed to its own byte bound: this bounds the excess).
GROUP_MAX_EVENTS = 512
GROUP_EVENT_MAX_BYTES = 64 * 1024
GROUP_MAX_BYTES = 256 * 1024
ENTRY_BYTES = 8  # a size and a CRC-32, 4 bytes each

# SQLite's ``PRAGMA user_version`` of a journal this hopline writes: 1, row groups (a journal at 0,
# written before them, reads the same); 2, segment records and each session's commit point
# (store/records.py; a journal at 1 reads the same, its segment files taken as committed whole). One
# at a higher format was written by a newer hopline, whose rows or records this one could misread
# or write past: it is refused (never read, never repaired), saying so.
JOURNAL_FORMAT = 2


def newer_format(db: sqlite3.Connection) -> str | None:
    """What to say of a journal written in a newer format than this hopline reads, else None."""
    (found,) = db.execute("PRAGMA user_version").fetchone()
    if int(found) <= JOURNAL_FORMAT:
        return None
    return (f"was written by a newer hopline (journal format {found}; this one reads formats up to "
            f"{JOURNAL_FORMAT}): run that hopline, or a newer one")


class JournalTooNew(StoreError):
    """The journal was written in a newer format than this hopline reads."""


def claim_format(db: sqlite3.Connection, path: object) -> None:
    """The journal ``db`` (at ``path``) opened for writing: marked with this hopline's format, or
    closed and refused (:class:`JournalTooNew`) when a newer hopline wrote it."""
    newer = newer_format(db)
    if newer is not None:
        db.close()
        raise JournalTooNew(f"the journal {path} {newer}")
    db.execute(f"PRAGMA user_version={JOURNAL_FORMAT}")


# (seq, type, offset, size, crc) of one event of a group (offset: in the segment file, or in data)
Member = tuple[int, str, int, int, int]


def is_group(data: Any, ext_offset: Any) -> bool:
    """True for a group's row (an offset and an index), given its ``data`` and ``ext_offset``."""
    return ext_offset is not None and len(data) > 0


def pack(sizes: Sequence[int], crcs: Sequence[int]) -> bytes:
    """A group's index: the sizes, then the CRC-32s."""
    return struct.pack(f"<{2 * len(sizes)}I", *sizes, *crcs)


def count(index: bytes) -> int:
    """The events of a group (at least one: an index of a wrong length still stands for its id)."""
    return max(1, len(index) // ENTRY_BYTES)


def first_id(last: int, index: bytes) -> int:
    return last - count(index) + 1


def damaged_ids(last: int, index: bytes, after: int, top: int) -> range:
    """The ids ``after < id <= top`` of a group whose index is damaged (each said damaged)."""
    return range(max(first_id(last, index), after + 1), min(last, top) + 1)


def expand(last: int, event_type: str, index: bytes, offset: int, crc: Any) -> Iterator[Member] | None:
    """A group's events in id order, or None when its index does not match its CRC (then every
    id of the group, :func:`first_id` to ``last``, is damaged)."""
    if crc is None or checksum(index) != int(crc) or len(index) % ENTRY_BYTES:
        return None
    n = len(index) // ENTRY_BYTES
    values = struct.unpack(f"<{2 * n}I", index)
    return _members(last - n + 1, event_type, offset, values[:n], values[n:])


# One event of the stored rows: (seq, type, inline data, ext_offset, ext_bytes, crc, why it is
# damaged or None); ext_offset None for an inline event.
Event = tuple[int, str, bytes, "int | None", int, Any, "str | None"]


def events_of(rows: Sequence[Sequence[Any]], after: int = 0, upto: int | None = None) -> Iterator[Event]:
    """The events ``after < id <= upto`` that ``(seq, type, data, ext_offset, ext_bytes, crc)``
    rows stand for, in id order: a group's one by one (all of them said damaged when its index is),
    a plain row as itself."""
    top = upto if upto is not None else 2**63 - 1
    for seq, event_type, data, offset, nbytes, crc in rows:
        seq, event_type = int(seq), str(event_type)
        if not is_group(data, offset):
            if after < seq <= top:
                yield (seq, event_type, bytes(data), None if offset is None else int(offset),
                       0 if nbytes is None else int(nbytes), crc, None)
            continue
        index = bytes(data)
        members = expand(seq, event_type, index, int(offset), crc)
        if members is None:  # a damaged index: its events cannot be told apart
            for damaged in damaged_ids(seq, index, after, top):
                yield damaged, event_type, b"", None, 0, None, CHECKSUM_MISMATCH
            continue
        for member_seq, _, member_offset, size, member_crc in members:
            if after < member_seq <= top:
                yield member_seq, event_type, b"", member_offset, size, member_crc, None


def _members(first: int, event_type: str, offset: int, sizes: Sequence[int],
             crcs: Sequence[int]) -> Iterator[Member]:
    for i, (size, crc) in enumerate(zip(sizes, crcs, strict=True)):
        yield first + i, event_type, offset, size, crc
        offset += size


# One journal row: (session id, seq, type, data, ext_offset, ext_bytes, crc)
Row = tuple[str, int, str, bytes, "int | None", "int | None", int]


class _Run:
    """A session's run of small events, growing into one row."""

    __slots__ = ("crcs", "datas", "event_type", "last", "nbytes", "session_id", "sizes", "start")

    def __init__(self, session_id: str, event_type: str, seq: int, start: int = 0) -> None:
        self.session_id = session_id
        self.event_type = event_type
        self.last = seq - 1
        self.start = start
        self.sizes: list[int] = []
        self.crcs: list[int] = []
        self.datas: list[bytes] = []
        self.nbytes = 0

    def takes(self, seq: int, event_type: str, size: int) -> bool:
        """The one rule of a group: consecutive ids, one type, within its bounds."""
        return (seq == self.last + 1 and event_type == self.event_type and len(self.sizes) < GROUP_MAX_EVENTS
                and self.nbytes + size <= GROUP_MAX_BYTES)

    def add(self, seq: int, data: bytes, crc: int) -> None:
        self.last = seq
        self.nbytes += len(data)
        self.sizes.append(len(data))
        self.crcs.append(crc)
        self.datas.append(data)

    def row(self) -> Row:
        """SQLite's row: the bytes are in the segment file from ``start`` on."""
        if len(self.sizes) == 1:  # a lone event keeps the plain row
            return (self.session_id, self.last, self.event_type, b"", self.start, self.sizes[0], self.crcs[0])
        index = pack(self.sizes, self.crcs)
        return (self.session_id, self.last, self.event_type, index, self.start, self.nbytes, checksum(index))

    def inline_row(self) -> InlineRow:
        """PostgreSQL's row: the bytes end to end in ``data``, the index in ``parts``."""
        if len(self.sizes) == 1:
            return (self.session_id, self.last, self.event_type, self.datas[0], self.crcs[0], None)
        index = pack(self.sizes, self.crcs)
        return (self.session_id, self.last, self.event_type, b"".join(self.datas), checksum(index), index)


def journal_rows(staged: Sequence[tuple[str, int, str, bytes]], offsets: dict[str, int],
                 inline_max: int, crcs: Sequence[int], inline: Set[str] = frozenset()) -> list[Row]:
    """SQLite's rows of a commit's staged events (session id, id, type, data) and their CRC-32s:
    data up to ``inline_max`` bytes in its row; larger data, appended to its session's segment
    file in staged order from ``offsets[session]`` on, pointed at, each run of small ones by one
    group row. ``offsets`` is advanced past what the rows point at. The events of the ``inline``
    sessions have their data in their rows whatever its size (their segment file refused them)."""
    out: list[Row] = []
    runs: dict[str, _Run] = {}
    for index, (session_id, seq, event_type, data) in enumerate(staged):
        crc = crcs[index]
        size = len(data)
        if session_id in inline:
            out.append((session_id, seq, event_type, data, None, None, crc))
            continue
        run = runs.get(session_id)
        if run is not None and (size <= inline_max or size >= GROUP_EVENT_MAX_BYTES
                                or not run.takes(seq, event_type, size)):
            out.append(runs.pop(session_id).row())
            run = None
        if size <= inline_max:
            out.append((session_id, seq, event_type, data, None, None, crc))
            continue
        offset = offsets[session_id]
        offsets[session_id] = offset + size
        if size >= GROUP_EVENT_MAX_BYTES:
            out.append((session_id, seq, event_type, b"", offset, size, crc))
            continue
        if run is None:
            run = runs[session_id] = _Run(session_id, event_type, seq, offset)
        run.add(seq, data, crc)
    out.extend(run.row() for run in runs.values())
    return out


# One PostgreSQL row: (session id, seq, type, data, crc, parts: a group's index or None)
InlineRow = tuple[str, int, str, bytes, int, "bytes | None"]


def inline_rows(staged: Sequence[tuple[str, int, str, bytes]]) -> list[InlineRow]:
    """PostgreSQL's rows of a commit's staged events: data in the row; each run of events smaller
    than ``GROUP_EVENT_MAX_BYTES`` one group row (their bytes end to end, the index in ``parts``,
    the index's CRC in ``crc``): a row a run, not a row an event, to COPY and to insert."""
    out: list[InlineRow] = []
    runs: dict[str, _Run] = {}
    for session_id, seq, event_type, data in staged:
        size = len(data)
        run = runs.get(session_id)
        if run is not None and (size >= GROUP_EVENT_MAX_BYTES or not run.takes(seq, event_type, size)):
            out.append(runs.pop(session_id).inline_row())
            run = None
        if size >= GROUP_EVENT_MAX_BYTES:
            out.append((session_id, seq, event_type, data, checksum(data), None))
            continue
        if run is None:
            run = runs[session_id] = _Run(session_id, event_type, seq)
        run.add(seq, data, checksum(data))
    out.extend(run.inline_row() for run in runs.values())
    return out


def inline_events(rows: Sequence[Sequence[Any]], after: int = 0, upto: int | None = None) -> list[JournalRow]:
    """PostgreSQL's ``(seq, type, data, crc, parts)`` rows as the events ``after < id <= upto``
    they hold, each checked against its CRC (T-3): a damaged one comes back with its reason and no
    bytes, and every id of a group whose index is damaged is said."""
    out: list[JournalRow] = []
    top = upto if upto is not None else 2**63 - 1
    for seq, event_type, data, crc, parts in rows:
        seq, event_type = int(seq), str(event_type)
        if parts is None:
            if after < seq <= top:
                out.append(_checked(seq, event_type, bytes(data), crc))
            continue
        index = bytes(parts)
        members = expand(seq, event_type, index, 0, crc)
        if members is None:
            out.extend(JournalRow(damaged, event_type, b"", CHECKSUM_MISMATCH)
                       for damaged in damaged_ids(seq, index, after, top))
            continue
        view = memoryview(data)
        for member_seq, _, offset, size, member_crc in members:
            if after < member_seq <= top:
                piece = view[offset:offset + size].tobytes()
                out.append(_checked(member_seq, event_type, piece, member_crc) if len(piece) == size
                           else JournalRow(member_seq, event_type, b"", CHECKSUM_MISMATCH))
    return out


def _checked(seq: int, event_type: str, data: bytes, crc: Any) -> JournalRow:
    if verified(data, crc):
        return JournalRow(seq, event_type, data)
    return JournalRow(seq, event_type, b"", CHECKSUM_MISMATCH)


# How many events a row stands for, in SQL (the same rule as is_group and count).
ROW_EVENTS_SQL = ("CASE WHEN ext_offset IS NOT NULL AND length(data) > 0 "
                  f"THEN max(1, length(data) / {ENTRY_BYTES}) ELSE 1 END")
_COVERING_ROW = ("SELECT seq, type, data, ext_offset, ext_bytes, crc FROM events WHERE session_id = ? "
                 "AND seq >= ? AND seq < ? ORDER BY seq LIMIT 1")


def first_of(row: Sequence[Any]) -> int:
    """The first id a ``(seq, type, data, ext_offset, ...)`` row stands for."""
    seq = int(row[0])
    return first_id(seq, bytes(row[2])) if is_group(row[2], row[3]) else seq


def covering_row(db: sqlite3.Connection, session_id: str, seq: int) -> tuple[Any, ...] | None:
    """The ``(seq, type, data, ext_offset, ext_bytes, crc)`` row that holds event ``seq`` (its own,
    or its group's), None when there is none; raises SQLite's error on a damaged page."""
    row = db.execute(_COVERING_ROW, (session_id, seq, seq + GROUP_MAX_EVENTS)).fetchone()
    if row is None or first_of(row) > seq:
        return None
    return tuple(row)


class _Sized(Protocol):
    @property
    def data(self) -> bytes: ...


S = TypeVar("S", bound=_Sized)


def within_bytes(rows: list[S], max_bytes: int) -> list[S]:
    """The first of ``rows`` whose data add up to at most ``max_bytes`` (at least one): a page that
    took a whole group may hold more of its events than the page's bound."""
    total = 0
    for i, row in enumerate(rows):
        total += len(row.data)
        if i and total > max_bytes:
            return rows[:i]
    return rows


def ungroup(db: sqlite3.Connection, session_id: str, seq: int, reason: str) -> int:
    """Give event ``seq`` a row of its own (repair quarantines rows): a group that holds it is
    replaced by one plain row per event. A group whose index is damaged cannot be split: its row
    goes to ``quarantined_events`` whole (with ``reason``) and each of its ids is marked
    quarantined. Returns how many ids were marked."""
    row = covering_row(db, session_id, seq)
    if row is None or not is_group(row[2], row[3]):
        return 0
    last, event_type, index = int(row[0]), str(row[1]), bytes(row[2])
    members = expand(last, event_type, index, int(row[3]), row[5])
    db.execute("DELETE FROM events WHERE session_id = ? AND seq = ?", (session_id, last))
    insert = "INSERT INTO events (session_id, seq, type, data, ext_offset, ext_bytes, crc) VALUES "
    if members is not None:
        db.executemany(insert + "(?, ?, ?, x'', ?, ?, ?)",
                       [(session_id, *member) for member in members])
        return 0
    db.execute("INSERT OR REPLACE INTO quarantined_events VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
               (session_id, *row, reason, time.time()))
    ids = damaged_ids(last, index, 0, last)
    db.executemany(insert + "(?, ?, ?, x'', NULL, NULL, ?)",
                   [(session_id, marked, event_type, QUARANTINED_CRC) for marked in ids])
    return len(ids)
