"""Reading what a test run and a compile printed: pytest's ``-rA`` short summary (or JUnit XML),
``python -m py_compile``'s errors, and whether a Python change leaves its behaviour's AST the same.
Pure: no I/O (the offline reviewer and the gate's fix check both read through here).
"""

from __future__ import annotations

import ast
import dataclasses
import re
import xml.etree.ElementTree as ElementTree
from collections.abc import Sequence
from typing import Any

# pytest -rA: "PASSED tests/test_x.py::test_a", "FAILED tests/test_x.py::test_b - assert 1 == 2",
# "ERROR tests/test_x.py - ImportError: ..." (a module that did not import: a collection error).
_SUMMARY_RE = re.compile(r"^(PASSED|FAILED|ERROR|XPASS|XFAIL|SKIPPED)\s+(\S+?)(?:\s+-\s+(.*))?$",
                         re.MULTILINE)
_COUNTS_RE = re.compile(r"^(?:=+ )?(\d+ "
                        r"(?:passed|failed|errors?|skipped|deselected|xfailed|xpassed|warnings?)"
                        r"\b.*?|no tests ran) in [\d.]+s(?: \([^)]*\))?(?: =+)?$", re.MULTILINE)
_COUNT_RE = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected|warnings?)")
# py_compile: '  File "src/calc.py", line 3' then the source line, a caret, then "SyntaxError: ..."
_COMPILE_RE = re.compile(r'^\s*File "([^"]+)", line (\d+)\n(?:.*\n){0,3}?((?:\w+Error|\w+Exception)[^\n]*)',
                         re.MULTILINE)
# py_compile of Python 3.11: "Sorry: IndentationError: expected an indented block ... (src/calc.py, line 2)"
_SORRY_RE = re.compile(r"^Sorry: ((?:\w+Error|\w+Exception)[^\n]*?) \((.+), line (\d+)\)$", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class FailedTest:
    test: str  # the test's id (pytest node id, JUnit classname::name)
    file: str
    line: int | None
    message: str


@dataclasses.dataclass
class TestReport:
    """A test run as its output tells it: which tests passed, which failed, the counts line."""

    passed: set[str] = dataclasses.field(default_factory=set)
    failed: list[FailedTest] = dataclasses.field(default_factory=list)
    counts: dict[str, int] = dataclasses.field(default_factory=dict)
    summary: str = ""  # pytest's last line ("1 failed, 3 passed"), or ""

    @property
    def failed_ids(self) -> set[str]:
        return {f.test for f in self.failed}

    def to_json(self) -> dict[str, Any]:
        return {"passed": len(self.passed), "failed": sorted(self.failed_ids), "counts": dict(self.counts),
                "summary": self.summary}


def _line_of(text: str, file: str, test: str) -> int | None:
    """The line of ``file`` where ``test`` failed: pytest's ``--tb=short`` frame ``file:N: in name``."""
    name = test.rsplit("::", 1)[-1].split("[", 1)[0]
    frame = re.search(rf"^{re.escape(file)}:(\d+): in {re.escape(name)}\b", text, re.MULTILINE)
    if frame is None:  # --tb=long/line: "file:N: AssertionError"
        frame = re.search(rf"^(?:.*/)?{re.escape(file)}:(\d+): ", text, re.MULTILINE)
    return int(frame.group(1)) if frame else None


def parse_pytest(text: str) -> TestReport:
    """The report in pytest's output (run with ``-rA`` so that every outcome is in the summary)."""
    report = TestReport()
    for kind, test, message in _SUMMARY_RE.findall(text):
        if kind == "PASSED":
            report.passed.add(test)
        elif kind in ("FAILED", "ERROR"):
            file = test.split("::", 1)[0]
            if test not in report.failed_ids:
                report.failed.append(FailedTest(test, file, _line_of(text, file,
                                                                     test) if "::" in test else None,
                                                (message or kind.lower()).strip()[:500]))
    counts = _COUNTS_RE.findall(text)
    if counts:
        report.summary = counts[-1].strip()
        for number, what in _COUNT_RE.findall(report.summary):
            report.counts[what.rstrip("s") if what.startswith(("error", "warning")) else what] = int(number)
    return report


def parse_junit(xml: str) -> TestReport:
    """The report in a JUnit XML document (``testcase`` with ``failure`` or ``error``)."""
    report = TestReport()
    root = ElementTree.fromstring(xml)
    for case in root.iter("testcase"):
        test = f"{case.get('classname', '')}::{case.get('name', '')}".strip(":")
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is None:
            if case.find("skipped") is None:
                report.passed.add(test)
            continue
        line = case.get("line")
        report.failed.append(FailedTest(test, case.get("file") or "",
                                        int(line) if line and line.isdigit() else None,
                                        (bad.get("message") or bad.tag)[:500]))
    report.counts = {"passed": len(report.passed), "failed": len(report.failed)}
    report.summary = f"{len(report.failed)} failed, {len(report.passed)} passed"
    return report


def parse_compile_errors(text: str, files: Sequence[str] = ()) -> list[tuple[str, int, str]]:
    """``(file, line, error)`` of each file ``python -m py_compile`` could not compile; a bare file
    name (Python 3.11's "Sorry: ... (calc.py, line 5)") is given back as the one of ``files`` it names."""
    found = [(file, int(line), error.strip()[:300]) for file, line, error in _COMPILE_RE.findall(text)]
    found += [(file, int(line), error.strip()[:300]) for error, file, line in _SORRY_RE.findall(text)]
    out: list[tuple[str, int, str]] = []
    for file, line, error in found:
        if "/" not in file:
            named = [f for f in files if f.rsplit("/", 1)[-1] == file]
            file = named[0] if len(named) == 1 else file
        if all((file, line) != (f, n) for f, n, _ in out):
            out.append((file, line, error))
    return out


# --- a change that leaves behaviour alone ------------------------------------------------------------

_TYPING_ONLY = frozenset({"typing", "typing_extensions", "__future__"})
_TYPE_FACTORIES = frozenset({"TypeVar", "ParamSpec", "TypeVarTuple", "NewType", "TypeAlias"})


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value,
                                                     ast.Constant) and isinstance(node.value.value, str)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


