"""What qa_automation's and qa_strategy's runs show, and what each verdict says it checked. Pure: no I/O.

A run is what ``run_command`` gave back: its text, its ``_meta["hopline.command"]`` (exit code,
timeout, sandbox) and, for the gate's test command, ``_meta["hopline.tests"]`` (what the run
showed: :mod:`hopline.harness.testruns`; the tests the base had that the head has not; the coverage
of the change). At the head:

- a test command that ran no test is ``tests-did-not-run``, an error whatever the base does;
- a failing test is ``test-failed`` at its line with the assertion's first lines, an error unless
  it fails at the base too (then a warning: the change did not introduce it);
- a failing command that named no failing test is ``test-command-failed``, with its exit code and
  its last lines;
- a test of the base that is gone or skipped at the head is ``test-removed``, an error when the
  change touches source code too.
"""

from __future__ import annotations

import shlex
from typing import Any

from hopline.harness.diffs import is_source_path
from hopline.harness.rules import agents_rules
from hopline.harness.testresults import parse_compile_errors
from hopline.harness.testruns import last_lines
from hopline.scripted import review_analyze
from hopline.scripted.review import (
    COMPILE_RULE,
    NO_TESTS_RULE,
    PROCESS_LIMIT_RULE,
    REMOVED_RULE,
    TEST_COMMAND_RULE,
    TEST_RULE,
    coverage_findings,
    is_doc_path,
    untested_findings,
)

_AT_BASE_TOO = " (it fails at the base too: not introduced by this change)"
_INTERPRETER_HINT = ("; run the tests with the project's interpreter: hopline gate --python PATH, "
                     "python = in .hopline/gate.toml, or a .venv/ in the repository")


def docs_only(notes: dict[str, Any]) -> list[str] | None:
    """The changed files when every one is documentation (no test runs for them), else None."""
    paths = [str(f[0]) for f in notes["files"] or []]
    return paths if paths and all(is_doc_path(p) for p in paths) else None


def compile_failed(notes: dict[str, Any]) -> bool:
    run = notes["runs"].get("compile")
    return run is not None and not run["failed"] and run["exitCode"] != 0


def _compile_findings(notes: dict[str, Any]) -> list[dict[str, Any]]:
    run = notes["runs"].get("compile")
    if not compile_failed(notes):
        return []
    assert run is not None
    python = [str(f[0]) for f in notes["files"] or [] if str(f[0]).endswith(".py") and int(f[1]) > 0]
    errors = parse_compile_errors(run["text"], python)
    if not errors:
        first = next((str(f[0]) for f in notes["files"] or [] if str(f[0]).endswith(".py")), ".")
        return [{"severity": "error", "file": first, "line": None, "rule": COMPILE_RULE,
                 "message": f"py_compile failed (exit code {run['exitCode']}) and named no line"}]
    return [{"severity": "error", "file": file, "line": line, "rule": COMPILE_RULE,
             "message": f"this file does not compile: {error}"} for file, line, error in errors]


def _own_output(text: str) -> str:
    """A run's output without the lines hopline added after it (``[exit code N]``, ``[tests: ...]``)."""
    lines = text.rstrip().splitlines()
    while lines and lines[-1].startswith("[") and lines[-1].endswith("]"):
        lines.pop()
    return "\n".join(lines)


def tests_of(run: dict[str, Any] | None) -> dict[str, Any] | None:
    """A run's ``_meta["hopline.tests"]`` (what the test command showed), if it has one."""
    found = run.get("tests") if run is not None and not run["failed"] else None
    return found if isinstance(found, dict) else None


