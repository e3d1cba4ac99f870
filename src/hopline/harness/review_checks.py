"""What qa_automation's runs show, and what each verdict says it checked. Pure: no I/O.

A run is what ``run_command`` gave back (its text, and its ``_meta["hopline.command"]``: exit code,
timeout, sandbox). A test failing at the head is an error finding unless it fails at the base too
(then a warning: the change did not introduce it).
"""

from __future__ import annotations

import shlex
from typing import Any

from hopline.harness import review_analyze
from hopline.harness.review import COMPILE_RULE, PROCESS_LIMIT_RULE, TEST_COMMAND_RULE, TEST_RULE
from hopline.harness.rules import agents_rules
from hopline.harness.testresults import TestReport, parse_compile_errors, parse_pytest

_NO_TESTS_COLLECTED = 5
_AT_BASE_TOO = " (it fails at the base too: not introduced by this change)"


def _compile_findings(notes: dict[str, Any]) -> list[dict[str, Any]]:
    run = notes["runs"].get("compile")
    if run is None or run["failed"] or run["exitCode"] == 0:
        return []
    python = [str(f[0]) for f in notes["files"] or [] if str(f[0]).endswith(".py") and int(f[1]) > 0]
    errors = parse_compile_errors(run["text"], python)
    if not errors:
        first = next((str(f[0]) for f in notes["files"] or [] if str(f[0]).endswith(".py")), ".")
        return [{"severity": "error", "file": first, "line": None, "rule": COMPILE_RULE,
                 "message": f"py_compile failed (exit code {run['exitCode']}) and named no line"}]
    return [{"severity": "error", "file": file, "line": line, "rule": COMPILE_RULE,
             "message": f"this file does not compile: {error}"} for file, line, error in errors]


def _report(run: dict[str, Any] | None) -> TestReport | None:
    return parse_pytest(run["text"]) if run is not None and not run["failed"] else None


def _test_findings(notes: dict[str, Any], test: dict[str, Any]) -> list[dict[str, Any]]:
    head_run, base_run = notes["runs"].get("head"), notes["runs"].get("base")
    if head_run is None or head_run["failed"] or head_run["exitCode"] in (0, _NO_TESTS_COLLECTED):
        return []
    config = str(test.get("file") or ".")
    shown = shlex.join(str(a) for a in test["argv"])
    if head_run["timedOut"]:
        return [{"severity": "error", "file": config, "line": None, "rule": TEST_COMMAND_RULE,
                 "message": f"{shown} ran past its timeout at the head (killed)"}]
    head, base = _report(head_run), _report(base_run)
    at_base = base.failed_ids if base is not None else set()
    base_failed = base_run is not None and base_run["exitCode"] not in (0, None)
    found = []
    for failed in head.failed if head is not None else []:
        also = failed.test in at_base
        found.append({"severity": "warning" if also else "error", "file": failed.file or config,
                      "line": failed.line, "rule": TEST_RULE,
                      "message": f"{failed.test} fails: {failed.message}"
                                 + (_AT_BASE_TOO if also else "")})
    if not found:  # no test named (another runner, or the run broke before any test)
        found.append({"severity": "warning" if base_failed else "error", "file": config, "line": None,
                      "rule": TEST_COMMAND_RULE,
                      "message": f"{shown} fails at the head (exit code {head_run['exitCode']})"
                                 + (" and at the base too" if base_failed else ", and passes at the base")})
    return found


def _process_findings(notes: dict[str, Any], test: dict[str, Any] | None) -> list[dict[str, Any]]:
    """A run the sandbox's process ceiling cut short (a fork bomb, or a suite that needs a larger
    HOPLINE_SANDBOX_MAX_PROCESSES): its result is not the code's, whatever its exit code."""
    found = []
    for which, run in notes["runs"].items():
        if int(run.get("refused") or 0) > 0:
            found.append({"severity": "error", "file": str(test.get("file") or ".") if test else ".",
                          "line": None, "rule": PROCESS_LIMIT_RULE,
                          "message": f"the {which} run started more processes than the sandbox allows: "
                                     f"{run['refused']} refused (HOPLINE_SANDBOX_MAX_PROCESSES)"})
    return found


def automation_findings(notes: dict[str, Any], test: dict[str, Any] | None) -> tuple[list[dict[str, Any]],
                                                                                    str | None]:
    """qa_automation's findings from its runs, and why it could not verify (None when it could)."""
    found = _compile_findings(notes) + _process_findings(notes, test)
    for which in ("compile", "head", "base"):
        run = notes["runs"].get(which)
        if run is not None and run["failed"]:
            return found, f"the {which} run could not be made: {run['text'][:300]}"
    if test is not None:
        found += _test_findings(notes, test)
    return found, None


def _run_said(run: dict[str, Any] | None, where: str) -> str:
    if run is None:
        return ""
    if run["timedOut"]:
        return f"at {where}: killed at its timeout"
    report = parse_pytest(run["text"])
    told = report.summary or ("no test ran" if run["exitCode"] == _NO_TESTS_COLLECTED else "")
    return f"at {where}: {told + ', ' if told else ''}exit code {run['exitCode']}"


def _files_said(notes: dict[str, Any]) -> str:
    names = [str(f[0]) for f in notes["files"] or []]
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return f"read {len(names)} changed files ({shown})"


def summary_of(agent: str, notes: dict[str, Any], test: dict[str, Any] | None) -> str:
    """What ``agent`` checked: its runs and their counts, the files, the rules."""
    parts: list[str] = []
    if agent == "qa_automation":
        runs = notes["runs"]
        sandbox = next((r.get("sandbox") for r in runs.values() if r.get("sandbox")), None)
        if "compile" in runs:
            compiled = sum(1 for f in notes["files"] or [] if str(f[0]).endswith(".py") and int(f[1]) > 0)
            ok = "all compile" if runs["compile"]["exitCode"] == 0 else "a file does not compile"
            parts.append(f"py_compile on {compiled} changed Python files: {ok}")
        if test is None:
            parts.append("no test command found (pytest, go, cargo, npm, make test; or --test-cmd): no test "
                         "ran")
        else:
            runs_said = (_run_said(runs.get("head"), "head"), _run_said(runs.get("base"), "base"))
            said = "; ".join(s for s in runs_said if s)
            parts.append(f"ran `{shlex.join(str(a) for a in test['argv'])}` {said}".rstrip())
        if sandbox:
            parts.append(f"in the {sandbox} sandbox")
    elif agent == "qa_strategy" and notes["sameBehaviour"]:
        parts.append(f"{len(notes['sameBehaviour'])} changed files keep their AST once annotations, "
                     f"docstrings "
                     "and comments are stripped (no behaviour to test)")
    if notes.get("unreadable"):
        parts.append(f"{len(notes['unreadable'])} diffs could not be read")
    if analyzers := review_analyze.said(notes):
        parts.append(analyzers)
    parts.append(_files_said(notes))
    parts.append("rules " + ", ".join(agents_rules(agent)))
    return "; ".join(parts)
