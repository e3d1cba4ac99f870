"""The agent's end of the ACP pipe: stdio claimed for protocol lines only, read with the budget's
max frame (SPEC B-4, W-2, H-10).

``claim_stdio()`` keeps private duplicates of fd 0 and fd 1 for the protocol and points the
process's own fd 1 (and ``sys.stdout``) at stderr and fd 0 at ``/dev/null``: a stray ``print`` or a
child process writing to its stdout can then never corrupt the protocol stream.

:class:`PipeTransport` is an ``acp`` message transport (the SDK's ``Connection`` takes it as its
``Transport``). The SDK's own NDJSON reader treats its buffer limit as a chunk size and reassembles
lines of any length past it; this reader enforces the max frame exactly instead: a line of
``max_frame_bytes`` passes, one byte more is discarded up to its newline (never buffered past the
limit), reported on stderr with its size only, and the channel goes on. Outgoing frames are
encoded with orjson and refused before writing when they exceed the same max frame, so both ends
of the pipe agree.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
import sys
from typing import Any, Protocol

import orjson

from hopline.budget import CEILINGS_BY_KEY, HOP_PIPE

log = logging.getLogger("hopline.agent.pipe")
_MAX_FRAME_SETTING = CEILINGS_BY_KEY["agent_max_frame_bytes"].name


class OutgoingFrameTooLarge(RuntimeError):
    """A message the agent was about to write is larger than the pipe's max frame."""

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(f"{HOP_PIPE}: outgoing frame of {size} bytes exceeds the max frame of {limit} "
                         f"bytes ({_MAX_FRAME_SETTING}); not sent")


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
        self._write_lock = asyncio.Lock()
        self._closed = False
        self.frames_dropped = 0

    @classmethod
    async def open_fds(cls, read_fd: int, write_fd: int, max_frame_bytes: int) -> PipeTransport:
        loop = asyncio.get_running_loop()
        # The reader's limit is the max frame: readuntil() refuses a line one byte longer.
        reader = asyncio.StreamReader(limit=max_frame_bytes)
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
        data = orjson.dumps(message)
        if len(data) > self._max:
            raise OutgoingFrameTooLarge(len(data), self._max)
        return data + b"\n"

    async def send(self, message: dict[str, Any]) -> None:
        data = self.encode(message)
        async with self._write_lock:
            self._writer.write(data)
            await self._writer.drain()

    async def receive(self) -> dict[str, Any] | None:
        while True:
            line = await self._read_frame()
            if line is None:
                return None
            line = line.rstrip(b"\r\n")
            if not line.strip():
                continue
            try:
                message = orjson.loads(line)
            except orjson.JSONDecodeError:
                log.warning("invalid JSON frame skipped", extra={"hop": HOP_PIPE, "bytes": len(line)})
                continue
            if not isinstance(message, dict):
                log.warning("non-object frame skipped", extra={"hop": HOP_PIPE, "bytes": len(line)})
                continue
            return message

    async def _read_frame(self) -> bytes | None:
        try:
            return await self._reader.readuntil(b"\n")
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                log.warning("stream ended inside a frame", extra={"hop": HOP_PIPE, "bytes": len(exc.partial)})
            return None
        except asyncio.LimitOverrunError as exc:
            return await self._discard_oversized(exc.consumed)

    async def _discard_oversized(self, consumed: int) -> bytes | None:
        """Drop a line longer than the max frame without buffering it; report its size."""
        size = 0
        pending = consumed
        while True:
            if pending:
                await self._reader.readexactly(pending)
                size += pending
            try:
                tail = await self._reader.readuntil(b"\n")
            except asyncio.LimitOverrunError as exc:
                pending = exc.consumed
                continue
            except asyncio.IncompleteReadError as exc:
                size += len(exc.partial)
                self._report_dropped(size)
                return None
            size += len(tail.rstrip(b"\n"))
            self._report_dropped(size)
            return b"\n"

    def _report_dropped(self, size: int) -> None:
        self.frames_dropped += 1
        log.error("frame dropped", extra={"hop": HOP_PIPE, "bytes": size, "limit": self._max,
                                          "setting": _MAX_FRAME_SETTING})

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):  # the peer may be gone already
            self._writer.close()
