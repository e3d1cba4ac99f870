"""`hopline serve` startup: an incoherent budget is refused; a missing token is made (kept in a 0600 file)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from .support import iter_sse, start_daemon, stop_daemon_proc

pytestmark = pytest.mark.e2e  # every test here starts real processes


def test_incoherent_budget_refuses_to_start(tmp_path: Path) -> None:
    env = {**os.environ, "HOPLINE_PIPE_MAX_FRAME_BYTES": "1mb", "HOPLINE_AGENT_MAX_FRAME_BYTES": "2mb"}
    result = subprocess.run([sys.executable, "-m", "hopline", "serve", "--port", "0", "--data-dir",
                             str(tmp_path)], env=env, capture_output=True, timeout=60)
    assert result.returncode == 2
    assert b"pipe_ends_agree" in result.stderr and b"HOPLINE_AGENT_MAX_FRAME_BYTES" in result.stderr
    assert b"listening" not in result.stdout


def test_bad_setting_names_the_variable(tmp_path: Path) -> None:
    env = {**os.environ, "HOPLINE_SSE_QUEUE_MAX_BYTES": "lots"}
    result = subprocess.run([sys.executable, "-m", "hopline", "serve", "--data-dir", str(tmp_path)],
                            env=env, capture_output=True, timeout=60)
    assert result.returncode == 2 and b"HOPLINE_SSE_QUEUE_MAX_BYTES" in result.stderr


def test_bad_provider_settings_name_the_variable_never_the_value(tmp_path: Path) -> None:
    for extra, needle in (({"HOPLINE_PROVIDER": "gpt"}, b"HOPLINE_PROVIDER='gpt'"),
                          ({"HOPLINE_PROVIDER": "openai", "OPENAI_API_KEY": "sk-canary-1",
                            "HOPLINE_PROVIDER_EXTRA_HEADERS": '{"Authorization": "Bearer sk-canary-2"}'},
                           b"HOPLINE_PROVIDER_EXTRA_HEADERS: authorization conflicts with OPENAI_API_KEY")):
        result = subprocess.run([sys.executable, "-m", "hopline", "serve", "--port", "0", "--data-dir",
                                 str(tmp_path)], env={**os.environ, **extra}, capture_output=True, timeout=60)
        assert result.returncode == 2 and needle in result.stderr, result.stderr[-2000:]
        assert b"sk-canary" not in result.stderr + result.stdout
        assert b"listening" not in result.stdout


def test_generated_token_is_printed_and_required(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, token="")
    try:
        assert daemon.url.startswith("http://127.0.0.1:") and not daemon.url.endswith(":0")
        assert httpx.get(daemon.url + "/daemon/status", timeout=10).status_code == 401
        assert len(daemon.token) >= 32
        ok = httpx.get(daemon.url + "/daemon/status", headers=daemon.headers, timeout=10)
        assert ok.status_code == 200
        assert ok.json()["eventLoop"] == "uvloop"  # uvicorn[standard] is a dependency: serve runs on it
    finally:
        stop_daemon_proc(daemon.proc)


def test_naive_mode_serves_the_seeds_incoherent_gateway_limit_on_purpose(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, env={"API_JSON_BODY_LIMIT": "100kb", "HOPLINE_NAIVE": "1"})
    try:
        status = httpx.get(daemon.url + "/daemon/status", headers=daemon.headers, timeout=10).json()
        assert [e["rule"] for e in status["budget"]["errors"]] == ["engine_within_gateway"]
    finally:
        stop_daemon_proc(daemon.proc)
    assert "HOPLINE_NAIVE=1: running the incoherent budget on purpose" in daemon.log_text()


async def test_sigterm_ends_open_event_streams_cleanly(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path)
    try:
        async with daemon.client() as client:
            created = await client.post("/session", json={"cwd": str(tmp_path)})
            sid = created.json()["sessionId"]
            seen: list[str] = []
            async with client.stream("GET", f"/session/{sid}/events") as response:
                async for event in iter_sse(response):
                    seen.append(event.type)
                    if event.type == "replay_complete":
                        daemon.proc.send_signal(signal.SIGTERM)
            # the stream ended with a complete response (no protocol error), after the replay
            assert seen == ["session_update", "replay_complete"]
        assert daemon.proc.wait(30) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal it handled
    finally:
        stop_daemon_proc(daemon.proc)
