"""Provider errors that say what to check, as `hopline run` and `hopline gate` print them over the
real embedded stack and a real OpenAI-compatible server on 127.0.0.1 (tests/strict_openai.py)."""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from strict_openai import StrictOpenAI

from .conftest import run_cli

pytestmark = pytest.mark.e2e  # every test here starts real processes

KEY = "sk-canary-provider-key-5f1e"


def openai_env(base_url: str, **extra: str) -> dict[str, str]:
    return {"HOPLINE_PROVIDER": "openai", "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": KEY,
            "HOPLINE_MODEL_RETRY_BACKOFF": "0.01", "HOPLINE_URL": "", **extra}


@pytest.fixture
def provider() -> Iterator[StrictOpenAI]:
    with StrictOpenAI() as server:
        yield server


def failed_run(env: dict[str, str], cwd: Path) -> dict[str, object]:
    """`hopline run --json` on the embedded stack, whose turn fails: its final line's error."""
    result = run_cli(["run", "hello", "--json"], cwd=cwd, env=env)
    assert result.returncode == 1, result.stderr[-2000:]
    assert KEY not in result.stdout + result.stderr
    final = json.loads(result.stdout.splitlines()[-1])
    assert final["type"] == "final"
    return dict(final["error"])


@pytest.mark.parametrize(("base_url", "shown"), [
    ("127.0.0.1:18181/v1", "'127.0.0.1:18181/v1'"),
    ("http:///v1", "'http:///v1'"),
    ("ftp://user:hunter2@models.internal/v1", "'ftp://user:***@models.internal/v1'"),
])
def test_a_base_url_without_a_scheme_or_a_host_is_refused_at_start(tmp_path: Path, base_url: str,
                                                                    shown: str) -> None:
    served = run_cli(["serve", "--port", "0", "--data-dir", str(tmp_path / "data")],
                     env=openai_env(base_url))
    assert served.returncode == 2
    assert (f"hopline serve: bad setting: OPENAI_BASE_URL={shown}: needs a scheme and a host"
            in served.stderr)
    assert "listening" not in served.stdout and "hunter2" not in served.stderr
    ran = run_cli(["run", "hello"], cwd=tmp_path, env=openai_env(base_url))  # the embedded stack: the same
    assert ran.returncode == 2 and f"OPENAI_BASE_URL={shown}: needs a scheme and a host" in ran.stderr


def test_a_401_names_the_key_and_the_url(provider: StrictOpenAI, tmp_path: Path) -> None:
    provider.fail_with = 401
    error = failed_run(openai_env(provider.base_url), tmp_path)
    assert error["message"] == (f"HTTP 401 from {provider.base_url}: the provider refused the credentials; "
                                "check OPENAI_API_KEY and OPENAI_BASE_URL")
    assert (error["origin"], error["status"]) == ("code", 401)
    assert len(provider.rejections) == 1  # never retried: a refused key stays refused


def test_nothing_listening_names_the_url_and_the_variable(tmp_path: Path) -> None:
    with socket.socket() as sock:  # bound, never listening: the connection is refused
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        error = failed_run(openai_env(url, HOPLINE_MODEL_RETRY_ATTEMPTS="0"), tmp_path)
    assert str(error["message"]).startswith(f"nothing answers at {url} (")
    assert "; check OPENAI_BASE_URL" in str(error["message"])


def test_a_timeout_names_the_setting_and_its_value(provider: StrictOpenAI, tmp_path: Path) -> None:
    provider.hold_after = 0  # the answer's first chunk, then silence
    provider.hold_seconds = 10
    error = failed_run(openai_env(provider.base_url, HOPLINE_PROVIDER_READ_TIMEOUT="1",
                                  HOPLINE_MODEL_RETRY_ATTEMPTS="0"), tmp_path)
    assert str(error["message"]).startswith("the provider's stream was cut before it finished (")
    assert (f"{provider.base_url} sent nothing for 1 s (HOPLINE_PROVIDER_READ_TIMEOUT=1, the longest silence"
            in str(error["message"]))


def test_the_retries_printed_are_the_retries_made(provider: StrictOpenAI, tmp_path: Path) -> None:
    provider.fail_with = 429
    result = run_cli(["run", "hello"], cwd=tmp_path, env=openai_env(provider.base_url,
                                                                      HOPLINE_MODEL_RETRY_ATTEMPTS="2"))
    assert result.returncode == 1, result.stderr[-2000:]
    printed = result.stdout.count("↻ llm-turn sent again after a failure (origin model, HTTP 429)")
    assert (printed, len(provider.rejections)) == (2, 3)
    assert "(3 requests sent: 2 retries, HOPLINE_MODEL_RETRY_ATTEMPTS=2)" in " ".join(result.stdout.split())


def test_a_gate_sends_a_failing_model_no_more_retries_than_the_budget(provider: StrictOpenAI,
                                                                      tmp_path: Path) -> None:
    """The turn's loop retries a transient model failure HOPLINE_MODEL_RETRY_ATTEMPTS times; the gate
    does not start a second attempt that would send them all again."""
    from hopline.scripted.sample_pull_request import make_sample_pull_request

    repo, base, head = make_sample_pull_request(tmp_path / "pr", log_bytes=4096, logs=1)
    provider.fail_with = 503
    result = run_cli(["gate", "--repo", str(repo), "--base", base, "--head", head, "--agent", "qa_strategy",
                      "--json"], env=openai_env(provider.base_url, HOPLINE_MODEL_RETRY_ATTEMPTS="1"),
                     timeout=180)
    assert result.returncode == 2, result.stderr[-2000:]
    [agent] = json.loads(result.stdout)["agents"]
    assert (agent["verdict"], agent["attempt"]) == ("error", 1)
    assert len(provider.rejections) == 2  # one request, one retry
    subprocess.run(["git", "worktree", "prune"], cwd=repo, check=False)
