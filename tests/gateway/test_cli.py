"""`hopline gateway` as a real child process on 127.0.0.1."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from ._bodies import body_of_size

pytestmark = pytest.mark.e2e  # every test here starts real processes

STARTUP_TIMEOUT_SECONDS = 20


@contextlib.contextmanager
def gateway_process(env: dict[str, str], *args: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "hopline", "gateway", "--port", "0", *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()  # the one line saying where it listens
        assert line.startswith("hopline gateway listening on http://127.0.0.1:"), line
        yield proc, line.rsplit(" ", 1)[1]
    finally:
        proc.terminate()
        try:
            proc.wait(STARTUP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOPLINE_", "API_JSON", "OPENAI_"))}
    env.update(extra)
    return env


def test_serves_with_the_token_from_the_environment_and_the_env_limit() -> None:
    limit = 9 * 1024 * 1024  # coherent: over the 8 MiB engine ceiling
    env = _env(HOPLINE_INTERNAL_TOKEN="cli-token-abc", API_JSON_BODY_LIMIT="9mb")
    with gateway_process(env) as (proc, url), httpx.Client(base_url=url, timeout=10) as client:
        assert client.get("/health").json()["bodyLimitBytes"] == limit
        turn = "/internal/sessions/s/llm-turn"
        headers = {"authorization": "Bearer cli-token-abc", "content-type": "application/json"}
        ok = client.post(turn, content=body_of_size(limit), headers=headers)
        assert ok.status_code == 200 and ok.json()["provider"] == "scripted"
        assert client.post(turn, content=body_of_size(limit + 1), headers=headers).status_code == 413
        assert client.post(turn, content=body_of_size(100), headers={"content-type": "application/json"}
                           ).status_code == 401
    _, err = proc.communicate(timeout=10)
    assert "token from HOPLINE_INTERNAL_TOKEN" in err
    assert "cli-token-abc" not in err
    assert "/internal/sessions/s" not in err  # no access log with session ids


def test_a_generated_token_is_never_printed_and_can_go_to_a_private_file(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    with gateway_process(_env(), "--token-file", str(token_file)) as (proc, url):
        token = token_file.read_text()
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        r = httpx.post(f"{url}/internal/sessions/s/llm-turn", content=body_of_size(200),
                       headers={"authorization": f"Bearer {token}", "content-type": "application/json"})
        assert r.status_code == 200
    out, err = proc.communicate(timeout=10)
    assert "token from generated" in err
    assert token not in out and token not in err


def test_refuses_to_start_on_an_incoherent_budget() -> None:
    env = _env(API_JSON_BODY_LIMIT="100kb")  # under the 8 MiB engine ceiling: the incident K-5 replays
    proc = subprocess.run([sys.executable, "-m", "hopline", "gateway", "--port", "0"], env=env,
                          capture_output=True, text=True, timeout=STARTUP_TIMEOUT_SECONDS)
    assert proc.returncode == 2
    assert "engine_within_gateway" in proc.stderr and "API_JSON_BODY_LIMIT" in proc.stderr
    assert "listening" not in proc.stdout


def test_a_request_head_still_incomplete_at_its_deadline_gets_a_408_naming_the_gateway() -> None:
    env = _env(HOPLINE_INTERNAL_TOKEN="cli-token-abc", HOPLINE_REQUEST_HEAD_TIMEOUT="0.5")
    with gateway_process(env) as (_, url):
        host, port = url.removeprefix("http://").split(":")
        head = b"POST /internal/sessions/s/llm-turn HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(head)
            raw = b""
            while chunk := sock.recv(65536):
                raw += chunk
    status, _, body = raw.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 408")
    error = orjson.loads(body)["error"]
    assert error["hop"] == "gateway.llm_turn" and error["setting"] == "HOPLINE_REQUEST_HEAD_TIMEOUT"
    assert error["receivedBytes"] == len(head) and error["timeoutSeconds"] == 0.5


def test_naive_mode_serves_the_seeds_incoherent_limit_on_purpose_as_serve_does() -> None:
    env = _env(API_JSON_BODY_LIMIT="100kb", HOPLINE_NAIVE="1", HOPLINE_INTERNAL_TOKEN="cli-token-naive")
    with gateway_process(env) as (proc, url), httpx.Client(base_url=url, timeout=10) as client:
        assert client.get("/health").json()["bodyLimitBytes"] == 100 * 1024
        turn = "/internal/sessions/s/llm-turn"
        headers = {"authorization": "Bearer cli-token-naive", "content-type": "application/json"}
        assert client.post(turn, content=body_of_size(100 * 1024), headers=headers).status_code == 200
        assert client.post(turn, content=body_of_size(100 * 1024 + 1), headers=headers).status_code == 413
    _, err = proc.communicate(timeout=10)
    assert "hopline gateway: incoherent budget: engine_within_gateway" in err
    assert "HOPLINE_NAIVE=1: running the incoherent budget on purpose" in err
