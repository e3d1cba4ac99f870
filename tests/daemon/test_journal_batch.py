"""Batched publishing on a real SQLite file: one transaction per batch, delivery only after it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from hopline.budget import Budget
from hopline.daemon.bus import EventBus, Subscriber, wire_size
from hopline.daemon.journal import JOURNAL_FILE, PAGE_SIZE_BYTES, Journal


def _bus(tmp_path: Path, **changes: int) -> EventBus:
    budget = Budget.defaults().replace(**changes) if changes else Budget.defaults()
    journal = Journal(tmp_path)
    journal.create_session("s1", {})
    return EventBus(budget, journal)


def _drain(sub: Subscriber) -> list[tuple[int | None, str]]:
    out = []
    while (event := sub.pop_nowait()) is not None:
        out.append((event.id, event.type))
    return out


def test_batch_journals_then_delivers_in_order_and_survives_a_restart(tmp_path: Path) -> None:
    bus = _bus(tmp_path)
    bus.publish("s1", "e", {"i": 0})
    sub, _ = bus.subscribe("s1", 64)
    with bus.batch():
        first = bus.publish("s1", "e", {"i": 1})
        bus.publish_synthetic("s1", "frame_dropped", {"bytes": 1})
        second = bus.publish("s1", "e", {"i": 2})
        # nothing is journaled or delivered inside the batch (D-5: journaled before published)
        assert bus.journal.last_id("s1") == 1
        assert sub.queued == 0 and _drain(sub) == []
    assert first is not None and second is not None and (first.id, second.id) == (2, 3)
    assert _drain(sub) == [(2, "e"), (None, "frame_dropped"), (3, "e")]
    bus.journal.close()
    reopened = Journal(tmp_path)  # a restart: every delivered event is on disk
    rows = reopened.read_page("s1", 0, max_bytes=1 << 20)
    assert [(r.seq, r.data) for r in rows] == [(1, b'{"i":0}'), (2, b'{"i":1}'), (3, b'{"i":2}')]
    reopened.close()


def test_failed_batch_commit_delivers_nothing_and_consumes_no_id(tmp_path: Path) -> None:
    bus = _bus(tmp_path)
    sub, _ = bus.subscribe("s1", 64)
    # a row the bus does not know about makes the batch's second insert fail
    outside = sqlite3.connect(tmp_path / JOURNAL_FILE)
    outside.execute("INSERT INTO events (session_id, seq, type, data) VALUES ('s1', 2, 'x', x'00')")
    outside.commit()
    outside.close()
    with pytest.raises(sqlite3.IntegrityError), bus.batch():
        bus.publish("s1", "e", {"i": 1})
        bus.publish("s1", "e", {"i": 2})
    assert _drain(sub) == []
    assert bus.journal.last_id("s1") == 0
    assert [r.seq for r in bus.journal.read_page("s1", 0, upto=5, max_bytes=1 << 20)] == [2]  # rolled back


def test_oversize_check_in_a_batch_sizes_each_event_with_its_journal_id(tmp_path: Path) -> None:
    # Event 10 has a two-digit id: a payload that fits with id 9 is one byte over with id 10.
    limit = 4096
    bus = _bus(tmp_path, sse_max_event_bytes=limit)
    fill = limit - wire_size(10, "e", len(b'{"f":""}')) + 1
    with bus.batch():
        for i in range(8):
            assert bus.publish("s1", "e", {"i": i}) is not None
        assert bus.publish("s1", "e", {"f": "f" * fill}) is not None  # id 9: at the limit
        assert bus.publish("s1", "e", {"f": "f" * fill}) is None  # id 10: one byte over
    assert bus.journal.last_id("s1") == 9
    assert bus.oversize_dropped == 1


def test_new_journal_uses_large_pages(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    page_size = journal._db.execute("PRAGMA page_size").fetchone()[0]
    mode = journal._db.execute("PRAGMA journal_mode").fetchone()[0]
    journal.close()
    assert (page_size, mode) == (PAGE_SIZE_BYTES, "wal")


def test_the_journal_alone_allocates_ids_and_a_failed_commit_releases_them(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.create_session("s1", {})
    journal.create_session("s2", {})
    assert journal.next_id("s1") == journal.next_id("s1") == 1  # asking allocates nothing
    staged = [journal.stage(session, "e", b"{}") for session in ("s1", "s2", "s1")]
    assert staged == [1, 1, 2]
    assert journal.last_id("s1") == 0 and journal.next_id("s1") == 3  # staged, not committed
    journal.commit()
    assert (journal.last_id("s1"), journal.last_id("s2")) == (2, 1)
    outside = sqlite3.connect(tmp_path / JOURNAL_FILE)
    outside.execute("INSERT INTO events (session_id, seq, type, data) VALUES ('s1', 4, 'x', x'00')")
    outside.commit()
    outside.close()
    journal.stage("s1", "e", b"{}")  # id 3
    journal.stage("s1", "e", b"{}")  # id 4: taken outside, the transaction fails
    with pytest.raises(sqlite3.IntegrityError):
        journal.commit()
    assert journal.last_id("s1") == 2 and journal.next_id("s1") == 3  # released, none written
    assert [r.seq for r in journal.read_page("s1", 0, upto=9, max_bytes=1 << 20)] == [1, 2, 4]
    journal.close()
