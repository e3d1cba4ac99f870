"""Reviewing a diff deterministically: how the offline scripted model plays the four gate agents and
the dev agent that fixes their findings (the gate workflow of ADR 0098). Pure: no I/O.

A gate prompt starts with :data:`GATE_REVIEW_MARKER` and names its agent; a fix prompt starts with
:data:`FIX_MARKER` and carries the findings as JSON. The rules, one per gate agent's domain:

============================  ==========================  ========  ===================================
rule                          agent                       severity  what, in the lines the change adds
============================  ==========================  ========  ===================================
``test-failure``              ``qa_automation``           error     a failing test in a test log (*.log)
``unsafe-eval``               ``qa_performance_security`` error     ``eval(`` / ``exec(`` in source code
``untested-change``           ``qa_strategy``             error     a changed source file, no test changed
``todo-added``                ``qa_strategy``             warning   a ``TODO`` / ``FIXME``
``hardcoded-credential``      ``appsec``                  error     an AWS key id, ``password = "..."``
============================  ==========================  ========  ===================================

The review reads the changed files' list (``git_diff`` stat), then each file's diff, and the parts
of a long one that were cut (``read_file`` of the kept output, as the cut marker says); with the
iterations the scripted hints leave it reads the changed files themselves (the large test logs).
What it has found so far travels in its own answers as ``Review notes: {json}`` (and in the
compaction summary, which keeps the latest notes), so it survives compaction like a real model's
notes. It ends with a verdict: ``fail`` when a finding is an error, else ``pass``.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable
from pathlib import PurePosixPath
from typing import Any

GATE_REVIEW_MARKER = "hopline gate review"
FIX_MARKER = "hopline gate fix"
NOTES_PREFIX = "Review notes: "
# The gate prompt's first line: "hopline gate review · agent <name> · base <sha> · head <sha>".
_GATE_HEADER_RE = re.compile(r"^" + re.escape(GATE_REVIEW_MARKER) + r" · agent ([a-z_]+)\b", re.MULTILINE)
_FENCED_JSON_RE = re.compile(r"```json\s*\n(.*?)\n```", re.DOTALL)
_HUNK_RE = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,\d+)? @@")
# The cut markers of hopline's tool results (harness.tools): where the rest of an output is kept.
_KEPT_OUTPUT_RE = re.compile(r"read_file path='(@output/[^']+)' offset=(\d+) limit=(\d+)")
_CUT_PART_RE = re.compile(r"Read the cut part with read_file path='(@output/[^']+)' offset=(\d+) limit=(\d+)")
_CAP_MARKER = "[hopline: "

SOURCE_SUFFIXES = frozenset({".py", ".js", ".ts", ".tsx", ".jsx", ".go", ".rs", ".java", ".rb", ".php",
                             ".c", ".cc", ".cpp", ".h", ".hpp", ".cs", ".kt", ".swift", ".sh", ".ex",
                             ".exs"})
LOG_SUFFIXES = frozenset({".log"})


def is_test_path(path: str) -> bool:
    parts = PurePosixPath(path).parts
    name = parts[-1] if parts else ""
    return (any(p in ("tests", "test", "spec", "__tests__") for p in parts[:-1])
            or name.startswith("test_") or bool(re.search(r"[._-](test|spec)\.[a-z]+$", name)))


def is_source_path(path: str) -> bool:
    return PurePosixPath(path).suffix in SOURCE_SUFFIXES and not is_test_path(path)


def is_log_path(path: str) -> bool:
    return PurePosixPath(path).suffix in LOG_SUFFIXES


@dataclasses.dataclass(frozen=True)
class LineRule:
    """A rule over the lines a change adds: ``applies`` to a path, ``pattern`` finds the issue."""

    rule: str
    agent: str
    severity: str
    pattern: re.Pattern[str]
    message: str
    applies: str  # "source", "text" (not a log) or "log"

    def covers(self, path: str) -> bool:
        if self.applies == "source":
            return is_source_path(path)
        if self.applies == "log":
            return is_log_path(path)
        return not is_log_path(path)


LINE_RULES: tuple[LineRule, ...] = (
    LineRule("test-failure", "qa_automation", "error", re.compile(r"\bFAILED\b"),
             "a test fails in this test log: {text}", "log"),
    LineRule("unsafe-eval", "qa_performance_security", "error", re.compile(r"(?<![\w.])(?:eval|exec)\("),
             "{match} runs text as code: unsafe with any input it does not fully control", "source"),
    LineRule("todo-added", "qa_strategy", "warning", re.compile(r"\b(?:TODO|FIXME)\b"),
             "the change adds a {match}: unfinished work ships with it", "text"),
    LineRule("hardcoded-credential", "appsec", "error",
             re.compile(r"\bAKIA[0-9A-Z]{16}\b|(?i:\bpassword)\s*=\s*['\"][^'\"]+['\"]"),
             "a hard-coded credential ({kind}): read it from the environment or a secret store", "text"),
)
UNTESTED_RULE = "untested-change"  # qa_strategy, error: a file-level rule (the changed files' list)
GATE_AGENTS: tuple[str, ...] = ("qa_automation", "qa_performance_security", "qa_strategy", "appsec")
# A test log's failures make one finding per log (its first failure), not one per failing line.
_ONCE_PER_FILE = frozenset({"test-failure"})


@dataclasses.dataclass(frozen=True)
class AddedLine:
    path: str
    line: int | None  # in the new file; None in a cut part read without its hunk header
    text: str


def parse_diff(text: str, *, path: str | None = None) -> list[AddedLine]:
    """The lines a unified diff adds, with their new-file line numbers where the hunk header is seen.

    ``path`` names the file of a piece read without its ``diff --git`` header (a cut part); a cap
    marker inside the text loses the line count until the next hunk header."""
    out: list[AddedLine] = []
    current = path
    line: int | None = None
    for raw in text.splitlines():
        if raw.startswith("diff --git "):
            current, line = None, None
        elif raw.startswith("+++ "):
            target = raw[4:].strip()
            current = None if target == "/dev/null" else (target[2:] if target.startswith("b/") else target)
        elif raw.startswith("--- ") and line is None:
            continue
        elif (match := _HUNK_RE.match(raw)) is not None:
            line = int(match.group(1))
        elif raw.startswith(_CAP_MARKER) or raw.startswith("[file continues"):
            line = None
        elif raw.startswith("+"):
            if current is not None:
                out.append(AddedLine(current, line, raw[1:]))
            if line is not None:
                line += 1
        elif raw.startswith(" ") and line is not None:
            line += 1
    return out


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
            match = rule.pattern.search(entry.text)
            if match is None or (rule.rule in _ONCE_PER_FILE and (rule.rule, entry.path) in once):
                continue
            once.add((rule.rule, entry.path))
            kind = "an AWS access key id" if match.group(0).startswith("AKIA") else "a password"
            message = rule.message.format(match=match.group(0).rstrip("("), kind=kind, text=_clip(entry.text))
            found.append({"severity": rule.severity, "file": entry.path, "line": entry.line,
                          "rule": rule.rule, "message": message})
    return found


def untested_findings(files: list[list[Any]], first_lines: dict[str, int]) -> list[dict[str, Any]]:
    """qa_strategy's file rule: source files the change adds lines to while it changes no test."""
    paths = [str(f[0]) for f in files]
    if any(is_test_path(p) for p in paths):
        return []
    return [{"severity": "error", "file": p, "line": first_lines.get(p), "rule": UNTESTED_RULE,
             "message": "this source file changes and no test does: the change is not covered"}
            for p, added in ((str(f[0]), int(f[1])) for f in files) if added > 0 and is_source_path(p)]


