"""The gate's reviewers run real analyzers (SPEC K-6): the sixteen planted defects of one pull request
are named with the analyzer's rule id, clean changes pass, a report longer than the tool-result cap is
read page by page, and --format github annotates a finding at its line. Real git repositories, a real
`hopline serve` with hopline's agent and the offline scripted model, real ruff and detect-secrets in
the sandbox."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from daemon.support import Daemon, running_daemon

from .conftest import make_repo, run_gate, validate_sarif
from .defects import BASE, planted_files, where

pytestmark = pytest.mark.e2e
SECURITY = ("appsec", "qa_performance_security")


def _findings(result: dict[str, Any], *agents: str) -> list[dict[str, Any]]:
    return [f for a in result["agents"] if not agents or a["agent"] in agents for f in a["findings"]]


def _named(result: dict[str, Any]) -> list[tuple[str, int, tuple[str, ...]]]:
    """The planted defects a finding of severity error names at their line, with one of their ids."""
    errors = [f for f in _findings(result) if f["severity"] == "error"]
    return [(path, line, rules) for path, line, rules in where()
            if any(f["file"] == path and f["line"] == line and f["rule"] in rules for f in errors)]


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    return make_repo(tmp_path_factory.mktemp("planted") / "repo", BASE, planted_files())


def test_the_sixteen_planted_defects_are_named_with_the_analyzers_rule_ids(
        hopline_gate_daemon: Daemon, planted: tuple[Path, str, str]) -> None:
    repo, base, head = planted
    result, _ = run_gate(hopline_gate_daemon, repo, base=base, head=head)
    assert result["exitCode"] == 1
    verdicts = {a["agent"]: a["verdict"] for a in result["agents"]}
    assert verdicts["qa_automation"] == "pass", result["agents"]  # its test passes: the analyzers fail it
    assert verdicts["appsec"] == "fail"
    named = _named(result)
    assert len(named) >= 15, sorted(set(where()) - set(named))
    by_line = {(f["file"], f["line"]): f for f in _findings(result, "appsec") if f["severity"] == "error"}
    shell = by_line[("app/handlers.py", 17)]
    assert shell["rule"] == "ruff/S602" and shell["helpUri"].startswith("https://docs.astral.sh/ruff/rules/")
    assert shell["column"] == 5
    assert by_line[("app/clients.py", 3)]["rule"] == "detect-secrets/GitHubTokenDetector"
    appsec = next(a for a in result["agents"] if a["agent"] == "appsec")
    ran = {a["name"]: a["status"] for a in appsec["analyzers"]}
    assert ran["ruff"] == ran["detect-secrets"] == "ran"
    assert "ruff ran on 4 files" in appsec["summary"] and "detect-secrets ran on 6 files" in appsec["summary"]
    # one finding per line and concern: ruff's S602 and bandit's B602 are one check
    on_17 = [f for f in _findings(result, "appsec") if (f["file"], f["line"]) == ("app/handlers.py", 17)]
    assert len(on_17) == 1


CLEAN: dict[str, tuple[dict[str, str], dict[str, str | None]]] = {
    "a comment mentioning eval": (
        {"app/calc.py": "def add(a: int, b: int) -> int:\n    return a + b\n",
         "web/calc.js": "export function add(a, b) {\n  return a + b;\n}\n",
         "tests/test_calc.py": "from app.calc import add\n\n\ndef test_add() -> None:\n"
                               "    assert add(1, 2) == 3\n"},
        {"app/calc.py": "def add(a: int, b: int) -> int:\n"
                        "    # never eval() the input here: it comes from users\n    return a + b\n",
         "web/calc.js": "export function add(a, b) {\n  // never eval(a) nor exec(b): 'eval(' is only text\n"
                        "  const note = \"eval(x) is unsafe\";\n  return a + b;\n}\n"}),
    "a docs-only change": (
        {"README.md": "# calc\n", "app/calc.py": "X = 1\n"},
        {"README.md": "# calc\n\nSet `password: <from your vault>` in the settings; never `eval()` input.\n",
         "docs/usage.md": "Run `calc --token $CALC_TOKEN`.\n"}),
    "a typing-only change": (
        {"app/calc.py": "def add(a, b):\n    return a + b\n"},
        {"app/calc.py": "from __future__ import annotations\n\n\ndef add(a: int, b: int) -> int:\n"
                        "    return a + b\n"}),
    "a refactor that the tests cover": (
        {"app/calc.py": "def total(xs):\n    t = 0\n    for x in xs:\n        t += x\n    return t\n",
         "tests/test_calc.py": "from app.calc import total\n\n\ndef test_total() -> None:\n"
                               "    assert total([1, 2]) == 3\n"},
        {"app/calc.py": "def total(xs: list[int]) -> int:\n    return sum(xs)\n",
         "tests/test_calc.py": "from app.calc import total\n\nPASSWORD = 'fixture-only-pass'\n\n\n"
                               "def test_total() -> None:\n    assert total([1, 2]) == 3\n"}),
}


@pytest.mark.parametrize("name", list(CLEAN))
def test_clean_changes_get_no_error_from_the_security_gates(hopline_gate_daemon: Daemon, tmp_path: Path,
                                                           name: str) -> None:
    repo, base, head = make_repo(tmp_path / "repo", *CLEAN[name])
    result, _ = run_gate(hopline_gate_daemon, repo, base=base, head=head, agents=list(SECURITY))
    errors = [f for f in _findings(result) if f["severity"] == "error"]
    assert errors == [], errors
    assert {a["agent"]: a["verdict"] for a in result["agents"]} == dict.fromkeys(SECURITY, "pass")


@pytest.fixture(scope="module")
def small_cap_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """hopline's agent with a tool-result cap of 4 KiB: every analyzer report here is longer."""
    with running_daemon(tmp_path_factory.mktemp("small-cap"), agent_cmd=None,
                        env={"HOPLINE_TOOL_RESULT_MAX_BYTES": "4096"}) as daemon:
        yield daemon


