"""Issue #47, one test per row: the gate's tests must run, untested lines are found by coverage. Each
plants a repository and runs `hopline gate` as a real process (the embedded stack: hopline serve,
hopline's agent, the offline scripted reviewer), whose commands run in the real sandbox."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import make_repo, validate_sarif, worktrees

pytestmark = pytest.mark.e2e  # every test here starts real processes (git, daemons, agents, sandboxes)

PYPROJECT = '[tool.pytest.ini_options]\npythonpath = ["src"]\n'
CALC = ("def add(a: int, b: int) -> int:\n    return a + b\n\n\n"
        "def sub(a: int, b: int) -> int:\n    return a - b\n")
TEST_ADD = "def test_add() -> None:\n    assert add(1, 2) == 3\n"
TEST_SUB = "def test_sub() -> None:\n    assert sub(3, 2) == 1\n"
TESTS = f"from calc import add, sub\n\n\n{TEST_ADD}\n\n{TEST_SUB}"
BASE = {"pyproject.toml": PYPROJECT, "src/calc.py": CALC, "tests/test_calc.py": TESTS}


def gate(repo: Path, tmp_path: Path, *args: str,
         env: dict[str, str] | None = None) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """`hopline gate --json --sarif` in ``repo``: its exit code, its result, its SARIF."""
    sarif = tmp_path / "gate.sarif"
    done = subprocess.run([sys.executable, "-m", "hopline", "gate", "--json", "--sarif", str(sarif), *args],
                          cwd=repo, env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=300)
    assert done.stdout, done.stderr[-3000:]
    document = json.loads(sarif.read_text())
    validate_sarif(document)
    return done.returncode, json.loads(done.stdout), document


def agent(result: dict[str, Any], name: str) -> dict[str, Any]:
    return next(a for a in result["agents"] if a["agent"] == name)


def rules(result: dict[str, Any], name: str) -> list[tuple[str, str, Any, str]]:
    return [(f["rule"], f["file"], f["line"], f["severity"]) for f in agent(result, name)["findings"]]


def invocation(document: dict[str, Any], name: str) -> dict[str, Any]:
    run = next(r for r in document["runs"] if r["tool"]["driver"]["name"] == f"hopline-gate/{name}")
    return dict(run["invocations"][0])


def no_worktree_left(repo: Path) -> None:
    """Every checkout of the run removed, and git's records of them pruned (none left prunable)."""
    assert worktrees(repo) == [str(repo)]
    listed = subprocess.run(["git", "worktree", "list", "--porcelain"], cwd=repo, capture_output=True,
                            text=True, check=True).stdout
    assert "prunable" not in listed
    records = repo / ".git" / "worktrees"
    assert not records.exists() or list(records.iterdir()) == []


def test_a_pr_whose_tests_cannot_run_exits_1_naming_the_cause(tmp_path: Path) -> None:
    """The project's interpreter (--python) has no pytest: head and base fail the same way, and that is
    tests-did-not-run, an error, naming `No module named pytest`; SARIF says the tests did not run."""
    python = tmp_path / "no-pytest"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(python)], check=True, timeout=120)
    repo, _, _ = make_repo(tmp_path / "repo", BASE, {"src/calc.py": CALC.replace("a + b", "a - b")})
    code, result, document = gate(repo, tmp_path, "--python", str(python / "bin" / "python"),
                                  "--agent", "qa_automation")
    assert code == 1, result
    assert result["python"] == {"path": str(python / "bin" / "python"), "source": "given"}
    [finding] = agent(result, "qa_automation")["findings"]
    assert (finding["rule"], finding["severity"], finding["file"]) == ("tests-did-not-run", "error",
                                                                        "pyproject.toml")
    assert "No module named pytest" in finding["message"] and "--python" in finding["message"]
    said = invocation(document, "qa_automation")
    assert said["executionSuccessful"] is False
    assert said["commandLine"] == "python -m pytest -rA --tb=short -q --color no"
    assert "No module named pytest" in said["toolExecutionNotifications"][0]["message"]["text"]
    no_worktree_left(repo)


def test_tests_that_do_not_import_are_tests_that_did_not_run(tmp_path: Path) -> None:
    """A src layout whose tests do not import (no pythonpath): every test module fails to collect at the
    head and at the base; one error naming the module that does not import, never a pass."""
    repo, _, _ = make_repo(tmp_path / "repo", {**BASE, "pyproject.toml": "[tool.pytest.ini_options]\n"},
                           {"src/calc.py": CALC.replace("a + b", "a - b")})
    code, result, _ = gate(repo, tmp_path, "--agent", "qa_automation")
    assert code == 1, result
    [finding] = agent(result, "qa_automation")["findings"]
    assert finding["rule"] == "tests-did-not-run" and "No module named calc" in finding["message"]
    assert "tests/test_calc.py" in finding["message"]


