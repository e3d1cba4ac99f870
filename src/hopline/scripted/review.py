"""Reviewing a diff deterministically: the rules and readers the offline scripted model plays the
four gate agents with (SPEC K-6; the steps are :mod:`hopline.scripted.review_plan`, the dev agent's
fix :mod:`hopline.scripted.review_fix`). Pure: no I/O.

A gate prompt starts with :data:`GATE_REVIEW_MARKER` and names its agent, its second line the test
command (:data:`TEST_COMMAND_MARKER`); a fix prompt starts with :data:`FIX_MARKER` and carries the
findings as JSON. Each rule's agent, severity and meaning are the severity table's
(:mod:`hopline.harness.rules`).

What a tool result says for a program (where it was cut, how a command ended) is read from the tool
message's ``_meta`` (:class:`Result`), never parsed out of the English a model reads.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
import re
from collections.abc import Iterable
from pathlib import PurePosixPath
from typing import Any

from hopline.harness.diffs import AddedLine, is_source_path, is_test_path
from hopline.harness.rules import rule_of
from hopline.vocabulary import FIX_MARKER, GATE_AGENTS, GATE_REVIEW_MARKER, MESSAGE_META, TEST_COMMAND_MARKER

NOTES_PREFIX = "Review notes: "
# The gate prompt's first line: "hopline gate review · agent <name> · base <sha> · head <sha>".
_GATE_HEADER_RE = re.compile(r"^" + re.escape(GATE_REVIEW_MARKER) + r" · agent ([a-z_]+)\b", re.MULTILINE)
_FENCED_JSON_RE = re.compile(r"```json\s*\n(.*?)\n```", re.DOTALL)
# The second line of a gate prompt: the test command as JSON ({"argv": [...], "file": ...} or null).
_TEST_COMMAND_RE = re.compile(r"^" + re.escape(TEST_COMMAND_MARKER) + r" (.*)$", re.MULTILINE)

LOG_SUFFIXES = frozenset({".log"})
# What a documentation-only change touches (a pull request of only these runs no test): prose by its
# suffix, and the usual top-level notices by their name.
DOC_SUFFIXES = frozenset({".md", ".markdown", ".rst", ".adoc", ".asciidoc"})
DOC_NAMES = frozenset({"LICENSE", "LICENCE", "COPYING", "NOTICE", "AUTHORS", "CONTRIBUTORS", "CHANGELOG",
                       "CHANGES", "HISTORY"})
# Files besides the tests whose change can add, drop or skip tests: the test ids are compared.
TEST_CONFIGS = frozenset({"conftest.py", "pytest.ini", "pyproject.toml", "setup.cfg", "tox.ini"})


def is_log_path(path: str) -> bool:
    return PurePosixPath(path).suffix in LOG_SUFFIXES


# String literals (their quotes kept, their text blanked) and comments, by the comment syntax of a
# file's language: what a line rule never matches inside.
_STRING = r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`(?:\\.|[^`\\])*`'
_HASH_COMMENT = re.compile(_STRING + r"|#.*$")
_SLASH_COMMENT = re.compile(_STRING + r"|//.*$|/\*.*?(?:\*/|$)")
_HASH_COMMENT_SUFFIXES = frozenset({".py", ".sh", ".rb", ".ex", ".exs"})


def code_of(path: str, text: str) -> str:
    """``text`` (one line of ``path``) with its comments dropped and its string literals emptied."""
    pattern = _HASH_COMMENT if PurePosixPath(path).suffix in _HASH_COMMENT_SUFFIXES else _SLASH_COMMENT

    def blank(match: re.Match[str]) -> str:
        found = match.group(0)
        return found[0] * 2 if found[0] in "\"'`" else ""

    return pattern.sub(blank, text)


def is_doc_path(path: str) -> bool:
    name = PurePosixPath(path).name
    return PurePosixPath(path).suffix.lower() in DOC_SUFFIXES or name.split(".", 1)[0] in DOC_NAMES


def touches_tests(paths: Iterable[str]) -> bool:
    """Whether a change to ``paths`` can change which tests exist (a test file, a test configuration)."""
    return any(is_test_path(p) or PurePosixPath(p).name in TEST_CONFIGS for p in paths)


@dataclasses.dataclass(frozen=True)
class LineRule:
    """A rule over the lines a change adds: ``applies`` to a path, ``pattern`` finds the issue (in
    the line's code only, for ``code``: no comment, no string's text); its agent and severity are
    the severity table's (:mod:`hopline.harness.rules`)."""

    rule: str
    pattern: re.Pattern[str]
    message: str
    applies: str  # "source" (not Python: ruff reads Python), "python", "text" (not a log) or "log"
    code: bool = False

    @property
    def agent(self) -> str:
        return rule_of(self.rule).agent

    @property
    def severity(self) -> str:
        return rule_of(self.rule).severity

    def covers(self, path: str) -> bool:
        if self.applies == "source":
            return is_source_path(path) and PurePosixPath(path).suffix != ".py"
        if self.applies == "python":
            return PurePosixPath(path).suffix == ".py"
        if self.applies == "log":
            return is_log_path(path)
        return not is_log_path(path)

    def search(self, path: str, text: str) -> re.Match[str] | None:
        return self.pattern.search(code_of(path, text) if self.code else text)