def parse_numstat(text: str) -> list[list[Any]]:
    """``git diff --numstat`` lines as ``[path, added, removed]`` (binary files count 0)."""
    files: list[list[Any]] = []
    for raw in text.splitlines():
        parts = raw.split("\t")
        if len(parts) != 3 or not (parts[0].isdigit() or parts[0] == "-"):
            continue
        path = parts[2]
        if " => " in path:  # a rename: the new name ("{a => b}/c" or "a => b")
            path = re.sub(r"\{[^{}]* => ([^{}]*)\}", r"\1", path)
            path = path.split(" => ")[-1].replace("//", "/")
        files.append([path, int(parts[0]) if parts[0].isdigit() else 0,
                      int(parts[1]) if parts[1].isdigit() else 0])
    return files


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


def last_results(messages: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any], str]]:
    """The previous iteration's calls with their results: ``(tool name, arguments, result text)``."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        calls = message.get("tool_calls") if message.get("role") == "assistant" else None
        if not calls:
            continue
        results = {m.get("tool_call_id"): message_text(m) for m in messages[index + 1:]
                   if m.get("role") == "tool"}
        out: list[tuple[str, dict[str, Any], str]] = []
        for call in calls:
            fn = call.get("function") or {}
            try:
                args = json.loads(fn.get("arguments") or "{}")
            except ValueError:
                args = {}
            out.append((str(fn.get("name")), args if isinstance(args, dict) else {},
                        results.get(call.get("id"), "")))
        return out
    return []


# --- the gate agent's plan ------------------------------------------------------------------------


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


def _fold_results(agent: str, notes: dict[str, Any], results: list[tuple[str, dict[str, Any], str]]) -> None:
    """What the previous iteration's results add to the notes: the file list, findings, cut parts."""
    for name, args, text in results:
        if text.startswith("error:"):
            if name == "git_diff" and args.get("stat") and notes["files"] is None:
                notes["files"] = []  # no diff to read: the verdict says so
            continue
        kept = None
        if name == "git_diff" and args.get("stat"):
            notes["files"] = parse_numstat(text)
            continue
        if name == "git_diff":
            path = str(args.get("path") or "")
            if path and path not in notes["read"]:
                notes["read"].append(path)
            added = parse_diff(text)
            kept = _KEPT_OUTPUT_RE.search(text)
        elif name == "read_file" and str(args.get("path", "")).startswith("@output/"):
            part = next((p for p in notes["parts"] if p["path"] == args.get("path")), None)
            added = parse_diff(text, path=part["file"] if part else None)
            kept = _CUT_PART_RE.search(text)
        else:
            continue
        for entry in added:
            if entry.line is not None and is_source_path(entry.path):
                notes["firstLines"].setdefault(entry.path, entry.line)
        _merge(notes["findings"], line_findings(agent, added))
        if name == "read_file":
            notes["parts"] = [p for p in notes["parts"] if p["path"] != args.get("path")
                              or p["offset"] != args.get("offset")]
        if kept is not None:
            file = str(args.get("path") or "") if name == "git_diff" else (part["file"] if part else "")
            notes["parts"].append({"path": kept.group(1), "offset": int(kept.group(2)),
                                   "limit": int(kept.group(3)), "file": file})