def test_a_failing_test_is_named_at_its_line_with_its_assertion(tmp_path: Path) -> None:
    repo, _, _ = make_repo(tmp_path / "repo", BASE, {"src/calc.py": CALC.replace("a + b", "a - b")})
    code, result, document = gate(repo, tmp_path, "--agent", "qa_automation")
    assert code == 1
    assert rules(result, "qa_automation") == [("test-failed", "tests/test_calc.py", 5, "error")]
    message = agent(result, "qa_automation")["findings"][0]["message"]
    assert message.startswith("tests/test_calc.py::test_add fails: assert -1 == 3")
    assert "where -1 = add(1, 2)" in message
    said = invocation(document, "qa_automation")
    assert said["executionSuccessful"] is True and said["exitCode"] == 1
    assert said["properties"]["testRuns"][0]["counts"] == {"failed": 1, "passed": 1}
    region = document["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["region"]
    assert region == {"startLine": 5}


def test_a_syntax_error_is_one_finding(tmp_path: Path) -> None:
    """Not one more per test file that cannot import it: a change that does not compile runs no test."""
    broken = CALC.replace("def sub(a: int, b: int) -> int:", "def sub(a: int, b: int) -> int")
    more = {"tests/test_more.py": TESTS.replace("def test_", "def test_2_")}  # two test files import calc
    repo, _, _ = make_repo(tmp_path / "repo", {**BASE, **more}, {"src/calc.py": broken})
    code, result, _ = gate(repo, tmp_path, "--agent", "qa_automation")
    assert code == 1
    assert rules(result, "qa_automation") == [("compile-error", "src/calc.py", 5, "error")]
    assert "not run: the change does not compile" in agent(result, "qa_automation")["summary"]


def test_a_pr_that_deletes_the_test_that_catches_its_bug_is_found(tmp_path: Path) -> None:
    """add() broken and test_add deleted: the head's tests pass, but the base had test_add."""
    only_sub = f"from calc import sub\n\n\n{TEST_SUB}"
    repo, _, _ = make_repo(tmp_path / "repo", BASE, {"src/calc.py": CALC.replace("a + b", "a - b"),
                                                     "tests/test_calc.py": only_sub})
    code, result, _ = gate(repo, tmp_path, "--agent", "qa_automation")
    assert code == 1
    [removed] = agent(result, "qa_automation")["findings"]
    assert (removed["rule"], removed["file"], removed["severity"]) == ("test-removed", "tests/test_calc.py",
                                                                       "error")
    assert "tests/test_calc.py::test_add (gone)" in removed["message"]
    assert "1 tests of the base not run at the head" in agent(result, "qa_automation")["summary"]
    no_worktree_left(repo)


def _big_module(docstring: str) -> str:
    """A module over 40 KiB: functions with docstrings (the last one's given)."""
    parts = [f'def step_{i}(x: int) -> int:\n    """Step {i} of the pipeline."""\n    return x + {i}\n\n\n'
             for i in range(600)]
    parts.append(f'def last(x: int) -> int:\n    """{docstring}"""\n    return x\n')
    return "".join(parts)


def test_a_docstring_only_change_in_a_40_kib_file_passes(tmp_path: Path) -> None:
    """The whole-file diff is over the 32 KiB tool result: the AST is compared on the whole file read
    outside the capped result, so no untested-change, whatever the size."""
    big = _big_module("The last step.")
    assert len(big.encode()) > 40 * 1024
    test = "from big import last, step_1\n\n\ndef test_steps() -> None:\n    assert last(step_1(1)) == 2\n"
    repo, _, _ = make_repo(tmp_path / "repo", {**BASE, "src/big.py": big, "tests/test_big.py": test},
                           {"src/big.py": _big_module("The last step: it returns its input.").replace(
                               '"""Step 3 of the pipeline."""', '"""Step three."""')})
    code, result, _ = gate(repo, tmp_path)
    assert code == 0, [(a["agent"], a["findings"]) for a in result["agents"]]
    assert all(a["verdict"] == "pass" and a["findings"] == [] for a in result["agents"])
    assert "1 changed files keep their AST" in agent(result, "qa_strategy")["summary"]


def test_a_refactor_the_existing_tests_cover_passes_with_no_test_change(tmp_path: Path) -> None:
    refactor = CALC.replace("    return a + b\n", "    total = a\n    total += b\n    return total\n")
    repo, _, _ = make_repo(tmp_path / "repo", BASE, {"src/calc.py": refactor})
    code, result, _ = gate(repo, tmp_path)
    assert code == 0, [(a["agent"], a["findings"]) for a in result["agents"]]
    assert all(a["findings"] == [] for a in result["agents"])
    assert "3 of the 3 statements the change adds" in agent(result, "qa_strategy")["summary"]


def test_an_added_line_no_test_runs_is_untested_at_its_line(tmp_path: Path) -> None:
    """The same kind of refactor plus a branch no test takes: untested-change at that line only."""
    changed = CALC.replace("    return a + b\n",
                           "    if a < 0:\n        raise ValueError(a)\n    return a + b\n")
    repo, _, _ = make_repo(tmp_path / "repo", BASE, {"src/calc.py": changed})
    code, result, _ = gate(repo, tmp_path, "--agent", "qa_strategy")
    assert code == 1
    assert rules(result, "qa_strategy") == [("untested-change", "src/calc.py", 3, "error")]
    assert "no test runs line 3" in agent(result, "qa_strategy")["findings"][0]["message"]


def test_a_docs_only_pr_runs_no_test_and_says_so(tmp_path: Path) -> None:
    repo, _, _ = make_repo(tmp_path / "repo", {**BASE, "README.md": "# calc\n"},
                           {"README.md": "# calc\n\nAdds and subtracts.\n",
                            "docs/usage.rst": "Usage\n=====\n"})
    code, result, document = gate(repo, tmp_path)
    assert code == 0
    qa = agent(result, "qa_automation")
    assert "the change touches documentation only (README.md, docs/usage.rst): no test ran" in qa["summary"]
    assert all(a["testRuns"] == [] for a in result["agents"])  # no run of the test command at all
    assert "commandLine" not in invocation(document, "qa_automation")
    no_worktree_left(repo)
