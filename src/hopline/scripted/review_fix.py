"""How the offline scripted model plays the dev agent that fixes a gate's findings (``--fix``).
Pure: no I/O.

It reads the files with line findings and writes them back without the flagged lines (a finding
without a line: the lines its rule's pattern matches), and writes a smoke test for each file with
untested lines (it runs the module and calls its functions);
then, when the prompt names the gate's test command, it runs it once with ``run_command`` (in the
gate's sandbox) and says how it ended. It does not act on that result: the gate checks the fix
itself (:mod:`hopline.gate.verify`), and refuses one that does not build or breaks a test.
"""

from __future__ import annotations

import re
import shlex
from pathlib import PurePosixPath
from typing import Any

from hopline.harness.diffs import CAP_MARKER
from hopline.scripted.review import LINE_RULES, UNTESTED_RULE, Result, last_results
from hopline.scripted.review_plan import Step

# Rules a fix removes the offending line for (hopline's line rules, and every analyzer's rule: its
# finding names its line); an untested change gets a test; a failing test log is left for a real
# test run.
_RULES_BY_ID = {r.rule: r for r in LINE_RULES if r.rule != "test-failure"}


def _line_fix(finding: dict[str, Any]) -> bool:
    rule = str(finding.get("rule"))
    return rule in _RULES_BY_ID or ("/" in rule and isinstance(finding.get("line"), int)
                                    and finding.get("severity") == "error")


def _test_for(path: str) -> tuple[str, str]:
    """A smoke test (stdlib unittest, which every Python has) that runs the module and calls each of
    its functions with placeholder arguments: what the change adds then runs in a test."""
    stem = re.sub(r"\W", "_", PurePosixPath(path).stem)
    test = f"tests/test_{stem}_gate.py"
    body = (f'"""Written by the dev agent after the gate: {path} changed with no test."""\n\n'
            "import importlib.util\nimport inspect\nimport unittest\nfrom pathlib import Path\n\n"
            f"SOURCE = Path(__file__).resolve().parents[1] / {path!r}\n\n\n"
            f"class {stem.title().replace('_', '')}GateTest(unittest.TestCase):\n"
            f"    def test_{stem}_runs(self) -> None:\n"
            f"        spec = importlib.util.spec_from_file_location({stem!r}, SOURCE)\n"
            "        assert spec is not None and spec.loader is not None\n"
            "        module = importlib.util.module_from_spec(spec)\n"
            "        spec.loader.exec_module(module)\n"
            "        for function in list(vars(module).values()):\n"
            "            if inspect.isfunction(function) and function.__module__ == module.__name__:\n"
            "                needed = [p for p in inspect.signature(function).parameters.values()\n"
            "                          if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, "
            "p.POSITIONAL_OR_KEYWORD)]\n"
            "                try:\n"
            "                    function(*['1'] * len(needed))\n"
            "                except Exception:  # a smoke test: it runs; what it returns is for a real test\n"
            "                    pass\n")
    return test, body


def _turn_results(messages: list[dict[str, Any]]) -> list[Result]:
    """Every call of the current turn (since the last prompt), with its result, in order."""
    start = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    asks = [i for i in range(start + 1, len(messages))
            if messages[i].get("role") == "assistant" and messages[i].get("tool_calls")]
    out: list[Result] = []
    for n in range(len(asks)):
        out += last_results(messages[:asks[n + 1]] if n + 1 < len(asks) else messages)
    return out


def _finished(findings: list[dict[str, Any]], results: list[tuple[str, dict[str, Any], str]]) -> Step:
    written = [str(a.get("path")) for n, a, t in results if n == "write_file" and t.startswith("wrote")]
    left = [f for f in findings if not _line_fix(f) and f.get("rule") != UNTESTED_RULE]
    ran = [t for n, _, t in results if n == "run_command"]
    tests = f" The test command ended: {ran[-1].strip().splitlines()[-1]}." if ran and ran[-1].strip() else ""
    return Step(f"Fixed the findings in {len(written)} files ({', '.join(written) or 'none'}); "
                f"{len(left)} findings need more than an edit (a failing test needs a test run).{tests}", [])


def fix_step(findings: list[dict[str, Any]], messages: list[dict[str, Any]], tools: set[Any],
             test_command: dict[str, Any] | None = None) -> Step:
    """The dev agent's next answer: read the files with line findings, write them without the
    flagged lines (and a test for each untested file), run ``test_command`` (the prompt's, when it
    names one), then say what was fixed and what was not."""
    fixable = [f for f in findings if _line_fix(f) and isinstance(f.get("file"), str)]
    files = sorted({str(f["file"]) for f in fixable})
    results = [(r.name, r.args, r.text) for r in _turn_results(messages)]
    if any(name == "write_file" for name, _, _ in results) or "write_file" not in tools:
        if (test_command is not None and "run_command" in tools
                and not any(name == "run_command" for name, _, _ in results)):
            shown = shlex.join(str(a) for a in test_command["argv"])
            return Step(f"Running the tests: {shown}", [("run_command", {"command": shown})])
        return _finished(findings, results)
    read = {str(a.get("path")): t for n, a, t in results if n == "read_file"}
    if files and not read:
        return Step("Reading the files with findings.", [("read_file", {"path": p}) for p in files])
    writes: list[tuple[str, dict[str, Any]]] = []
    for path in files:
        text = read.get(path, "")
        if not text or text.startswith("error:") or CAP_MARKER in text or "[file continues" in text:
            continue  # cut or unreadable: never write back a partial file
        flagged = [f for f in fixable if f["file"] == path]
        lines = text.splitlines(keepends=True)
        drop = {int(f["line"]) for f in flagged if isinstance(f.get("line"), int)}
        rules = [_RULES_BY_ID[str(f["rule"])] for f in flagged if not isinstance(f.get("line"), int)]
        kept = [line for number, line in enumerate(lines, 1)
                if number not in drop and not any(r.search(path, line) for r in rules)]
        writes.append(("write_file", {"path": path, "content": "".join(kept)}))
    for path in sorted({str(f["file"]) for f in findings if f.get("rule") == UNTESTED_RULE}):
        test, body = _test_for(path)
        writes.append(("write_file", {"path": test, "content": body}))
    if not writes:
        return Step("Nothing I can fix by editing: the findings need a test run.", [])
    return Step("Writing the fixes.", writes)
