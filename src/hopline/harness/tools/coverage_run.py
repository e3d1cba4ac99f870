"""The head's tests under coverage, and which lines a change adds that no test runs (as diff-cover
does): what a gate session's ``run_command`` gives with ``coverage: true``.

The test command runs under ``coverage run`` (the project's coverage when its interpreter has it,
else hopline's own, bound read-only into the sandbox and found last on ``sys.path``, so that it never
shadows the project's packages), measuring the directories of the changed Python source files, then
``coverage json`` reports those files into the sandbox's private tmp, read back through the results
pipe. The project's own coverage configuration is not read (``--rcfile=/dev/null``): a plugin it
names may not be installed, and what is measured is the gate's choice. An added line is untested
when coverage counts it as a statement that did not run; lines that are not statements (blank,
comments, docstrings, a statement's continuation) are never counted, as with diff-cover.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Sequence
from typing import Any

from hopline.harness.diffs import is_source_path, parse_diff, parse_numstat

REPORT_FILE = "coverage.json"
# Runs as ``python -c RUNNER LIB OUT INCLUDE SOURCE -- ARGS...`` (ARGS: the test command after its
# interpreter, as ``-m pytest -q``); exits with the tests' status.
RUNNER = r"""
import os, sys
lib, out, include, source = sys.argv[1:5]
try:
    import coverage.cmdline as cmdline
except ImportError:
    sys.path.append(lib)
    import coverage.cmdline as cmdline
os.environ["COVERAGE_FILE"] = out + "/.coverage"
code = cmdline.main(["run", "--rcfile=/dev/null", "--source=" + source, *sys.argv[6:]])
cmdline.main(["json", "-q", "--rcfile=/dev/null", "-o", out + "/coverage.json", "--include=" + include])
sys.exit(code if isinstance(code, int) else 1)
"""


def changed_python(numstat: str) -> list[str]:
    """The Python source files (not tests) a change adds lines to, from ``git diff --numstat``."""
    return [str(f[0]) for f in parse_numstat(numstat)
            if int(f[1]) > 0 and str(f[0]).endswith(".py") and is_source_path(str(f[0]))]


def added_lines(diff: str) -> dict[str, list[int]]:
    """The line numbers each file of a ``git diff -U0`` adds."""
    out: dict[str, list[int]] = {}
    for entry in parse_diff(diff):
        if entry.line is not None:
            out.setdefault(entry.path, []).append(entry.line)
    return out


def runner_argv(python_argv: Sequence[str], lib: str, out: str, files: Sequence[str]) -> list[str]:
    """``python_argv`` (``[python, -m, pytest, ...]``) run under coverage, measuring the directories
    of ``files`` and reporting ``files``."""
    sources = sorted({posixpath.dirname(f) or "." for f in files})
    return [python_argv[0], "-c", RUNNER, lib, out, ",".join(files), ",".join(sources), "--",
            *python_argv[1:]]


def _grouped(untested: list[int], executed: set[int]) -> list[list[int]]:
    """Untested lines as runs, two of them joined when no line that ran lies between them."""
    out: list[list[int]] = []
    for line in sorted(untested):
        if out and not any(out[-1][1] < done < line for done in executed):
            out[-1][1] = line
        else:
            out.append([line, line])
    return out


def change_coverage(report: bytes | None, added: dict[str, list[int]],
                    files: Sequence[str]) -> dict[str, Any]:
    """Per changed file: the added lines that are statements, how many of them ran, and the runs of
    those that did not (``untested``); ``measured: false`` for a file coverage did not report."""
    try:
        data = json.loads(report) if report is not None else None
    except ValueError:
        data = None
    measured = data.get("files") if isinstance(data, dict) and isinstance(data.get("files"), dict) else {}
    out: dict[str, Any] = {}
    for path in files:
        entry = measured.get(path) if isinstance(measured, dict) else None
        if not isinstance(entry, dict):
            out[path] = {"measured": False}
            continue
        executed = {int(n) for n in entry.get("executed_lines") or [] if isinstance(n, int)}
        missing = {int(n) for n in entry.get("missing_lines") or [] if isinstance(n, int)}
        mine = set(added.get(path, []))
        untested = sorted(mine & missing)
        out[path] = {"measured": True, "statements": len(mine & (missing | executed)),
                     "tested": len(mine & executed), "untested": _grouped(untested, executed)}
    return out


def shown(coverage: dict[str, Any]) -> str:
    """The coverage of a change in words, for a model: a line per file with untested lines."""
    if coverage.get("error"):
        return f"[coverage of the change: not measured: {coverage['error']}]"
    lines = []
    for path, entry in (coverage.get("files") or {}).items():
        if not entry.get("measured"):
            lines.append(f"[coverage: {path}: not measured]")
        elif entry["untested"]:
            spans = ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in entry["untested"])
            lines.append(f"[coverage: {path}: {entry['statements'] - entry['tested']} of the "
                         f"{entry['statements']} statements this change adds run in no test: lines {spans}]")
        else:
            lines.append(f"[coverage: {path}: all {entry['statements']} statements this change adds run]")
    return "\n".join(lines) or "[coverage of the change: it adds no Python source line]"
