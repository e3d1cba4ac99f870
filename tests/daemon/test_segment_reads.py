"""A page read from the journal is freed as soon as its reader drops it, and a commit's events as
soon as they are durable: compiled with mypyc (src/hopline/compiled.py), closures and their
environment form a reference cycle, and a slow client's replays of 1 MiB events then held the pages
until the collector ran (the daemon's RSS grew 2.2x past its bounds). The journals are compiled
too, so their commits and reads are held to the same rule. With the collector off, nothing may
outlive its use."""

from __future__ import annotations

import gc
import sys
import weakref
from pathlib import Path

from hopline.store.integrity import checksum
from hopline.store.journal import JournalRow
from hopline.store.segments import SegmentWriter, read_rows
from hopline.store.sqlite_journal import SqliteJournal


class _Event:
    def __init__(self, seq: int, event_type: str, data: bytes, corrupt: str | None) -> None:
        self.seq, self.type, self.data, self.corrupt = seq, event_type, data, corrupt


def test_a_read_page_is_freed_without_the_collector(tmp_path: Path) -> None:
    datas = [bytes([65 + i]) * (300 + i) for i in range(5)] + [b"z" * 200_000]  # a run, then one alone
    offset = SegmentWriter(tmp_path).append("s1", datas)
    rows, at = [], offset
    for seq, data in enumerate(datas, start=1):
        rows.append((seq, "session_update", b"", at, len(data), checksum(data)))
        at += len(data)
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        page = read_rows(tmp_path, "s1", rows, _Event)
        assert [event.data for event in page] == datas and all(e.corrupt is None for e in page)
        refs = [weakref.ref(event) for event in page]
        del page
        assert [ref() for ref in refs] == [None] * len(refs)
    finally:
        if enabled:
            gc.enable()


def _journal_rows() -> int:
    return sum(isinstance(o, JournalRow) for o in gc.get_objects())


async def test_a_commits_events_and_a_read_page_are_freed_without_the_collector(tmp_path: Path) -> None:
    journal = SqliteJournal(tmp_path)
    try:
        await journal.create_session("s1", {})
        data = b"x" * 100_000 + bytes(range(256))  # over the inline size: a segment file's
        enabled = gc.isenabled()
        gc.collect()
        gc.disable()
        try:
            before = sys.getrefcount(data)
            journal.stage("s1", "session_update", data)
            await journal.commit()
            await journal.commit()  # an empty commit: the writer has let go of the first one's write
            assert sys.getrefcount(data) == before
            held = _journal_rows()
            page = await journal.read_page("s1", 0, max_bytes=1 << 20)
            assert [row.data for row in page] == [data]
            assert _journal_rows() == held + 1
            del page
            await journal.count("s1", "session_update")  # the reader thread has let go of the read
            assert _journal_rows() == held
        finally:
            if enabled:
                gc.enable()
    finally:
        await journal.close()
