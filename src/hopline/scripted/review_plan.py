"""How the offline scripted model plays a gate agent, step by step (SPEC K-6). Pure: no I/O.

Every agent reads the changed files' list (``git_diff`` stat), then each file's diff, and the parts
of a long one that were cut (``read_file`` of the kept output, where ``_meta["hopline.cut"]`` says).
Then, by agent:

- ``qa_strategy`` reads each changed Python source file's diff with its whole file as context
  (``git_diff whole``: the tool says, from the whole file, whether its AST is the same once
  annotations, docstrings and comments are stripped: such a file has no behaviour to test), then
  runs the head's tests under coverage (``run_command coverage=true``): each run of added lines no
  test runs is ``untested-change`` at its first line; where coverage cannot run, the file-level rule
  (a source file changes and no test does) stays, as a warning saying why;
- ``qa_automation`` compiles the changed Python files (``run_command python -m py_compile``, in the
  sandbox); unless the change is documentation only or does not compile, runs the gate's test
  command at the head, and at the base when the head fails or the change touches tests; and reads
  what the runs showed (:mod:`hopline.scripted.review_checks`);
- ``appsec`` finds the symlinks the change adds that leave the repository (one finding each).

With the iterations the scripted hints leave, an agent then reads the changed files themselves.
What it found so far travels in its own answers as ``Review notes: {json}``, so it survives
compaction like a real model's notes. It ends with a verdict whose summary says what it checked.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from collections.abc import Callable, Iterable
from typing import Any

from hopline.harness.diffs import AddedLine, is_source_path, parse_diff, parse_numstat
from hopline.harness.rules import one_per_concern
from hopline.scripted import review, review_analyze
from hopline.scripted.review import Result
from hopline.scripted.review_checks import (
    automation_findings,
    compile_failed,
    docs_only,
    strategy_findings,
    summary_of,
    tests_of,
)
from hopline.vocabulary import META_COMMAND, META_CUT, META_DIFF, META_TESTS

_ONCE_PER_FILE = frozenset({"test-failure"})


@dataclasses.dataclass(frozen=True)
class Step:
    """One answer: ``calls`` to make (tool name, arguments), or the final ``content`` when empty."""

    content: str
    calls: list[tuple[str, dict[str, Any]]]


def _merge(findings: list[dict[str, Any]], new: Iterable[dict[str, Any]]) -> None:
    seen = {(f["rule"], f["file"], f["line"], f["message"]) for f in findings}
    once = {(f["rule"], f["file"]) for f in findings if f["rule"] in _ONCE_PER_FILE}
    for finding in new:
        key = (finding["rule"], finding["file"], finding["line"], finding["message"])
        if key in seen or (finding["rule"] in _ONCE_PER_FILE and (finding["rule"], finding["file"]) in once):
            continue
        seen.add(key)
        once.add((finding["rule"], finding["file"]))
        findings.append(finding)


_ANALYZER_NOTES = ("added", "addedError", "paging", "planned", "analyzers", "analyzerFindings", "links")


def _new_notes(agent: str, previous: dict[str, Any]) -> dict[str, Any]:
    kept = {k: previous[k] for k in _ANALYZER_NOTES if k in previous}
    if review_analyze.wants_analyzers(agent):
        review_analyze.start(kept)
    return {**kept, "agent": agent, "files": previous.get("files"), "read": list(previous.get("read") or []),
            "parts": list(previous.get("parts") or []), "findings": list(previous.get("findings") or []),
            "firstLines": dict(previous.get("firstLines") or {}), "whole": list(previous.get("whole") or []),
            "sameBehaviour": list(previous.get("sameBehaviour") or []),
            "runs": dict(previous.get("runs") or {}),
            "unreadable": list(previous.get("unreadable") or []),
            "coverageWhy": previous.get("coverageWhy")}


def _keep_cut(notes: dict[str, Any], result: Result, file: str) -> None:
    cut = result.meta.get(META_CUT)
    if isinstance(cut, dict) and isinstance(cut.get("path"), str) and str(cut["path"]).startswith("@output/"):
        notes["parts"].append({"path": cut["path"], "offset": int(cut["readOffset"]),
                               "limit": int(cut["cut"]),
                               "file": file})


def _fold_diff(agent: str, notes: dict[str, Any], result: Result) -> None:
    path = str(result.args.get("path") or "")
    if result.args.get("stat"):
        notes["files"] = [] if result.failed else parse_numstat(result.text)
        return
    if result.args.get("added"):
        review_analyze.fold_added(notes, result)
        return
    if result.args.get("whole"):
        notes["whole"].append(path)
        facts = result.meta.get(META_DIFF)  # compared by the tool on the whole file, before any cut
        if not result.failed and isinstance(facts, dict) and facts.get("sameBehaviour") is True:
            notes["sameBehaviour"].append(path)
        return
    if path and path not in notes["read"]:
        notes["read"].append(path)
    if result.failed:
        notes["unreadable"].append(path)
        return
    _fold_added(agent, notes, parse_diff(result.text))
    links = review.symlinks_added(result.text)
    if "links" in notes:  # the analyzers never read through a symlink
        notes["links"] = sorted({*notes["links"], *links})
    if agent == "appsec":
        _merge(notes["findings"], review.symlink_findings(links))
    _keep_cut(notes, result, path)


def _fold_added(agent: str, notes: dict[str, Any], added: list[AddedLine]) -> None:
    for entry in added:
        if entry.line is not None and is_source_path(entry.path):
            notes["firstLines"].setdefault(entry.path, entry.line)
    _merge(notes["findings"], review.line_findings(agent, added))


def _fold_part(agent: str, notes: dict[str, Any], result: Result) -> None:
    part = next((p for p in notes["parts"] if p["path"] == result.args.get("path")
                 and p["offset"] == result.args.get("offset")), None)
    notes["parts"] = [p for p in notes["parts"] if p is not part]
    if part is None or result.failed:
        return
    _fold_added(agent, notes, parse_diff(result.text, path=part["file"]))
    _keep_cut(notes, result, part["file"])


_EXIT_CODE_LINE = re.compile(r"\[exit code (-?\d+)\]\s*$")
_RUN_TEXT_KEPT = 8_000  # of a run's output, kept in the notes (the compile errors, a runner's last lines)


def _fold_run(notes: dict[str, Any], result: Result) -> None:
    command_line = str(result.args.get("command") or "")
    at_base = result.args.get("at") == "base"
    which = ("compile" if "py_compile" in command_line else "coverage" if result.args.get("coverage")
             else "base" if at_base else "head")
    found = result.meta.get(META_COMMAND)
    command: dict[str, Any] = found if isinstance(found, dict) else {}
    exit_code = command.get("exitCode")
    if exit_code is None and "exitCode" not in command:
        # A model behind an OpenAI-compatible provider sees the tool's text, not its _meta: the
        # text's last line says the exit code (``[exit code N]``, tools/commands.py).
        said = _EXIT_CODE_LINE.search(result.text[-200:])
        exit_code = int(said.group(1)) if said else None
    tests = result.meta.get(META_TESTS)
    if which == "coverage" and result.failed:  # the tool said why coverage cannot run this command
        notes["coverageWhy"] = result.text.removeprefix("error: ").removeprefix("coverage cannot run: ")[:300]
    notes["runs"][which] = {"text": result.text[-_RUN_TEXT_KEPT:], "failed": result.failed,
                            "exitCode": exit_code, "timedOut": command.get("timedOut"),
                            "sandbox": command.get("sandbox"),
                            "refused": command.get("refusedProcesses") or 0,  # by its process ceiling
                            "tests": tests if isinstance(tests, dict) else None}


def fold_results(agent: str, notes: dict[str, Any], results: list[Result]) -> None:
    """What the previous iteration's results add to the notes."""
    for result in results:
        if result.name == "git_diff":
            _fold_diff(agent, notes, result)
        elif result.name == "read_file" and str(result.args.get("path", "")).startswith("@output/"):
            if not ("paging" in notes and review_analyze.fold_page(notes, result)):
                _fold_part(agent, notes, result)
        elif result.name == "run_command":
            if review_analyze.wants_analyzers(agent):
                review_analyze.fold_run(notes, result)
            else:
                _fold_run(notes, result)


