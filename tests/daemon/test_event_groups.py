"""Row groups of the SQLite journal (issue 30): a run of small external events of one session in one
commit is one row, and every read says each of its events as if it had a row of its own: pages
that start or end inside a group, the page's byte bound, ``count``, the probe past a damaged page,
a damaged event of a group (said alone), a damaged group index (every id said), and
`hopline store check --repair` (a grouped event quarantined alone, a damaged index kept whole)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hopline.store.check import check_sqlite, repair
from hopline.store.event_groups import (
    GROUP_EVENT_MAX_BYTES,
    GROUP_MAX_BYTES,
    GROUP_MAX_EVENTS,
    first_of,
    journal_rows,
)
from hopline.store.integrity import CHECKSUM_MISMATCH, QUARANTINED, checksum
from hopline.store.segments import segment_path
from hopline.store.sqlite_journal import (
    INLINE_MAX_BYTES,
    JOURNAL_FILE,
    JOURNAL_SCHEMA,
    SEGMENTS_DIR,
    SqliteJournal,
    probe_rows,
)

KiB = 1024


def _data(n: int, size: int) -> bytes:
    """``size`` bytes of JSON, told apart by ``n``."""
    head = b'{"n":%d,"t":"' % n
    return head + b"x" * (size - len(head) - 2) + b'"}'


def _rows(tmp_path: Path) -> list[tuple[int, int, int]]:
    """(seq, first id, events) of each of s1's rows."""
    db = sqlite3.connect(tmp_path / JOURNAL_FILE)
    try:
        rows = db.execute("SELECT seq, type, data, ext_offset FROM events WHERE session_id = 's1' "
                          "ORDER BY seq").fetchall()
    finally:
        db.close()
    return [(row[0], first_of(row), row[0] - first_of(row) + 1) for row in rows]


async def _journal(tmp_path: Path, sizes: list[int], *, event_type: str = "session_update",
                   ) -> tuple[SqliteJournal, dict[int, bytes]]:
    journal = SqliteJournal(tmp_path)
    await journal.create_session("s1", {})
    datas = {n: _data(n, size) for n, size in enumerate(sizes, start=1)}
    await journal.append_many("s1", [(event_type, datas[n]) for n in sorted(datas)])
    return journal, datas


async def _read_all(journal: SqliteJournal, max_bytes: int = 1 << 30) -> list[tuple[int, bytes, str | None]]:
    out: list[tuple[int, bytes, str | None]] = []
    after = 0
    while rows := await journal.read_page("s1", after, max_bytes=max_bytes):
        assert rows[0].seq > after  # each page moves on
        out += [(r.seq, r.data, r.corrupt) for r in rows]
        after = rows[-1].seq
    return out


def _data_start(tmp_path: Path) -> int:
    """Where s1's first external event's bytes start in its segment file (past its record's header)."""
    db = sqlite3.connect(tmp_path / JOURNAL_FILE)
    try:
        (start,) = db.execute("SELECT MIN(ext_offset) FROM events WHERE session_id = 's1'").fetchone()
    finally:
        db.close()
    return int(start)