class _Strip(ast.NodeTransformer):
    """Annotations, docstrings, ``if TYPE_CHECKING:`` blocks, ``cast()``, ``@overload`` stubs and
    ``from __future__`` imports removed: what is left is what runs."""

    def _body(self, body: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for node in body:
            if _is_docstring(node) or (isinstance(node, ast.If) and _is_type_checking(node.test)):
                continue
            if isinstance(node, ast.ImportFrom) and node.module == "__future__":
                continue
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and (
                    getattr(node.value.func, "id", None) in _TYPE_FACTORIES
                    or getattr(node.value.func, "attr", None) in _TYPE_FACTORIES):
                continue
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                    (isinstance(d, ast.Name) and d.id == "overload")
                    or (isinstance(d, ast.Attribute) and d.attr == "overload") for d in node.decorator_list):
                continue
            new = self.visit(node)
            if isinstance(new, ast.stmt):
                out.append(new)
        return out or [ast.Pass()]

    def generic_visit(self, node: ast.AST) -> ast.AST:
        for field in ("body", "orelse", "finalbody"):
            value = getattr(node, field, None)
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                setattr(node, field, self._body(value))
        return super().generic_visit(node)

    def visit_arg(self, node: ast.arg) -> ast.arg:
        node.annotation = None
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        node.returns = None
        return self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST | None:
        if node.value is None:
            return None
        return ast.Assign(targets=[node.target], value=self.visit(node.value))

    def visit_Call(self, node: ast.Call) -> ast.AST:
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if name == "cast" and len(node.args) == 2:
            return self.visit(node.args[1])
        return self.generic_visit(node)


def _unused_imports_dropped(tree: ast.Module) -> ast.Module:
    """Imports of typing modules, and imports no name of the stripped module uses, dropped."""
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        n.value.id for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)}
    body: list[ast.stmt] = []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            module = node.module if isinstance(node, ast.ImportFrom) else None
            names = [a for a in node.names if (a.asname or a.name).split(".")[0] in used
                     and module not in _TYPING_ONLY and a.name not in _TYPING_ONLY]
            if not names:
                continue
            node.names = names
        body.append(node)
    tree.body = body
    return tree


def behaviour_dump(source: str) -> str | None:
    """The module's AST without annotations, docstrings and comments (None when it does not parse)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    stripped = _Strip().visit(tree)
    assert isinstance(stripped, ast.Module)
    stripped.body = _Strip()._body(stripped.body)
    return ast.dump(_unused_imports_dropped(stripped), include_attributes=False)


def same_behaviour(old: str, new: str) -> bool:
    """True when both versions parse and their ASTs are equal once annotations, docstrings and
    comments are stripped (a typing-only refactor: no behaviour to test)."""
    before, after = behaviour_dump(old), behaviour_dump(new)
    return before is not None and before == after


def sides_of_diff(diff: str) -> tuple[str, str] | None:
    """The old and the new text of one file from its diff with whole-file context (``git diff
    -U<large>``): None when the diff does not hold the whole file (a cut, or several hunks)."""
    old: list[str] = []
    new: list[str] = []
    hunks = 0
    for raw in diff.splitlines():
        if raw.startswith("@@"):
            hunks += 1
            continue
        if hunks == 0 or raw.startswith("\\"):
            continue
        if raw.startswith("[hopline: "):
            return None
        if raw.startswith("-"):
            old.append(raw[1:])
        elif raw.startswith("+"):
            new.append(raw[1:])
        else:
            old.append(raw[1:])
            new.append(raw[1:])
    if hunks != 1:
        return None
    return "\n".join(old) + "\n", "\n".join(new) + "\n"