def test_a_report_over_the_tool_result_cap_is_read_page_by_page(small_cap_daemon: Daemon,
                                                                planted: tuple[Path, str, str]) -> None:
    repo, base, head = planted
    result, _ = run_gate(small_cap_daemon, repo, base=base, head=head, agents=["appsec"])
    appsec = result["agents"][0]
    for name, files, found in (("ruff", 4, 10), ("detect-secrets", 6, 10)):
        pages = re.search(rf"{name} ran on {files} files: {found} findings on added lines \(its report read "
                          r"from the kept output in (\d+) pages\)", appsec["summary"])
        assert pages is not None and int(pages.group(1)) >= 2, appsec["summary"]
    assert len(_named(result)) >= 15


def _cli(args: list[str], daemon: Daemon) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOPLINE_SERVER_TOKEN": daemon.token}
    return subprocess.run([sys.executable, "-m", "hopline", "gate", "--url", daemon.url, *args], env=env,
                          capture_output=True, text=True, timeout=600)


def test_format_github_annotates_shell_true_at_its_line(hopline_gate_daemon: Daemon, tmp_path: Path) -> None:
    repo, base, head = make_repo(
        tmp_path / "repo", {"app/__init__.py": ""},
        {"app/run.py": "import subprocess\n\n\ndef convert(name: str) -> None:\n"
                       "    subprocess.run(f\"convert {name} out.png\", shell=True)  # a, b\n"})
    sarif = tmp_path / "gate.sarif"
    done = _cli(["--repo", str(repo), "--base", base, "--head", head, "--agent", "appsec",
                 "--format", "github", "--sarif", str(sarif)], hopline_gate_daemon)
    assert done.returncode == 1, done.stderr[-2000:]
    commands = [line for line in done.stdout.splitlines() if line.startswith("::")]
    parsed = [re.fullmatch(r"::(error|warning|notice) ((?:[a-zA-Z]+=[^,:]*,?)+)::(.+)", c) for c in commands]
    assert all(parsed), commands
    annotations = [(m.group(1), dict(p.split("=", 1) for p in m.group(2).split(",")), m.group(3))
                   for m in parsed if m]
    shell = [a for a in annotations if a[1].get("title") == "appsec/ruff/S602"]
    assert len(shell) == 1, annotations
    level, props, message = shell[0]
    assert (level, props["file"], props["line"], props["col"]) == ("error", "app/run.py", "5", "5")
    assert "shell=True" in message and "https://docs.astral.sh/ruff/rules/" in message
    assert "appsec: fail" in done.stdout  # the summary follows the annotations
    document = __import__("json").loads(sarif.read_text())
    validate_sarif(document)
    rules = [r for run in document["runs"] for r in run["tool"]["driver"]["rules"]]
    assert rules and all(r["fullDescription"]["text"] and r["helpUri"].startswith("https://") for r in rules)
    results = [r for run in document["runs"] for r in run["results"]]
    assert results and all("region" in loc["physicalLocation"] for r in results for loc in r["locations"])
    assert {e["name"] for e in document["runs"][0]["tool"]["extensions"]} >= {"ruff", "detect-secrets"}
