"""The SQLite journal's segment records (SPEC T-10, T-3): each session's segment file is a log of
what was committed for it, readable without the journal.

Every write of the journal's writer that touches a session appends ONE record to the session's
segment file, inside the same transaction: a commit's events of that session (their ids, types,
sizes, CRC-32s, then their bytes), or an accepted prompt opened or closed. The journal's rows point
into the records (an external event's row holds the offset and size of its bytes), and the session's
row holds the end of its last committed record (``segment_end``). When the journal lost its last
commits (a torn WAL) the records past that point still say, byte for byte, what was committed and
acknowledged: :mod:`hopline.store.recovery` restores them with their own ids.

A record, little-endian::

    magic "HLR" + version 1       4 bytes
    crc                           CRC-32 of every header byte after this field
    header_len                    the whole header, these fixed fields included
    kind                          1 byte (EVENTS, PROMPT_OPEN, PROMPT_CLOSE), 3 bytes of padding
    data_len                      8 bytes: the event bytes that follow the header
    EVENTS:  count, external      the events; the first ``external`` are the rows' external ones
             seqs (8 bytes each), sizes, crcs (4 bytes each), type indexes (2 bytes each)
             the types: how many (2 bytes), then each one's length (2 bytes) and UTF-8 bytes
    PROMPT_*: after_seq (8 bytes), the prompt id's length (2 bytes) and UTF-8 bytes

then the events' bytes end to end, in the header's order: the external events (in id order, so a
run of them is where the rows' offsets say), then the inline ones (copies of what their rows hold).
"""

from __future__ import annotations

import dataclasses
import os
import struct
from collections.abc import Sequence

from hopline.store.integrity import checksum, verified

MAGIC = b"HLR\x01"
EVENTS, PROMPT_OPEN, PROMPT_CLOSE = 1, 2, 3
KINDS = (EVENTS, PROMPT_OPEN, PROMPT_CLOSE)
_FIXED = struct.Struct("<4sIIB3xQ")  # magic, crc, header_len, kind, data_len
_CRC_FROM = 8  # the CRC covers the header from header_len on
_COUNTS = struct.Struct("<II")  # count, external
_PROMPT = struct.Struct("<QH")  # after_seq, the prompt id's length
_LEN = struct.Struct("<H")
# A sanity bound on a header read back (a damaged length must not make recovery read gigabytes):
# far above any real one (a commit's events of one session: the journal queue bounds them).
HEADER_MAX_BYTES = 64 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Event:
    """One event of a record: its id, type, where its bytes are in the file, their size and CRC;
    ``external`` when its row points at those bytes (else the row holds a copy)."""

    seq: int
    type: str
    offset: int
    size: int
    crc: int
    external: bool


@dataclasses.dataclass(frozen=True)
class Record:
    offset: int  # where it starts in the file
    end: int  # where the next one starts
    kind: int
    events: tuple[Event, ...] = ()
    prompt_id: str = ""
    after_seq: int = 0

    @property
    def ids(self) -> tuple[int, int] | None:
        """The first and last event id it holds (None for a prompt record)."""
        return (min(e.seq for e in self.events), max(e.seq for e in self.events)) if self.events else None


def events_record(seqs: Sequence[int], types: Sequence[str], sizes: Sequence[int], crcs: Sequence[int],
                  external: int) -> bytes:
    """The header of an EVENTS record whose bytes follow in this order (the first ``external``
    events are the rows' external ones)."""
    index: dict[str, int] = {}
    type_ids = [index.setdefault(t, len(index)) for t in types]
    n = len(seqs)
    names = b"".join(_LEN.pack(len(raw)) + raw for raw in (t.encode() for t in index))
    body = (_COUNTS.pack(n, external) + struct.pack(f"<{n}Q{n}I{n}I{n}H", *seqs, *sizes, *crcs, *type_ids)
            + _LEN.pack(len(index)) + names)
    return _sealed(EVENTS, sum(sizes), body)


def prompt_record(kind: int, prompt_id: str, after_seq: int) -> bytes:
    raw = prompt_id.encode()
    return _sealed(kind, 0, _PROMPT.pack(after_seq, len(raw)) + raw)


