"""Checked on read (SPEC T-3, issue #25) on a real SQLite journal and real segment files: a flipped
byte, a moved offset, a truncated, overwritten or deleted segment, a damaged page; each damaged
event said by id (``data_corrupt`` on the bus's replay), every good one still delivered; the
startup check and `hopline store check` (with ``--repair``) over the same faults; the one mapping
of a refused write to 507 / 503."""

from __future__ import annotations

import errno
import os
import sqlite3
import zlib
from pathlib import Path

import orjson
import pytest

from hopline.budget import Budget
from hopline.daemon.bus import EventBus
from hopline.daemon.storage_faults import refusal
from hopline.errors import StoreDamaged
from hopline.store.check import check_sqlite, repair, require_usable
from hopline.store.integrity import (
    CHECKSUM_MISMATCH,
    QUARANTINED,
    SEGMENT_MISSING,
    SEGMENT_SHORT,
    checksum,
    verified,
)
from hopline.store.segments import segment_path
from hopline.store.sqlite_journal import (
    INLINE_MAX_BYTES,
    JOURNAL_FILE,
    JOURNAL_SCHEMA,
    SEGMENTS_DIR,
    SqliteJournal,
    probe_rows,
)
from hopline.vocabulary import DATA_CORRUPT

SMALL = b'{"n":"small"}'


