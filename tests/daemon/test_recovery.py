"""Recovery past the commit point (SPEC T-10) on real SQLite files and segment files: a journal that
lost its last commits (an older copy of it put back, its segment files kept) gets them back with
their own ids and bytes at its next open; a torn, damaged or headless record is quarantined and its
ids recorded as a gap; ids continue past every id a row, a record or a gap holds; `store check`
names the gap; a replay that reaches into it says ``frame_dropped`` with the missing ids."""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import orjson

from hopline.budget import Budget
from hopline.daemon.bus import EventBus
from hopline.store import records
from hopline.store.check import check_sqlite, repair
from hopline.store.recovery import DAMAGED, TORN
from hopline.store.segments import segment_path
from hopline.store.sqlite_journal import (
    INLINE_MAX_BYTES,
    JOURNAL_FILE,
    JOURNAL_SCHEMA,
    SEGMENTS_DIR,
    SqliteJournal,
)
from hopline.vocabulary import FRAME_DROPPED

BIG = INLINE_MAX_BYTES + 100


def _event(n: int, size: int) -> bytes:
    head = b'{"n":%d,"t":"' % n
    return head + b"x" * max(0, size - len(head) - 2) + b'"}'


async def _commit(journal: SqliteJournal, first: int, last: int) -> dict[int, bytes]:
    """Events ``first..last`` of s1, one commit each, large and small ones alternating."""
    sent: dict[int, bytes] = {}
    for n in range(first, last + 1):
        data = _event(n, BIG if n % 3 else 40)
        [seq] = await journal.append_many("s1", [("session_update", data)])
        assert seq == n
        sent[n] = data
    return sent


def _snapshot(tmp_path: Path) -> Path:
    """A copy of the journal file as it is now (closed: the WAL checkpointed into it)."""
    copy = tmp_path / "journal-at-commit-point.sqlite3"
    shutil.copyfile(tmp_path / JOURNAL_FILE, copy)
    return copy


def _lose_commits(tmp_path: Path, copy: Path) -> None:
    """The journal loses every commit since ``copy`` (its segment files keep theirs)."""
    for suffix in ("-wal", "-shm"):
        Path(str(tmp_path / JOURNAL_FILE) + suffix).unlink(missing_ok=True)
    shutil.copyfile(copy, tmp_path / JOURNAL_FILE)


async def _lost_journal(tmp_path: Path) -> tuple[dict[int, bytes], Path]:
    """Events 1..10 committed and kept, 11..30 and a prompt committed then lost by the journal."""
    journal = SqliteJournal(tmp_path)
    await journal.create_session("s1", {"cwd": "/w"})
    sent = await _commit(journal, 1, 10)
    await journal.close()
    copy = _snapshot(tmp_path)
    journal = SqliteJournal(tmp_path)
    await journal.get_session("s1")
    await journal.open_prompt("s1", "p_cut")
    sent |= await _commit(journal, 11, 30)
    await journal.close()
    _lose_commits(tmp_path, copy)
    return sent, segment_path(tmp_path / SEGMENTS_DIR, "s1")


def _records(path: Path) -> list[records.Record]:
    fd = os.open(path, os.O_RDONLY)
    try:
        out, at, size = [], 0, path.stat().st_size
        while at < size:
            record = records.read_record(fd, at, size)
            assert isinstance(record, records.Record)
            out.append(record)
            at = record.end
    finally:
        os.close(fd)
    return out


async def _all(journal: SqliteJournal) -> dict[int, bytes]:
    rows = await journal.read_page("s1", 0, max_bytes=1 << 30)
    assert all(r.corrupt is None for r in rows)
    return {r.seq: r.data for r in rows}


