"""What one run of a test command showed (SPEC T-7): which tests ran, which failed (at which line,
with the assertion's first lines), which were skipped, and whether any test ran at all. Pure: no I/O.

Three readers, by runner:

- pytest: its JUnit XML report (``--junitxml`` into the sandbox's private tmp, ``junit_family=xunit1``
  so that each test case names its file), the one source of truth; a run that wrote none never
  got to its tests (``No module named pytest``, a usage error), and its output says why;
- ``python -m unittest`` (verbose): its ``test (id) ... ok`` lines, its ``FAIL:``/``ERROR:`` blocks
  (the test's own frame gives the line) and ``Ran N tests``;
- any other command: its exit status, the pytest summary it may print (``-rA``), and its output.

A run in which no test ran is said with its cause, taken from the first error lines of its output
(a module that does not import, ``No module named ...``, ``no tests ran``, ``Ran 0 tests``, pytest's
exit codes 2 to 5), with the machine's paths taken out.
"""

from __future__ import annotations

import dataclasses
import re
import xml.etree.ElementTree as ElementTree
from collections.abc import Sequence
from typing import Any, Literal

Runner = Literal["pytest", "unittest", "other"]
JUNIT_FILE = "junit.xml"
FAILED_KEPT = 20  # failed tests a run's record keeps (the count is whole)
_PYTEST_EXITS = {2: "pytest was interrupted (exit code 2)", 3: "pytest hit an internal error (exit code 3)",
                 4: "pytest was given a wrong usage (exit code 4)", 5: "no tests ran: pytest collected none "
                                                                    "(exit code 5)"}
# pytest -rA: "PASSED tests/test_x.py::test_a", "FAILED tests/test_x.py::test_b - assert 1 == 2".
_SUMMARY_RE = re.compile(r"^(PASSED|FAILED|ERROR|XPASS|XFAIL|SKIPPED)\s+(\S+?)(?:\s+-\s+(.*))?$",
                         re.MULTILINE)
_COUNTS_RE = re.compile(r"^(?:=+ )?(\d+ "
                        r"(?:passed|failed|errors?|skipped|deselected|xfailed|xpassed|warnings?)"
                        r"\b.*?|no tests ran) in [\d.]+s(?: \([^)]*\))?(?: =+)?$", re.MULTILINE)
_NO_TESTS_RE = re.compile(r"no tests ran|NO TESTS RAN|\bRan 0 tests\b|collected 0 items", re.IGNORECASE)
_NO_MODULE_RE = re.compile(r"No module named '?([\w.]+)'?")
_PYTEST_E_RE = re.compile(r"^E\s+([\w.]+(?:Error|Exception|Exit)\b:?.*)$", re.MULTILINE)
_ERROR_LINE_RE = re.compile(r"^(?:E\s+)?((?:[\w.]+(?:Error|Exception|Exit)|error|ERROR|fatal)\b:?.*)$",
                            re.MULTILINE)
# unittest -v: "test_add (tests.test_calc.CalcTest.test_add) ... ok"
_UNITTEST_LINE_RE = re.compile(r"^(\S+) \(([\w.]+)\)(?:\n.*?)?? \.\.\. "
                               r"(ok|FAIL|ERROR|skipped|expected failure|unexpected success)", re.MULTILINE)
_UNITTEST_BLOCK_RE = re.compile(r"^(FAIL|ERROR): (\S+) \(([\w.]+)\)\n-{20,}\n"
                                r"(.*?)(?=^={20,}$|^-{20,}\nRan |\Z)", re.MULTILINE | re.DOTALL)
_UNITTEST_RAN_RE = re.compile(r"^Ran (\d+) tests? in ", re.MULTILINE)
_FRAME_RE = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)', re.MULTILINE)
_IMPORT_FAILED = ("unittest.loader._FailedTest", "unittest.loader.ModuleImportFailure")


@dataclasses.dataclass(frozen=True)
class FailedTest:
    test: str  # the test's id (pytest node id; unittest's dotted id)
    file: str  # relative to the checkout, or "" when the run does not say
    line: int | None
    message: str  # the assertion's (the exception's) first lines

    def to_json(self) -> dict[str, Any]:
        return {"test": self.test, "file": self.file, "line": self.line, "message": self.message}