def _python_changed(notes: dict[str, Any]) -> list[str]:
    return [str(f[0]) for f in notes["files"] or [] if str(f[0]).endswith(".py") and int(f[1]) > 0]


def _python_sources(notes: dict[str, Any]) -> list[str]:
    """The Python source files (not tests) the change adds lines to."""
    return [p for p in _python_changed(notes) if is_source_path(p)]


def _run(command: str, at: str = "head", coverage: bool = False) -> tuple[str, dict[str, Any]]:
    args: dict[str, Any] = {"command": command}
    if at != "head":
        args["at"] = at
    if coverage:
        args["coverage"] = True
    return "run_command", args


def _automation_checks(notes: dict[str, Any],
                       test: dict[str, Any] | None) -> list[tuple[str, dict[str, Any]]]:
    """Compile the changed Python files; run the tests at the head (not for a change of documentation
    only, nor one that does not compile), and at the base when the head fails or the change can
    change which tests exist (to compare them)."""
    runs = notes["runs"]
    python = _python_changed(notes)
    if python and "compile" not in runs:
        return [_run(shlex.join(["python", "-m", "py_compile", *python]))]
    if test is None or docs_only(notes) is not None or compile_failed(notes):
        return []
    shown = shlex.join(str(a) for a in test["argv"])
    if "head" not in runs:
        return [_run(shown)]
    head = runs["head"]
    tests = tests_of(head)
    if "base" in runs or head["failed"] or head["timedOut"] or (tests is not None and not tests.get("ran")):
        return []
    compares = tests is not None and tests.get("namesTests") and review.touches_tests(
        str(f[0]) for f in notes["files"] or [])
    return [_run(shown, "base")] if head["exitCode"] != 0 or compares else []


