"""The agent's end of the ACP pipe: stdio claimed for protocol lines only, read with the budget's
max frame (SPEC B-4, W-2, H-10).

``claim_stdio()`` keeps private duplicates of fd 0 and fd 1 for the protocol and points the
process's own fd 1 (and ``sys.stdout``) at stderr and fd 0 at ``/dev/null``: a stray ``print`` or a
child process writing to its stdout can then never corrupt the protocol stream.

:class:`PipeTransport` is an ``acp`` message transport (the SDK's ``Connection`` takes it as its
``Transport``). It reads and writes through the same sans-IO codec as the daemon's end
(:class:`hopline.wire.ndjson.NdjsonDecoder` and :func:`hopline.wire.ndjson.encode`), so both ends
agree on every frame (B-4): a line of ``max_frame_bytes`` passes (a trailing ``\\r`` is not part of
the frame), one byte more is discarded up to its newline (never buffered past the limit), reported
on stderr with its size only, and the channel goes on. Outgoing frames over the same max frame are
refused before writing (:class:`~hopline.budget.LimitExceeded`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import stat
import sys
from typing import Any, Protocol

from hopline.budget import CEILINGS_BY_KEY, HOP_PIPE
from hopline.wire.ndjson import (
    READ_CHUNK_BYTES,
    Frame,
    FrameError,
    FrameTooLarge,
    IncompleteFrame,
    NdjsonDecoder,
    encode,
)

log = logging.getLogger("hopline.agent.pipe")
_MAX_FRAME = CEILINGS_BY_KEY["agent_max_frame_bytes"]


def claim_stdio() -> tuple[int, int]:
    """Reserve stdin/stdout for the protocol; return the (read fd, write fd) to use for it."""
    sys.stdout.flush()
    proto_in = os.dup(0)
    proto_out = os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return proto_in, proto_out


class _Writer(Protocol):
    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...

    def close(self) -> None: ...


class _FileWriter:
    """stdout redirected to a regular file (no pipe transport possible): plain blocking writes."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view):]

    async def drain(self) -> None:
        return None

    def close(self) -> None:
        os.close(self._fd)


class PipeTransport:
    """Newline-delimited JSON over a reader/writer pair with an exact max frame on both ways."""

    def __init__(self, reader: asyncio.StreamReader, writer: _Writer, max_frame_bytes: int):
        self._reader = reader
        self._writer = writer
        self._max = max_frame_bytes
        self._decoder = NdjsonDecoder(max_frame_bytes)
        self._ready: collections.deque[dict[str, Any]] = collections.deque()
        self._eof = False
        self._write_lock = asyncio.Lock()
        self._closed = False
        self.frames_dropped = 0

    @classmethod
    async def open_fds(cls, read_fd: int, write_fd: int, max_frame_bytes: int) -> PipeTransport:
        loop = asyncio.get_running_loop()
        # The stream reader only ever serves read(n): its limit is the chunk size, not a frame bound.
        reader = asyncio.StreamReader(limit=READ_CHUNK_BYTES)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                     os.fdopen(read_fd, "rb", buffering=0))
        writer: _Writer
        if stat.S_ISREG(os.fstat(write_fd).st_mode):
            writer = _FileWriter(write_fd)
        else:
            w_transport, w_protocol = await loop.connect_write_pipe(
                asyncio.streams.FlowControlMixin, os.fdopen(write_fd, "wb", buffering=0))
            writer = asyncio.StreamWriter(w_transport, w_protocol, None, loop)
        return cls(reader, writer, max_frame_bytes)

    def encode(self, message: dict[str, Any]) -> bytes:
        line = encode(message)
        size = len(line) - 1  # the frame without its newline, as the reader measures it
        if size > self._max:
            raise _MAX_FRAME.exceeded(self._max, size, f"{HOP_PIPE}: outgoing frame of {size} bytes exceeds "
                                      f"the max frame of {self._max} bytes ({_MAX_FRAME.name}); not sent")
        return line

    async def send(self, message: dict[str, Any]) -> None:
        data = self.encode(message)
        async with self._write_lock:
            self._writer.write(data)
            await self._writer.drain()

    async def receive(self) -> dict[str, Any] | None:
        """The next JSON object from the peer; ``None`` once the stream ended."""
        while not self._ready:
            if self._eof:
                return None
            chunk = await self._reader.read(READ_CHUNK_BYTES)
            items = self._decoder.feed(chunk) if chunk else self._decoder.eof()
            self._eof = not chunk
            for item in items:
                self._take(item)
        return self._ready.popleft()

    def _take(self, item: Frame | FrameError) -> None:
        if isinstance(item, Frame):
            if isinstance(item.message, dict):
                self._ready.append(item.message)
            else:
                log.warning("non-object frame skipped", extra={"hop": HOP_PIPE, "bytes": item.size})
        elif isinstance(item, FrameTooLarge):
            self.frames_dropped += 1
            log.error("frame dropped", extra={"hop": HOP_PIPE, "bytes": item.size, "limit": item.limit,
                                              "setting": _MAX_FRAME.name})
        elif isinstance(item, IncompleteFrame):
            log.warning("stream ended inside a frame", extra={"hop": HOP_PIPE, "bytes": item.size})
        else:  # InvalidFrame: its size only, never its bytes
            log.warning("invalid JSON frame skipped", extra={"hop": HOP_PIPE, "bytes": item.size})

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):  # the peer may be gone already
            self._writer.close()