async def test_lost_commits_are_restored_with_their_ids_bytes_and_prompt(tmp_path: Path) -> None:
    sent, _ = await _lost_journal(tmp_path)
    before = check_sqlite(tmp_path / JOURNAL_FILE)  # the operator's look first: nothing changes
    assert before.ok and before.gaps == []
    assert (before.restorable.restored_events, before.restorable.restored_prompts) == (20, 1)
    journal = SqliteJournal(tmp_path)
    assert (journal.recovery.restored_events, journal.recovery.restored_prompts) == (20, 1)
    await journal.get_session("s1")
    assert await _all(journal) == sent  # every id names the bytes it named before
    assert journal.next_id("s1") == 31
    assert await journal.unended_prompts() == [("s1", "p_cut")]  # its turn will be ended
    await journal.close()
    again = SqliteJournal(tmp_path)  # restored once: nothing past the commit point any more
    assert again.recovery.sessions == 0
    await again.close()
    assert check_sqlite(tmp_path / JOURNAL_FILE).restorable.sessions == 0


async def test_a_torn_last_record_is_a_named_gap_quarantined_and_ids_continue_past_it(tmp_path: Path) -> None:
    sent, path = await _lost_journal(tmp_path)
    last = _records(path)[-1]
    assert last.ids == (30, 30)
    os.truncate(path, last.end - 5)  # its bytes cut: the header says which ids it held
    report = check_sqlite(tmp_path / JOURNAL_FILE)
    assert not report.ok and [g.to_json() for g in report.gaps] == [
        {"sessionId": "s1", "firstId": 30, "lastId": 30, "reason": TORN}]
    journal = SqliteJournal(tmp_path)
    assert [(g.first, g.last) for g in journal.recovery.gaps] == [(30, 30)]
    await journal.get_session("s1")
    assert await _all(journal) == {n: sent[n] for n in range(1, 30)}
    assert journal.next_id("s1") == 31 and await journal.last_id("s1") == 30  # 30 is never given again
    assert path.stat().st_size == last.offset  # the torn tail is cut off, its bytes kept aside
    [moved] = [f for f in (tmp_path / "journal.quarantine").rglob("*") if f.is_file()]
    assert moved.name.endswith(f".{last.offset}-{last.end - 5}.{TORN}")
    assert len(moved.read_bytes()) == last.end - 5 - last.offset
    [seq] = await journal.append_many("s1", [("session_update", _event(31, BIG))])
    assert seq == 31
    await journal.close()
    after = check_sqlite(tmp_path / JOURNAL_FILE)  # the recorded gap is still named: exit 1
    assert not after.ok and [(g.first, g.last) for g in after.gaps] == [(30, 30)]
    fixed = repair(tmp_path / JOURNAL_FILE, JOURNAL_SCHEMA)
    assert fixed.problem is None and [(g.first, g.last) for g in fixed.gaps] == [(30, 30)]


async def test_a_damaged_middle_record_is_a_gap_between_the_records_that_verify(tmp_path: Path) -> None:
    sent, path = await _lost_journal(tmp_path)
    middle = next(r for r in _records(path) if r.ids == (20, 20))
    with open(path, "r+b") as handle:  # one byte of its data flipped
        handle.seek(middle.events[0].offset + 3)
        byte = handle.read(1)
        handle.seek(middle.events[0].offset + 3)
        handle.write(bytes([byte[0] ^ 0x20]))
    size = path.stat().st_size
    journal = SqliteJournal(tmp_path)
    assert [(g.first, g.last, g.reason) for g in journal.recovery.gaps] == [(20, 20, DAMAGED)]
    await journal.get_session("s1")
    assert await _all(journal) == {n: sent[n] for n in range(1, 31) if n != 20}
    assert path.stat().st_size == size  # a stretch in the middle stays where it is (copied aside)
    assert journal.next_id("s1") == 31
    await journal.close()


async def test_a_torn_header_is_a_gap_of_unknown_length_and_ids_continue_past_what_verifies(
        tmp_path: Path) -> None:
    sent, path = await _lost_journal(tmp_path)
    last = _records(path)[-1]
    os.truncate(path, last.offset + 10)  # not even its header is whole
    report = check_sqlite(tmp_path / JOURNAL_FILE)
    assert [(g.first, g.last) for g in report.gaps] == [(30, None)] and not report.ok
    journal = SqliteJournal(tmp_path)
    await journal.get_session("s1")
    assert await _all(journal) == {n: sent[n] for n in range(1, 30)}
    assert journal.next_id("s1") == 30  # nothing says 30 was written: the store never held it
    await journal.close()


