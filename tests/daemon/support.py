"""Helpers for the daemon tests: a real `hopline serve` subprocess on 127.0.0.1 and an SSE reader."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson

AGENT = Path(__file__).parent / "agents" / "big_update_agent.py"
BIG_AGENT_CMD = f"{shlex.quote(sys.executable)} {shlex.quote(str(AGENT))}"
START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0


@dataclasses.dataclass
class Daemon:
    url: str
    token: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    data_dir: Path
    stdout_lines: list[str] = dataclasses.field(default_factory=list)  # all it printed, so far

    @property
    def console_url(self) -> str:
        """The URL of the browser console, as `hopline serve` printed it."""
        return next(line.split(" ", 1)[1] for line in self.stdout_lines if line.startswith("console: "))

    @property
    def signed_in_console_url(self) -> str:
        """The console's URL with the token in its fragment, as `serve` prints it on a terminal."""
        return f"{self.url}/ui/#token={self.token}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def client(self, timeout: float = 30.0) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, headers=self.headers, timeout=timeout)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


def _repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def start_daemon(tmp: Path, *, data_dir: Path | None = None, agent_cmd: str | None = BIG_AGENT_CMD,
                 env: dict[str, str] | None = None, token: str = "test-server-token",
                 log_name: str = "daemon.log", port: int = 0, args: tuple[str, ...] = ()) -> Daemon:
    data = data_dir or tmp / "data"
    log_path = tmp / log_name
    full_env = {**os.environ, "HOPLINE_SERVER_TOKEN": token, **(env or {})}
    if not token:
        full_env.pop("HOPLINE_SERVER_TOKEN")
    full_env.pop("HOPLINE_INTERNAL_TOKEN", None)
    argv = [sys.executable, "-m", "hopline", "serve", "--port", str(port), "--data-dir", str(data)]
    if agent_cmd is not None:
        argv += ["--agent-cmd", agent_cmd]
    argv += args
    log_file = open(log_path, "ab")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log_file, env=full_env, cwd=_repo_root())
    log_file.close()
    assert proc.stdout is not None
    found: list[str] = []
    stdout_lines: list[str] = []

    def read_url() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:  # read to the end, so the daemon never blocks on stdout
            line = raw.decode(errors="replace").strip()
            stdout_lines.append(line)
            if line.startswith("hopline serve listening on "):
                found.append(line.rsplit(" ", 1)[1])

    threading.Thread(target=read_url, daemon=True).start()
    deadline = time.monotonic() + START_TIMEOUT
    while not found:
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_daemon_proc(proc)
            raise RuntimeError(f"hopline serve did not start: {log_path.read_text(errors='replace')[-2000:]}")
        time.sleep(0.05)
    url = found[0]
    if not token:  # the daemon made one: off a terminal it is in the data directory's 0600 file
        token = (data / "server-token").read_text().strip()
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        if time.monotonic() > deadline:
            stop_daemon_proc(proc)
            raise RuntimeError("hopline serve never became healthy")
        time.sleep(0.05)
    return Daemon(url, token, proc, log_path, data, stdout_lines)


def free_port() -> int:
    """A loopback port free right now (for a daemon restarted on the same address)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def stop_daemon_proc(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(STOP_TIMEOUT)


@contextlib.contextmanager
def running_daemon(tmp: Path, **kwargs: Any) -> Iterator[Daemon]:
    daemon = start_daemon(tmp, **kwargs)
    try:
        yield daemon
    finally:
        stop_daemon_proc(daemon.proc)


# --- SSE --------------------------------------------------------------------------------------------

@dataclasses.dataclass
class SseEvent:
    id: int | None
    type: str
    data: Any
    raw: bytes = dataclasses.field(default=b"", compare=False)  # the data's bytes, as sent


def parse_block(block: bytes) -> SseEvent | None:
    event_id: int | None = None
    event_type = "message"
    data_lines: list[bytes] = []
    for line in block.split(b"\n"):
        if not line or line.startswith(b":"):
            continue
        name, _, value = line.partition(b":")
        value = value[1:] if value.startswith(b" ") else value
        if name == b"id":
            event_id = int(value)
        elif name == b"event":
            event_type = value.decode()
        elif name == b"data":
            data_lines.append(value)
    if not data_lines:
        return None
    raw = b"\n".join(data_lines)
    return SseEvent(event_id, event_type, orjson.loads(raw), raw)


async def iter_sse(response: httpx.Response) -> AsyncIterator[SseEvent]:
    buffer = b""
    async for chunk in response.aiter_bytes():
        buffer += chunk
        while b"\n\n" in buffer:
            block, buffer = buffer.split(b"\n\n", 1)
            event = parse_block(block)
            if event is not None:
                yield event


async def read_events(client: httpx.AsyncClient, session_id: str, until: Callable[[SseEvent], bool], *,
                      last_event_id: int | None = None, params: dict[str, Any] | None = None,
                      limit: int = 100_000) -> list[SseEvent]:
    """Open the session's stream and collect events until ``until(event)`` is true (inclusive)."""
    headers = {} if last_event_id is None else {"Last-Event-ID": str(last_event_id)}
    events: list[SseEvent] = []
    async with client.stream("GET", f"/session/{session_id}/events", headers=headers,
                             params=params or {}) as response:
        assert response.status_code == 200, await response.aread()
        async for event in iter_sse(response):
            events.append(event)
            if until(event) or len(events) >= limit:
                break
    return events
