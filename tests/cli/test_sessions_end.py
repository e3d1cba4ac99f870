"""Sessions end with their client: `hopline run --url` deletes its session (unless --keep), Ctrl-C
cancels the remote prompt first, `hopline sessions` lists, shows and deletes, `run -` reads stdin
within the budget, and the daemon reaps a session nobody uses, keeping its journal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from daemon.support import Daemon, running_daemon

from .conftest import HOPLINE, run_cli

pytestmark = pytest.mark.e2e  # every test here starts real processes

WAIT_SECONDS = 30.0


def client_env(daemon: Daemon, **extra: str) -> dict[str, str]:
    """What a person's shell holds after `serve` told them: HOPLINE_URL and HOPLINE_SERVER_TOKEN."""
    return {"HOPLINE_URL": daemon.url, "HOPLINE_SERVER_TOKEN": daemon.token, **extra}


def api(daemon: Daemon, method: str, route: str, **kwargs: Any) -> httpx.Response:
    return httpx.request(method, daemon.url + route, headers=daemon.headers, timeout=30, **kwargs)


def listed(daemon: Daemon) -> list[dict[str, Any]]:
    body = api(daemon, "GET", "/session").json()
    assert body["total"] == len(body["sessions"])
    return list(body["sessions"])


def agent_pids(daemon: Daemon) -> set[int]:
    return {child.pid for child in psutil.Process(daemon.proc.pid).children(recursive=True)}


def wait_until(check: Callable[[], Any], what: str, timeout: float = WAIT_SECONDS) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.1)


@pytest.fixture
def two_session_daemon(tmp_path: Path) -> Iterator[Daemon]:
    env = {"HOPLINE_MAX_LIVE_SESSIONS": "2", "HOPLINE_WARM_CHILDREN": "0"}
    with running_daemon(tmp_path, env=env) as daemon:
        yield daemon


def test_three_runs_against_a_daemon_limited_to_two_sessions_all_succeed(two_session_daemon: Daemon,
                                                                          tmp_path: Path) -> None:
    daemon = two_session_daemon
    for number in range(3):
        result = run_cli(["run", f"hello {number}"], cwd=tmp_path, env=client_env(daemon))
        assert result.returncode == 0, result.stderr[-2000:]
        assert f"echo: hello {number}" in result.stdout
    assert listed(daemon) == []  # every run's session ended with it
    assert api(daemon, "GET", "/daemon/status").json()["sessions"] == []
    assert agent_pids(daemon) == set()  # and its agent (no warm pool here)


def test_keep_leaves_the_session_which_hopline_sessions_lists_shows_and_deletes(two_session_daemon: Daemon,
                                                                                 tmp_path: Path) -> None:
    daemon = two_session_daemon
    env = client_env(daemon)
    kept = run_cli(["run", "hello", "--keep"], cwd=tmp_path, env=env)
    assert kept.returncode == 0, kept.stderr[-2000:]
    [row] = listed(daemon)
    session_id = row["sessionId"]
    assert f"session {session_id} kept (hopline sessions delete {session_id} removes it)" in kept.stderr
    assert (row["state"], row["activity"], row["cwd"]) == ("ready", "idle", str(tmp_path))

    table = run_cli(["sessions"], env=env)
    assert table.returncode == 0, table.stderr
    assert session_id in table.stdout and "idle" in table.stdout
    as_json = json.loads(run_cli(["sessions", "list", "--json"], env=env).stdout)
    assert [s["sessionId"] for s in as_json["sessions"]] == [session_id] and as_json["total"] == 1
    shown = run_cli(["sessions", "show", session_id], env=env)
    assert shown.returncode == 0, shown.stderr
    assert f"sessionId: {session_id}" in shown.stdout and "activity: idle" in shown.stdout
    assert "lastEventId: " in shown.stdout and f"cwd: {tmp_path}" in shown.stdout

    deleted = run_cli(["sessions", "delete", session_id, "0" * 32], env=env)
    assert deleted.returncode == 1  # one of the two was no session
    assert f"deleted {session_id}" in deleted.stdout and "404" in deleted.stderr
    assert listed(daemon) == []
    missing = run_cli(["sessions", "show", session_id], env=env)
    assert missing.returncode == 2 and "404" in missing.stderr
    nowhere = run_cli(["sessions"], env={"HOPLINE_URL": ""})
    assert nowhere.returncode == 2 and "give --url or set HOPLINE_URL" in nowhere.stderr