def _strategy_checks(notes: dict[str, Any], test: dict[str, Any] | None,
                     count: int) -> list[tuple[str, dict[str, Any]]]:
    """Each changed Python source file's whole diff (is its behaviour the same?), then the head's
    tests under coverage for the others."""
    sources = _python_sources(notes)
    todo = [p for p in sources if p not in notes["whole"]]
    if todo:
        return [("git_diff", {"path": p, "whole": True}) for p in todo[:count]]
    left = [p for p in sources if p not in notes["sameBehaviour"]]
    if not left or "coverage" in notes["runs"] or notes["coverageWhy"]:
        return []
    if test is None:
        notes["coverageWhy"] = "no test command to run"
        return []
    return [_run(shlex.join(str(a) for a in test["argv"]), coverage=True)]


def _checks(agent: str, notes: dict[str, Any], test: dict[str, Any] | None,
            count: int) -> list[tuple[str, dict[str, Any]]]:
    """The agent's own checks still to make once the diffs are read (see the module docstring)."""
    if agent == "qa_strategy":
        return _strategy_checks(notes, test, count)
    if review_analyze.wants_analyzers(agent):
        review_analyze.plan(agent, notes, notes.get("links") or [])
        return review_analyze.calls(notes, count)
    if agent == "qa_automation":
        return _automation_checks(notes, test)
    return []


def review_step(agent: str, messages: list[dict[str, Any]], tools: set[Any], *, per_iteration: int,
                iteration: int, explore_until: int, pick: Callable[[list[str]], str]) -> Step:
    """The next answer of ``agent`` reviewing the change (``pick(seq)`` chooses deterministically)."""
    notes = _new_notes(agent, review.latest_notes(messages) or {})
    fold_results(agent, notes, review.last_results(messages))
    count = max(1, per_iteration)
    if "git_diff" not in tools:
        return Step(review.verdict_text(agent, "error", [],
                                        "no git_diff tool: the change could not be read"), [])
    prompt = next((review.message_text(m) for m in reversed(messages) if m.get("role") == "user"
                   and review.gate_agent_of(review.message_text(m))), "")
    test = review.test_command_of(prompt)
    calls: list[tuple[str, dict[str, Any]]] = []
    if notes["files"] is None:
        calls = [("git_diff", {"stat": True})]
        if review_analyze.wants_analyzers(agent):
            calls.append(("git_diff", {"added": True}))
    elif notes["parts"]:
        calls = [("read_file", {"path": p["path"], "offset": p["offset"], "limit": p["limit"]})
                 for p in notes["parts"][:count]]
    elif unread := [str(f[0]) for f in notes["files"] if str(f[0]) not in notes["read"]]:
        calls = [("git_diff", {"path": p}) for p in unread[:count]]
    elif checks := _checks(agent, notes, test, count):
        calls = checks if "run_command" in tools or checks[0][0] != "run_command" else []
    elif iteration <= explore_until and notes["files"] and "read_file" in tools:
        # Deeper reading of what changed, the largest first (the test logs): outputs near the cap.
        changed = sorted(notes["files"], key=lambda f: -int(f[1]))
        paths = [str(f[0]) for f in changed if int(f[1]) > 0] or [str(changed[0][0])]
        calls = [("read_file", {"path": pick(paths), "offset": 0}) for _ in range(count)]
    if calls:
        return Step(review.NOTES_PREFIX + json.dumps(notes, separators=(",", ":")), calls)
    return _verdict(agent, notes, test)


def _verdict(agent: str, notes: dict[str, Any], test: dict[str, Any] | None) -> Step:
    if not notes["files"]:
        return Step(review.verdict_text(agent, "pass", [], "the change is empty: nothing to review"), [])
    findings = list(notes["findings"])
    if agent == "qa_strategy":
        _merge(findings, strategy_findings(notes))
    error: str | None = None
    analyzers: list[dict[str, Any]] | None = None
    if agent == "qa_automation":
        found, error = automation_findings(notes, test)
        _merge(findings, found)
    if review_analyze.wants_analyzers(agent):
        findings = one_per_concern([*findings, *notes.get("analyzerFindings", [])])
        error, analyzers = review_analyze.error_of(notes), review_analyze.ran(notes)
    summary = summary_of(agent, notes, test)
    if error is not None:
        return Step(review.verdict_text(agent, "error", findings, f"{error}; {summary}", analyzers), [])
    verdict = "fail" if any(f["severity"] == "error" for f in findings) else "pass"
    return Step(review.verdict_text(agent, verdict, findings, summary, analyzers), [])

