"""Checking a dev fix before it becomes a commit (``--fix``, SPEC T-7): its head must build and the
tests that passed at the base must still pass. Both run in the sandbox, through the same sandboxed
commands a gate session's ``run_command`` uses (:class:`~hopline.harness.tools.reviewing.ReviewCommands`).

"Builds": every changed Python file compiles (``python -m py_compile``, in the sandbox); for another
language the test command's own build step says it. "Still pass": tests run at the fix's head
(unless none ran at the base either), and, when the runner names its tests (pytest's JUnit XML,
``unittest -v``), every test that passed at the base passes at the fix's head (a test the fix
deleted counts as not passing); with any other command, it exits 0 at the head when it did at the base.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shlex
from pathlib import Path
from typing import Any

from hopline.budget import Budget
from hopline.gate.testcmd import TestCommand
from hopline.harness.git import Checkout
from hopline.harness.testresults import parse_compile_errors
from hopline.harness.testruns import TestRun
from hopline.harness.tools import ReviewRange, ToolError
from hopline.harness.tools.reviewing import ReviewCommands, ReviewRun


@dataclasses.dataclass
class FixCheck:
    """What was checked of one fix and what it showed; ``ok`` only when everything held."""

    ok: bool
    reason: str
    compiled: int = 0
    compile_errors: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    base_tests: dict[str, Any] | None = None
    head_tests: dict[str, Any] | None = None
    broken_tests: list[str] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "reason": self.reason, "compiledFiles": self.compiled,
                "compileErrors": self.compile_errors, "baseTests": self.base_tests,
                "headTests": self.head_tests,
                "brokenTests": self.broken_tests}


def _outcome(review: ReviewRun, command: TestCommand) -> tuple[TestRun | None, dict[str, Any]]:
    tests, run = review.tests, review.run
    said = tests.to_json() if tests is not None else {}
    return tests, {"command": shlex.join(command.argv), "exitCode": run.exit_code, "timedOut": run.timed_out,
                   **{k: said.get(k) for k in ("ran", "didNotRun", "counts", "summary")},
                   "passed": sum(1 for s in (tests.statuses.values() if tests else ()) if s == "passed"),
                   "failed": sorted(f.test for f in (tests.failed if tests else []))}


def _passed(tests: TestRun | None) -> set[str]:
    return {t for t, s in tests.statuses.items() if s == "passed"} if tests is not None else set()


class FixVerifier:
    """One run's fix checks: the base's test results are taken once, each fix's head in turn."""

    def __init__(self, checkout: Path, base: str, head: str, budget: Budget, sandbox: str,
                 command: TestCommand | None, python: str | None = None) -> None:
        argv = command.argv if command else None
        self.commands = ReviewCommands(checkout, budget,
                                       ReviewRange(base, head, argv, sandbox, python=python))
        self.command = command
        self._base: tuple[TestRun | None, dict[str, Any]] | None = None

    def close(self) -> None:
        self.commands.close()

    async def _compile(self, changed: list[str], check: FixCheck) -> bool:
        python = [p for p in changed if p.endswith(".py")]
        check.compiled = len(python)
        if not python:
            return True
        run = (await self.commands.run(shlex.join(["python", "-m", "py_compile", *python]), "head")).run
        if run.exit_code == 0:
            return True
        errors = parse_compile_errors(run.text, python)
        check.compile_errors = [{"file": f, "line": line, "error": e} for f, line, e in errors]
        where = ", ".join(f"{f}:{line}" for f, line, _ in errors) or f"exit code {run.exit_code}"
        check.reason = f"the fix does not build: py_compile fails ({where})"
        return False

    async def _tests(self, check: FixCheck) -> bool:
        command = self.command
        if command is None:
            return True
        shown = shlex.join(command.argv)
        if self._base is None:
            self._base = _outcome(await self.commands.run(shown, "base"), command)
        base, check.base_tests = self._base
        head_run = await self.commands.run(shown, "head")
        head, check.head_tests = _outcome(head_run, command)
        if head_run.run.timed_out:
            check.reason = f"the tests ran past their timeout at the fix's head ({shown})"
            return False
        if head is not None and not head.ran and (base is None or base.ran):
            check.reason = f"no test runs at the fix's head ({shown}): {head.did_not_run}"
            return False
        if base is not None and head is not None and base.knows_tests and head.knows_tests:
            check.broken_tests = sorted(_passed(base) - _passed(head))
            if check.broken_tests:
                check.reason = (f"{len(check.broken_tests)} tests that passed at the base do not pass at the "
                                f"fix's head: {', '.join(check.broken_tests[:5])}")
                return False
        elif check.base_tests.get("exitCode") == 0 and head_run.run.exit_code != 0:
            check.reason = (f"{shown} passed at the base and fails at the fix's head "
                            f"(exit {head_run.run.exit_code})")
            return False
        return True

    async def check(self, changed: list[str]) -> FixCheck:
        """The fix in the checkout's working tree (``changed``: its paths that differ from the base)."""
        check = FixCheck(False, "")
        try:
            if await self._compile(changed, check) and await self._tests(check):
                check.ok = True
                check.reason = "the fix builds and every test that passed at the base still passes"
        except ToolError as exc:
            check.reason = f"the fix could not be checked: {exc}"
        return check


async def verified_commit(checkout: Checkout, verifier: FixVerifier, base: str, round_number: int,
                          turn: dict[str, Any]) -> str | None:
    """The fix's commit when its head builds and the base's passing tests still pass; else None,
    with ``turn["reason"]`` saying why (and the refused changes taken back)."""
    if "error" in turn:
        turn["reason"] = "the dev turn failed"
        return None
    if not await asyncio.to_thread(checkout.stage_all):
        turn["reason"] = "the dev agent changed nothing"
        return None
    changed = await asyncio.to_thread(checkout.changed_since, base)
    check = await verifier.check(changed)
    turn["verification"] = check.to_json()
    turn["reason"] = check.reason
    if not check.ok:
        await asyncio.to_thread(_discard, checkout)
        return None
    new_head = await asyncio.to_thread(checkout.commit_staged,
                                       f"hopline dev agent: fixes after gate round {round_number}")
    turn["commit"] = new_head
    return new_head


def _discard(checkout: Checkout) -> None:
    checkout.writable()
    try:
        checkout.discard()
    finally:
        checkout.read_only()