def _removed_findings(notes: dict[str, Any], base: dict[str, Any] | None) -> list[dict[str, Any]]:
    removed = list((base or {}).get("removed") or [])
    if not removed:
        return []
    source = any(is_source_path(str(f[0])) for f in notes["files"] or [])
    by_file: dict[str, list[str]] = {}
    for entry in removed:
        by_file.setdefault(str(entry.get("file") or "."), []).append(
            f"{entry.get('test')} ({'skipped' if entry.get('how') == 'skipped' else 'gone'})")
    more = int(base.get("removedCount") or len(removed)) - len(removed) if base else 0
    found = []
    for file, tests in sorted(by_file.items()):
        named = ", ".join(tests[:5]) + (f" and {len(tests) - 5} more" if len(tests) > 5 else "")
        plural = "s" if len(tests) > 1 else ""
        found.append({"severity": "error" if source else "warning", "file": file, "line": None,
                      "rule": REMOVED_RULE,
                      "message": f"{len(tests)} test{plural} of the base the head does not run: {named}"
                                 + (f" (and {more} more elsewhere)" if more > 0 else "")
                                 + ("; the change also changes source code" if source else "")})
    return found


def _test_findings(notes: dict[str, Any], test: dict[str, Any]) -> list[dict[str, Any]]:
    head_run, base_run = notes["runs"].get("head"), notes["runs"].get("base")
    if head_run is None or head_run["failed"]:
        return []
    config = str(test.get("file") or ".")
    shown = shlex.join(str(a) for a in test["argv"])
    if head_run["timedOut"]:
        return [{"severity": "error", "file": config, "line": None, "rule": TEST_COMMAND_RULE,
                 "message": f"{shown} ran past its timeout at the head (killed)"}]
    head, base = tests_of(head_run), tests_of(base_run)
    if head is not None and not head.get("ran"):
        cause = str(head.get("didNotRun"))
        return [{"severity": "error", "file": config, "line": None, "rule": NO_TESTS_RULE,
                 "message": f"{shown} ran no test at the head: {cause} (exit code {head_run['exitCode']})"
                            + (_INTERPRETER_HINT if "No module named" in cause else "")}]
    found = _removed_findings(notes, base)
    if head_run["exitCode"] == 0:
        return found
    at_base = {f.get("test") for f in (base or {}).get("failed") or []}
    base_failed = base_run is not None and base_run["exitCode"] not in (0, None)
    failures = []
    for failed in (head or {}).get("failed") or []:
        also = failed.get("test") in at_base
        message = " ".join(str(failed.get("message") or "").split())
        failures.append({"severity": "warning" if also else "error", "file": failed.get("file") or config,
                         "line": failed.get("line"), "rule": TEST_RULE,
                         "message": f"{failed.get('test')} fails: {message}"
                                    + (_AT_BASE_TOO if also else "")})
    if not failures:  # no test named (another runner, or the run broke outside any test)
        told = last_lines(_own_output(head_run["text"]))
        failures.append({"severity": "warning" if base_failed else "error", "file": config, "line": None,
                         "rule": TEST_COMMAND_RULE,
                         "message": f"{shown} fails at the head (exit code {head_run['exitCode']})"
                                    + (" and at the base too" if base_failed else "")
                                    + (f"; its last lines: {' / '.join(told.splitlines())}" if told else "")})
    return failures + found


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


def strategy_findings(notes: dict[str, Any]) -> list[dict[str, Any]]:
    """qa_strategy's untested changes: by coverage where it ran, else the file-level rule as a warning
    saying why (for every changed source file coverage did not measure)."""
    sources = [str(f[0]) for f in notes["files"] or [] if int(f[1]) > 0 and is_source_path(str(f[0]))]
    exempt = set(notes["sameBehaviour"])
    coverage = (tests_of(notes["runs"].get("coverage")) or {}).get("coverage") or {}
    measured = coverage.get("files") or {} if not coverage.get("error") else {}
    found = coverage_findings({"files": measured})
    unmeasured = [p for p in sources if p not in exempt and not (measured.get(p) or {}).get("measured")]
    if unmeasured:
        why = (coverage.get("error") or notes.get("coverageWhy")
               or ("coverage measures Python only" if not any(p.endswith(".py") for p in unmeasured)
                   else "coverage did not measure it"))
        files = [f for f in notes["files"] or [] if str(f[0]) in unmeasured or not is_source_path(str(f[0]))]
        found += untested_findings(files, notes["firstLines"], exempt, str(why))
    return found


