"""The embedded stack for ``hopline run`` and ``hopline demo``: ``hopline serve`` as a child process.

The daemon (with its gateway and the offline scripted model) runs as ``python -m hopline serve`` on
127.0.0.1 with port 0 (it binds a free port and prints its URL, which is read back from its output),
a fresh random bearer token and a private data directory. A subprocess
(rather than in-process uvicorn) keeps the stack's environment separate: ``hopline demo --naive``
hands it the incident's gateway limit without touching this process's budget. :func:`embedded_stack`
waits until ``/health`` answers, and stops the child (SIGTERM, then SIGKILL) on the way out.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

from hopline.budget import DATA_DIR_ENV, SERVER_TOKEN_ENV
from hopline.errors import EmbeddedStackError

log = logging.getLogger("hopline.embedded")

# --- FALLBACKS (not byte ceilings; the coordinator may move them to the budget): how long the
# embedded daemon may take to answer /health, and to exit after SIGTERM.
FALLBACK_STARTUP_TIMEOUT_SECONDS = 30.0
FALLBACK_STOP_TIMEOUT_SECONDS = 10.0
_POLL_SECONDS = 0.05
_STDERR_TAIL_CHARS = 4000


@dataclasses.dataclass
class EmbeddedStack:
    url: str
    token: str
    data_dir: Path
    process: subprocess.Popen[bytes]
    stderr_path: Path  # the daemon's stdout and stderr
    owns_data_dir: bool = True

    def stop(self) -> None:
        """Stop the daemon (and its agent children); remove a temporary data directory."""
        stop_process(self.process)
        if self.owns_data_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def stderr_tail(self) -> str:
        try:
            text = self.stderr_path.read_text("utf-8", "replace")
        except OSError:
            return ""
        return text[-_STDERR_TAIL_CHARS:]


# The line `hopline serve` prints once it has bound its socket.
_URL_LINE = re.compile(rb"listening on (http://\S+)")


def serve_command(host: str, agent_cmd: Sequence[str] | None = None) -> list[str]:
    command = [sys.executable, "-m", "hopline", "serve", "--host", host, "--port", "0"]
    if agent_cmd:
        command += ["--agent-cmd", shlex.join(agent_cmd)]
    return command


def start_embedded(*, env: Mapping[str, str] | None = None, data_dir: Path | None = None,
                   agent_cmd: Sequence[str] | None = None,
                   startup_timeout: float = FALLBACK_STARTUP_TIMEOUT_SECONDS) -> EmbeddedStack:
    """Start ``hopline serve`` on loopback and wait until ``/health`` answers (blocking).

    ``env`` adds to (or overrides) the child's environment, e.g. ``API_JSON_BODY_LIMIT`` for the
    naive demo; ``agent_cmd`` replaces the daemon's default agent (``hopline agent``). The data
    directory is temporary (removed by :meth:`EmbeddedStack.stop`) unless ``data_dir`` is given.
    """
    owned_dir = data_dir is None
    root = Path(tempfile.mkdtemp(prefix="hopline-embedded-")) if data_dir is None else Path(data_dir)
    root.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(24)
    host = "127.0.0.1"
    child_env = dict(os.environ)
    child_env.update(env or {})
    child_env[SERVER_TOKEN_ENV] = token
    child_env[DATA_DIR_ENV] = str(root / "data")
    stderr_path = root / "serve.stderr.log"
    with open(stderr_path, "wb") as stderr_file:
        process = subprocess.Popen(serve_command(host, agent_cmd), env=child_env, stdin=subprocess.DEVNULL,
                                   stdout=stderr_file, stderr=stderr_file, start_new_session=True)
    stack = EmbeddedStack("", token, root, process, stderr_path, owned_dir)
    try:
        _wait_healthy(stack, startup_timeout)
    except BaseException:
        stack.stop()
        raise
    return stack


@contextlib.asynccontextmanager
async def embedded_stack(*, env: Mapping[str, str] | None = None, data_dir: Path | None = None,
                         agent_cmd: Sequence[str] | None = None,
                         startup_timeout: float = FALLBACK_STARTUP_TIMEOUT_SECONDS
                         ) -> AsyncIterator[EmbeddedStack]:
    """:func:`start_embedded` as an async context manager: the stack is stopped on exit."""
    stack = await asyncio.to_thread(start_embedded, env=env, data_dir=data_dir, agent_cmd=agent_cmd,
                                    startup_timeout=startup_timeout)
    try:
        yield stack
    finally:
        await asyncio.to_thread(stack.stop)


def _wait_healthy(stack: EmbeddedStack, timeout: float) -> None:
    """Read the URL line from the daemon's output, then wait until ``/health`` answers."""
    import httpx

    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=httpx.Timeout(2.0)) as http:
        while True:
            if stack.process.poll() is not None:
                raise EmbeddedStackError(f"hopline serve exited with code {stack.process.returncode} "
                                         f"before it was ready:\n{stack.stderr_tail()}")
            if not stack.url:
                match = _URL_LINE.search(stack.stderr_path.read_bytes())
                if match is not None:
                    stack.url = match.group(1).decode()
            if stack.url:
                with contextlib.suppress(httpx.HTTPError):
                    if http.get(stack.url + "/health").status_code == 200:
                        return
            if time.monotonic() > deadline:
                raise EmbeddedStackError(f"hopline serve did not answer /health within {timeout:.0f} s:\n"
                                         f"{stack.stderr_tail()}")
            time.sleep(_POLL_SECONDS)


def stop_process(process: subprocess.Popen[bytes],
                 timeout: float = FALLBACK_STOP_TIMEOUT_SECONDS) -> None:
    """SIGTERM the child's process group (the daemon and its agent children), then SIGKILL."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout)