def _flip(tmp_path: Path, offset: int) -> None:
    with open(segment_path(tmp_path / SEGMENTS_DIR, "s1"), "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0x01]))


async def test_a_run_of_small_external_events_is_one_row_and_each_reads_back(tmp_path: Path) -> None:
    # 1..40 grouped; 41 inline ends the run; 42..50 a second group
    sizes = [KiB] * 40 + [INLINE_MAX_BYTES] + [KiB] * 9
    journal, datas = await _journal(tmp_path, sizes)
    assert _rows(tmp_path) == [(40, 1, 40), (41, 41, 1), (50, 42, 9)]
    assert await _read_all(journal) == [(n, datas[n], None) for n in range(1, 51)]
    assert await journal.count("s1", "session_update") == 50
    assert await journal.last_id("s1") == 50
    await journal.close()
    reopened = SqliteJournal(tmp_path)
    await reopened.get_session("s1")
    assert reopened.next_id("s1") == 51  # MAX(seq) is a group's last id
    assert await _read_all(reopened, max_bytes=3 * KiB) == [(n, datas[n], None) for n in range(1, 51)]
    await reopened.close()


@pytest.mark.parametrize(("sizes", "expected"), [
    ([INLINE_MAX_BYTES + 1] * 2, [(2, 1, 2)]),  # one byte over the inline bound: grouped
    ([INLINE_MAX_BYTES] * 2, [(1, 1, 1), (2, 2, 1)]),  # at it: inline rows
    ([GROUP_EVENT_MAX_BYTES - 1] * 2, [(2, 1, 2)]),  # under the group's event bound: grouped
    ([GROUP_EVENT_MAX_BYTES] * 2, [(1, 1, 1), (2, 2, 1)]),  # at it: a row each, read alone
    ([300] * GROUP_MAX_EVENTS, [(GROUP_MAX_EVENTS, 1, GROUP_MAX_EVENTS)]),  # a full group
    ([300] * (GROUP_MAX_EVENTS + 1), [(GROUP_MAX_EVENTS, 1, GROUP_MAX_EVENTS),
                                      (GROUP_MAX_EVENTS + 1, GROUP_MAX_EVENTS + 1, 1)]),  # one over
    ([KiB], [(1, 1, 1)]),  # a lone event keeps a plain row
    ([GROUP_MAX_BYTES // 8] * 8, [(8, 1, 8)]),  # exactly the group's bytes
    ([GROUP_MAX_BYTES // 8] * 7 + [GROUP_MAX_BYTES // 8 + 1], [(7, 1, 7), (8, 8, 1)]),  # one byte over
])
async def test_group_bounds(tmp_path: Path, sizes: list[int], expected: list[tuple[int, int, int]]) -> None:
    journal, datas = await _journal(tmp_path, sizes)
    assert _rows(tmp_path) == expected
    assert await _read_all(journal) == [(n, datas[n], None) for n in sorted(datas)]
    await journal.close()


def test_runs_are_per_session_consecutive_and_of_one_type() -> None:
    staged = [("a", 1, "u", b"1" * 300), ("b", 1, "u", b"2" * 300), ("a", 2, "u", b"3" * 300),
              ("b", 2, "v", b"4" * 300), ("a", 4, "u", b"5" * 300), ("a", 5, "u", b"6" * 300)]
    offsets = {"a": 0, "b": 1000}
    rows = journal_rows(staged, offsets, INLINE_MAX_BYTES, [checksum(row[3]) for row in staged])
    shape = sorted((r[0], r[1], r[4], r[5], len(r[3]) // 8) for r in rows)
    # a: 1-2 grouped, 4-5 grouped (3 is missing: not consecutive); b: 1 and 2 differ in type
    assert shape == [("a", 2, 0, 600, 2), ("a", 5, 600, 600, 2),
                     ("b", 1, 1000, 300, 0), ("b", 2, 1300, 300, 0)]
    assert offsets == {"a": 1200, "b": 1600}
    plain = {r[1]: r for r in rows if r[0] == "b"}
    assert plain[1][6] == checksum(b"2" * 300)


async def test_pages_that_start_and_end_inside_a_group_hold_exactly_their_ids(tmp_path: Path) -> None:
    journal, datas = await _journal(tmp_path, [KiB] * 100)
    assert _rows(tmp_path) == [(100, 1, 100)]
    rows = await journal.read_page("s1", 37, upto=60, max_bytes=1 << 30)
    assert [r.seq for r in rows] == list(range(38, 61))
    assert all(r.data == datas[r.seq] for r in rows)
    # the byte bound counts the events, not the group: 10 KiB of 1 KiB events is 10 of them
    rows = await journal.read_page("s1", 5, max_bytes=10 * KiB)
    assert [r.seq for r in rows] == list(range(6, 16))
    rows = await journal.read_page("s1", 5, max_bytes=1)  # at least one
    assert [r.seq for r in rows] == [6]
    await journal.close()


async def test_a_damaged_event_of_a_group_is_said_alone(tmp_path: Path) -> None:
    journal, datas = await _journal(tmp_path, [KiB] * 20)
    start = _data_start(tmp_path)
    _flip(tmp_path, start + 6 * KiB + 100)  # inside event 7
    got = await _read_all(journal)
    assert [(seq, corrupt) for seq, _, corrupt in got if corrupt] == [(7, CHECKSUM_MISMATCH)]
    assert [seq for seq, data, corrupt in got if corrupt is None and data == datas[seq]] == [
        n for n in range(1, 21) if n != 7]
    await journal.close()
    report = check_sqlite(tmp_path / JOURNAL_FILE)
    assert report.events_checked == 20 and [(d.event_id, d.reason) for d in report.damaged] == [
        (7, CHECKSUM_MISMATCH)]
    fixed = repair(tmp_path / JOURNAL_FILE, JOURNAL_SCHEMA)
    assert [(d.event_id, d.reason) for d in fixed.damaged] == [(7, QUARANTINED)]
    assert fixed.repaired == ["quarantined 1 damaged event row(s) into the quarantined_events table"]
    db = sqlite3.connect(tmp_path / JOURNAL_FILE)
    kept = db.execute("SELECT seq, ext_offset, ext_bytes, reason FROM quarantined_events").fetchall()
    db.close()
    assert kept == [(7, start + 6 * KiB, KiB, CHECKSUM_MISMATCH)]  # where its bytes were
    reopened = SqliteJournal(tmp_path)
    await reopened.get_session("s1")
    got = await _read_all(reopened)
    assert [(seq, corrupt) for seq, _, corrupt in got if corrupt] == [(7, QUARANTINED)]
    assert all(data == datas[seq] for seq, data, corrupt in got if corrupt is None) and len(got) == 20
    await reopened.close()


async def test_a_damaged_group_index_says_every_id_and_repair_keeps_the_row_whole(tmp_path: Path) -> None:
    journal, datas = await _journal(tmp_path, [KiB] * 5 + [100] + [KiB] * 4)
    await journal.close()
    start = _data_start(tmp_path)
    db = sqlite3.connect(tmp_path / JOURNAL_FILE)
    (index,) = db.execute("SELECT data FROM events WHERE session_id = 's1' AND seq = 5").fetchone()
    damaged_index = bytes([index[0] ^ 0x01]) + index[1:]
    db.execute("UPDATE events SET data = ? WHERE session_id = 's1' AND seq = 5", (damaged_index,))
    db.commit()
    db.close()
    reopened = SqliteJournal(tmp_path)
    await reopened.get_session("s1")
    got = await _read_all(reopened)
    assert [(seq, corrupt) for seq, _, corrupt in got] == [
        (n, CHECKSUM_MISMATCH if n <= 5 else None) for n in range(1, 11)]
    rows = await reopened.read_page("s1", 2, upto=3, max_bytes=1 << 30)  # inside it, still every id
    assert [(r.seq, r.corrupt) for r in rows] == [(3, CHECKSUM_MISMATCH)]
    await reopened.close()
    fixed = repair(tmp_path / JOURNAL_FILE, JOURNAL_SCHEMA)
    assert sorted((d.event_id, d.reason) for d in fixed.damaged) == [(n, QUARANTINED) for n in range(1, 6)]
    assert fixed.repaired == ["quarantined 5 damaged event row(s) into the quarantined_events table"]
    db = sqlite3.connect(tmp_path / JOURNAL_FILE)
    kept = db.execute("SELECT seq, data, ext_offset, ext_bytes, reason FROM quarantined_events").fetchall()
    db.close()
    assert kept == [(5, damaged_index, start, 5 * KiB, CHECKSUM_MISMATCH)]
    again = SqliteJournal(tmp_path)
    await again.get_session("s1")
    got = await _read_all(again)
    assert [(seq, corrupt) for seq, _, corrupt in got] == [
        (n, QUARANTINED if n <= 5 else None) for n in range(1, 11)]
    assert all(data == datas[seq] for seq, data, corrupt in got if corrupt is None)
    await again.close()


async def test_the_probe_past_a_damaged_page_reads_a_group_once(tmp_path: Path) -> None:
    journal, datas = await _journal(tmp_path, [KiB] * 30 + [100] + [KiB] * 3)
    await journal.close()
    db = sqlite3.connect(tmp_path / JOURNAL_FILE)
    try:
        rows = probe_rows(db, tmp_path / SEGMENTS_DIR, "s1", 10, 32, 1 << 30)
        assert [(r.seq, r.data) for r in rows] == [(n, datas[n]) for n in range(11, 33)]
        rows = probe_rows(db, tmp_path / SEGMENTS_DIR, "s1", 0, 34, 4 * KiB)  # the byte bound, in events
        assert [r.seq for r in rows] == [1, 2, 3, 4]
    finally:
        db.close()


async def test_count_and_prompt_ends_see_grouped_events(tmp_path: Path) -> None:
    journal = SqliteJournal(tmp_path)
    await journal.create_session("s1", {})
    await journal.open_prompt("s1", "p1")
    big_end = orjson.dumps({"promptId": "p1", "message": "x" * 400})
    await journal.append_many("s1", [("session_update", _data(n, KiB)) for n in range(8)]
                              + [("turn_error", big_end), ("turn_error", big_end)])
    assert _rows(tmp_path)[-1] == (10, 9, 2)  # the two ends, external and alike, are a group
    assert await journal.count("s1", "session_update") == 8
    assert await journal.count("s1", "turn_error") == 2
    assert await journal.unended_prompts("s1") == []  # its end was found inside the group
    await journal.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(commits=st.lists(st.lists(st.tuples(st.sampled_from(["u", "v"]),
                                           st.sampled_from([10, INLINE_MAX_BYTES + 1, KiB, 3 * KiB,
                                                            GROUP_EVENT_MAX_BYTES])),
                                 min_size=1, max_size=25), min_size=1, max_size=4),
       after=st.integers(0, 60), span=st.integers(1, 60),
       max_bytes=st.sampled_from([1, 2 * KiB, 64 * KiB, 1 << 30]))
def test_any_page_of_any_journal_is_its_events_in_order(tmp_path_factory: pytest.TempPathFactory,
                                                         commits: list[list[tuple[str, int]]], after: int,
                                                         span: int, max_bytes: int) -> None:
    async def run() -> None:
        journal = SqliteJournal(tmp_path_factory.mktemp("groups"))
        await journal.create_session("s1", {})
        events: list[tuple[str, bytes]] = []
        for commit in commits:
            batch = [(event_type, _data(len(events) + i + 1, size))
                     for i, (event_type, size) in enumerate(commit)]
            await journal.append_many("s1", batch)
            events += batch
        upto = after + span
        rows = await journal.read_page("s1", after, upto=upto, max_bytes=max_bytes)
        expected = list(enumerate(events, start=1))[after:upto]
        assert [(r.seq, r.type, r.data, r.corrupt) for r in rows] == [
            (n, t, d, None) for n, (t, d) in expected[:len(rows)]]
        if expected:
            assert rows  # at least one
            total = sum(len(r.data) for r in rows)
            assert len(rows) == 1 or total <= max_bytes  # (a page may end sooner: a group counts whole)
        assert await journal.count("s1", "u") + await journal.count("s1", "v") == len(events)
        await journal.close()
    asyncio.run(run())


async def test_repair_of_a_damaged_journal_copies_groups_whole_and_says_every_id(tmp_path: Path) -> None:
    journal = SqliteJournal(tmp_path)
    await journal.create_session("s1", {})
    datas: dict[int, bytes] = {}
    for _ in range(400):  # 400 commits: a group of 10 and an inline event each, over many pages
        batch = [_data(len(datas) + i + 1, KiB if i < 10 else 100) for i in range(11)]
        seqs = await journal.append_many("s1", [("session_update", data) for data in batch])
        datas.update(zip(seqs, batch, strict=True))
    await journal.close()
    path = tmp_path / JOURNAL_FILE
    page = 4 * KiB
    with open(path, "r+b") as handle:  # a page in the middle, overwritten
        handle.seek((path.stat().st_size // page // 2) * page)
        handle.write(b"\xff" * page)
    assert check_sqlite(path).problem is not None
    fixed = repair(path, JOURNAL_SCHEMA)
    assert fixed.problem is None and any("readable event(s) into a new" in line for line in fixed.repaired)
    reopened = SqliteJournal(tmp_path)
    await reopened.get_session("s1")
    got = await _read_all(reopened)
    assert [seq for seq, _, _ in got] == list(range(1, 4401))  # every id, none twice, none missing
    lost = [seq for seq, _, corrupt in got if corrupt is not None]
    assert {corrupt for _, _, corrupt in got if corrupt is not None} <= {QUARANTINED}
    assert 0 < len(lost) < 4400 / 2
    assert all(data == datas[seq] for seq, data, corrupt in got if corrupt is None)
    await reopened.close()


async def test_a_journal_in_a_newer_format_is_refused_and_never_repaired(tmp_path: Path) -> None:
    from hopline.errors import StoreDamaged
    from hopline.store.check import require_usable
    from hopline.store.event_groups import JOURNAL_FORMAT, JournalTooNew

    journal, _ = await _journal(tmp_path, [KiB] * 3)
    await journal.close()
    path = tmp_path / JOURNAL_FILE
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone() == (JOURNAL_FORMAT,)  # marked by its writer
    db.execute(f"PRAGMA user_version={JOURNAL_FORMAT + 1}")
    db.close()
    before = path.read_bytes()
    with pytest.raises(StoreDamaged, match="newer hopline") as refused:
        require_usable(path, tmp_path)
    assert "\n" not in str(refused.value) and f"journal format {JOURNAL_FORMAT + 1}" in str(refused.value)
    with pytest.raises(JournalTooNew):
        SqliteJournal(tmp_path)
    report = repair(path, JOURNAL_SCHEMA)
    assert report.problem is not None and "newer hopline" in report.problem and not report.repaired
    assert path.read_bytes() == before and not (tmp_path / "journal.quarantine").exists()
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version=0")  # a journal from before the format mark reads as before
    db.close()
    require_usable(path, tmp_path)
    reopened = SqliteJournal(tmp_path)
    await reopened.get_session("s1")
    assert [r.seq for r in await reopened.read_page("s1", 0, max_bytes=1 << 30)] == [1, 2, 3]
    await reopened.close()