def _run_said(run: dict[str, Any] | None, where: str) -> str:
    if run is None:
        return ""
    if run["timedOut"]:
        return f"at {where}: killed at its timeout"
    tests = tests_of(run) or {}
    if tests and not tests.get("ran"):
        told = f"no test ran ({tests.get('didNotRun')})"
    else:
        told = str(tests.get("summary") or "")
        if tests.get("source") == "junit":
            told += " (JUnit XML)"
    removed = tests.get("removedCount")
    if removed is not None:
        told += f", {removed} tests of the base not run at the head" if removed else ", no test removed"
    return f"at {where}: {told.strip(', ') + ', ' if told.strip(', ') else ''}exit code {run['exitCode']}"


def _files_said(notes: dict[str, Any]) -> str:
    names = [str(f[0]) for f in notes["files"] or []]
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return f"read {len(names)} changed files ({shown})"


def _automation_said(notes: dict[str, Any], test: dict[str, Any] | None) -> list[str]:
    runs = notes["runs"]
    parts = []
    if "compile" in runs:
        compiled = sum(1 for f in notes["files"] or [] if str(f[0]).endswith(".py") and int(f[1]) > 0)
        ok = "all compile" if runs["compile"]["exitCode"] == 0 else "a file does not compile"
        parts.append(f"py_compile on {compiled} changed Python files: {ok}")
    docs = docs_only(notes)
    if docs is not None:
        parts.append(f"the change touches documentation only ({', '.join(docs[:5])}): no test ran")
    elif test is None:
        parts.append("no test command found (pytest, unittest, go, cargo, npm, make test; or --test-cmd): "
                     "no test ran")
    elif compile_failed(notes):
        parts.append(f"`{shlex.join(str(a) for a in test['argv'])}` not run: the change does not compile")
    else:
        said = "; ".join(s for s in (_run_said(runs.get("head"), "head"), _run_said(runs.get("base"), "base"))
                         if s)
        parts.append(f"ran `{shlex.join(str(a) for a in test['argv'])}` {said}".rstrip())
    sandbox = next((r.get("sandbox") for r in runs.values() if r.get("sandbox")), None)
    if sandbox:
        parts.append(f"in the {sandbox} sandbox")
    return parts


def _strategy_said(notes: dict[str, Any]) -> list[str]:
    parts = []
    if notes["sameBehaviour"]:
        parts.append(f"{len(notes['sameBehaviour'])} changed files keep their AST once annotations, "
                     "docstrings and comments are stripped (no behaviour to test)")
    coverage = tests_of(notes["runs"].get("coverage"))
    measured = (coverage or {}).get("coverage") or {}
    files = measured.get("files") or {}
    if files and not measured.get("error"):
        statements = sum(int(e.get("statements") or 0) for e in files.values() if e.get("measured"))
        tested = sum(int(e.get("tested") or 0) for e in files.values() if e.get("measured"))
        parts.append(f"coverage of the head's tests: {tested} of the {statements} statements the change adds "
                     f"in {len(files)} Python files run in a test")
    elif notes.get("coverageWhy"):
        parts.append(f"coverage not measured: {notes['coverageWhy']}")
    return parts


def summary_of(agent: str, notes: dict[str, Any], test: dict[str, Any] | None) -> str:
    """What ``agent`` checked: its runs and their counts, the files, the rules."""
    parts: list[str] = []
    if agent == "qa_automation":
        parts += _automation_said(notes, test)
    elif agent == "qa_strategy":
        parts += _strategy_said(notes)
    if notes.get("unreadable"):
        parts.append(f"{len(notes['unreadable'])} diffs could not be read")
    if analyzers := review_analyze.said(notes):
        parts.append(analyzers)
    parts.append(_files_said(notes))
    parts.append("rules " + ", ".join(agents_rules(agent)))
    return "; ".join(parts)
