"""Backpressure (SPEC D-5 bounds): when the journal writer's queue is past its bound, the pipe
reader stops reading its child, so the child blocks in its write and the daemon's memory does not
grow; when the writer catches up, everything flows, nothing lost.

Real parts: a real child process on a real pipe (``AcpChild``), the real bus over a real
``SqliteJournal`` whose writer thread the test holds with a blocking write."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from collections.abc import Awaitable
from pathlib import Path

import orjson
import pytest

from hopline.budget import Budget
from hopline.daemon.bus import EventBus
from hopline.daemon.child import AcpChild
from hopline.observe.pipe import PipeObservability
from hopline.store.sqlite_journal import SqliteJournal
from hopline.wire.ndjson import READ_CHUNK_BYTES, Frame, FrameError

FRAMES = 20_000  # of about 1 KiB: 20 MiB, far more than the queue, the pipe and the stream buffer
# Writes a session/update per line, then one stderr line per frame written (the daemon counts them).
CHILD = r"""
import sys
line = b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"a","update":' \
       b'{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"%s"}}}}\n'
for i in range(FRAMES):
    sys.stdout.buffer.write(line % (b"%06d" % i + b"x" * 1000))
    sys.stdout.buffer.flush()
    sys.stderr.buffer.write(b".\n")
    sys.stderr.buffer.flush()
"""


def _queue_budget(**changes: int) -> Budget:
    return Budget.defaults().replace(**changes)


class _Relay:
    """The child's handler: every notification published on the bus, one batch per read."""

    def __init__(self, bus: EventBus) -> None:
        self.bus = bus

    def on_notification(self, frame: Frame) -> Awaitable[None] | None:
        self.bus.publish_encoded("s1", "session_update", frame.raw)
        return None

    def on_request(self, frame: Frame) -> Awaitable[None] | None:
        raise AssertionError("no requests expected")

    def on_stalled(self, failure: object) -> None:
        raise AssertionError("the daemon writes nothing here")

    def on_frame_error(self, error: FrameError | None, size: int, reason: str) -> None:
        raise AssertionError(f"frame error {reason}")

    def on_exit(self, returncode: int | None) -> None:
        pass

    def batch(self) -> contextlib.AbstractContextManager[None]:
        return self.bus.batch()

    def backpressure(self) -> Awaitable[None] | None:
        return self.bus.backpressure()


async def test_backpressure_is_exact_at_the_bounds(tmp_path: Path) -> None:
    journal = SqliteJournal(tmp_path)
    await journal.create_session("s1", {})
    bus = EventBus(_queue_budget(journal_queue_max_events=3, journal_queue_max_bytes=64), journal)
    release = threading.Event()
    journal.submit_write(lambda db: release.wait(30))  # hold the writer: nothing commits
    for _ in range(3):
        bus.publish_encoded("s1", "e", b'"%s"' % (b"x" * 18))  # 20 bytes each
    assert (bus.queued_events, bus.queued_bytes) == (3, 60)
    assert bus.backpressure() is None  # at the count limit, under the bytes: read on
    with bus.batch():
        bus.publish_encoded("s1", "e", b'"xx"')  # 64 bytes: at the byte limit, one event over
    held = bus.backpressure()
    assert held is not None and (bus.queued_events, bus.queued_bytes) == (4, 64)
    release.set()
    await held  # resolved as soon as a delivered commit brings the queue within both bounds
    assert bus.queued_events <= 3 and bus.queued_bytes <= 64 and bus.backpressure() is None
    await bus.flushed()
    assert (bus.queued_events, bus.queued_bytes) == (0, 0)

    release.clear()
    journal.submit_write(lambda db: release.wait(30))
    bus.publish_encoded("s1", "e", b'"%s"' % (b"x" * 63))  # 65 bytes, one event: one byte over
    assert bus.backpressure() is not None
    release.set()
    await bus.flushed()
    assert bus.backpressure() is None
    await journal.close()


@pytest.mark.e2e
async def test_a_full_journal_queue_stops_the_pipe_reader_and_the_child_waits(tmp_path: Path) -> None:
    max_bytes = 256 * 1024
    budget = _queue_budget(journal_queue_max_bytes=max_bytes)
    journal = SqliteJournal(tmp_path)
    await journal.create_session("s1", {})
    bus = EventBus(budget, journal)
    instruments = PipeObservability(budget)
    release = threading.Event()
    journal.submit_write(lambda db: release.wait(60))  # the disk "stops": nothing commits
    child = AcpChild([sys.executable, "-c", CHILD.replace("FRAMES", str(FRAMES))], env={}, budget=budget,
                     instruments=instruments, handler=_Relay(bus))
    await child.start()
    try:
        async def engaged() -> None:
            while bus.backpressure() is None:
                await asyncio.sleep(0.01)
        await asyncio.wait_for(engaged(), 30)
        read_when_held = instruments.stats.snapshot()["inbound"]["count"]

        async def child_blocked_in_its_write() -> None:
            # the kernel says where the child sleeps: in a pipe write once the pipe is full, which it
            # stays in only while nothing reads (older kernels say pipe_write, newer anon_pipe_write)
            assert child.pid is not None
            while "pipe_write" not in Path(f"/proc/{child.pid}/wchan").read_text():
                await asyncio.sleep(0.01)

        await asyncio.wait_for(child_blocked_in_its_write(), 30)
        read_later = instruments.stats.snapshot()["inbound"]["count"]
        written = child.stderr.lines
        # the reader stopped: not one more frame read; the queue holds its bound plus one read
        assert read_later == read_when_held
        assert max_bytes < bus.queued_bytes <= max_bytes + READ_CHUNK_BYTES
        # the child is blocked in its write: it wrote what was read plus what the stream's
        # buffer and the pipe hold, a few hundred KiB of its 20 MiB
        assert written < read_later + 1024
        assert written < FRAMES // 10
        release.set()
        await asyncio.wait_for(child.exited.wait(), 120)
        await bus.flushed()
        rows = await journal.read_page("s1", FRAMES - 1, max_bytes=1 << 20)
        assert [r.seq for r in rows] == [FRAMES]  # every frame journaled, in order
        last_text = orjson.loads(rows[0].data)["params"]["update"]["content"]["text"]
        assert last_text.startswith(f"{FRAMES - 1:06d}")
        assert await journal.count("s1", "session_update") == FRAMES
        assert child.stderr.lines == FRAMES
    finally:
        release.set()
        await child.stop()
        await journal.close()
