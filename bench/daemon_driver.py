"""Driving a real daemon for the benchmarks: start it, open sessions, stream a prompt's frames.

``launch="serve"`` runs ``hopline serve --agent-cmd ...`` exactly as a user would;
``launch="bench"`` runs ``bench/daemon_server.py`` (the same app factory) for the A/B switches the
daemon has no flag for (observer off, sidecars on). The SSE reader resumes with ``Last-Event-ID``
when the daemon evicts it (a slow-client eviction costs time, as it would cost a real client).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import secrets
import shlex
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from bench.common import BENCH_DIR, HOST, PYTHON, REPO_ROOT, Settings, free_port, started, tail
from bench.cpu import CpuWindow
from bench.sse_client import SseCounter, stream_sse
from hopline.budget import SERVER_TOKEN_ENV

TIMEOUT_S = 90.0


def available() -> str | None:
    """None when the daemon can be benchmarked, else why not."""
    try:
        import hopline.cli.serve
        import hopline.daemon.app  # noqa: F401
    except Exception as exc:  # an unfinished component must not break the other benchmarks
        return f"the daemon is not importable yet ({type(exc).__name__}: {exc})"
    return None


@dataclasses.dataclass
class Daemon:
    port: int
    token: str
    pid: int
    data_dir: Path
    stderr: Path

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.token}"}


@contextlib.contextmanager
def daemon(settings: Settings, agent: list[str], *, launch: str = "serve", observer: bool = True,
           sidecars: bool | None = None, journal: bool = True, histogram: bool = True,
           env: dict[str, str] | None = None, extra_args: tuple[str, ...] = (),
           name: str = "daemon") -> Iterator[Daemon]:
    import os

    port = free_port()
    token = secrets.token_hex(24)  # never starts with "-" (argv)
    data_dir = settings.workdir / f"{name}-{port}"
    data_dir.mkdir(parents=True, exist_ok=True)
    stderr = settings.workdir / f"{name}-{port}.stderr"
    child_env = {**os.environ, SERVER_TOKEN_ENV: token, **(env or {})}
    if launch == "serve":
        if not observer or sidecars is not None or not journal or not histogram or extra_args:
            raise ValueError("hopline serve has no observer/sidecar switch; use launch='bench'")
        args = [PYTHON, "-m", "hopline", "serve", "--port", str(port), "--data-dir", str(data_dir),
                "--agent-cmd", shlex.join(agent)]
    else:
        args = [PYTHON, str(BENCH_DIR / "daemon_server.py"), str(port), str(data_dir), token]
        if not observer:
            args.append("--no-observer")
        elif not histogram:
            args.append("--no-histogram")
        if sidecars is not None:
            args += ["--sidecars", "on" if sidecars else "off"]
        if not journal:
            args.append("--journal-off")
        args += [*extra_args, "--", *agent]
    try:
        with started(args, env=child_env, port=port, stderr_path=stderr, startup_timeout=60) as proc:
            yield Daemon(port, token, proc.pid, data_dir, stderr)
    except Exception as exc:
        raise RuntimeError(f"{exc}; daemon stderr tail: {tail(stderr, 1500)}") from exc


def stream_agent(path: Path) -> list[str]:
    return [PYTHON, str(BENCH_DIR / "stream_agent.py"), str(path)]


async def create_session(client: httpx.AsyncClient, d: Daemon) -> str:
    response = await client.post(f"{d.url}/session", json={"cwd": str(REPO_ROOT)}, headers=d.headers)
    response.raise_for_status()
    return str(response.json()["sessionId"])


async def stream_prompt(client: httpx.AsyncClient, d: Daemon, session_id: str, frames: int,
                        text: str = "go", marker: bytes = b"agent_message_chunk",
                        resume: bool = True, cpu: CpuWindow | None = None) -> dict[str, Any]:
    """Subscribe, prompt, read until ``frames`` events carrying ``marker``; resume on eviction.

    ``cpu``: started just before the prompt is posted, stopped at the last frame (the same window
    as the wall clock)."""
    counter = SseCounter(marker)
    last_id: int | None = None
    evictions = 0
    prompt_started: float | None = None
    path = f"/session/{session_id}/events"
    while counter.marked < frames:
        headers = dict(d.headers)
        if last_id is not None:
            headers["last-event-id"] = str(last_id)
        reads = stream_sse(HOST, d.port, path, counter.feed_from, headers)
        try:
            evicted_before = counter.names.get("client_evicted", 0)
            async for _ in reads:
                if counter.last_id is not None:
                    last_id = counter.last_id
                if prompt_started is None and counter.names.get("replay_complete"):
                    if cpu is not None:
                        cpu.start()
                    prompt_started = time.perf_counter()
                    accepted = await client.post(f"{d.url}/session/{session_id}/prompt", json={"text": text},
                                                 headers=d.headers)
                    accepted.raise_for_status()
                if counter.marked >= frames:
                    if cpu is not None and cpu.sample is None:
                        cpu.stop()
                    break
                if counter.names.get("client_evicted", 0) > evicted_before:
                    break
                if counter.names.get("turn_error"):
                    raise RuntimeError("the daemon reported turn_error; stderr tail: " + tail(d.stderr, 800))
        finally:
            await reads.aclose()
        if counter.names.get("client_evicted", 0) > evicted_before:
            evictions += 1
            if not resume:
                raise RuntimeError(f"evicted as a slow client after {counter.marked} of {frames} frames "
                                   "(this daemon cannot be resumed)")
            continue
        if counter.marked < frames:
            raise RuntimeError(f"SSE stream ended after {counter.marked} of {frames} frames")
    assert prompt_started is not None and counter.last_marked_at is not None
    return {"seconds": counter.last_marked_at - prompt_started, "evictions": evictions,
            "cpu": cpu.sample.to_json() if cpu is not None and cpu.sample is not None else None,
            "sseBytes": counter.bytes_received, "events": counter.events,
            "slowClientWarnings": counter.names.get("slow_client_warning", 0),
            "framesDropped": counter.names.get("frame_dropped", 0)}


async def status(client: httpx.AsyncClient, d: Daemon) -> dict[str, Any]:
    response = await client.get(f"{d.url}/daemon/status", headers=d.headers)
    response.raise_for_status()
    data: dict[str, Any] = response.json()
    return data


async def _relay_once(d: Daemon, frames: int, text: str, resume: bool, cpu: bool) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(TIMEOUT_S, connect=10.0)) as client:
        session_id = await create_session(client, d)
        # Made after the session: its agent is then a child of the daemon, so the window counts it.
        window = CpuWindow(d.pid) if cpu else None
        outcome = await stream_prompt(client, d, session_id, frames, text=text, resume=resume, cpu=window)
        daemon_status = await status(client, d)
        outcome["pipe"] = daemon_status.get("runtime", {}).get("perf", {}).get("pipe")
        with contextlib.suppress(httpx.HTTPError):
            await client.delete(f"{d.url}/session/{session_id}", headers=d.headers)
    return outcome


def relay_on(d: Daemon, path: Path, frames: int, *, resume: bool = True, cpu: bool = True) -> dict[str, Any]:
    """One prompt streaming ``path`` through a running daemon (its agent honours ``stream PATH``).

    ``resume=False``: an eviction is an error (a daemon without a journal cannot replay).
    ``outcome["cpu"]``: CPU seconds of the daemon, its agent and this client over the window."""
    try:
        return asyncio.run(asyncio.wait_for(_relay_once(d, frames, f"stream {path}", resume, cpu),
                                            TIMEOUT_S))
    except TimeoutError:
        raise TimeoutError(f"{frames} frames not received through the daemon within {TIMEOUT_S:.0f} s "
                           f"({path.name})") from None


def measure_relay(path: Path, frames: int, settings: Settings, *, frame_bytes: int,
                  launch: str = "serve", observer: bool = True) -> float | None:
    with daemon(settings, stream_agent(path), launch=launch, observer=observer) as d:
        return float(relay_on(d, path, frames)["seconds"])


def observer_switch() -> str | None:
    """A note on how the observer A/B is done (no daemon flag exists)."""
    return ("the daemon has no CLI flag for it: the A/B run uses bench/daemon_server.py, which builds "
            "the same app with PipeObservability(hooks=False) (create_daemon_app(instruments=...))")
