"""The gate on GitHub: the example workflow is a valid GitHub Actions workflow (check-jsonschema's
vendored schema, offline) that runs the gate with annotations and uploads its SARIF; annotations
are escaped so a message cannot end the command; the severity table is documented row by row."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from ruamel.yaml import YAML

from hopline.gate.github import annotate, annotation
from hopline.harness.rules import RULES

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "github" / "hopline-gate.yml"


def _check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema",
                           "vendor.github-workflows", str(path)], capture_output=True, text=True, timeout=120)


def test_the_example_workflow_is_valid_and_runs_the_gate_then_uploads_its_sarif(tmp_path: Path) -> None:
    done = _check(EXAMPLE)
    assert done.returncode == 0, done.stdout + done.stderr
    broken = tmp_path / "broken.yml"  # the check can fail: a job whose runs-on is a number
    broken.write_text(EXAMPLE.read_text().replace("runs-on: ubuntu-24.04", "runs-on: 24"))
    assert _check(broken).returncode == 1
    workflow = YAML(typ="safe").load(EXAMPLE.read_text())
    steps = workflow["jobs"]["gate"]["steps"]
    gate = next(s["run"] for s in steps if "hopline gate" in str(s.get("run")))
    assert "--format github" in gate and "--sarif hopline-gate.sarif" in gate
    assert "github.event.pull_request.base.sha" in gate and "github.event.pull_request.head.sha" in gate
    upload = next(s for s in steps if str(s.get("uses", "")).startswith("github/codeql-action/upload-sarif@"))
    assert upload["with"]["sarif_file"] == "hopline-gate.sarif" and "always()" in upload["if"]
    assert workflow["permissions"]["security-events"] == "write"
    shown = subprocess.run([sys.executable, "-m", "hopline", "gate", "--help"], capture_output=True,
                           text=True, timeout=60, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"}).stdout
    for option in re.findall(r"(--[a-z-]+)", gate):  # every option the example passes, the CLI takes
        assert option in shown, option


def test_an_annotation_cannot_be_ended_or_extended_by_what_it_carries() -> None:
    finding = {"severity": "error", "file": "a,b:c.py", "line": 3, "column": 7, "rule": "ruff/S602",
               "message": "100% bad\n::error file=x::forged", "helpUri": "https://docs.astral.sh/ruff/rules/x"}
    line = annotation("appsec", finding)
    assert line == ("::error file=a%2Cb%3Ac.py,line=3,col=7,title=appsec/ruff/S602::100%25 bad "
                    "::error file=x::forged (https://docs.astral.sh/ruff/rules/x)")
    assert "\n" not in annotation("appsec", {**finding, "message": "two\r\nlines", "file": "x\ny.py"})
    note = annotation("qa_strategy", {"severity": "note", "file": "a.py", "line": None, "rule": "r",
                                      "message": "m"})
    assert note == "::notice file=a.py,title=qa_strategy/r::m"
    result = {"agents": [{"agent": "appsec", "verdict": "error", "summary": "ruff missing", "findings": []}]}
    assert annotate(result) == ["::error title=appsec::ruff missing"]


def test_the_severity_table_is_documented_row_by_row() -> None:
    text = (ROOT / "docs" / "gate.md").read_text()
    for row in RULES:
        shown = rf"^\| `{re.escape(row.rule)}` \| {row.agent} \| {row.severity}\b"
        assert re.search(shown, text, re.MULTILINE), row
    assert "docs/gate.md" in (ROOT / "README.md").read_text()
