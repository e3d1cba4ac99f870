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

    @property
    def timed_out(self) -> bool:
        return self.exit_code is None


def _kill(proc: asyncio.subprocess.Process) -> None:
    # The command runs in its own session: kill its whole process group (by the group's id).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


async def run_captured(command: str | Sequence[str], *, cwd: Path, env: Mapping[str, str], timeout: float,
                       capture: int, preexec: Callable[[], None] | None = None) -> CommandRun:
    """``command`` (a shell line, or an argv run without a shell) in ``cwd``; OSError when it
    cannot start."""
    pipes: dict[str, Any] = {"cwd": cwd, "stdin": asyncio.subprocess.DEVNULL, "env": dict(env),
                             "stdout": asyncio.subprocess.PIPE, "stderr": asyncio.subprocess.STDOUT,
                             "start_new_session": True}
    if preexec is not None:
        pipes["preexec_fn"] = preexec
    if isinstance(command, str):
        proc = await asyncio.create_subprocess_shell(command, **pipes)
    else:
        proc = await asyncio.create_subprocess_exec(*command, **pipes)
    chunks: list[bytes] = []
    kept = dropped = 0

    async def pump() -> None:
        nonlocal kept, dropped
        assert proc.stdout is not None
        while chunk := await proc.stdout.read(64 * 1024):
            room = max(capture - kept, 0)
            chunks.append(chunk[:room])
            kept += min(room, len(chunk))
            dropped += len(chunk) - min(room, len(chunk))
        await proc.wait()

    try:
        await asyncio.wait_for(pump(), timeout)
    except TimeoutError:
        _kill(proc)
        await proc.wait()
        return CommandRun(b"".join(chunks).decode("utf-8", errors="replace"), None, dropped, timeout)
    except asyncio.CancelledError:
        _kill(proc)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(proc.wait(), 5)
        raise
    return CommandRun(b"".join(chunks).decode("utf-8", errors="replace"), proc.returncode, dropped, timeout)


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
