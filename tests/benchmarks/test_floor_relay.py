"""The floor relay (bench/floor_relay.py) delivers every frame whole, in order, with its id: its
CPU figure is only a floor of the daemon's work if it does that work."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import orjson
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root holds bench/
from bench.common import BENCH_DIR, HOST, PYTHON, free_port, started
from bench.frames import message_chunk_line
from bench.sse_client import stream_sse

pytestmark = pytest.mark.e2e  # starts the relay and its agent

# Small frames, one larger than the relay's 1 MiB read (it crosses reads), then small ones again.
SIZES = [300, 1024, 1024, (1 << 20) + 4097, 700, 2 * (1 << 20) + 1, 1024]


async def _events(port: int) -> list[bytes]:
    body = bytearray()

    def keep(buf: bytearray, start: int, end: int) -> None:
        body.extend(buf[start:end])

    reads = stream_sse(HOST, port, "/events", keep)
    try:
        async for _ in reads:
            pass
    finally:
        await reads.aclose()
    return [bytes(e) for e in bytes(body).split(b"\n\n") if e]


def test_the_floor_relay_sends_every_frame_whole_with_its_id_and_leaves_no_file(tmp_path: Path) -> None:
    lines = [message_chunk_line(size, seed) for seed, size in enumerate(SIZES)]
    stream = tmp_path / "stream.ndjson"
    stream.write_bytes(b"".join(lines))
    port = free_port()
    agent = [PYTHON, str(BENCH_DIR / "stream_agent.py"), str(stream)]
    scratch = tmp_path / "scratch"  # its temporary directory, for its journal
    scratch.mkdir()
    with started([PYTHON, str(BENCH_DIR / "floor_relay.py"), str(port), *agent], port=port,
                 env={**os.environ, "TMPDIR": str(scratch)}):
        events = asyncio.run(asyncio.wait_for(_events(port), 60))
    # Stopped as the bench stops it (SIGTERM): its journal goes with it (each run left up to 256 MiB)
    assert list(scratch.iterdir()) == []
    assert events[0] == b": ready"
    assert events[-1] == b"event: done\ndata: {}"
    relayed = events[1:-1]
    assert len(relayed) == len(lines)
    for number, (event, line) in enumerate(zip(relayed, lines, strict=True), start=1):
        head = b"id: %d\nevent: session_update\ndata: " % number
        assert event.startswith(head)
        assert event[len(head):] == line[:-1]  # the frame's own bytes, without its newline
        assert orjson.loads(event[len(head):])["method"] == "session/update"