@dataclasses.dataclass
class TestRun:
    """A run of the test command as hopline read it (see the module docstring)."""

    runner: Runner
    source: Literal["junit", "output"] = "output"
    exit_code: int | None = None
    statuses: dict[str, str] = dataclasses.field(default_factory=dict)  # id: passed, failed, skipped
    failed: list[FailedTest] = dataclasses.field(default_factory=list)
    counts: dict[str, int] = dataclasses.field(default_factory=dict)
    summary: str = ""
    did_not_run: str | None = None  # why no test ran; None: tests ran (or the runner does not say)

    @property
    def ran(self) -> bool:
        return self.did_not_run is None

    @property
    def knows_tests(self) -> bool:
        """Whether the run named its tests (so that two runs' tests can be compared)."""
        return bool(self.statuses) or (self.runner == "pytest" and self.source == "junit")

    def to_json(self) -> dict[str, Any]:
        """What a tool result's ``_meta`` carries: bounded (the failed tests kept, and their count)."""
        return {"runner": self.runner, "source": self.source, "ran": self.ran, "didNotRun": self.did_not_run,
                "counts": dict(self.counts), "summary": self.summary,
                "failed": [f.to_json() for f in self.failed[:FAILED_KEPT]], "failedCount": len(self.failed),
                "namesTests": self.knows_tests}


def runner_of(argv: Sequence[str]) -> Runner:
    """Which reader reads a run of ``argv``."""
    head = [a.rsplit("/", 1)[-1] for a in argv[:3]]
    if head[:1] == ["pytest"] or head[1:3] == ["-m", "pytest"] or head[:1] == ["py.test"]:
        return "pytest"
    if head[1:3] == ["-m", "unittest"]:
        return "unittest"
    return "other"


def pytest_report_args(path: str) -> list[str]:
    """What a pytest command gets to write its JUnit XML report at ``path`` (test cases with files)."""
    return [f"--junitxml={path}", "-o", "junit_family=xunit1"]


def _clean(line: str, roots: Sequence[str]) -> str:
    for root in sorted(roots, key=len, reverse=True):
        if root.strip("/"):
            at = r"(?<![\w./+-])" + re.escape(root.rstrip("/"))
            line = re.sub(at + r"(?![\w.+-])/?", lambda m: "" if m.group(0).endswith("/") else ".", line)
    line = re.sub(r"(?<![\w.])/(?:[\w.+-]+/)+([\w.+-]+)", r"\1", line)  # no absolute path of the machine
    return " ".join(line.split())[:240]


def error_cause(text: str, roots: Sequence[str] = ()) -> str | None:
    """The cause a run's output gives for failing early: ``No module named X`` when it says so, else
    its first error line; paths under ``roots`` made relative, other absolute paths shortened."""
    missing = _NO_MODULE_RE.search(text)
    if missing is not None:
        return f"No module named {missing.group(1)}"
    found = _PYTEST_E_RE.search(text) or _ERROR_LINE_RE.search(text)  # pytest's own "E   " line first
    if found is not None:
        return _clean(found.group(1), roots)
    said = _NO_TESTS_RE.search(text)
    return said.group(0) if said else None


def _last_lines(text: str, count: int = 3) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return "\n".join(line[:200] for line in lines[-count:])


def _first_lines(text: str, count: int = 3) -> str:
    lines = [line.rstrip() for line in text.strip().splitlines() if line.strip()]
    return "\n".join(line[:200] for line in lines[:count])


def _relative(path: str, roots: Sequence[str]) -> str:
    for root in sorted(roots, key=len, reverse=True):
        prefix = root.rstrip("/") + "/"
        if root and path.startswith(prefix):
            return path[len(prefix):]
    return path


# --- pytest -----------------------------------------------------------------------------------------


def _node_id(case: ElementTree.Element) -> tuple[str, str]:
    """A test case's pytest node id and file (xunit1 names the file)."""
    name, classname, file = case.get("name", ""), case.get("classname", ""), case.get("file") or ""
    if not file:
        return f"{classname}::{name}".strip(":"), ""
    module = file[:-3].replace("/", ".") if file.endswith(".py") else ""
    rest = classname[len(module) + 1:] if module and classname.startswith(module + ".") else ""
    return file + "".join(f"::{part}" for part in rest.split(".") if part) + f"::{name}", file