def _big(n: int) -> bytes:
    return orjson.dumps({"n": n, "text": f"{n:04d}" * ((INLINE_MAX_BYTES + 200) // 4)})


async def _twelve(tmp_path: Path) -> tuple[SqliteJournal, dict[int, bytes]]:
    """Session s1 with 12 events: odd ids external (segment file), even ids inline."""
    journal = SqliteJournal(tmp_path)
    await journal.create_session("s1", {})
    datas = {n: (_big(n) if n % 2 else SMALL) for n in range(1, 13)}
    await journal.append_many("s1", [("e", datas[n]) for n in range(1, 13)])
    return journal, datas


def _offset(tmp_path: Path, seq: int) -> tuple[int, int]:
    db = sqlite3.connect(tmp_path / JOURNAL_FILE)
    try:
        row = db.execute("SELECT ext_offset, ext_bytes FROM events WHERE session_id = 's1' AND seq = ?",
                         (seq,)).fetchone()
    finally:
        db.close()
    return int(row[0]), int(row[1])


async def _replayed(journal: SqliteJournal) -> tuple[list[int], list[int]]:
    """(good ids, ids said as data_corrupt), through the bus's replay from the journal."""
    bus = EventBus(Budget.defaults(), journal)
    good: list[int] = []
    damaged: list[int] = []
    async for page in bus.replay("s1", 0, 12):
        for event in page:
            if event.type == DATA_CORRUPT:
                damaged.append(orjson.loads(event.data)["eventId"])
            else:
                assert event.id is not None
                good.append(event.id)
    assert bus.corrupt.status()["corruptEvents"] == len(damaged)
    return good, damaged


@pytest.mark.parametrize("size", [0, 1, INLINE_MAX_BYTES, INLINE_MAX_BYTES + 1, 1 << 20])
def test_the_checksum_is_zlibs_crc32_so_journals_written_before_still_verify(size: int) -> None:
    data = bytes((i * 131 + 7) % 256 for i in range(size))
    assert checksum(data) == zlib.crc32(data)
    assert checksum(memoryview(data)) == zlib.crc32(data)
    assert verified(data, zlib.crc32(data))
    if size:
        flipped = bytes([data[0] ^ 1]) + data[1:]
        assert not verified(flipped, zlib.crc32(data))


async def test_a_flipped_byte_in_a_segment_is_said_by_id_and_the_rest_delivered(tmp_path: Path) -> None:
    journal, datas = await _twelve(tmp_path)
    offset, _ = _offset(tmp_path, 5)
    with open(segment_path(tmp_path / SEGMENTS_DIR, "s1"), "r+b") as handle:
        handle.seek(offset + 20)
        byte = handle.read(1)
        handle.seek(offset + 20)
        handle.write(bytes([byte[0] ^ 0x01]))
    rows = await journal.read_page("s1", 0, max_bytes=1 << 30)
    assert [(r.seq, r.corrupt) for r in rows if r.corrupt] == [(5, CHECKSUM_MISMATCH)]
    assert all(r.data == datas[r.seq] for r in rows if r.corrupt is None)
    good, damaged = await _replayed(journal)
    assert damaged == [5] and good == [n for n in range(1, 13) if n != 5]
    await journal.close()


async def test_a_flipped_inline_byte_and_a_moved_offset_are_caught(tmp_path: Path) -> None:
    journal, _ = await _twelve(tmp_path)
    await journal.close()
    offset_7, _ = _offset(tmp_path, 7)
    db = sqlite3.connect(tmp_path / JOURNAL_FILE)
    db.execute("UPDATE events SET data = ? WHERE session_id = 's1' AND seq = 4", (SMALL.replace(b"s", b"S"),))
    # event 9 now points at event 7's bytes
    db.execute("UPDATE events SET ext_offset = ? WHERE session_id = 's1' AND seq = 9", (offset_7,))
    db.commit()
    db.close()
    reopened = SqliteJournal(tmp_path)
    await reopened.get_session("s1")
    good, damaged = await _replayed(reopened)
    assert damaged == [4, 9] and len(good) == 10
    await reopened.close()


@pytest.mark.parametrize("fault", ["truncate", "delete", "random"])
async def test_a_damaged_segment_file_is_said_event_by_event(tmp_path: Path, fault: str) -> None:
    journal, _ = await _twelve(tmp_path)
    path = segment_path(tmp_path / SEGMENTS_DIR, "s1")
    offset_7, _ = _offset(tmp_path, 7)
    if fault == "truncate":  # event 7 cut in the middle: 7, 9, 11 short; 1, 3, 5 whole
        os.truncate(path, offset_7 + 10)
        expected = {7: SEGMENT_SHORT, 9: SEGMENT_SHORT, 11: SEGMENT_SHORT}
    elif fault == "delete":
        path.unlink()
        expected = {n: SEGMENT_MISSING for n in (1, 3, 5, 7, 9, 11)}
    else:  # the whole file overwritten with random bytes of its own size
        path.write_bytes(os.urandom(path.stat().st_size))
        expected = {n: CHECKSUM_MISMATCH for n in (1, 3, 5, 7, 9, 11)}
    rows = await journal.read_page("s1", 0, max_bytes=1 << 30)
    assert {r.seq: r.corrupt for r in rows if r.corrupt} == expected
    good, damaged = await _replayed(journal)
    assert damaged == sorted(expected) and good == [n for n in range(1, 13) if n not in expected]
    await journal.close()
    report = check_sqlite(tmp_path / JOURNAL_FILE)
    assert report.problem is None and report.events_checked == 12
    assert {(d.session_id, d.event_id, d.reason) for d in report.damaged} == {
        ("s1", n, reason) for n, reason in expected.items()}


async def test_repair_quarantines_damaged_rows_keeps_their_bytes_and_reads_say_quarantined(
        tmp_path: Path) -> None:
    journal, _ = await _twelve(tmp_path)
    offset, size = _offset(tmp_path, 3)
    with open(segment_path(tmp_path / SEGMENTS_DIR, "s1"), "r+b") as handle:
        handle.seek(offset)
        handle.write(b"X")
    await journal.close()
    fixed = repair(tmp_path / JOURNAL_FILE, JOURNAL_SCHEMA)
    assert [(d.event_id, d.reason) for d in fixed.damaged] == [(3, QUARANTINED)]
    assert fixed.repaired and fixed.problem is None
    db = sqlite3.connect(tmp_path / JOURNAL_FILE)
    kept = db.execute("SELECT seq, ext_offset, ext_bytes, reason FROM quarantined_events").fetchall()
    db.close()
    assert kept == [(3, offset, size, CHECKSUM_MISMATCH)]  # never deleted: where its bytes were
    assert segment_path(tmp_path / SEGMENTS_DIR, "s1").exists()
    reopened = SqliteJournal(tmp_path)
    await reopened.get_session("s1")
    rows = await reopened.read_page("s1", 0, max_bytes=1 << 30)
    assert [(r.seq, r.corrupt) for r in rows if r.corrupt] == [(3, QUARANTINED)]
    await reopened.close()


async def test_a_damaged_page_is_read_past_and_every_unreadable_id_said(tmp_path: Path) -> None:
    journal = SqliteJournal(tmp_path)
    await journal.create_session("s1", {})
    # inline rows of ~200 bytes over many pages, so one damaged page holds some of them only
    datas = [orjson.dumps({"n": n, "pad": "p" * 200}) for n in range(1, 2001)]
    await journal.append_many("s1", [("e", d) for d in datas])
    await journal.close()
    size = (tmp_path / JOURNAL_FILE).stat().st_size
    page = 32 * 1024
    with open(tmp_path / JOURNAL_FILE, "r+b") as handle:  # a leaf page in the middle, zeroed
        handle.seek((size // page // 2) * page)
        handle.write(b"\xff" * page)
    with pytest.raises(StoreDamaged) as refused:
        require_usable(tmp_path / JOURNAL_FILE, tmp_path)
    line = str(refused.value)
    assert "\n" not in line and str(tmp_path / JOURNAL_FILE) in line and "hopline store check" in line
    report = check_sqlite(tmp_path / JOURNAL_FILE)
    assert report.problem is not None and report.damaged
    lost = {d.event_id for d in report.damaged}
    # the daemon's reads, on the damaged file, say the same ids and deliver every other one
    db = sqlite3.connect(tmp_path / JOURNAL_FILE)  # the daemon's id-by-id read past a damaged page
    rows = probe_rows(db, tmp_path / SEGMENTS_DIR, "s1", 0, 2000, 1 << 30)
    db.close()
    assert {r.seq for r in rows if r.corrupt} == lost
    assert [r.data for r in rows if not r.corrupt] == [d for n, d in enumerate(datas, 1) if n not in lost]
    fixed = repair(tmp_path / JOURNAL_FILE, JOURNAL_SCHEMA)
    assert fixed.problem is None
    require_usable(tmp_path / JOURNAL_FILE, tmp_path)  # usable again
    assert (tmp_path / "journal.quarantine").is_dir()  # the damaged file kept


async def test_a_truncated_header_an_emptied_journal_and_orphan_segments_are_refused_in_one_line(
        tmp_path: Path) -> None:
    journal, _ = await _twelve(tmp_path)
    await journal.close()
    path = tmp_path / JOURNAL_FILE
    original = path.read_bytes()
    for damage, needle in ((original[:50], "header"), (b"", "empty (0 bytes)")):
        path.write_bytes(damage)
        with pytest.raises(StoreDamaged) as refused:
            require_usable(path, tmp_path)
        assert needle in str(refused.value) and "\n" not in str(refused.value)
    path.write_bytes(original)
    require_usable(path, tmp_path)
    segment_path(tmp_path / SEGMENTS_DIR, "a session the journal never knew").write_bytes(b"x" * 300)
    with pytest.raises(StoreDamaged, match="belong to no session"):
        require_usable(path, tmp_path)
    fixed = repair(path, JOURNAL_SCHEMA)
    assert fixed.orphan_segments == [] and any("orphan segment" in line for line in fixed.repaired)
    require_usable(path, tmp_path)


def test_a_refused_write_is_507_on_a_full_disk_and_503_otherwise() -> None:
    full = refusal(OSError(errno.ENOSPC, "No space left on device"), "the prompt")
    assert full.status == 507 and full.body["error"]["type"] == "storage_full"
    assert full.body["error"]["hop"] == "daemon.journal"
    sqlite_full = sqlite3.OperationalError("database or disk is full")
    sqlite_full.sqlite_errorcode = sqlite3.SQLITE_FULL  # type: ignore[attr-defined]
    assert refusal(sqlite_full, "the prompt").status == 507
    failed = refusal(OSError(errno.EIO, "Input/output error"), "the prompt")
    assert failed.status == 503 and failed.body["error"]["type"] == "storage_unavailable"
