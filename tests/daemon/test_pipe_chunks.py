"""The child's stdout read as its pipe's chunks (daemon/pipe_chunks.py), with a real child process:
every byte arrives once and in order, and a reader that stops reading stops the pipe at the
StreamReader's bound (twice the limit, plus the one pipe read that passed it)."""

from __future__ import annotations

import asyncio
import hashlib
import sys

from hopline.daemon.pipe_chunks import start_child

PIPE_READ_MAX = 64 * 1024  # a Linux pipe's default capacity: the most one read of it returns
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
            assert sum(len(c) for c in got) <= max(limit, len(got[0]))
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
