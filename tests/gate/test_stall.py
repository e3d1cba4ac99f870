"""Gate agents that misbehave (a test agent on the ACP SDK behind a real `hopline serve`): a hung gate
is gate_stalled, retried once, then error, and the dev session never leaves awaiting_gate before; a
model with no valid verdict gets error, never pass; a cancel leaves no checkout; the CLI's exit 2."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from daemon.support import Daemon, running_daemon
from hopline.client import DaemonClient
from hopline.gate.sarif import to_sarif

from .conftest import follow, gate_agent_cmd, items_of, make_repo, validate_sarif, worktrees
from .test_gate_run import check_items

pytestmark = pytest.mark.e2e  # every test here starts real processes (git, daemons, agents)

STALL_SECONDS = 2


@pytest.fixture(scope="module")
def log_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gate-agent") / "prompts.log"


@pytest.fixture(scope="module")
def odd_daemon(tmp_path_factory: pytest.TempPathFactory, log_path: Path) -> Iterator[Daemon]:
    """appsec hangs, qa_automation answers garbage, qa_strategy breaks the schema, the other passes."""
    cmd = gate_agent_cmd(hang="appsec", garbage="qa_automation", invalid="qa_strategy")
    env = {"HOPLINE_GATE_STALL_SECONDS": str(STALL_SECONDS), "HOPLINE_MAX_GATE_RUNS": "1",
           "HOPLINE_GATE_RUNS_KEPT": "1", "GATE_AGENT_LOG": str(log_path)}
    with running_daemon(tmp_path_factory.mktemp("odd-daemon"), agent_cmd=cmd, env=env,
                        args=("--agent-env", "GATE_AGENT_LOG")) as daemon:
        yield daemon


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root, _, _ = make_repo(tmp_path_factory.mktemp("odd") / "repo", {"a.py": "x = 1\n"}, {"a.py": "x = 2\n"})
    return root


def prompts(log_path: Path, profile: str) -> list[str]:
    if not log_path.exists():
        return []
    return [line.split("\t", 1)[1] for line in log_path.read_text().splitlines()
            if line.split("\t", 1)[0] == profile]


def test_a_hung_gate_is_stalled_retried_then_error_and_the_dev_session_waits(
        odd_daemon: Daemon, repo: Path, log_path: Path) -> None:
    daemon = odd_daemon

    async def go() -> tuple[dict[str, Any], list[Any], list[int], str]:
        async with DaemonClient(daemon.url, daemon.token) as client:
            dev = await client.create_session(cwd=str(repo), profile="dev")
            gate_id = await client.start_gate(str(repo), base="HEAD~1", dev_session_id=dev,
                                              agents=["appsec", "qa_performance_security"])
            refused: list[int] = []
            events: list[Any] = []
            stream = client.gate_events(gate_id)
            async for event in stream:
                events.append(event)
                if event.type == "gate_item" and event.data["item"] == "gate_stalled":
                    # while the gate hangs, the dev session takes no prompt (K-2)
                    answer = httpx.post(f"{daemon.url}/session/{dev}/prompt", headers=daemon.headers,
                                        json={"text": "carry on"})
                    refused.append(answer.status_code)
                    assert answer.json()["error"]["gateId"] == gate_id
                    assert answer.json()["error"]["state"] == "awaiting_gate"
                if event.type == "gate_complete":
                    break
            await stream.aclose()
            result = await client.gate(gate_id)
            after = httpx.post(f"{daemon.url}/session/{dev}/prompt", headers=daemon.headers,
                               json={"text": "carry on"})
            await client.delete_session(dev)
            return result, events, refused, str(after.status_code)

    result, events, refused, after = asyncio.run(go())
    assert items_of(events, "appsec") == ["gate_queued", "gate_running", "gate_stalled", "gate_retrying",
                                          "gate_running", "gate_stalled", "gate_error"]
    assert refused == [409, 409] and after == "202"  # the dev session takes prompts again once idle
    appsec = next(a for a in result["agents"] if a["agent"] == "appsec")
    assert (appsec["verdict"], appsec["attempt"], appsec["stalls"]) == ("error", 2, 2)
    assert "HOPLINE_GATE_STALL_SECONDS" in appsec["summary"]
    assert len(prompts(log_path, "appsec")) == 2  # one per attempt, each on a fresh session
    assert next(a for a in result["agents"] if a["agent"] == "qa_performance_security")["verdict"] == "pass"
    assert result["exitCode"] == 2
    # the dev session was awaiting_gate from the first event to the error of the hung gate
    changes = [e for e in events if e.type == "dev_state"]
    assert [(c.data["previous"], c.data["state"]) for c in changes] == [
        ("idle", "awaiting_gate"), ("awaiting_gate", "idle")]
    error_id = next(e.id for e in events if e.type == "gate_item" and e.data["item"] == "gate_error")
    assert changes[1].id > error_id
    pending = {e.data["item"] for e in events if e.type == "gate_item" and e.id < changes[1].id}
    assert {"gate_stalled", "gate_retrying"} <= pending
    check_items(events)
    document = to_sarif(result)
    validate_sarif(document)
    run = next(r for r in document["runs"] if r["tool"]["driver"]["name"] == "hopline-gate/appsec")
    assert run["invocations"][0]["executionSuccessful"] is False and run["results"] == []
    assert worktrees(repo) == [str(repo)]


def test_no_valid_verdict_is_an_error_never_a_pass(odd_daemon: Daemon, repo: Path, log_path: Path) -> None:
    async def go() -> dict[str, Any]:
        async with DaemonClient(odd_daemon.url, odd_daemon.token) as client:
            gate_id = await client.start_gate(str(repo), base="HEAD~1",
                                              agents=["qa_automation", "qa_strategy"])
        return (await follow(odd_daemon, gate_id))[0]

    result = asyncio.run(go())
    verdicts = {a["agent"]: a for a in result["agents"]}
    for agent, why in (("qa_automation", "no JSON object"), ("qa_strategy", "does not match the schema")):
        assert verdicts[agent]["verdict"] == "error" and why in verdicts[agent]["summary"]
        assert (verdicts[agent]["attempt"], verdicts[agent]["verdictAsks"]) == (1, 2)  # asked once more
        asked = prompts(log_path, agent)
        assert len(asked) == 2 and all(a.startswith("hopline gate review · agent " + agent) for a in asked)
    assert result["exitCode"] == 2


def test_a_cancel_ends_the_run_and_removes_its_checkout(odd_daemon: Daemon, repo: Path) -> None:
    daemon = odd_daemon

    async def go() -> tuple[dict[str, Any], int]:
        async with DaemonClient(daemon.url, daemon.token) as client:
            gate_id = await client.start_gate(str(repo), base="HEAD~1", agents=["appsec"])
            stream = client.gate_events(gate_id)
            async for event in stream:
                if event.type == "gate_item" and event.data["item"] == "gate_running":
                    break
            await stream.aclose()
            # one run at a time here (HOPLINE_MAX_GATE_RUNS=1): a second is refused, naming the limit
            second = httpx.post(f"{daemon.url}/gate", headers=daemon.headers,
                                json={"repo": str(repo), "base": "HEAD~1"})
            assert second.status_code == 429
            assert second.json()["error"]["setting"] == "HOPLINE_MAX_GATE_RUNS"
            assert "limit of 1" in second.text
            assert await client.cancel_gate(gate_id) is True
            return await client.gate(gate_id), len((await client.status())["sessions"])

    result, sessions = asyncio.run(go())
    assert result["state"] == "cancelled" and result["exitCode"] == 2 and result["error"] == "cancelled"
    assert worktrees(repo) == [str(repo)] and sessions == 0
    assert not (daemon.data_dir / "gate").exists() or not list((daemon.data_dir / "gate").iterdir())


def test_the_cli_exits_2_on_a_gate_error_and_writes_sarif(odd_daemon: Daemon, repo: Path,
                                                          tmp_path: Path) -> None:
    sarif = tmp_path / "gate.sarif"
    done = subprocess.run([sys.executable, "-m", "hopline", "gate", "--url", odd_daemon.url, "--json",
                           "--sarif", str(sarif), "--agent", "qa_strategy", "--base", "HEAD~1"],
                          cwd=repo, env={**_env(), "HOPLINE_SERVER_TOKEN": odd_daemon.token},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert [a["verdict"] for a in result["agents"]] == ["error"]
    validate_sarif(json.loads(sarif.read_text()))


def test_ended_runs_past_the_kept_count_are_read_back_from_the_journal(odd_daemon: Daemon,
                                                                       repo: Path) -> None:
    async def one(client: DaemonClient) -> str:
        gate_id = await client.start_gate(str(repo), base="HEAD~1", agents=["qa_performance_security"])
        await follow(odd_daemon, gate_id)
        return gate_id

    async def go() -> tuple[list[str], list[str], dict[str, Any], dict[str, Any]]:
        async with DaemonClient(odd_daemon.url, odd_daemon.token) as client:
            ids = [await one(client) for _ in range(3)]
            listed = [g["gateId"] for g in await client.gates()]
            return ids, listed, await client.gate(ids[0]), await client.gate(ids[1])

    ids, listed, oldest, kept = asyncio.run(go())
    # HOPLINE_GATE_RUNS_KEPT=1: when the third started, one ended run stayed in memory, the older left
    assert ids[0] not in listed and ids[1] in listed and ids[2] in listed
    assert (oldest["gateId"], oldest["state"], oldest["exitCode"]) == (ids[0], "done", 0)  # from the journal
    assert [a["verdict"] for a in oldest["agents"]] == [a["verdict"] for a in kept["agents"]] == ["pass"]


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)