async def test_a_replay_into_a_gap_says_which_ids_are_missing_then_goes_on(tmp_path: Path) -> None:
    _, path = await _lost_journal(tmp_path)
    middle = next(r for r in _records(path) if r.ids == (20, 20))
    with open(path, "r+b") as handle:
        handle.seek(middle.offset + 4)  # its header's CRC
        handle.write(b"\0\0\0\0")
    journal = SqliteJournal(tmp_path)
    await journal.get_session("s1")
    bus = EventBus(Budget.defaults(), journal)
    for after, said in ((18, (20, 20)), (0, (20, 20))):
        told: list[tuple[int | None, str, object]] = []
        async for page in bus.replay("s1", after, 30):
            told += [(e.id, e.type, orjson.loads(e.data).get("missingIds") if e.id is None else None)
                     for e in page]
        gap_at = next(i for i, item in enumerate(told) if item[1] == FRAME_DROPPED)
        assert told[gap_at][2] == {"first": said[0], "last": said[1]}
        assert [t[0] for t in told[:gap_at]] == list(range(after + 1, 20))  # in its place
        assert [t[0] for t in told[gap_at + 1:]] == list(range(21, 31))
    told = [e async for page in bus.replay("s1", 19, 20) for e in page]  # resuming inside it
    assert [(e.id, orjson.loads(e.data)["missingIds"]) for e in told] == [(None, {"first": 20, "last": 20})]
    assert [e async for page in bus.replay("s1", 20, 30) for e in page if e.id is None] == []
    await journal.close()


async def test_a_failed_transaction_leaves_no_record_behind(tmp_path: Path) -> None:
    journal = SqliteJournal(tmp_path)
    await journal.create_session("s1", {})
    await _commit(journal, 1, 3)
    path = segment_path(tmp_path / SEGMENTS_DIR, "s1")
    size = path.stat().st_size
    outside = sqlite3.connect(tmp_path / JOURNAL_FILE)
    outside.execute("INSERT INTO events (session_id, seq, type, data) VALUES ('s1', 5, 'x', x'00')")
    outside.commit()
    outside.close()
    journal.stage("s1", "e", _event(4, BIG))
    journal.stage("s1", "e", _event(5, BIG))  # its insert fails: the whole commit fails
    try:
        await journal.commit()
    except sqlite3.IntegrityError:
        pass
    else:
        raise AssertionError("the commit should have failed")
    assert path.stat().st_size == size  # its record was cut back with the rollback
    await journal.close()
    reopened = SqliteJournal(tmp_path)
    assert reopened.recovery.sessions == 0
    await reopened.close()


async def test_small_events_commit_without_their_record_when_the_segment_file_cannot_take_it(
        tmp_path: Path) -> None:
    """A record whose rows hold everything (small events, a prompt) is a copy: when the segment file
    cannot be written the rows commit without it; events whose bytes would live there fail."""
    journal = SqliteJournal(tmp_path)
    await journal.create_session("s1", {})
    (tmp_path / SEGMENTS_DIR).write_bytes(b"")  # where the directory would be: nothing can be made
    assert await journal.append_many("s1", [("e", b'{"small":1}')]) == [1]
    await journal.open_prompt("s1", "p_1")
    journal.stage("s1", "e", _event(2, BIG))
    try:
        await journal.commit()
    except OSError:
        pass
    else:
        raise AssertionError("a large event with no segment file to hold it should fail")
    rows = await journal.read_page("s1", 0, max_bytes=1 << 20)
    assert [(r.seq, r.data) for r in rows] == [(1, b'{"small":1}')]
    assert await journal.unended_prompts() == [("s1", "p_1")]
    await journal.close()
