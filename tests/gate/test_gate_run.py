"""Gate runs on a real `hopline serve` with hopline's agent and the offline scripted model: the four
verdicts on a diff with one planted issue per gate domain, a clean diff, the dev states with and
without --fix, SARIF, the pending types the gate emits, compaction, and no checkout left behind."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from daemon.support import Daemon
from hopline.client import DaemonClient
from hopline.gate.sarif import to_sarif
from hopline.gate.states import DEV_PENDING_TYPES, TERMINAL_TYPES
from hopline.scripted.sample_pull_request import make_sample_pull_request

from .conftest import follow, items_of, make_repo, run_gate, validate_sarif, worktrees

PYTEST_SRC = '[tool.pytest.ini_options]\npythonpath = ["src"]\n'
pytestmark = pytest.mark.e2e  # every test here starts real processes (git, daemons, agents)


def check_items(events: list[Any]) -> None:
    """Every item type a run emitted is terminal or in DEV_PENDING_TYPES (each run's test calls it;
    compaction is seen below, stalls and retries in test_stall.py)."""
    types = {e.data["item"] for e in events if e.type == "gate_item"}
    assert types - {t.value for t in TERMINAL_TYPES} <= {t.value for t in DEV_PENDING_TYPES}


def no_checkout_left(daemon: Daemon, repo: Path) -> None:
    assert worktrees(repo) == [str(repo)]
    work = daemon.data_dir / "gate"
    assert not work.exists() or list(work.iterdir()) == []


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """The sample pull request with small logs, one of them failing: one issue per gate domain."""
    return make_sample_pull_request(tmp_path_factory.mktemp("planted") / "repo", log_bytes=8 * 1024, logs=2,
                                    failing_log=True)


def test_the_four_gates_each_find_the_issue_of_their_domain(hopline_gate_daemon: Daemon,
                                                            planted: tuple[Path, str, str]) -> None:
    repo, base, head = planted
    result, events = run_gate(hopline_gate_daemon, repo)  # base: the merge base with main, head: HEAD
    assert (result["state"], result["exitCode"], result["base"], result["baseFrom"], result["head"]) == (
        "done", 1, base, "main", head)
    rules = {a["agent"]: sorted({f["rule"] for f in a["findings"] if f["severity"] == "error"})
             for a in result["agents"]}
    assert rules == {
        "qa_automation": ["test-failure"],
        "qa_performance_security": ["ruff/S307"],  # eval: ruff reads Python
        "qa_strategy": ["untested-change"],
        "appsec": ["detect-secrets/AWSKeyDetector", "detect-secrets/KeywordDetector", "ruff/S602"],
    }
    assert {a["agent"]: a["verdict"] for a in result["agents"]} == dict.fromkeys(rules, "fail")
    where = {(f["rule"], f["file"], f["line"]) for a in result["agents"] for f in a["findings"]}
    assert ("ruff/S307", "src/sample/cache.py", 12) in where
    assert ("ruff/S602", "src/sample/cache.py", 13) in where
    assert ("todo-added", "src/sample/cache.py", 10) in where
    assert ("detect-secrets/AWSKeyDetector", "src/sample/settings.py", 3) in where
    assert ("detect-secrets/KeywordDetector", "src/sample/settings.py", 4) in where
    for agent in result["agents"]:
        assert agent["http413s"] == 0
        assert 0 < agent["maxBodyBytes"] <= agent["ceilingBytes"] == 8 * 1024 * 1024
        assert agent["attempt"] == 1 and agent["item"] == "gate_failed" and agent["iterations"] >= 3
        assert items_of(events, agent["agent"])[:2] == ["gate_queued", "gate_running"]
    assert "devStates" not in result  # no dev session attached
    check_items(events)
    no_checkout_left(hopline_gate_daemon, repo)
    document = to_sarif(result)
    validate_sarif(document)
    assert [run["tool"]["driver"]["name"] for run in document["runs"]] == [
        f"hopline-gate/{a}" for a in ("qa_automation", "qa_performance_security", "qa_strategy", "appsec")]
    results = [r for run in document["runs"] for r in run["results"]]
    assert len(results) == sum(len(a["findings"]) for a in result["agents"])
    assert {r["level"] for r in results} == {"error", "warning"}
    assert all(not r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"].startswith("/")
               for r in results)


def test_a_clean_change_passes_every_gate(hopline_gate_daemon: Daemon, tmp_path: Path) -> None:
    add = "def add(a: int, b: int) -> int:\n    return a + b\n"
    test_add = "\n\ndef test_add() -> None:\n    assert add(1, 2) == 3\n"
    repo, base, head = make_repo(tmp_path / "clean", {
        "pyproject.toml": PYTEST_SRC, "src/calc.py": add,
        "tests/test_calc.py": "from calc import add\n" + test_add},
        {"src/calc.py": add + "\n\ndef sub(a: int, b: int) -> int:\n    return a - b\n",
         "tests/test_calc.py": "from calc import add, sub\n" + test_add
                               + "\n\ndef test_sub() -> None:\n    assert sub(3, 2) == 1\n"})
    result, events = run_gate(hopline_gate_daemon, repo, base=base, head=head)
    assert result["exitCode"] == 0
    assert [(a["verdict"], a["findings"]) for a in result["agents"]] == [("pass", [])] * 4
    check_items(events)
    # A gate run's stream is journaled beside the sessions, and no session route serves it.
    gate_id = result["gateId"]
    for method, path in [("GET", f"/session/{gate_id}/events"), ("GET", f"/session/{gate_id}/transcript"),
                         ("POST", f"/session/{gate_id}/prompt")]:
        response = httpx.request(method, hopline_gate_daemon.url + path, headers=hopline_gate_daemon.headers,
                                 json={"text": "x"} if method == "POST" else None, timeout=30)
        assert response.status_code == 404, (path, response.text)
    validate_sarif(to_sarif(result))
    no_checkout_left(hopline_gate_daemon, repo)


def test_an_attached_dev_session_waits_then_returns_to_idle(hopline_gate_daemon: Daemon,
                                                            planted: tuple[Path, str, str]) -> None:
    repo, base, head = planted
    daemon = hopline_gate_daemon

    async def go() -> tuple[str, dict[str, Any], list[Any], list[Any], dict[str, Any]]:
        async with DaemonClient(daemon.url, daemon.token) as client:
            dev = await client.create_session(cwd=str(repo), profile="dev", permission_mode="auto")
            gate_id = await client.start_gate(str(repo), base=base, head=head, dev_session_id=dev,
                                              agents=["appsec"])
            result, events = await follow(daemon, gate_id)
            journaled = []
            stream = client.events(dev, last_event_id=0)
            async for event in stream:
                if event.type == "dev_state":
                    journaled.append(event.data)
                if len(journaled) == 2:
                    break
            await stream.aclose()
            status = await client.status()
            await client.delete_session(dev)
            return dev, result, events, journaled, status

    dev, result, events, journaled, status = asyncio.run(go())
    assert [(c["previous"], c["state"]) for c in result["devStates"]] == [
        ("idle", "awaiting_gate"), ("awaiting_gate", "idle")]
    # every state change is journaled, on the gate's stream and on the dev session's own
    on_gate = [e.data for e in events if e.type == "dev_state"]
    assert [c["state"] for c in on_gate] == [c["state"] for c in journaled] == ["awaiting_gate", "idle"]
    assert journaled[0]["gateId"] == result["gateId"]
    # it left awaiting_gate after the verdict, not before
    ids = {e.type: e.id for e in events if e.type in ("gate_verdict",)} | {
        "idle": next(e.id for e in events if e.type == "dev_state" and e.data["state"] == "idle")}
    assert ids["gate_verdict"] < ids["idle"]
    row = next(s for s in status["sessions"] if s["sessionId"] == dev)
    assert row["devState"] == "idle"
    assert any(g["gateId"] == result["gateId"] and g["devState"] == "idle" for g in status["gates"])


def test_fix_hands_the_findings_to_the_dev_agent_and_gates_again(hopline_gate_daemon: Daemon,
                                                                 tmp_path: Path) -> None:
    repo, _, head = make_sample_pull_request(tmp_path / "fix", log_bytes=8 * 1024, logs=1)
    result, events = run_gate(hopline_gate_daemon, repo, fix=True)
    assert [(c["previous"], c["state"]) for c in result["devStates"]] == [
        ("idle", "awaiting_gate"), ("awaiting_gate", "working"), ("working", "awaiting_gate"),
        ("awaiting_gate", "idle")]
    first = {a["agent"]: a["verdict"] for a in result["history"][0]["agents"]}
    assert first == {"qa_automation": "pass", "qa_performance_security": "fail", "qa_strategy": "fail",
                     "appsec": "fail"}
    fix = result["devTurns"][0]
    assert fix["commit"] == result["finalHead"] != head and result["roundsRun"] == 2
    assert [(a["agent"], a["verdict"]) for a in result["agents"]] == [
        ("qa_automation", "pass"), ("qa_performance_security", "pass"), ("qa_strategy", "pass"),
        ("appsec", "pass")]
    assert result["exitCode"] == 0
    check_items(events)
    no_checkout_left(hopline_gate_daemon, repo)
    # the dev session it made is gone with the checkout; the fix commit stays, with what it changed
    status = httpx.get(hopline_gate_daemon.url + "/daemon/status", headers=hopline_gate_daemon.headers).json()
    assert result["devSessionId"] not in {s["sessionId"] for s in status["sessions"]}
    from hopline.scripted.sample_pull_request import git

    changed = git(repo, "diff", "--name-only", head, fix["commit"]).splitlines()
    assert changed == ["src/sample/cache.py", "src/sample/settings.py", "tests/test_cache_gate.py",
                       "tests/test_settings_gate.py"]
    assert "eval(" not in git(repo, "show", f"{fix['commit']}:src/sample/cache.py")


def test_large_outputs_compact_within_the_ceiling_with_no_413(hopline_gate_daemon: Daemon,
                                                              tmp_path: Path) -> None:
    repo, _, _ = make_sample_pull_request(tmp_path / "large", logs=2)
    result, events = run_gate(hopline_gate_daemon, repo, agents=["qa_automation"],
                              scripted={"iterations": 12, "toolsPerIteration": 3})
    agent = result["agents"][0]
    assert agent["verdict"] == "pass" and agent["compactions"] >= 1 and agent["http413s"] == 0
    assert agent["sidecars"] > 0 and agent["maxBodyBytes"] <= agent["ceilingBytes"]
    assert "gate_compacting" in items_of(events, "qa_automation")
    check_items(events)


def test_bad_gate_requests_get_a_4xx_naming_what(hopline_gate_daemon: Daemon, tmp_path: Path,
                                                 planted: tuple[Path, str, str]) -> None:
    daemon = hopline_gate_daemon
    repo = str(planted[0])
    plain = tmp_path / "not-a-repo"
    plain.mkdir()
    from hopline.budget import Budget

    most = Budget.defaults().gate_max_rounds
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"repo": "relative/path"}, 422, "absolute"),
        ({"repo": str(plain)}, 422, "not inside a git work tree"),
        ({"repo": repo, "base": "--output=/tmp/x"}, 422, "not a revision"),
        ({"repo": repo, "base": "no-such-branch"}, 422, "not a commit"),
        ({"repo": repo, "rounds": 0}, 400, "HOPLINE_GATE_MAX_ROUNDS"),
        ({"repo": repo, "rounds": most + 1}, 400, f"outside 1..{most}"),
        ({"repo": repo, "fix": True, "devSessionId": "x"}, 400, "give one of them"),
        ({"repo": repo, "devSessionId": "nope"}, 422, "names no session"),
        ({"repo": repo, "agents": ["appsec", "appsec"]}, 400, "twice"),
        ({"repo": repo, "agents": ["reviewer"]}, 422, ""),
        ({"repo": repo, "scripted": {"iterations": 10**9}}, 400, "HOPLINE_SCRIPTED_MAX_ITERATIONS"),
        ({"repo": repo, "colour": "blue"}, 422, "colour"),
    ]
    with httpx.Client(base_url=daemon.url, headers=daemon.headers, timeout=30) as http:
        for body, status, text in cases:
            answer = http.post("/gate", json=body)
            assert answer.status_code == status, (body, answer.text)
            error = answer.json()["error"]
            assert error["hop"] == "daemon.gate" and text in answer.text, (body, answer.text)
        surrogate = http.post("/gate", content=b'{"repo": "\\ud800"}',
                              headers={"Content-Type": "application/json"})
        assert surrogate.status_code == 400 and surrogate.json()["error"]["hop"] == "daemon.gate"
        assert http.get("/gate/g_0123456789abcdef01234567/events", params={"maxQueued": 1}).json()[
            "error"]["hop"] == "daemon.gate"  # a query parameter out of its range
        assert http.get("/gate/g_0123456789abcdef01234567").status_code == 404
        assert http.get("/gate/not-an-id/events").status_code == 404
        assert http.post("/gate/g_0123456789abcdef01234567/cancel").status_code == 404
        at_limit = http.post("/gate", json={"repo": repo, "rounds": most, "fix": True})
        assert at_limit.status_code == 202  # the most rounds a run may have
        gate_id = at_limit.json()["gateId"]
        cancelled = http.post(f"/gate/{gate_id}/cancel")
        assert cancelled.status_code == 200, cancelled.text
        result = http.get(f"/gate/{gate_id}").json()
    # a cancelled run ends with no verdict that counts, its sessions and its checkout gone
    assert (result["state"], result["exitCode"], result["rounds"]) == ("cancelled", 2, most)
    no_checkout_left(daemon, Path(repo))
    status = httpx.get(daemon.url + "/daemon/status", headers=daemon.headers).json()
    assert status["sessions"] == []