_DIGEST_NAME = r"(?:[\w.]*\.(?:hex)?digest\(\)|\b\w*(?:signature|digest|hmac)\w*\b|\b(?:\w+_)?mac\b)"
_NOT_A_VALUE = r"(?!\s*(?:None|True|False|\d|\"\"|\'\'|$))"
LINE_RULES: tuple[LineRule, ...] = (
    LineRule("test-failure", re.compile(r"\bFAILED\b"), "a test fails in this test log: {text}", "log"),
    LineRule("unsafe-eval", re.compile(r"(?<![\w.$])(?:eval|exec)\("),
             "{match} runs text as code: unsafe with any input it does not fully control", "source", True),
    LineRule("timing-unsafe-compare",
             re.compile(_DIGEST_NAME + r"\s*[!=]=" + _NOT_A_VALUE + r"|(?<![!=<>])[!=]=\s*" + _DIGEST_NAME),
             "{match}: a digest compared with == or != leaks, by its time, how much of a forged value is "
             "right: compare with hmac.compare_digest", "python", True),
    LineRule("todo-added", re.compile(r"\b(?:TODO|FIXME)\b"),
             "the change adds a {match}: unfinished work ships with it", "text"),
)
# qa_strategy: added lines of source code no test runs (error, by coverage); where coverage cannot
# run, a changed source file with no changed test (warning, saying why)
UNTESTED_RULE = "untested-change"
SYMLINK_RULE = "symlink-escape"  # appsec, error: a symlink the change adds that points out of the repo
COMPILE_RULE = "compile-error"  # qa_automation, error: a changed source file that does not compile
TEST_RULE = "test-failed"  # qa_automation: a test the test command ran failed (error; warning at base too)
TEST_COMMAND_RULE = "test-command-failed"  # qa_automation: the test command failed, no test named
NO_TESTS_RULE = "tests-did-not-run"  # qa_automation, error: the test command ran no test at the head
REMOVED_RULE = "test-removed"  # qa_automation: a base test gone or skipped (error with a source change)
PROCESS_LIMIT_RULE = "process-limit"  # qa_automation, error: the sandbox refused a run's new processes
# A test log's failures make one finding per log (its first failure), not one per failing line.
_ONCE_PER_FILE = frozenset({"test-failure"})