def _failing_line(text: str, file: str, defined: str | None) -> int | None:
    """The last line of ``file`` a failure's traceback names (``file:N: ...`` or ``File "...", line N``),
    else the line after the test's definition (xunit1 counts from 0)."""
    found = [int(n) for n in re.findall(rf"^{re.escape(file)}:(\d+): ", text, re.MULTILINE)] if file else []
    found += [int(n) for f, n, _ in _FRAME_RE.findall(text) if file and f.endswith("/" + file)]
    if found:
        return found[-1]
    return int(defined) + 1 if defined and defined.isdigit() else None


def read_junit(run: TestRun, xml: bytes, roots: Sequence[str]) -> bool:
    """Fold a JUnit XML report into ``run``; False when it does not parse."""
    try:
        tree = ElementTree.fromstring(xml)
    except (ElementTree.ParseError, ValueError):
        return False
    run.source = "junit"
    unimported: list[tuple[str, str]] = []
    for case in tree.iter("testcase"):
        test, file = _node_id(case)
        bad = next((case.find(tag) for tag in ("failure", "error") if case.find(tag) is not None), None)
        if bad is not None and "collection failure" in (bad.get("message") or ""):
            unimported.append((file or test, error_cause(bad.text or "", roots) or "it does not import"))
        elif bad is not None:
            run.statuses[test] = "failed"
            message = _first_lines(bad.get("message") or bad.text or bad.tag)
            run.failed.append(FailedTest(test, file, _failing_line(bad.text or "", file, case.get("line")),
                                         message))
        else:
            run.statuses.setdefault(test, "skipped" if case.find("skipped") is not None else "passed")
    if unimported:
        shown = "; ".join(f"{where}: {cause}" for where, cause in unimported[:3])
        run.did_not_run = (f"{len(unimported)} test module{'s' if len(unimported) > 1 else ''} did not "
                           f"import ({shown})")
        run.counts["errors"] = len(unimported)
    return True


# --- unittest ---------------------------------------------------------------------------------------


def _unittest_id(name: str, where: str) -> str:
    return where if where.endswith("." + name) else f"{where}.{name}"


def _read_unittest(run: TestRun, text: str, roots: Sequence[str]) -> list[str]:
    """Fold ``python -m unittest -v`` output into ``run``; the import failures' causes."""
    unimported: list[str] = []
    for name, where, outcome in _UNITTEST_LINE_RE.findall(text):
        if where.startswith(_IMPORT_FAILED):
            continue
        test = _unittest_id(name, where)
        run.statuses[test] = {"ok": "passed", "skipped": "skipped", "expected failure": "passed"}.get(outcome,
                                                                                                    "failed")
    for _, name, where, block in _UNITTEST_BLOCK_RE.findall(text):
        if where.startswith(_IMPORT_FAILED):
            unimported.append(f"{name}: {error_cause(_last_lines(block, 1), roots) or 'it does not import'}")
            continue
        test = _unittest_id(name, where)
        frames = list(_FRAME_RE.finditer(block))
        own = [f for f in frames if f.group(3) == name.split(".")[-1]] or [
            f for f in frames if _relative(f.group(1), roots) != f.group(1)]
        file, line = (_relative(own[-1].group(1), roots), int(own[-1].group(2))) if own else ("", None)
        tail = block[frames[-1].end():] if frames else "\n" + block
        exception = [ln for ln in tail.splitlines()[1:] if ln.strip() and not ln.startswith(" ")]
        run.statuses[test] = "failed"
        run.failed.append(FailedTest(test, file, line, _first_lines("\n".join(exception) or block)))
    return unimported


