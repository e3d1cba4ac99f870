"""Issue #29, one test per row: a gate that verifies (SPEC T-7). Real `hopline serve`, hopline's agent,
the offline scripted reviewer calling run_command in the real sandbox, real git repositories."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from daemon.support import Daemon, running_daemon

from .conftest import make_repo, run_gate, worktrees

pytestmark = pytest.mark.e2e  # every test here starts real processes (git, daemons, agents, sandboxes)

PYPROJECT = '[tool.pytest.ini_options]\npythonpath = ["src"]\n'
CALC = ("def add(a: int, b: int) -> int:\n    return a + b\n\n\n"
        "def sub(a: int, b: int) -> int:\n    return a - b\n")
TESTS = ("from calc import add, sub\n\n\ndef test_add() -> None:\n    assert add(1, 2) == 3\n\n\n"
         "def test_sub() -> None:\n    assert sub(3, 2) == 1\n")
BASE = {"pyproject.toml": PYPROJECT, "src/calc.py": CALC, "tests/test_calc.py": TESTS}


def by_agent(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {a["agent"]: a for a in result["agents"]}


def test_a_source_file_that_does_not_parse_fails_qa_automation_at_its_line(hopline_gate_daemon: Daemon,
                                                                          tmp_path: Path) -> None:
    broken = CALC.replace("def sub(a: int, b: int) -> int:", "def sub(a: int, b: int) -> int")
    repo, base, head = make_repo(tmp_path / "repo", BASE, {"src/calc.py": broken,
                                                           "tests/test_calc.py": TESTS + "\n# touched\n"})
    result, _ = run_gate(hopline_gate_daemon, repo, base=base, head=head, agents=["qa_automation"])
    assert result["exitCode"] == 1
    qa = by_agent(result)["qa_automation"]
    assert qa["verdict"] == "fail"
    compile_errors = [f for f in qa["findings"] if f["rule"] == "compile-error"]
    assert [(f["file"], f["line"], f["severity"]) for f in compile_errors] == [("src/calc.py", 5, "error")]
    assert "py_compile on 2 changed Python files" in qa["summary"] and "sandbox" in qa["summary"]
    assert result["testCommand"]["source"] == "pytest"


def test_a_broken_add_fails_qa_automation_naming_test_add(hopline_gate_daemon: Daemon,
                                                          tmp_path: Path) -> None:
    repo, base, head = make_repo(tmp_path / "repo", BASE, {"src/calc.py": CALC.replace("a + b", "a - b")})
    result, _ = run_gate(hopline_gate_daemon, repo, base=base, head=head, agents=["qa_automation"])
    assert result["exitCode"] == 1, by_agent(result)["qa_automation"]["summary"]
    qa = by_agent(result)["qa_automation"]
    failed = [f for f in qa["findings"] if f["rule"] == "test-failed"]
    assert [(f["file"], f["line"], f["severity"]) for f in failed] == [("tests/test_calc.py", 5, "error")]
    assert failed[0]["message"].startswith("tests/test_calc.py::test_add fails")
    # what ran and with what result: the head failed, so the base ran too and passed
    assert "at head: 1 failed, 1 passed" in qa["summary"] and "at base: 2 passed" in qa["summary"]


def test_a_failure_the_base_has_too_is_a_warning_not_a_fail(hopline_gate_daemon: Daemon,
                                                            tmp_path: Path) -> None:
    failing = {**BASE, "tests/test_calc.py": TESTS + "\n\ndef test_old() -> None:\n    assert False\n"}
    repo, base, head = make_repo(tmp_path / "repo", failing, {"src/calc.py": CALC + "\n\nZERO = 0\n",
                                                              "tests/test_zero.py": "def test_zero():\n    "
                                                                                    "pass\n"})
    result, _ = run_gate(hopline_gate_daemon, repo, base=base, head=head, agents=["qa_automation"])
    qa = by_agent(result)["qa_automation"]
    assert (result["exitCode"], qa["verdict"]) == (0, "pass")
    [finding] = qa["findings"]
    assert (finding["rule"], finding["severity"]) == ("test-failed", "warning")
    assert "fails at the base too" in finding["message"]


def test_pr_code_writes_nothing_outside_its_checkout_and_reaches_no_network(hopline_gate_daemon: Daemon,
                                                                            tmp_path: Path) -> None:
    canary = tmp_path / "written-by-the-pr"
    conftest = ("import pathlib, socket\n"
                f"pathlib.Path({str(canary)!r}).write_text('escaped')\n")
    test = ("import socket\n\n\ndef test_network() -> None:\n"
            "    try:\n        socket.create_connection(('192.0.2.1', 80), 1)\n"
            "    except OSError:\n        return\n    raise AssertionError('the network was reachable')\n")
    repo, base, head = make_repo(tmp_path / "repo", BASE, {"tests/conftest.py": conftest,
                                                           "tests/test_net.py": test})
    result, _ = run_gate(hopline_gate_daemon, repo, base=base, head=head, agents=["qa_automation"])
    assert not canary.exists()
    qa = by_agent(result)["qa_automation"]
    assert result["sandbox"]["kind"] in ("bwrap", "unshare")
    # the conftest's write fails (read-only file system) at the head: no test runs there, a fail
    [finding] = [f for f in qa["findings"] if f["rule"] == "tests-did-not-run"]
    # the cause is the conftest's own error: the path it writes to is not in the sandbox
    assert qa["verdict"] == "fail" and "FileNotFoundError" in finding["message"], finding


def test_fix_never_passes_a_head_that_does_not_compile(hopline_gate_daemon: Daemon, tmp_path: Path) -> None:
    planted = CALC + "\n\ndef debug_eval() -> object:\n    return eval(input())\n"
    repo, base, head = make_repo(tmp_path / "repo", BASE, {"src/calc.py": planted,
                                                           "tests/test_calc.py": TESTS + "\n# touched\n"})
    result, events = run_gate(hopline_gate_daemon, repo, base=base, head=head, fix=True,
                              agents=["qa_automation", "qa_performance_security"])
    assert result["exitCode"] == 1 and result["roundsRun"] == 1  # no second round on a refused fix
    [turn] = result["devTurns"]
    assert "commit" not in turn and turn["verification"]["ok"] is False
    assert turn["verification"]["compileErrors"][0]["file"] == "src/calc.py"
    assert "does not build" in turn["reason"]
    assert result["devState"] == "awaiting_gate"
    assert [c["event"] for c in result["devStates"]][-1] == "fix_failed"
    assert any(e.type == "gate_fix" and e.data["verification"]["ok"] is False for e in events)
    assert result["finalHead"] == head
    assert worktrees(repo) == [str(repo)]


def test_a_symlink_out_of_the_repository_is_one_finding_in_few_iterations(hopline_gate_daemon: Daemon,
                                                                          tmp_path: Path) -> None:
    repo, base, head = make_repo(tmp_path / "repo", BASE, {"README.md": "see the link\n"})
    os.symlink("/etc/passwd", repo / "passwd")
    from hopline.scripted.sample_pull_request import git

    git(repo, "add", "passwd")
    git(repo, "commit", "--quiet", "-m", "link")
    head = git(repo, "rev-parse", "HEAD")
    result, _ = run_gate(hopline_gate_daemon, repo, base=base, head=head)
    agents = by_agent(result)
    assert all(a["verdict"] in ("pass", "fail") for a in agents.values())
    links = [f for f in agents["appsec"]["findings"] if f["rule"] == "symlink-escape"]
    assert [(f["file"], f["severity"]) for f in links] == [("passwd", "error")]
    assert all(a["iterations"] < 10 for a in agents.values())  # read once, never retried in a loop


def test_an_empty_range_is_nothing_to_review_and_starts_no_agent(hopline_gate_daemon: Daemon,
                                                                 tmp_path: Path) -> None:
    repo, _, head = make_repo(tmp_path / "repo", BASE, {"README.md": "x\n"})
    result, events = run_gate(hopline_gate_daemon, repo, base=head, head=head)
    assert (result["state"], result["exitCode"], result["agents"]) == ("done", 0, [])
    assert result["nothingToReview"].startswith("nothing to review")
    assert not any(e.type in ("gate_item", "gate_verdict") for e in events)
    assert worktrees(repo) == [str(repo)]


def test_a_typing_only_refactor_is_not_an_untested_change(hopline_gate_daemon: Daemon,
                                                          tmp_path: Path) -> None:
    plain = 'def add(a, b=None):\n    """Add."""\n    return a + (b or 0)\n'
    typed = ("from __future__ import annotations\n\nimport typing as t\n\n\n"
             "def add(a: int, b: t.Optional[int] = None) -> int:\n    # the sum\n    return a + (b or 0)\n")
    repo, base, head = make_repo(tmp_path / "repo", {"src/m.py": plain, "src/n.py": "X = 1\n"},
                                 {"src/m.py": typed, "src/n.py": "X = 2\n"})
    result, _ = run_gate(hopline_gate_daemon, repo, base=base, head=head, agents=["qa_strategy"])
    findings = by_agent(result)["qa_strategy"]["findings"]
    untested = [f["file"] for f in findings if f["rule"] == "untested-change"]
    assert untested == ["src/n.py"]  # the typing-only file is exempt, the behaviour change is not
    assert "keep their AST" in by_agent(result)["qa_strategy"]["summary"]


def test_with_no_sandbox_the_gate_refuses_to_run_pr_code_unless_allowed(tmp_path: Path) -> None:
    tools = tmp_path / "bin"  # a PATH with git but neither bwrap nor unshare
    tools.mkdir()
    for name in ("git", "sh"):
        found = shutil.which(name)
        assert found is not None
        (tools / name).symlink_to(found)
    env = {"PATH": str(tools)}
    repo, base, head = make_repo(tmp_path / "repo", BASE, {"README.md": "x\n"})
    (tmp_path / "d").mkdir()
    with running_daemon(tmp_path / "d", agent_cmd=None, env=env) as daemon:
        refused, _ = run_gate(daemon, repo, base=base, head=head, agents=["appsec"])
        allowed, _ = run_gate(daemon, repo, base=base, head=head, agents=["qa_automation"],
                              allow_unsandboxed=True)
    assert (refused["state"], refused["exitCode"]) == ("failed", 2)
    assert "only in a sandbox" in refused["error"] and "--allow-unsandboxed" in refused["error"]
    assert allowed["exitCode"] == 0 and allowed["sandbox"]["kind"] == "none"
    assert sys.executable  # the agent ran with the daemon's interpreter, found without PATH


def test_gate_vocabulary_is_served_once(hopline_gate_daemon: Daemon) -> None:
    from hopline.vocabulary import GATE_AGENTS, GATE_EVENT_TYPES

    response = httpx.get(hopline_gate_daemon.url + "/gate/vocabulary", headers=hopline_gate_daemon.headers,
                         timeout=30)
    assert response.status_code == 200
    served = response.json()
    assert served["agents"] == list(GATE_AGENTS)
    assert sorted(served["events"].values()) == sorted(GATE_EVENT_TYPES)
    assert served["events"]["GATE_ROUND"] == "gate_round"
