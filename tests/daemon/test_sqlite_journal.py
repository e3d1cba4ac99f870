"""The SQLite journal on a real file: a writer thread with group commit, reads on their own
connection, checkpoints between batches, the id contract of ``EventJournal``; and the bus's batches
over it (one commit per batch, delivery only after it)."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
from pathlib import Path

import orjson
import pytest

from hopline.budget import Budget
from hopline.daemon.bus import EventBus, Subscriber, wire_size
from hopline.store import records, segments, sqlite_journal, sqlite_writer
from hopline.store.integrity import SEGMENT_SHORT
from hopline.store.segments import segment_path
from hopline.store.sqlite_journal import (
    INLINE_MAX_BYTES,
    JOURNAL_FILE,
    PAGE_SIZE_BYTES,
    ROWS_PER_INSERT,
    SEGMENTS_DIR,
    SqliteJournal,
)
from hopline.vocabulary import TURN_COMPLETE


async def _journal(tmp_path: Path, *sessions: str) -> SqliteJournal:
    journal = SqliteJournal(tmp_path)
    for session_id in sessions:
        await journal.create_session(session_id, {"cwd": "/w"})
    return journal


def _drain(sub: Subscriber) -> list[tuple[int | None, str]]:
    out = []
    while (event := sub.pop_nowait()) is not None:
        out.append((event.id, event.type))
    return out


def _take_outside(tmp_path: Path, seq: int) -> None:
    """A row the journal does not know about: the insert of that id fails."""
    outside = sqlite3.connect(tmp_path / JOURNAL_FILE)
    outside.execute("INSERT INTO events (session_id, seq, type, data) VALUES ('s1', ?, 'x', x'00')", (seq,))
    outside.commit()
    outside.close()


def _hold_writer(journal: SqliteJournal) -> threading.Event:
    """Block the writer thread, inside a write of its own, until the returned event is set; returns
    once the writer holds (so what is queued next waits behind it, in a batch of its own)."""
    release, holding = threading.Event(), threading.Event()

    def hold(db: object) -> None:
        holding.set()
        release.wait(30)

    journal.submit_write(hold)
    assert holding.wait(30)
    return release


async def test_batch_journals_then_delivers_in_order_and_survives_a_restart(tmp_path: Path) -> None:
    bus = EventBus(Budget.defaults(), await _journal(tmp_path, "s1"))
    bus.publish("s1", "e", {"i": 0})
    await bus.flushed()
    sub, upto = await bus.subscribe("s1", 64)
    assert upto == 1
    with bus.batch():
        first = bus.publish("s1", "e", {"i": 1})
        bus.publish_synthetic("s1", "frame_dropped", {"bytes": 1})
        second = bus.publish("s1", "e", {"i": 2})
    assert first is not None and second is not None and (first.id, second.id) == (2, 3)
    # handed to the writer, not yet committed: nothing delivered (D-5: journaled before published)
    assert sub.queued == 0 and _drain(sub) == []
    await bus.flushed()
    assert _drain(sub) == [(2, "e"), (None, "frame_dropped"), (3, "e")]
    await bus.journal.close()
    reopened = SqliteJournal(tmp_path)  # a restart: every delivered event is on disk
    rows = await reopened.read_page("s1", 0, max_bytes=1 << 20)
    assert [(r.seq, r.data) for r in rows] == [(1, b'{"i":0}'), (2, b'{"i":1}'), (3, b'{"i":2}')]
    await reopened.close()


async def test_failed_batch_commit_delivers_nothing_says_so_and_consumes_no_id(tmp_path: Path) -> None:
    bus = EventBus(Budget.defaults(), await _journal(tmp_path, "s1"))
    sub, _ = await bus.subscribe("s1", 64)
    _take_outside(tmp_path, 2)  # the batch's second insert fails
    with bus.batch():
        bus.publish("s1", "e", {"i": 1})
        bus.publish("s1", "e", {"i": 2})
    await bus.flushed()
    told = [orjson.loads(e.data) for e in iter(sub.pop_nowait, None)]
    assert [(t["reason"], t["eventType"], t["bytes"]) for t in told] == \
        [("journal_write_failed", "e", 7), ("journal_write_failed", "e", 7)]
    assert all(t["hop"] == "daemon.journal" for t in told) and bus.journal_failed == 2
    assert await bus.journal.last_id("s1") == 0 and bus.journal.next_id("s1") == 1  # released
    assert [r.seq for r in await bus.journal.read_page("s1", 0, upto=5, max_bytes=1 << 20)] == [2]
    await bus.journal.close()


async def test_oversize_check_in_a_batch_sizes_each_event_with_its_journal_id(tmp_path: Path) -> None:
    # Event 10 has a two-digit id: a payload that fits with id 9 is one byte over with id 10.
    limit = 4096
    bus = EventBus(Budget.defaults().replace(sse_max_event_bytes=limit), await _journal(tmp_path, "s1"))
    fill = limit - wire_size(10, "e", len(b'{"f":""}')) + 1
    with bus.batch():
        for i in range(8):
            assert bus.publish("s1", "e", {"i": i}) is not None
        assert bus.publish("s1", "e", {"f": "f" * fill}) is not None  # id 9: at the limit
        assert bus.publish("s1", "e", {"f": "f" * fill}) is None  # id 10: one byte over
    await bus.flushed()
    assert await bus.journal.last_id("s1") == 9
    assert bus.oversize_dropped == 1
    await bus.journal.close()


async def test_new_journal_uses_its_page_size_wal_and_no_autocheckpoint(tmp_path: Path) -> None:
    journal = await _journal(tmp_path)
    await journal.close()
    db = sqlite3.connect(tmp_path / JOURNAL_FILE)
    assert db.execute("PRAGMA page_size").fetchone()[0] == PAGE_SIZE_BYTES
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()


async def test_the_journal_alone_allocates_ids_and_a_failed_commit_releases_them(tmp_path: Path) -> None:
    journal = await _journal(tmp_path, "s1", "s2")
    assert journal.next_id("s1") == journal.next_id("s1") == 1  # asking allocates nothing
    staged = [journal.stage(session, "e", b"{}") for session in ("s1", "s2", "s1")]
    assert staged == [1, 1, 2]
    assert await journal.last_id("s1") == 0 and journal.next_id("s1") == 3  # staged, not committed
    await journal.commit()
    assert (await journal.last_id("s1"), await journal.last_id("s2")) == (2, 1)
    _take_outside(tmp_path, 4)
    journal.stage("s1", "e", b"{}")  # id 3
    journal.stage("s1", "e", b"{}")  # id 4: taken outside, the transaction fails
    with pytest.raises(sqlite3.IntegrityError):
        await journal.commit()
    assert await journal.last_id("s1") == 2 and journal.next_id("s1") == 3  # released, none written
    assert [r.seq for r in await journal.read_page("s1", 0, upto=9, max_bytes=1 << 20)] == [1, 2, 4]
    await journal.close()


async def test_a_failed_commit_followed_by_staged_events_leaves_a_gap(tmp_path: Path) -> None:
    journal = await _journal(tmp_path, "s1")
    _take_outside(tmp_path, 1)
    release = _hold_writer(journal)
    journal.stage("s1", "e", b"{}")  # id 1: fails
    failing = journal.commit()
    journal.stage("s1", "e", b"{}")  # id 2, staged before the failure is known
    release.set()
    with pytest.raises(sqlite3.IntegrityError):
        await failing
    await journal.commit()
    assert journal.next_id("s1") == 3  # ids never go back
    assert [r.seq for r in await journal.read_page("s1", 0, upto=9, max_bytes=1 << 20)] == [1, 2]
    await journal.close()


async def test_commits_queued_while_the_writer_is_busy_join_one_transaction(tmp_path: Path) -> None:
    journal = await _journal(tmp_path, "s1")
    before = journal.transactions
    release = _hold_writer(journal)
    commits = []
    for i in range(10):
        journal.stage("s1", "e", b'{"i":%d}' % i)
        commits.append(journal.commit())
    # reads go on while the writer is busy: their own connection, off the event loop
    assert await journal.read_page("s1", 0, max_bytes=1 << 20) == []
    assert not any(c.done() for c in commits)
    release.set()
    await asyncio.gather(*commits)
    assert journal.transactions - before == 2  # the held write, then the ten commits together
    assert [r.seq for r in await journal.read_page("s1", 0, max_bytes=1 << 20)] == list(range(1, 11))
    await journal.close()


async def test_a_failing_write_in_a_group_fails_alone(tmp_path: Path) -> None:
    journal = await _journal(tmp_path, "s1")
    release = _hold_writer(journal)
    journal.stage("s1", "e", b"{}")
    events = journal.commit()
    duplicate = asyncio.ensure_future(journal.create_session("s1", {}))  # the id exists
    await asyncio.sleep(0)  # let it queue
    release.set()
    await events
    with pytest.raises(sqlite3.IntegrityError):
        await duplicate
    assert await journal.last_id("s1") == 1
    await journal.close()


async def test_checkpoints_run_in_the_writer_between_batches(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_writer, "CHECKPOINT_BYTES", 16 * 1024)
    journal = await _journal(tmp_path, "s1")
    # 20 x 4 KiB inline: past four times the threshold, a checkpoint runs even with writes queued
    for _ in range(20):
        journal.stage("s1", "e", b'"' + b"x" * (4 * 1024) + b'"')
        await journal.commit()
    await journal.commit()  # the writer has run its check after the last batch
    assert journal.checkpoints >= 1
    assert len(await journal.read_page("s1", 0, max_bytes=1 << 30)) == 20
    await journal.close()


async def test_sessions_prompts_and_counts(tmp_path: Path) -> None:
    journal = await _journal(tmp_path, "s1", "s2")
    await journal.set_agent_session_id("s1", "agent-1")
    listed = [(r.id, r.agent_session_id) for r in await journal.list_sessions()]
    assert listed == [("s1", "agent-1"), ("s2", None)]
    with pytest.raises(LookupError):
        journal.next_id("nobody")
    await journal.open_prompt("s1", "p1")
    await journal.open_prompt("s1", "p2")
    await journal.append_many("s1", [(TURN_COMPLETE, b'{"promptId":"p1"}'), ("e", b"{}")])
    assert await journal.count("s1", TURN_COMPLETE) == 1
    assert await journal.unended_prompts() == [("s1", "p2")]  # p1 ended: closed on the way
    await journal.close()
    reopened = SqliteJournal(tmp_path)
    assert await reopened.unended_prompts() == [("s1", "p2")]
    record = await reopened.get_session("s1")  # opens it: its last id is loaded
    assert record is not None and record.options == {"cwd": "/w"} and reopened.next_id("s1") == 3
    reopened.stage("s1", "e", b"{}")
    await reopened.delete_session("s1")  # drops what was staged for it
    await reopened.commit()
    assert await reopened.get_session("s1") is None and await reopened.last_id("s1") == 0
    assert await reopened.unended_prompts() == []
    await reopened.close()


async def test_close_commits_what_is_staged(tmp_path: Path) -> None:
    journal = await _journal(tmp_path, "s1")
    journal.stage("s1", "e", b"{}")
    await journal.close()
    reopened = SqliteJournal(tmp_path)
    assert await reopened.last_id("s1") == 1
    await reopened.close()


async def test_large_events_live_in_the_sessions_segment_file(tmp_path: Path) -> None:
    journal = await _journal(tmp_path, "s1", "s2")
    at_inline = b'"' + b"a" * (INLINE_MAX_BYTES - 2) + b'"'
    over = b'"' + b"b" * (INLINE_MAX_BYTES - 1) + b'"'  # one byte over: to the segment file
    big = b'"' + b"c" * (3 * 1024 * 1024) + b'"'
    await journal.append_many("s1", [("e", at_inline), ("e", over), ("e", b"{}"), ("e", big)])
    await journal.append_many("s2", [("e", big)])
    await journal.close()
    db = sqlite3.connect(tmp_path / JOURNAL_FILE)
    stored = db.execute("SELECT seq, length(data), ext_bytes FROM events WHERE session_id = 's1' "
                        "ORDER BY seq").fetchall()
    db.close()
    assert stored == [(1, INLINE_MAX_BYTES, None), (2, 0, INLINE_MAX_BYTES + 1), (3, 2, None),
                      (4, 0, len(big))]
    s1_segment = segment_path(tmp_path / SEGMENTS_DIR, "s1")
    # one record: its header, the external events' bytes (where their rows point), copies of the rest
    fd = os.open(s1_segment, os.O_RDONLY)
    try:
        record = records.read_record(fd, 0, s1_segment.stat().st_size)
    finally:
        os.close(fd)
    assert isinstance(record, records.Record) and record.end == s1_segment.stat().st_size
    assert [(e.seq, e.size, e.external) for e in record.events] == [
        (2, len(over), True), (4, len(big), True), (1, len(at_inline), False), (3, 2, False)]
    reopened = SqliteJournal(tmp_path)
    rows = await reopened.read_page("s1", 0, max_bytes=1 << 30)
    assert [r.data for r in rows] == [at_inline, over, b"{}", big]
    # a page is bounded by the events' own sizes, wherever their bytes live
    assert [r.seq for r in await reopened.read_page("s1", 0, max_bytes=len(at_inline) + len(over))] == [1, 2]
    assert await reopened.get_session("s1") is not None
    await reopened.delete_session("s1")  # its segment file goes with it, the other session's stays
    assert not s1_segment.exists() and segment_path(tmp_path / SEGMENTS_DIR, "s2").exists()
    assert [r.data for r in await reopened.read_page("s2", 0, max_bytes=1 << 30)] == [big]
    await reopened.close()


async def test_a_truncated_segment_file_is_said_never_short_data(tmp_path: Path) -> None:
    journal = await _journal(tmp_path, "s1")
    await journal.append_many("s1", [("e", b'"' + b"x" * 100_000 + b'"')])
    with open(segment_path(tmp_path / SEGMENTS_DIR, "s1"), "r+b") as handle:
        handle.truncate(50_000)
    [row] = await journal.read_page("s1", 0, max_bytes=1 << 20)
    assert (row.seq, row.data, row.corrupt) == (1, b"", SEGMENT_SHORT)
    await journal.close()


async def test_contiguous_small_external_events_are_read_in_one_read_each_large_one_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    journal = await _journal(tmp_path, "s1")
    small = [b'"' + b"%04d" % i + b"x" * (INLINE_MAX_BYTES + 10) + b'"' for i in range(10)]
    at_run_max = b'"' + b"r" * (segments.READ_RUN_MAX_EVENT_BYTES - 3) + b'"'  # one under: in a run
    over_run_max = b'"' + b"R" * (segments.READ_RUN_MAX_EVENT_BYTES - 2) + b'"'  # at it: alone
    events = [*small[:5], b"{}", *small[5:], at_run_max, over_run_max, small[0]]
    await journal.append_many("s1", [("e", data) for data in events])
    reads: list[int] = []
    real_pread = segments.os.pread

    def counting_pread(fd: int, n: int, offset: int) -> bytes:
        reads.append(n)
        return real_pread(fd, n, offset)
    monkeypatch.setattr(segments.os, "pread", counting_pread)
    rows = await journal.read_page("s1", 0, max_bytes=1 << 30)
    assert [r.data for r in rows] == events
    # the inline {} splits the small ones in two runs; the last small one is after the large one
    run = sum(map(len, small[5:])) + len(at_run_max)
    assert reads == [sum(map(len, small[:5])), run, len(over_run_max), len(small[0])]
    await journal.close()


async def test_a_truncated_run_of_small_events_names_every_short_one(tmp_path: Path) -> None:
    journal = await _journal(tmp_path, "s1")
    data = b'"' + b"x" * 1000 + b'"'
    await journal.append_many("s1", [("e", data)] * 10)
    with open(segment_path(tmp_path / SEGMENTS_DIR, "s1"), "r+b") as handle:
        handle.truncate(4 * len(data) + 500)
    assert len(await journal.read_page("s1", 0, upto=4, max_bytes=1 << 20)) == 4  # whole events: read
    rows = await journal.read_page("s1", 0, max_bytes=1 << 20)
    assert [r.data for r in rows[:4]] == [data] * 4
    assert [(r.seq, r.corrupt) for r in rows[4:]] == [(n, SEGMENT_SHORT) for n in range(5, 11)]
    await journal.close()


async def test_commits_of_external_events_alone_still_checkpoint(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_writer, "CHECKPOINT_BYTES", 2 * sqlite_journal.PAGE_SIZE_BYTES)
    journal = await _journal(tmp_path, "s1")
    # each commit dirties at least one page of the WAL, however small its rows
    for _ in range(2 * 4):
        journal.stage("s1", "e", b'"' + b"x" * (INLINE_MAX_BYTES + 1) + b'"')
        await journal.commit()
    await journal.commit()
    assert journal.checkpoints >= 1
    await journal.close()


async def test_a_journal_from_before_segment_files_is_migrated(tmp_path: Path) -> None:
    old = sqlite3.connect(tmp_path / JOURNAL_FILE)
    old.executescript("""
        CREATE TABLE sessions (id TEXT PRIMARY KEY, agent_session_id TEXT, options BLOB NOT NULL,
                               created REAL NOT NULL);
        CREATE TABLE events (session_id TEXT NOT NULL, seq INTEGER NOT NULL, type TEXT NOT NULL,
                             data BLOB NOT NULL, PRIMARY KEY (session_id, seq)) WITHOUT ROWID;
        INSERT INTO sessions VALUES ('s1', NULL, '{}', 0);
        INSERT INTO events VALUES ('s1', 1, 'e', CAST('{"old":1}' AS BLOB));
    """)
    old.close()
    journal = SqliteJournal(tmp_path)
    assert await journal.get_session("s1") is not None and journal.next_id("s1") == 2
    await journal.append_many("s1", [("e", b'"' + b"y" * 20_000 + b'"')])
    assert [len(r.data) for r in await journal.read_page("s1", 0, max_bytes=1 << 20)] == [9, 20_002]
    await journal.close()


async def test_a_commit_larger_than_one_insert_statement_keeps_every_row_in_order(tmp_path: Path) -> None:
    journal = await _journal(tmp_path, "s1")
    count = 2 * ROWS_PER_INSERT + 1  # two full statements and one row
    await journal.append_many("s1", [("e", b"%d" % i) for i in range(count)])
    rows = await journal.read_page("s1", 0, max_bytes=1 << 30)
    assert [(r.seq, r.data) for r in rows] == [(i + 1, b"%d" % i) for i in range(count)]
    await journal.close()


async def test_a_journal_file_outside_the_data_dir_keeps_its_segments_beside_it(tmp_path: Path) -> None:
    """HOPLINE_STORE_URL=sqlite:///elsewhere: large event data is written and read back there."""
    path = tmp_path / "elsewhere" / "journal.sqlite3"
    journal = SqliteJournal(tmp_path / "data-not-made-yet", path=path)
    await journal.create_session("s1", {})
    big = b'"' + b"x" * (4 * INLINE_MAX_BYTES) + b'"'
    await journal.append_many("s1", [("e", big)])
    rows = await journal.read_page("s1", 0, max_bytes=1 << 20)
    assert [r.data for r in rows] == [big]
    assert (path.parent / "journal.segments").is_dir()
    await journal.close()


@pytest.mark.parametrize(("sync", "synchronous"), [("full", 2), ("normal", 1)])
async def test_full_syncs_the_segment_files_before_each_commit_normal_at_checkpoints(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sync: str, synchronous: int) -> None:
    """HOPLINE_STORE_SYNC: FULL makes a resolved commit durable (SQLite synchronous=FULL, the
    segment file it appended to fdatasync-ed before the rows commit); NORMAL syncs neither per commit."""
    journal = SqliteJournal(tmp_path, sync=sync)
    await journal.create_session("s1", {})
    found = await journal.submit_write(lambda db: db.execute("PRAGMA synchronous").fetchone()[0])
    assert found == synchronous
    synced: list[int] = []
    real = segments.os.fdatasync
    monkeypatch.setattr(segments.os, "fdatasync", lambda fd: (synced.append(fd), real(fd))[1])
    journal.stage("s1", "e", b'"' + b"x" * (INLINE_MAX_BYTES + 1) + b'"')
    await journal.commit()  # resolved: under FULL its record was synced before its rows committed
    assert len(synced) == (1 if sync == "full" else 0)
    await journal.close()
