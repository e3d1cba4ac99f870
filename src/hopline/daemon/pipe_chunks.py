"""A child's stdout as the chunks its pipe delivered, without the copies of a ``StreamReader``.

``asyncio``'s ``StreamReader`` copies every byte twice on the way to the decoder: into its
buffer (``feed_data``), then out of it (``read``), and moves what is left behind each read. The
daemon only ever asks for "what is there, up to N bytes", so :class:`PipeChunks` keeps the bytes
objects the event loop read from the pipe and hands them over as they are, up to the bytes the
reader asks for (no copy at all unless one pipe read holds more than that).

Flow control is the ``StreamReader``'s: past twice ``limit`` bytes held, the pipe is not read
(the child then blocks in its write), and reading resumes once at most ``limit`` are held.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Sequence
from typing import Any


class PipeChunks:
    """What ``SubprocessStreamProtocol`` feeds a reader (``feed_data``, ``feed_eof``,
    ``set_exception``, ``set_transport``), read with :meth:`read_chunks`."""

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        self._limit = limit
        self._loop = loop
        self._chunks: collections.deque[bytes] = collections.deque()
        self._held = 0  # the bytes not yet handed over
        self._head_taken = 0  # the bytes of the first chunk already handed over (in pieces)
        self._eof = False
        self._exception: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._transport: asyncio.ReadTransport | None = None
        self._paused = False

    @property
    def held_bytes(self) -> int:
        return self._held

    def set_transport(self, transport: asyncio.ReadTransport) -> None:
        self._transport = transport

    def feed_data(self, data: bytes) -> None:
        if not data:
            return
        self._chunks.append(data)
        self._held += len(data)
        self._wake()
        if not self._paused and self._held > 2 * self._limit and self._transport is not None:
            self._transport.pause_reading()
            self._paused = True

    def feed_eof(self) -> None:
        self._eof = True
        self._wake()

    def set_exception(self, exc: BaseException) -> None:
        self._exception = exc
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def read_chunks(self, max_bytes: int) -> Sequence[bytes]:
        """The chunks held, in order, at most ``max_bytes`` in all; waits for one. A chunk larger
        than that (a pipe read returns up to the event loop's read buffer, 256 KiB, seen here) is
        handed over in pieces of ``max_bytes``, each copied once. Empty at the end of the stream."""
        while not self._chunks:
            if self._exception is not None:
                raise self._exception
            if self._eof:
                return ()
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        chunks = self._chunks
        head, offset = chunks[0], self._head_taken
        if len(head) - offset > max_bytes:
            # The caller's bound holds: one read's frames are at most max_bytes (64 KiB of small
            # frames is one journal commit and one burst per subscriber, SPEC T-6's fair shares).
            out = [head[offset:offset + max_bytes]]
            self._head_taken = offset + max_bytes
            taken = max_bytes
        else:
            chunks.popleft()
            self._head_taken = 0
            out = [head[offset:] if offset else head]
            taken = len(out[0])
            while chunks and taken + len(chunks[0]) <= max_bytes:
                chunk = chunks.popleft()
                out.append(chunk)
                taken += len(chunk)
        self._held -= taken
        if self._paused and self._held <= self._limit and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()
        return out


class ChildProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """``create_subprocess_exec``'s protocol with the child's stdout read as :class:`PipeChunks`
    (stdin and stderr as usual)."""

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=limit, loop=loop)
        self.chunks = PipeChunks(limit, loop)

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        stdout_transport = transport.get_pipe_transport(1)
        if stdout_transport is not None:
            self.chunks.set_transport(stdout_transport)
            self.stdout = self.chunks  # type: ignore[assignment]  # fed as the stream reader was


async def start_child(argv: Sequence[str], *, limit: int, **options: Any) -> tuple[asyncio.subprocess.Process,
                                                                                     PipeChunks]:
    """``asyncio.create_subprocess_exec(*argv, stdin=PIPE, stdout=PIPE, stderr=PIPE, **options)``,
    its stdout read as :class:`PipeChunks`."""
    loop = asyncio.get_running_loop()
    protocol = ChildProtocol(limit, loop)
    pipe = asyncio.subprocess.PIPE
    transport, _ = await loop.subprocess_exec(lambda: protocol, *argv, stdin=pipe, stdout=pipe,
                                              stderr=pipe, **options)
    return asyncio.subprocess.Process(transport, protocol, loop), protocol.chunks
