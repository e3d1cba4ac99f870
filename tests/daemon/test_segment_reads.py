"""A page read from the segment files is freed as soon as its reader drops it: compiled with mypyc
(src/hopline/compiled.py), closures and their environment form a reference cycle, and a slow
client's replays of 1 MiB events then held the pages until the collector ran (the daemon's RSS grew
2.2x past its bounds). With the collector off, nothing of a read may outlive its result."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

from hopline.store.integrity import checksum
from hopline.store.segments import SegmentWriter, read_rows


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