def review_step(agent: str, messages: list[dict[str, Any]], tools: set[Any], *, per_iteration: int,
                iteration: int, explore_until: int, pick: Any) -> Step:
    """The next answer of ``agent`` reviewing the change (``pick(seq)`` chooses deterministically)."""
    notes = latest_notes(messages) or {}
    notes = {"agent": agent, "files": notes.get("files"), "read": list(notes.get("read") or []),
             "parts": list(notes.get("parts") or []), "findings": list(notes.get("findings") or []),
             "firstLines": dict(notes.get("firstLines") or {})}
    _fold_results(agent, notes, last_results(messages))
    count = max(1, per_iteration)
    calls: list[tuple[str, dict[str, Any]]] = []
    if "git_diff" not in tools:
        return Step(verdict_text(agent, "error", [], "no git_diff tool: the change could not be read"), [])
    if notes["files"] is None:
        calls = [("git_diff", {"stat": True})]
    elif notes["parts"]:
        calls = [("read_file", {"path": p["path"], "offset": p["offset"], "limit": p["limit"]})
                 for p in notes["parts"][:count]]
    else:
        unread = [str(f[0]) for f in notes["files"] if str(f[0]) not in notes["read"]]
        if unread:
            calls = [("git_diff", {"path": p}) for p in unread[:count]]
        elif iteration <= explore_until and notes["files"] and "read_file" in tools:
            # Deeper reading of what changed, the largest first (the test logs): outputs near the cap.
            changed = sorted(notes["files"], key=lambda f: -int(f[1]))
            paths = [str(f[0]) for f in changed if int(f[1]) > 0] or [str(changed[0][0])]
            calls = [("read_file", {"path": pick(paths), "offset": 0}) for _ in range(count)]
    if calls:
        return Step(NOTES_PREFIX + json.dumps(notes, separators=(",", ":")), calls)
    findings = list(notes["findings"])
    if agent == "qa_strategy":
        _merge(findings, untested_findings(notes["files"] or [], notes["firstLines"]))
    if not notes["files"]:
        return Step(verdict_text(agent, "pass", [], "the change is empty: nothing to review"), [])
    verdict = "fail" if any(f["severity"] == "error" for f in findings) else "pass"
    return Step(verdict_text(agent, verdict, findings,
                             f"reviewed {len(notes['files'])} changed files"), [])


