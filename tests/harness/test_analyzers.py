"""The gate's analyzers as the offline reviewer runs them: their commands in the policy, their JSON
reports read piece by piece, the one severity table, and the reviewer driven over the real tools (a
workspace on a real git repository, ruff and detect-secrets in the sandbox), without a daemon."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hopline.budget import Budget
from hopline.errors import ToolError
from hopline.gate.prompts import gate_prompt
from hopline.gate.verdict import parse_verdict
from hopline.harness.analyzers import BY_NAME, RecordScanner, files_for, skip_reason
from hopline.harness.rules import one_per_concern, rule_of, severity_of
from hopline.harness.tools.policy import check_review_command
from hopline.harness.tools.reviewing import ReviewRange
from hopline.harness.tools.workspace import Workspace, added_lines_listing, whole_characters
from hopline.scripted import review_plan
from hopline.vocabulary import MESSAGE_META

SOURCE = ("import subprocess\n\n\ndef run(cmd: str) -> None:\n    # never eval() what a user typed\n"
          "    subprocess.run(cmd, shell=True)\n    print(undefined_name)\n")


def _git(root: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t.invalid", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t.invalid", "HOME": str(root), "PATH": "/usr/bin:/bin"}
    return subprocess.run(["git", *args], cwd=root, env=env, check=True, capture_output=True,
                          text=True).stdout.strip()


def _repo(root: Path, base: dict[str, str], head: dict[str, str]) -> tuple[str, str]:
    root.mkdir()
    _git(root, "init", "-q", "--initial-branch=main")
    for files in (base, head):
        for path, text in files.items():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(text)
        _git(root, "add", "--all")
        _git(root, "commit", "-q", "--allow-empty", "-m", "c")
    return _git(root, "rev-parse", "HEAD~1"), _git(root, "rev-parse", "HEAD")


def test_a_report_read_in_pieces_of_any_size_gives_its_records(tmp_path: Path) -> None:
    name = 'a"{[\\b.py'  # quotes, brackets and a backslash inside the report's strings
    (tmp_path / name).write_text("import os\n" + SOURCE)
    report = subprocess.run([sys.executable, "-m", "ruff", "check", "--isolated", "--no-cache", "--exit-zero",
                             "--select", "S,F", "--output-format", "json", name], cwd=tmp_path,
                            capture_output=True, text=True, check=True).stdout
    whole = json.loads(report)
    assert len(whole) >= 3 and any(r.get("fix") for r in whole)  # nested objects inside a record
    rng = random.Random(7)
    for _ in range(50):
        found: list[dict[str, Any]] = []
        state: dict[str, Any] | None = None
        at = 0
        while at < len(report):
            size = rng.randint(1, 64)
            scanner = RecordScanner(1, state)
            found += scanner.feed(report[at:at + size])
            state = json.loads(json.dumps(scanner.state()))  # what the notes keep between pages
            at += size
        assert found == whole


def test_the_severity_table_grades_every_rule_once() -> None:
    assert severity_of("ruff/S105", tests=False) == "error"
    assert severity_of("ruff/S105", tests=True) == "warning"  # a credential in a test fixture
    assert severity_of("detect-secrets/GitHubTokenDetector", tests=True) == "warning"
    assert severity_of("detect-secrets/Base64HighEntropyString", tests=False) == "warning"
    assert severity_of("ruff/S602", tests=True) == "error"  # only credentials are lowered in tests
    assert severity_of("bandit/B602", tests=False, said="LOW") == "warning"
    # bandit's check of ruff's S108 (a hard-coded temporary path) is lowered in tests as ruff's is
    assert severity_of("bandit/B108", tests=True, said="MEDIUM") == "note"
    assert severity_of("ruff/S108", tests=True) == "note"
    assert severity_of("bandit/B108", tests=False, said="MEDIUM") == "error"
    assert severity_of("bandit/B602", tests=True, said="HIGH") == "error"
    assert severity_of("semgrep/x.y", tests=False, said="INFO") == "note"
    assert rule_of("ruff/S307").agent == rule_of("bandit/B307").agent == "qa_performance_security"
    assert rule_of("ruff/S602").agent == rule_of("bandit/B602").agent == "appsec"
    assert (rule_of("ruff/F401").severity, rule_of("ruff/F821").severity) == ("warning", "error")
    assert rule_of("no-such/rule").severity == "warning"
    merged = one_per_concern([
        {"severity": "error", "file": "a.py", "line": 3, "rule": "ruff/S105", "message": "password"},
        {"severity": "error", "file": "a.py", "line": 3, "rule": "detect-secrets/GitHubTokenDetector",
         "message": "GitHub Token"},
        {"severity": "warning", "file": "a.py", "line": 3, "rule": "detect-secrets/Base64HighEntropyString",
         "message": "entropy"},
        {"severity": "error", "file": "a.py", "line": 4, "rule": "bandit/B602", "message": "shell"},
        {"severity": "error", "file": "a.py", "line": 4, "rule": "ruff/S602", "message": "shell=True"},
        {"severity": "error", "file": "a.py", "line": 5, "rule": "ruff/S602", "message": "other line"}])
    assert [(f["line"], f["rule"], f["message"]) for f in merged] == [
        (3, "detect-secrets/GitHubTokenDetector",
         "GitHub Token (also ruff/S105, detect-secrets/Base64HighEntropyString)"),
        (4, "ruff/S602", "shell=True (also bandit/B602)"), (5, "ruff/S602", "other line")]


def test_detect_secrets_skips_lock_vendored_and_minified_files_and_says_so() -> None:
    changed = [("uv.lock", 3), ("vendor/lib/x.py", 2), ("web/app.min.js", 1), ("conf/app.yaml", 4),
               ("a.py", 2), ("gone.py", 0), ("link.py", 1), ("$(x).txt", 1)]
    scan, skipped = files_for(BY_NAME["detect-secrets"], changed, ["link.py"])
    assert scan == ["conf/app.yaml", "a.py"]
    assert skipped == {"uv.lock": "a lock file", "vendor/lib/x.py": "vendored", "web/app.min.js": "minified",
                       "$(x).txt": "a name the command policy refuses"}
    assert files_for(BY_NAME["ruff"], changed, ["link.py"])[0] == ["vendor/lib/x.py", "a.py"]
    assert skip_reason("src/locks.py") is None


def test_the_policy_runs_the_analyzers_and_nothing_that_writes_or_loads(tmp_path: Path) -> None:
    for analyzer in BY_NAME.values():
        [command] = analyzer.commands(["a.py"])
        assert check_review_command(command, tmp_path)[:3] == ["python", "-m", analyzer.module]
    for refused in ("python -m ruff check --output-file out.json a.py", "python -m ruff check --fix a.py",
                    "python -m detect_secrets scan --baseline .secrets.baseline",
                    "python -m detect_secrets scan -p plugin.py a.py", "python -m bandit -o out.json a.py",
                    "python -m bandit -c conf.yaml a.py", "python -m detect_secrets audit x",
                    "python -m semgrep scan --config ../rules.yml a.py"):
        with pytest.raises(ToolError):
            check_review_command(refused, tmp_path)


def test_added_lines_are_listed_as_ranges_and_pages_end_on_whole_characters(tmp_path: Path) -> None:
    base, head = _repo(tmp_path / "r", {"a.py": "1\n2\n3\n4\n5\n", "b.txt": "x\n"},
                       {"a.py": "1\nTWO\n3\n3.5\n3.6\n4\n", "b.txt": "x\n", "c/ü.md": "é€😀\n" * 400})
    workspace = Workspace(tmp_path / "r", Budget.defaults(), review=ReviewRange(base, head))
    try:
        listing = workspace.git_diff({"added": True})
        assert listing.splitlines()[1:] == ["a.py\t2,4-5", "c/ü.md\t1-400"]
        assert workspace.git_diff({"stat": True}).splitlines()[-1] == "400\t0\tc/ü.md"
        assert added_lines_listing("") == listing.splitlines()[0]
        text, offset = "", 0
        while True:  # 100-byte pages through a file of 2-, 3- and 4-byte characters
            page = workspace.read_file({"path": "c/ü.md", "offset": offset, "limit": 100})
            read = page.meta["hopline.read"] if page.meta else {}
            text += page.output.split("\n[file continues")[0]
            offset += read["bytes"]
            if offset >= read["fileBytes"]:
                break
        assert text == "é€😀\n" * 400 and "\ufffd" not in text
    finally:
        workspace.close()
    assert whole_characters("é".encode()[:1]) == b"" and whole_characters(b"ab") == b"ab"


def _drive(root: Path, base: str, head: str, agent: str, budget: Budget) -> dict[str, Any]:
    """The offline reviewer over the real tools, in process: its verdict."""
    workspace = Workspace(root, budget, review=ReviewRange(base, head))
    messages: list[dict[str, Any]] = [{"role": "user", "content": gate_prompt(agent, base, head)}]
    tools = {"git_diff", "read_file", "run_command"}
    try:
        for iteration in range(1, 60):
            step = review_plan.review_step(agent, messages, tools, per_iteration=3, iteration=iteration,
                                           explore_until=0, pick=lambda seq: seq[0])
            if not step.calls:
                return parse_verdict(step.content, budget).to_json()
            calls = [{"id": f"call_1_{iteration}_{j}", "type": "function",
                      "function": {"name": name, "arguments": json.dumps(args)}}
                     for j, (name, args) in enumerate(step.calls)]
            messages.append({"role": "assistant", "content": step.content, "tool_calls": calls})
            for call, (name, args) in zip(calls, step.calls, strict=True):
                outcome = asyncio.run(workspace.run(name, args, call["id"]))
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": outcome.model_output,
                                 MESSAGE_META: outcome.meta or {}})
    finally:
        workspace.close()
    raise AssertionError("no verdict in 60 iterations")


@pytest.fixture
def shell_pr(tmp_path: Path) -> tuple[Path, str, str]:
    root = tmp_path / "repo"
    base, head = _repo(root, {"app/__init__.py": "", "app/run.py": "import subprocess\n"},
                       {"app/run.py": SOURCE, "conf/prod.yaml": "db:\n  password: Zx9-prod-Qm4-secret\n"})
    return root, base, head


def test_the_offline_reviewer_runs_the_analyzers_in_the_sandbox(shell_pr: tuple[Path, str, str]) -> None:
    verdict = _drive(*shell_pr, "appsec", Budget.defaults())
    assert verdict["verdict"] == "fail"
    found = {(f["file"], f["line"], f["rule"]) for f in verdict["findings"] if f["severity"] == "error"}
    assert ("app/run.py", 6, "ruff/S602") in found
    assert ("conf/prod.yaml", 2, "detect-secrets/KeywordDetector") in found
    assert all(f["line"] != 1 for f in verdict["findings"])  # the base's line is not the change's
    assert {a["name"]: a["status"] for a in verdict["analyzers"]}["ruff"] == "ran"
    perf = _drive(*shell_pr, "qa_performance_security", Budget.defaults())
    assert [(f["line"], f["rule"], f["severity"]) for f in perf["findings"]] == [(7, "ruff/F821", "error")]


def test_a_required_analyzer_that_is_missing_makes_the_verdict_error(shell_pr: tuple[Path, str, str],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    if subprocess.run(["/usr/bin/python3", "-c", "import ruff"], capture_output=True).returncode == 0:
        pytest.skip("the system's Python has ruff: no interpreter here lacks it")
    monkeypatch.setattr(sys, "executable", "/usr/bin/python3")  # the sandbox's python: no ruff there
    verdict = _drive(*shell_pr, "qa_performance_security", Budget.defaults())
    assert verdict["verdict"] == "error"
    assert verdict["summary"].startswith("ruff missing: python -m ruff: not installed")
    assert verdict["analyzers"] == [{"name": "ruff", "status": "missing", "files": 1, "findings": 0}]


def test_semgrep_and_bandit_records_keep_their_rule_id_level_and_link() -> None:
    """semgrep is never installed here: its record as its JSON report documents it (``results[]``)."""
    semgrep = {"check_id": "rules.no-shell", "path": "app/run.py", "start": {"line": 6, "col": 5},
               "end": {"line": 6, "col": 40}, "extra": {"message": "shell=True", "severity": "WARNING",
                                                        "metadata": {"references": ["https://example.org/r"]}}}
    raw = BY_NAME["semgrep"].read(semgrep)
    assert raw is not None and (raw.rule, raw.line, raw.column, raw.said) == ("semgrep/rules.no-shell", 6, 5,
                                                                               "WARNING")
    assert severity_of(raw.rule, tests=False, said=raw.said) == "warning" and raw.help_uri == "https://example.org/r"
    bandit = {"test_id": "B602", "filename": "./app/run.py", "line_number": 6, "col_offset": 4,
              "issue_text": "shell", "issue_severity": "HIGH", "more_info": "https://bandit.readthedocs.io/x"}
    raw = BY_NAME["bandit"].read(bandit)
    assert raw is not None and (raw.rule, raw.path, raw.column) == ("bandit/B602", "./app/run.py", 5)
    assert BY_NAME["ruff"].read({"code": None, "name": None}) is None  # not a record: skipped
