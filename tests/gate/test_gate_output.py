"""The gate's output for people and for CI (issue #29, item 6): plain untruncated finding lines off a
terminal, each round's own states live, every round and fix in the summary, SARIF for code scanning."""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from daemon.support import Daemon
from hopline.cli.gate import GateView, finding_line, print_result
from hopline.client.events import Event
from hopline.gate.sarif import FINGERPRINT_KEY, to_sarif
from hopline.harness.rules import rule_of
from hopline.scripted.sample_pull_request import make_sample_pull_request

from .conftest import make_repo, validate_sarif

HOPLINE = [sys.executable, "-m", "hopline"]


def cli(args: list[str], cwd: Path, daemon: Daemon) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "80",
           "HOPLINE_SERVER_TOKEN": daemon.token}  # a CI log: no TTY, 80 columns
    return subprocess.run([*HOPLINE, "gate", "--url", daemon.url, *args], cwd=cwd, env=env,
                          capture_output=True,
                          text=True, timeout=600)


@pytest.mark.e2e
def test_a_ci_log_has_plain_whole_finding_lines_naming_agent_and_rule(hopline_gate_daemon: Daemon,
                                                                      tmp_path: Path) -> None:
    repo, _, _ = make_sample_pull_request(tmp_path / "pr", log_bytes=4096, logs=1, failing_log=True)
    done = cli(["--repo", str(repo), "--base", "main", "--head", "feature"], tmp_path, hopline_gate_daemon)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert any(line.startswith("sandbox: bwrap") or line.startswith("sandbox: unshare") for line in lines)
    assert ("  error src/sample/settings.py:3 appsec/detect-secrets/AWSKeyDetector: AWS Access Key in the "
            "change: it is public to every reader of the repository; revoke it, and read it from the "
            "environment or a secret store") in lines
    assert any(re.fullmatch(r"  error src/sample/cache\.py:12 qa_performance_security/ruff/S307: .+", line)
               for line in lines)
    # the sample's tests are unittest's (they run with any Python): detected, run, and said
    assert any(line.startswith("qa_automation: fail, ") and "ran `python -m unittest discover -v" in line
               and "Ran 4 tests" in line for line in lines)
    assert "…" not in done.stdout and "\x1b[" not in done.stdout  # nothing cut, no terminal codes


@pytest.mark.e2e
def test_the_cli_says_an_empty_range_has_nothing_to_review(hopline_gate_daemon: Daemon,
                                                           tmp_path: Path) -> None:
    repo, _, head = make_repo(tmp_path / "repo", {"a.py": "A = 1\n"}, {"a.py": "A = 2\n"})
    done = cli(["--repo", str(repo), "--base", head, "--head", head], tmp_path, hopline_gate_daemon)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "nothing to review: base and head hold the same tree" in done.stdout


def _event(type_: str, **data: object) -> Event:
    return Event(1, type_, dict(data), 10)


def test_each_round_s_live_table_shows_its_own_states() -> None:
    view = GateView()
    view.apply(_event("gate_round", round=1, head="a" * 40))
    view.apply(_event("gate_verdict", agent="appsec", verdict="fail", findings=[], iterations=3,
                      compactions=0))
    assert view.rows["appsec"]["verdict"] == "fail"
    view.apply(_event("gate_round", round=2, head="b" * 40))
    view.apply(_event("gate_item", agent="appsec", item="gate_running"))
    assert view.rows == {"appsec": {"agent": "appsec", "item": "gate_running"}}  # no verdict of round 1


def _result() -> dict[str, object]:
    finding = {"severity": "error", "file": "src/k.py", "line": 3, "rule": "detect-secrets/KeywordDetector",
               "message": "Secret Keyword in the change: read it from the environment or a secret store",
               "helpUri": "https://github.com/Yelp/detect-secrets/blob/master/detect_secrets/plugins/keyword.py"}
    agent = {"agent": "appsec", "verdict": "fail", "summary": "read 1 changed files", "findings": [finding],
             "iterations": 3, "compactions": 0, "http413s": 0, "attempt": 1}
    return {"gateId": "g_" + "0" * 24, "base": "a" * 40, "head": "b" * 40, "finalHead": "c" * 40,
            "roundsRun": 2,
            "exitCode": 0, "agents": [{**agent, "verdict": "pass", "findings": []}],
            "history": [{"round": 1, "head": "b" * 40, "agents": [agent]}],
            "devTurns": [{"round": 1, "commit": "c" * 40, "reason": "the fix builds and every test that "
                                                                    "passed at "
                          "the base still passes", "verification": {"headTests": {"summary": "3 passed"}}}]}


def test_the_summary_shows_every_round_and_the_verified_fix_commit() -> None:
    from rich.console import Console

    console = Console(width=80, force_terminal=False, record=True)
    print_result(console, _result())
    text = console.export_text()
    assert "round 1 (head bbbbbbbbbbbb):" in text and "round 2 (head cccccccccccc):" in text
    assert ("  error src/k.py:3 appsec/detect-secrets/KeywordDetector: Secret Keyword in the change: read it "
            "from the environment or a secret store") in text.splitlines()
    assert f"dev fix after round 1: commit {'c' * 40}" in text and "verified: the fix builds" in text
    assert "tests at the fix's head: 3 passed" in text


def test_sarif_fingerprints_hold_over_line_moves_and_security_rules_carry_a_severity() -> None:
    result = _result()
    result["agents"] = result["history"][0]["agents"]  # type: ignore[index]
    document = to_sarif(result)
    validate_sarif(document)
    [run] = document["runs"]
    assert run["automationDetails"]["id"] == f"hopline-gate/appsec/{result['gateId']}"
    [rule] = run["tool"]["driver"]["rules"]
    assert rule["properties"]["security-severity"] == "8.5"
    assert rule["helpUri"] == result["history"][0]["agents"][0]["findings"][0]["helpUri"]  # type: ignore[index]
    assert rule["fullDescription"]["text"].startswith("detect-secrets/KeywordDetector: Secret Keyword in the "
                                                      "change")
    print_before = run["results"][0]["partialFingerprints"][FINGERPRINT_KEY]
    moved = copy.deepcopy(result)
    moved["agents"][0]["findings"][0]["line"] = 40  # type: ignore[index]
    after = to_sarif(moved)["runs"][0]["results"][0]
    assert after["partialFingerprints"][FINGERPRINT_KEY] == print_before
    assert after["locations"][0]["physicalLocation"]["region"]["startLine"] == 40
    other = copy.deepcopy(result)
    other["agents"][0]["findings"][0]["file"] = "src/other.py"  # type: ignore[index]
    assert to_sarif(other)["runs"][0]["results"][0]["partialFingerprints"][FINGERPRINT_KEY] != print_before
    lineless = copy.deepcopy(result)  # a file-level finding: still a region (line 1), its rule documented
    lineless["agents"][0]["findings"] = [{"severity": "error", "file": "src/k.py", "line": None,  # type: ignore[index]
                                          "rule": "untested-change", "message": "no test changes"}]
    run = to_sarif(lineless)["runs"][0]
    validate_sarif({"version": "2.1.0", "runs": [run]})
    assert run["results"][0]["locations"][0]["physicalLocation"]["region"] == {"startLine": 1}
    assert run["tool"]["driver"]["rules"][0]["helpUri"].startswith("https://")
    described = run["tool"]["driver"]["rules"][0]["fullDescription"]["text"]
    assert described == rule_of("untested-change").description
    assert finding_line("appsec", {"severity": "note", "file": "a", "line": None, "rule": "r",
                                   "message": "two\nlines"}) == "note a appsec/r: two lines"