def _clip(text: str, chars: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= chars else text[:chars - 1] + "…"


def line_findings(agent: str, added: Iterable[AddedLine]) -> list[dict[str, Any]]:
    """Findings of ``agent``'s line rules in ``added`` (the schema of a gate verdict's findings)."""
    rules = [r for r in LINE_RULES if r.agent == agent]
    found: list[dict[str, Any]] = []
    once: set[tuple[str, str]] = set()
    for entry in added:
        for rule in rules:
            if not rule.covers(entry.path):
                continue
            match = rule.search(entry.path, entry.text)
            if match is None or (rule.rule in _ONCE_PER_FILE and (rule.rule, entry.path) in once):
                continue
            once.add((rule.rule, entry.path))
            message = rule.message.format(match=match.group(0).strip().rstrip("("), text=_clip(entry.text))
            found.append({"severity": rule.severity, "file": entry.path, "line": entry.line,
                          "rule": rule.rule, "message": message})
    return found


def untested_findings(files: list[list[Any]], first_lines: dict[str, int], same_behaviour: Iterable[str] = (),
                      why: str = "") -> list[dict[str, Any]]:
    """qa_strategy's rule where coverage cannot run (``why``): a warning for each source file the
    change adds lines to while it changes no test, less those whose AST is the same once
    annotations, docstrings and comments are stripped."""
    paths = [str(f[0]) for f in files]
    if any(is_test_path(p) for p in paths):
        return []
    exempt = set(same_behaviour)
    files = [f for f in files if str(f[0]) not in exempt]
    because = f" (coverage could not tell which lines: {why})" if why else ""
    return [{"severity": "warning", "file": p, "line": first_lines.get(p), "rule": UNTESTED_RULE,
             "message": f"this source file changes and no test does{because}"}
            for p, added in ((str(f[0]), int(f[1])) for f in files) if added > 0 and is_source_path(p)]


def coverage_findings(coverage: dict[str, Any]) -> list[dict[str, Any]]:
    """qa_strategy's rule by coverage: an error at each run of added source lines no test runs."""
    found = []
    for path, entry in sorted((coverage.get("files") or {}).items()):
        for first, last in entry.get("untested") or [] if entry.get("measured") else []:
            span = f"line {first}" if first == last else f"lines {first}-{last}"
            found.append({"severity": "error", "file": path, "line": first, "rule": UNTESTED_RULE,
                          "message": f"no test runs {span}, which this change adds (coverage of the head's "
                                     "tests)"})
    return found


def symlinks_added(text: str) -> dict[str, str]:
    """The symlinks a diff adds or changes (mode 120000): path -> the target it points to."""
    links: dict[str, str] = {}
    current: str | None = None
    link = False
    for raw in text.splitlines():
        if raw.startswith("diff --git "):
            current, link = None, False
        elif raw.startswith(("new file mode 120000", "new mode 120000")):
            link = True
        elif raw.startswith("+++ ") and raw[4:].strip() != "/dev/null":
            target = raw[4:].strip()
            current = target[2:] if target.startswith("b/") else target
        elif link and current is not None and raw.startswith("+") and not raw.startswith("+++"):
            links[current] = raw[1:]
    return links


def leaves_repository(path: str, target: str) -> bool:
    """Whether a symlink at ``path`` pointing to ``target`` resolves outside the repository."""
    if target.startswith("/") or target.startswith("~"):
        return True
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    return joined == ".." or joined.startswith("../")


def symlink_findings(links: dict[str, str]) -> list[dict[str, Any]]:
    """appsec's finding for each symlink that leaves the repository: one per link."""
    return [{"severity": "error", "file": path, "line": 1, "rule": SYMLINK_RULE,
             "message": f"this symlink leaves the repository (it points to {_clip(target, 200)}): a "
                        f"checkout, "
                        "a build or a test that follows it reads or writes outside the repository"}
            for path, target in sorted(links.items()) if leaves_repository(path, target)]


# --- the conversation: prompts, notes -------------------------------------------------------------


def message_text(message: dict[str, Any]) -> str:
    """The text of a chat message's content (a string, or its text parts joined)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def gate_agent_of(prompt: str) -> str | None:
    """The gate agent a gate prompt names, or None when ``prompt`` is not a gate prompt."""
    match = _GATE_HEADER_RE.search(prompt)
    return match.group(1) if match and match.group(1) in GATE_AGENTS else None


def fix_findings_of(prompt: str) -> list[dict[str, Any]] | None:
    """The findings a fix prompt carries (its fenced JSON), or None when it is not a fix prompt."""
    if not prompt.startswith(FIX_MARKER):
        return None
    match = _FENCED_JSON_RE.search(prompt)
    try:
        value = json.loads(match.group(1)) if match else None
    except ValueError:
        return []
    return [f for f in value if isinstance(f, dict)] if isinstance(value, list) else []


def json_after(text: str, prefix: str) -> dict[str, Any] | None:
    """The JSON object right after the last ``prefix`` in ``text``, if it parses."""
    at = text.rfind(prefix)
    if at < 0:
        return None
    try:
        value, _ = json.JSONDecoder().raw_decode(text, at + len(prefix))
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def latest_notes(messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The newest review notes: in an answer of the model, or kept by a compaction summary."""
    for message in reversed(messages):
        if message.get("role") in ("assistant", "user"):
            notes = json_after(message_text(message), NOTES_PREFIX)
            if notes is not None:
                return notes
    return None


def notes_line(text: str) -> str | None:
    """``Review notes: {...}`` of the newest notes in a transcript, for a summary to keep."""
    notes = json_after(text, NOTES_PREFIX)
    return NOTES_PREFIX + json.dumps(notes, separators=(",", ":")) if notes is not None else None


def test_command_of(prompt: str) -> dict[str, Any] | None:
    """The test command a gate prompt names (``{"argv": [...], "file": ...}``), or None."""
    match = _TEST_COMMAND_RE.search(prompt)
    try:
        value = json.loads(match.group(1)) if match else None
    except ValueError:
        return None
    return value if isinstance(value, dict) and isinstance(value.get("argv"), list) else None


@dataclasses.dataclass(frozen=True)
class Result:
    """One call of the previous iteration and its result: the text a model reads, the _meta a
    program reads (where it was cut, how a command ended)."""

    name: str
    args: dict[str, Any]
    text: str
    meta: dict[str, Any]

    @property
    def failed(self) -> bool:
        return bool(self.meta.get("hopline.error")) or self.text.startswith("error:")


def last_results(messages: list[dict[str, Any]]) -> list[Result]:
    """The previous iteration's calls with their results."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        calls = message.get("tool_calls") if message.get("role") == "assistant" else None
        if not calls:
            continue
        results = {m.get("tool_call_id"): m for m in messages[index + 1:] if m.get("role") == "tool"}
        out: list[Result] = []
        for call in calls:
            fn = call.get("function") or {}
            try:
                args = json.loads(fn.get("arguments") or "{}")
            except ValueError:
                args = {}
            result = results.get(call.get("id")) or {}
            meta = result.get(MESSAGE_META)
            out.append(Result(str(fn.get("name")), args if isinstance(args, dict) else {},
                              message_text(result),
                              meta if isinstance(meta, dict) else {}))
        return out
    return []


def verdict_text(agent: str, verdict: str, findings: list[dict[str, Any]], summary: str,
                 analyzers: list[dict[str, Any]] | None = None) -> str:
    """A final answer with the verdict as a fenced JSON object (what a gate run parses)."""
    errors = sum(1 for f in findings if f.get("severity") == "error")
    value: dict[str, Any] = {"verdict": verdict, "summary": summary, "findings": findings}
    if analyzers is not None:
        value["analyzers"] = analyzers
    body = json.dumps(value, indent=1)
    return (f"Gate {agent}: {verdict} — {errors} error and {len(findings) - errors} other findings; "
            f"{summary}.\n\n```json\n{body}\n```")
