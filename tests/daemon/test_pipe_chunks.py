"""The child's stdout read as its pipe's chunks (daemon/pipe_chunks.py), with a real child process:
every byte arrives once and in order, and a reader that stops reading stops the pipe at the
StreamReader's bound (twice the limit, plus the one pipe read that passed it)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import sys
from collections.abc import Awaitable, Callable

import pytest
import uvloop

from hopline.budget import Budget
from hopline.daemon.child import LARGE_READ_BYTES, AcpChild
from hopline.daemon.pipe_chunks import PipeChunks, start_child
from hopline.observe.pipe import PipeObservability
from hopline.wire.ndjson import Frame, FrameError

PIPE_READ_MAX = 256 * 1024  # the event loop's read buffer: the most one pipe read returns
WRITER = ("import sys; block = bytes(range(256)) * 4096\n"
          "for _ in range(int(sys.argv[1])): sys.stdout.buffer.write(block)\n")


async def test_every_byte_arrives_once_in_order_and_a_reader_that_stops_stops_the_pipe() -> None:
    limit = 128 * 1024
    blocks = 16  # 16 MiB written, far past the bound
    proc, chunks = await start_child([sys.executable, "-c", WRITER, str(blocks)], limit=limit)
    try:
        # Not reading: the child fills the held chunks up to the bound, then blocks in its write.
        for _ in range(3000):  # a deadline of 30 s for the child to start and fill it
            if chunks.held_bytes > 2 * limit:
                break
            await asyncio.sleep(0.01)
        for _ in range(20):  # and had it not paused, 0.2 s more would bring megabytes
            await asyncio.sleep(0.01)
        assert 2 * limit < chunks.held_bytes <= 2 * limit + PIPE_READ_MAX
        assert proc.returncode is None  # still blocked in its write
        digest, total = hashlib.sha256(), 0
        while True:
            got = await asyncio.wait_for(chunks.read_chunks(limit), 30)
            if not got:
                break
            assert sum(len(c) for c in got) <= limit
            for chunk in got:
                digest.update(chunk)
                total += len(chunk)
        block = bytes(range(256)) * 4096
        assert total == blocks * len(block)
        assert digest.hexdigest() == hashlib.sha256(block * blocks).hexdigest()
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_a_pipe_read_larger_than_the_bound_is_handed_over_in_pieces_of_the_bound() -> None:
    # One pipe read can hold 256 KiB; a reader that asks for 64 KiB gets 64 KiB (its frames are one
    # journal commit: a whole 225 KiB read of 200-byte frames doubled another session's round trip
    # during a flood, bench/fair_share.py).
    chunks = PipeChunks(1024 * 1024, asyncio.get_running_loop())
    bound = 64 * 1024
    big = bytes(range(256)) * 1000  # 256,000 bytes: three whole pieces and a rest
    chunks.feed_data(big)
    chunks.feed_data(b"a" * 100)
    chunks.feed_data(b"b" * 200)
    chunks.feed_eof()
    reads = []
    while got := await asyncio.wait_for(chunks.read_chunks(bound), 5):
        reads.append(list(got))
    assert [sum(map(len, got)) for got in reads] == [bound, bound, bound, 256_000 - 3 * bound + 300]
    assert b"".join(b"".join(got) for got in reads) == big + b"a" * 100 + b"b" * 200
    assert reads[-1][1:] == [b"a" * 100, b"b" * 200]  # whole chunks after the rest are not copied
    assert chunks.held_bytes == 0
    # exactly at the bound: the chunk is handed over whole, as it is
    exact = PipeChunks(1024 * 1024, asyncio.get_running_loop())
    block = b"x" * bound
    exact.feed_data(block)
    assert (await exact.read_chunks(bound))[0] is block
    one_over = PipeChunks(1024 * 1024, asyncio.get_running_loop())
    one_over.feed_data(b"y" * (bound + 1))
    assert [len(c) for c in await one_over.read_chunks(bound)] == [bound]
    assert [len(c) for c in await one_over.read_chunks(bound)] == [1]


class _ReadCounter:
    """An AcpChild handler that counts the frames of each read (one batch per read) and holds the
    first read back until ``ready()`` (the child's output is held, up to the reader's bound)."""

    def __init__(self, ready: Callable[[], bool]) -> None:
        self.per_read: list[int] = []
        self.exited = asyncio.Event()
        self._ready = ready
        self._held_once = False

    def on_notification(self, frame: Frame) -> None:
        self.per_read[-1] += 1

    def on_request(self, frame: Frame) -> None:
        raise AssertionError("no requests expected")

    def on_stalled(self, failure: object) -> None:
        raise AssertionError("the test writes nothing")

    def on_frame_error(self, error: FrameError | None, size: int, reason: str) -> None:
        raise AssertionError(f"frame error {reason}")

    def on_exit(self, returncode: int | None) -> None:
        self.exited.set()

    def batch(self) -> contextlib.AbstractContextManager[None]:
        self.per_read.append(0)
        return contextlib.nullcontext()

    def backpressure(self) -> Awaitable[None] | None:
        if self._held_once:
            return None
        self._held_once = True
        return self._until_ready()

    async def _until_ready(self) -> None:
        for _ in range(3000):  # a deadline of 30 s, for a child starting on a loaded machine
            if self._ready():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the child's output was not held in time")


FRAME_LINE = b'{"jsonrpc":"2.0","method":"session/update","params":{"text":"%s"}}\n'
FRAMES_CHILD = (f"import sys\nline = {FRAME_LINE!r}\n"
                "size, count = int(sys.argv[1]), int(sys.argv[2])\n"
                "sys.stdout.buffer.write(b''.join(line % (b'x' * size) for _ in range(count)))\n")


@pytest.mark.parametrize(("text_bytes", "most_per_read", "least_of_the_most"),
                         [(1000, 64, 1), (16 * 1024, 16, 8)])
def test_a_read_carries_at_most_64_frames_of_1_kib_or_16_of_16_kib(
        text_bytes: int, most_per_read: int, least_of_the_most: int) -> None:
    # on uvloop, as the daemon runs: its pipe reads return up to 256 KiB at once
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_reads_of(text_bytes, most_per_read, least_of_the_most))


async def _reads_of(text_bytes: int, most_per_read: int, least_of_the_most: int) -> None:
    # 1 KiB frames are read 64 KiB at a time (a whole pipe read of 200-byte frames, ~1,100 of them,
    # doubled another session's round trip during a flood); after a read of frames of
    # LARGE_FRAME_BYTES or more, reads take up to LARGE_READ_BYTES, about 16 frames of 16 KiB
    # (64 KiB reads carry at most 4, and 64 KiB frames read so were a commit each).
    count = 200
    line_bytes = len(FRAME_LINE % b"") + text_bytes
    held_then = min(count * line_bytes, 2 * LARGE_READ_BYTES)  # all of it, or until reading pauses

    def ready() -> bool:
        return child._stdout is not None and child._stdout.held_bytes >= held_then

    handler = _ReadCounter(ready)
    child = AcpChild([sys.executable, "-c", FRAMES_CHILD, str(text_bytes), str(count)], env={},
                     budget=Budget.defaults(), instruments=PipeObservability(Budget.defaults()),
                     handler=handler)
    await child.start()
    try:
        await asyncio.wait_for(handler.exited.wait(), 30)
    finally:
        await child.stop()
    assert sum(handler.per_read) == count
    assert least_of_the_most <= max(handler.per_read) <= most_per_read
