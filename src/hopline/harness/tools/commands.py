"""Running one command for a tool: output captured up to a byte limit (the rest counted, never
buffered), killed with its whole process group at its deadline or on cancel."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any


@dataclasses.dataclass(frozen=True)
class CommandRun:
    """What a command printed (stdout and stderr, merged), up to the capture limit."""

    text: str
    exit_code: int | None  # None: killed at its deadline
    dropped_bytes: int  # printed past the capture limit: counted, not kept
    timeout: float
    refused_processes: int = 0  # new processes the sandbox's process ceiling refused
    process_limit: int | None = None  # that ceiling, when the command ran in the sandbox
    results: bytes = b""  # what it wrote to its results pipe (the sandbox's report files), bounded
    results_dropped: int = 0  # bytes past that bound: counted, not kept

    @property
    def timed_out(self) -> bool:
        return self.exit_code is None


def _kill(proc: asyncio.subprocess.Process) -> None:
    # The command runs in its own session: kill its whole process group (by the group's id).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


class ResultsPipe:
    """A pipe a command writes its report files to (:func:`hopline.harness.sandbox.read_results`):
    its write end is the child's standard input (the sandbox's wrapper moves it away from the
    command's), the read end is read while it runs, up to ``limit`` bytes."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)

    def close(self) -> None:
        for fd in (self.read_fd, self.write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.read_fd = self.write_fd = -1


class _Bounded:
    """Bytes read up to a limit; the rest counted, never kept."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.chunks: list[bytes] = []
        self.kept = self.dropped = 0

    def add(self, chunk: bytes) -> None:
        room = max(self.limit - self.kept, 0)
        self.chunks.append(chunk[:room])
        self.kept += min(room, len(chunk))
        self.dropped += len(chunk) - min(room, len(chunk))

    @property
    def data(self) -> bytes:
        return b"".join(self.chunks)


async def _read_pipe(fd: int, into: _Bounded) -> None:
    """Read ``fd`` to its end (every writer closed it) into ``into``."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                                os.fdopen(os.dup(fd), "rb", buffering=0))
    try:
        while chunk := await reader.read(64 * 1024):
            into.add(chunk)
    finally:
        transport.close()


async def run_captured(command: str | Sequence[str], *, cwd: Path, env: Mapping[str, str], timeout: float,
                       capture: int, preexec: Callable[[], None] | None = None,
                       results: ResultsPipe | None = None) -> CommandRun:
    """``command`` (a shell line, or an argv run without a shell) in ``cwd``; OSError when it
    cannot start. ``results``: its write end is the command's standard input, its read end read."""
    pipes: dict[str, Any] = {"cwd": cwd, "stdin": asyncio.subprocess.DEVNULL, "env": dict(env),
                             "stdout": asyncio.subprocess.PIPE, "stderr": asyncio.subprocess.STDOUT,
                             "start_new_session": True}
    if preexec is not None:
        pipes["preexec_fn"] = preexec
    if results is not None:  # the wrapper's standard input: it moves it away from the command's
        pipes["stdin"] = results.write_fd
    if isinstance(command, str):
        proc = await asyncio.create_subprocess_shell(command, **pipes)
    else:
        proc = await asyncio.create_subprocess_exec(*command, **pipes)
    output = _Bounded(capture)
    reports = _Bounded(results.limit if results is not None else 0)
    if results is not None:  # only the child holds the write end now: the read ends when it ends
        os.close(results.write_fd)
        results.write_fd = -1

    async def pump() -> None:
        assert proc.stdout is not None
        reading = asyncio.ensure_future(_read_pipe(results.read_fd, reports)) if results is not None else None
        try:
            while chunk := await proc.stdout.read(64 * 1024):
                output.add(chunk)
            await proc.wait()
            if reading is not None:
                await reading
        finally:
            if reading is not None and not reading.done():
                reading.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await reading

    try:
        await asyncio.wait_for(pump(), timeout)
    except TimeoutError:
        _kill(proc)
        await proc.wait()
        return CommandRun(output.data.decode("utf-8", errors="replace"), None, output.dropped, timeout)
    except asyncio.CancelledError:
        _kill(proc)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(proc.wait(), 5)
        raise
    return CommandRun(output.data.decode("utf-8", errors="replace"), proc.returncode, output.dropped, timeout,
                      results=reports.data, results_dropped=reports.dropped)


def shown_run(run: CommandRun, *, capture: int) -> str:
    """The run's text with what a reader must know after it: bytes not captured, the deadline, the
    exit code (a model reads these lines; a program reads ``_meta["hopline.command"]``)."""
    text = run.text
    if run.dropped_bytes:
        text += (f"\n[{run.dropped_bytes} more bytes of output not captured "
                 f"(HOPLINE_COMMAND_OUTPUT_MAX_BYTES={capture})]")
    if run.refused_processes:
        text += (f"\n[the sandbox's process limit refused {run.refused_processes} new processes "
                 f"(HOPLINE_SANDBOX_MAX_PROCESSES={run.process_limit})]")
    if run.timed_out:
        return text + f"\n[killed: the command ran past its timeout of {run.timeout} s]"
    return text + f"\n[exit code {run.exit_code}]"