def interrupted_run(daemon: Daemon, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`hopline run "sleep 60"` against the daemon, Ctrl-C (SIGINT) once the agent sleeps."""
    proc = subprocess.Popen([*HOPLINE, "run", "sleep 60", "--json", *args], cwd=cwd,
                            env={**os.environ, **client_env(daemon)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            if "sleeping" in line:
                break
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=WAIT_SECONDS)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_ctrl_c_cancels_the_remote_prompt_then_deletes_the_session(two_session_daemon: Daemon,
                                                                    tmp_path: Path) -> None:
    daemon = two_session_daemon
    result = interrupted_run(daemon, tmp_path, "--keep")
    assert result.returncode == 130, result.stderr[-2000:]
    [row] = listed(daemon)
    session_id = row["sessionId"]
    assert (f"interrupted: the prompt was cancelled on the daemon; session {session_id} kept"
            in result.stderr)

    def turn_end() -> dict[str, Any] | None:
        events = api(daemon, "GET", f"/session/{session_id}/transcript").json()["events"]
        return next((e for e in events if e["type"] == "turn_complete"), None)

    # the agent was told: its turn ended there, cancelled (it slept 60 s otherwise)
    assert wait_until(turn_end, "the cancelled turn's end")["data"]["stopReason"] == "cancelled"
    api(daemon, "DELETE", f"/session/{session_id}")

    result = interrupted_run(daemon, tmp_path)
    assert result.returncode == 130, result.stderr[-2000:]
    assert "interrupted: the prompt was cancelled on the daemon; its session deleted" in result.stderr
    assert listed(daemon) == []
    wait_until(lambda: agent_pids(daemon) == set(), "the session's agent stopped")


def test_run_dash_reads_the_prompt_from_stdin_within_the_daemon_body_limit(tmp_path: Path) -> None:
    limit = 4096
    prompt_log = tmp_path / "prompts.log"
    env = {"HOPLINE_AGENT_ENV": "BIG_AGENT_PROMPT_LOG", "BIG_AGENT_PROMPT_LOG": str(prompt_log)}
    with running_daemon(tmp_path, env=env) as daemon:
        env = client_env(daemon, HOPLINE_DAEMON_JSON_BODY_LIMIT=str(limit))
        envelope = len(b'{"text":""}')
        at_limit = "echo " + "x" * (limit - envelope - 5)  # the request body is the limit, exactly
        sent = subprocess.run([*HOPLINE, "run", "-"], input=at_limit, cwd=tmp_path,
                              env={**os.environ, **env}, capture_output=True, text=True, timeout=90)
        assert sent.returncode == 0, sent.stderr[-2000:]
        assert prompt_log.read_text().splitlines() == [at_limit]  # the agent got stdin, whole

        over = subprocess.run([*HOPLINE, "run", "-"], input=at_limit + "y", cwd=tmp_path,
                              env={**os.environ, **env}, capture_output=True, text=True, timeout=90)
        assert over.returncode == 2
        assert "HOPLINE_DAEMON_JSON_BODY_LIMIT" in over.stderr and "not sent" in over.stderr
        assert f"limit {limit} bytes, observed {limit + 1} bytes" in over.stderr
        assert listed(daemon) == []  # the session made for it went too

        flood = subprocess.run([*HOPLINE, "run", "-"], input="z" * (10 * limit), cwd=tmp_path,
                               env={**os.environ, **env}, capture_output=True, text=True, timeout=90)
        assert flood.returncode == 2
        assert (f"the prompt on stdin is over the daemon's body limit of {limit} bytes "
                "(HOPLINE_DAEMON_JSON_BODY_LIMIT, hop daemon.api)") in flood.stderr
        assert prompt_log.read_text().splitlines() == [at_limit]  # nothing more reached the agent
        assert listed(daemon) == []


def test_idle_sessions_are_reaped_with_their_journal_kept(tmp_path: Path) -> None:
    idle = 2.0
    with running_daemon(tmp_path, env={"HOPLINE_SESSION_IDLE_SECONDS": str(idle),
                                       "HOPLINE_WARM_CHILDREN": "0"}) as daemon:
        def create(**body: Any) -> str:
            created = api(daemon, "POST", "/session", json={"cwd": str(tmp_path), **body})
            assert created.status_code == 200, created.text
            return str(created.json()["sessionId"])

        def in_memory() -> dict[str, dict[str, Any]]:
            return {s["sessionId"]: s for s in api(daemon, "GET", "/daemon/status").json()["sessions"]}

        def prompt(session_id: str, text: str) -> None:
            sent = api(daemon, "POST", f"/session/{session_id}/prompt", json={"text": text})
            assert sent.status_code == 202, sent.text

        reaped = create()
        prompt(reaped, "hello")
        child = in_memory()[reaped]["childPid"]
        waiting = create()  # a permission request waits for its answer
        prompt(waiting, "permission")
        wait_until(lambda: in_memory()[waiting]["activity"] == "awaiting_permission", "the permission asked")
        watched = create()  # a client reads its events
        with httpx.Client(base_url=daemon.url, headers=daemon.headers, timeout=30) as http, \
                http.stream("GET", f"/session/{watched}/events"):
            wait_until(lambda: reaped not in in_memory(), "the idle session reaped")
            time.sleep(3 * idle)  # three idle periods more: the two in use stay
            alive = in_memory()
            assert alive[waiting]["activity"] == "awaiting_permission" and alive[waiting]["childPid"]
            assert alive[watched]["state"] == "ready" and alive[watched]["childPid"]
        assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE

        events = api(daemon, "GET", f"/session/{reaped}/transcript").json()["events"]
        types = [e["type"] for e in events]
        assert "turn_complete" in types and types[-1] == "session_reaped"  # the journal stays, and says why
        said = events[-1]["data"]  # the one limit shape: the setting, its limit, the idle time seen
        assert (said["hop"], said["setting"]) == ("daemon.api", "HOPLINE_SESSION_IDLE_SECONDS")
        assert (said["limit"], said["unit"]) == (idle, "seconds") and said["observed"] >= idle
        assert api(daemon, "GET", f"/session/{reaped}").json()["state"] == "detached"
        loaded = api(daemon, "POST", f"/session/{reaped}/load")
        assert loaded.status_code == 200, loaded.text
        prompt(reaped, "hello again")