def verdict_text(agent: str, verdict: str, findings: list[dict[str, Any]], summary: str) -> str:
    """A final answer with the verdict as a fenced JSON object (what a gate run parses)."""
    errors = sum(1 for f in findings if f.get("severity") == "error")
    body = json.dumps({"verdict": verdict, "summary": summary, "findings": findings}, indent=1)
    return (f"Gate {agent}: {verdict} — {errors} error and {len(findings) - errors} other findings; "
            f"{summary}.\n\n```json\n{body}\n```")


# --- the dev agent's fix ---------------------------------------------------------------------------

# Rules a fix removes the offending line for; an untested change gets a test; a failing test log is
# left for a real test run.
_LINE_FIXES = frozenset({"unsafe-eval", "todo-added", "hardcoded-credential"})
_RULES_BY_ID = {r.rule: r for r in LINE_RULES}


def _test_for(path: str) -> tuple[str, str]:
    stem = re.sub(r"\W", "_", PurePosixPath(path).stem)
    test = f"tests/test_{stem}_gate.py"
    body = (f'"""Written by the dev agent after the gate: {path} changed with no test."""\n\n'
            "import importlib.util\nfrom pathlib import Path\n\n\n"
            f"def test_{stem}_loads() -> None:\n"
            f"    path = Path(__file__).resolve().parents[1] / {path!r}\n"
            f"    spec = importlib.util.spec_from_file_location({stem!r}, path)\n"
            "    assert spec is not None and spec.loader is not None\n")
    return test, body


def fix_step(findings: list[dict[str, Any]], messages: list[dict[str, Any]], tools: set[Any]) -> Step:
    """The dev agent's next answer: read the files with line findings, write them without the
    flagged lines (and a test for each untested file), then say what was fixed and what was not."""
    fixable = [f for f in findings if f.get("rule") in _LINE_FIXES and isinstance(f.get("file"), str)]
    files = sorted({str(f["file"]) for f in fixable})
    results = last_results(messages)
    done = any(name == "write_file" for name, _, _ in results)
    if done or "write_file" not in tools:
        written = [str(a.get("path")) for n, a, t in results if n == "write_file" and t.startswith("wrote")]
        left = [f for f in findings if f.get("rule") not in _LINE_FIXES | {UNTESTED_RULE}]
        return Step(f"Fixed the findings in {len(written)} files ({', '.join(written) or 'none'}); "
                    f"{len(left)} findings need more than an edit (a failing test needs a test run).", [])
    read = {str(a.get("path")): t for n, a, t in results if n == "read_file"}
    if files and not read:
        return Step("Reading the files with findings.", [("read_file", {"path": p}) for p in files])
    writes: list[tuple[str, dict[str, Any]]] = []
    for path in files:
        text = read.get(path, "")
        if not text or text.startswith("error:") or _CAP_MARKER in text or "[file continues" in text:
            continue  # cut or unreadable: never write back a partial file
        flagged = [f for f in fixable if f["file"] == path]
        lines = text.splitlines(keepends=True)
        drop = {int(f["line"]) for f in flagged if isinstance(f.get("line"), int)}
        patterns = [_RULES_BY_ID[str(f["rule"])].pattern for f in flagged
                    if not isinstance(f.get("line"), int)]
        kept = [line for number, line in enumerate(lines, 1)
                if number not in drop and not any(p.search(line) for p in patterns)]
        writes.append(("write_file", {"path": path, "content": "".join(kept)}))
    for path in sorted({str(f["file"]) for f in findings if f.get("rule") == UNTESTED_RULE}):
        test, body = _test_for(path)
        writes.append(("write_file", {"path": test, "content": body}))
    if not writes:
        return Step("Nothing I can fix by editing: the findings need a test run.", [])
    return Step("Writing the fixes.", writes)
