"""Fixtures for the CLI tests: a real `hopline serve` and a sample workspace, both cleaned up."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

HOPLINE = [sys.executable, "-m", "hopline"]




def run_cli(args: Sequence[str], *, cwd: Path | None = None, env: dict[str, str] | None = None,
            timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*HOPLINE, *args], cwd=cwd, env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


def run_in_pty(args: Sequence[str], *, cwd: Path | None = None, env: dict[str, str] | None = None,
               timeout: float = 90, columns: int = 200,
               answer: tuple[str, bytes] | None = None) -> tuple[int, str]:
    """Run the CLI with a pseudo-terminal as stdin/stdout/stderr; return (exit code, output).

    ``answer = (prompt, reply)`` types ``reply`` each time new output contains ``prompt``."""
    import fcntl
    import pty
    import struct
    import termios

    main_fd, child_fd = pty.openpty()
    fcntl.ioctl(child_fd, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    full_env = {**os.environ, **(env or {}), "TERM": "xterm-256color", "COLUMNS": str(columns)}
    full_env.pop("NO_COLOR", None)
    process = subprocess.Popen([*HOPLINE, *args], cwd=cwd, env=full_env, stdin=child_fd, stdout=child_fd,
                               stderr=child_fd, close_fds=True)
    os.close(child_fd)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError("the CLI did not finish in time")
            ready, _, _ = select.select([main_fd], [], [], 0.2)
            if ready:
                try:
                    data = os.read(main_fd, 65536)
                except OSError:  # EIO: the child closed its side
                    break
                if not data:
                    break
                chunks.append(data)
                if answer is not None and answer[0].encode() in data:
                    os.write(main_fd, answer[1])
            elif process.poll() is not None:
                break
        code = process.wait(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
        os.close(main_fd)
    return code, b"".join(chunks).decode("utf-8", "replace")