def _unittest_outcome(run: TestRun, text: str, roots: Sequence[str]) -> None:
    unimported = _read_unittest(run, text, roots)
    ran = _UNITTEST_RAN_RE.findall(text)
    total = int(ran[-1]) if ran else None
    skipped = sum(1 for s in run.statuses.values() if s == "skipped")
    if total is not None:
        run.counts = {"ran": total, "failed": len(run.failed), "skipped": skipped}
        run.summary = f"Ran {total} tests" + (f", {len(run.failed)} failed" if run.failed else "") + (
            f", {skipped} skipped" if skipped else "")
    if unimported:
        run.did_not_run = (f"{len(unimported)} test module{'s' if len(unimported) > 1 else ''} did not "
                           f"import ({'; '.join(unimported[:3])})")
    elif total is None:
        run.did_not_run = (error_cause(text, roots)
                           or f"unittest printed no result (exit code {run.exit_code})")
    elif total - skipped == 0 or "NO TESTS RAN" in text:
        run.did_not_run = f"no tests ran (Ran {total} tests" + (f", {skipped} skipped)" if skipped else ")")


# --- any runner ---------------------------------------------------------------------------------------


def parse_pytest_summary(run: TestRun, text: str) -> None:
    """pytest's ``-rA`` short summary and counts line, when a command printed them."""
    for kind, test, message in _SUMMARY_RE.findall(text):
        if kind == "PASSED":
            run.statuses[test] = "passed"
        elif kind == "SKIPPED":
            continue
        elif kind in ("FAILED", "ERROR") and run.statuses.get(test) != "failed":
            run.statuses[test] = "failed"
            file = test.split("::", 1)[0]
            line = _failing_line(text, file, None) if "::" in test else None
            run.failed.append(FailedTest(test, file, line, (message or kind.lower()).strip()[:500]))
    counts = _COUNTS_RE.findall(text)
    if counts:
        run.summary = counts[-1].strip()
        for number, what in re.findall(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected)",
                                       run.summary):
            run.counts[what.rstrip("s") if what.startswith("error") else what] = int(number)


def analyze(argv: Sequence[str], text: str, exit_code: int | None, junit: bytes | None,
            roots: Sequence[str] = ()) -> TestRun:
    """What a run of the test command ``argv`` showed (see the module docstring); ``roots``: the
    checkout paths its output names, made relative."""
    run = TestRun(runner_of(argv), exit_code=exit_code)
    if run.runner == "pytest" and junit is not None and read_junit(run, junit, roots):
        counted = list(run.statuses.values())
        run.counts = {k: counted.count(k) for k in ("failed", "passed", "skipped")
                      if counted.count(k)} | run.counts
        run.summary = ", ".join(f"{n} {k if k != 'errors' or n > 1 else 'error'}"
                                for k, n in run.counts.items())
        if run.did_not_run is None and exit_code in _PYTEST_EXITS:
            run.did_not_run = _PYTEST_EXITS[exit_code]
        elif run.did_not_run is None and not any(s != "skipped" for s in counted):
            run.did_not_run = "no tests ran" + (f" ({len(counted)} skipped)" if counted else "")
        return run
    if run.runner == "unittest":
        _unittest_outcome(run, text, roots)
        return run
    parse_pytest_summary(run, text)
    if run.runner == "pytest":  # it wrote no report: it never got to its tests
        cause = error_cause(text, roots) or _PYTEST_EXITS.get(exit_code or 0)
        run.did_not_run = cause or f"pytest wrote no report (exit code {exit_code})"
    elif (said := _NO_TESTS_RE.search(text) or _NO_MODULE_RE.search(text)) is not None:
        run.did_not_run = error_cause(said.group(0), roots) if said.re is _NO_MODULE_RE else said.group(0)
    return run


def last_lines(text: str, count: int = 3) -> str:
    """The last non-empty lines of a run's output (what a finding quotes of a run with no report)."""
    return _last_lines(text, count)


def removed_tests(base: TestRun, head: TestRun) -> list[dict[str, str]]:
    """Tests the base's run had that the head's has not, or skips (having run them at the base):
    ``{"test", "file", "how"}`` (``gone`` or ``skipped``), in id order."""
    out: list[dict[str, str]] = []
    for test, status in sorted(base.statuses.items()):
        now = head.statuses.get(test)
        if now is None or (now == "skipped" and status != "skipped"):
            file = test.split("::", 1)[0] if "::" in test else ""
            out.append({"test": test, "file": file, "how": "gone" if now is None else "skipped"})
    return out