def _sealed(kind: int, data_len: int, body: bytes) -> bytes:
    header_len = _FIXED.size + len(body)
    tail = _FIXED.pack(MAGIC, 0, header_len, kind, data_len)[_CRC_FROM:] + body
    return MAGIC + struct.pack("<I", checksum(tail)) + tail


def read_record(fd: int, offset: int, file_size: int) -> Record | str:
    """The whole record at ``offset`` with every event's bytes checked against its CRC, or why
    there is none: ``torn`` (the file ends inside it), ``damaged`` (not a record, a header that
    fails its CRC, or bytes that fail theirs)."""
    header = _header(fd, offset, file_size)
    if isinstance(header, str):
        return header
    if header.end > file_size:
        return "torn"
    for event in header.events:  # each event's bytes as its CRC says
        if not verified(os.pread(fd, event.size, event.offset), event.crc):
            return "damaged"
    return header


def header_ids(fd: int, offset: int, file_size: int) -> tuple[int, int] | None:
    """The first and last event id of the record at ``offset`` when its header is whole and
    verifies (its bytes may not be), else None."""
    header = _header(fd, offset, file_size)
    return None if isinstance(header, str) else header.ids


def _header(fd: int, offset: int, file_size: int) -> Record | str:
    """The record at ``offset`` as its header says (its bytes not read), or why not."""
    fixed = os.pread(fd, _FIXED.size, offset)
    if len(fixed) < _FIXED.size:
        return "torn"
    magic, crc, header_len, kind, data_len = _FIXED.unpack(fixed)
    if magic != MAGIC or kind not in KINDS or not _FIXED.size <= header_len <= HEADER_MAX_BYTES:
        return "damaged"
    if offset + header_len > file_size:
        return "torn"
    header = fixed + os.pread(fd, header_len - _FIXED.size, offset + _FIXED.size)
    if not verified(header[_CRC_FROM:], crc):
        return "damaged"
    body = memoryview(header)[_FIXED.size:]
    end = offset + header_len + data_len
    try:
        if kind != EVENTS:
            after_seq, length = _PROMPT.unpack_from(body)
            prompt_id = bytes(body[_PROMPT.size:_PROMPT.size + length]).decode()
            return Record(offset, end, kind, prompt_id=prompt_id, after_seq=after_seq)
        events = _events(body, offset + header_len)
    except (struct.error, UnicodeDecodeError, IndexError):
        return "damaged"
    if sum(e.size for e in events) != data_len:
        return "damaged"
    return Record(offset, end, kind, events=events)


def _events(body: memoryview, data_at: int) -> tuple[Event, ...]:
    n, external = _COUNTS.unpack_from(body)
    arrays = struct.Struct(f"<{n}Q{n}I{n}I{n}H")
    values = arrays.unpack_from(body, _COUNTS.size)
    seqs, sizes, crcs, type_ids = values[:n], values[n:2 * n], values[2 * n:3 * n], values[3 * n:]
    at = _COUNTS.size + arrays.size
    (ntypes,) = _LEN.unpack_from(body, at)
    at += _LEN.size
    names: list[str] = []
    for _ in range(ntypes):
        (length,) = _LEN.unpack_from(body, at)
        names.append(bytes(body[at + _LEN.size:at + _LEN.size + length]).decode())
        at += _LEN.size + length
    events = []
    offset = data_at
    for i in range(n):
        events.append(Event(seqs[i], names[type_ids[i]], offset, sizes[i], crcs[i], i < external))
        offset += sizes[i]
    return tuple(events)


def find_next(fd: int, offset: int, file_size: int) -> Record | None:
    """The first whole record that starts after ``offset`` (past a damaged stretch), or None."""
    chunk = 1 << 20
    at = offset + 1
    while at < file_size:
        window = os.pread(fd, chunk + len(MAGIC) - 1, at)
        start = 0
        while (found := window.find(MAGIC, start)) >= 0:
            record = read_record(fd, at + found, file_size)
            if isinstance(record, Record):
                return record
            start = found + 1
        at += chunk
    return None
