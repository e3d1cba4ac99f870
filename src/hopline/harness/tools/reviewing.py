"""A gate session's own tools: ``git_diff`` over the change under review and ``run_command`` in the
sandbox, at the head (the session's checkout) or at the base (a checkout made on first use).

:class:`ReviewRange` is what ``session/new``'s ``_meta["hopline.review"]`` carries: the two commit
ids, the gate's test command (allowed as it is besides :data:`~hopline.harness.tools.policy.REVIEW_COMMANDS`),
the sandbox the gate chose (``none`` only when the operator allowed unsandboxed runs) and the
project's interpreter (``python``: bound read-only into the sandbox, it runs ``python`` and
``pytest``; else the agent's own). With ``fix`` it is the dev agent's session of a ``--fix`` run
instead: its ``run_command`` runs any shell line, in the same sandbox, with the checkout writable
(the one place it may write besides its private ``/tmp``).

A run of the gate's test command is read (:mod:`hopline.harness.testruns`): pytest writes its JUnit
XML report into the sandbox's private tmp, read back through the results pipe; which tests ran at
the head and at the base are kept for the session, so the second of the two runs says which tests
the base had that the head has not (or skips). Asked with ``coverage``, the head's run is made under
coverage and says which lines the change adds that no test runs (:mod:`.coverage_run`).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

from hopline.budget import Budget
from hopline.errors import ToolError
from hopline.harness import git, sandbox
from hopline.harness.analyzers import ANALYZERS
from hopline.harness.sandbox_mounts import COVERAGE_LIB, coverage_package, interpreter_dirs, share_tree
from hopline.harness.sandbox_pids import pids_cap
from hopline.harness.testruns import (
    JUNIT_FILE,
    TestRun,
    analyze,
    pytest_report_args,
    removed_tests,
    runner_of,
)
from hopline.harness.tools import coverage_run, secrets_cache
from hopline.harness.tools.commands import CommandRun, ResultsPipe, run_captured
from hopline.harness.tools.env import tool_environment
from hopline.harness.tools.policy import check_review_command
from hopline.harness.tools.results import check_relative

PYTHON_NAMES = frozenset({"python", "python3"})
# Analyzers run as the programs installed beside the agent's interpreter (its venv), when they are
ANALYZER_PROGRAMS = frozenset({"ruff", "detect-secrets", "bandit", "semgrep"})
ANALYZER_MODULES = frozenset(a.module for a in ANALYZERS)
PYTEST_NAMES = frozenset({"pytest", "py.test"})


@dataclasses.dataclass(frozen=True)
class ReviewRange:
    """A gate session's change under review: two commit ids (hex, so never read as options), the
    test command the gate runs (an argv), the sandbox kind PR code runs in, and the interpreter."""

    base: str
    head: str
    test_command: tuple[str, ...] | None = None
    sandbox: str | None = None  # None: the best one that runs here
    fix: bool = False  # the dev agent's session of a --fix run (see the module docstring)
    python: str | None = None  # the project's interpreter (an absolute path); None: the agent's own
    cache: str | None = None  # the gate run's directory of detect-secrets' results (secrets_cache)

    def __post_init__(self) -> None:
        git.check_commit(self.base, "base")
        git.check_commit(self.head, "head")
        if self.sandbox is not None and self.sandbox not in ("bwrap", "unshare", "none"):
            raise ValueError("sandbox must be bwrap, unshare or none")
        if self.python is not None and (not os.path.isabs(self.python) or len(self.python) > 4096):
            raise ValueError("python must be an absolute path")
        if self.cache is not None and (not os.path.isabs(self.cache) or len(self.cache) > 4096):
            raise ValueError("cache must be an absolute path")

    @classmethod
    def from_meta(cls, value: dict[str, Any]) -> ReviewRange:
        """From ``_meta["hopline.review"]``; ValueError saying what is wrong."""
        extra = set(value) - {"base", "head", "testCommand", "sandbox", "fix", "python", "cache"}
        if extra or not {"base", "head"} <= set(value):
            raise ValueError("an object with base and head (and optionally testCommand, sandbox, fix, "
                             "python, cache)")
        if not isinstance(value.get("fix", False), bool):
            raise ValueError("fix must be a boolean")
        command = value.get("testCommand")
        if command is not None and (not isinstance(command, list) or not command
                                    or not all(isinstance(a, str) and a for a in command)):
            raise ValueError("testCommand must be a non-empty list of strings")
        python, cache = value.get("python"), value.get("cache")
        if any(v is not None and not isinstance(v, str) for v in (python, cache)):
            raise ValueError("python and cache must be strings")
        return cls(value["base"], value["head"], tuple(command) if command else None, value.get("sandbox"),
                   value.get("fix", False), python, cache)

    def to_meta(self) -> dict[str, Any]:
        out: dict[str, Any] = {"base": self.base, "head": self.head}
        if self.test_command:
            out["testCommand"] = list(self.test_command)
        if self.sandbox is not None:
            out["sandbox"] = self.sandbox
        if self.fix:
            out["fix"] = True
        if self.python is not None:
            out["python"] = self.python
        if self.cache is not None:
            out["cache"] = self.cache
        return out


@dataclasses.dataclass(frozen=True)
class ReviewRun:
    """One sandboxed command: its argv as run, how it ran, and (the gate's test command) what it
    showed, the tests the base had that the head has not, the coverage of the change."""

    argv: list[str]
    run: CommandRun
    tests: TestRun | None = None
    removed: list[dict[str, str]] | None = None  # None: not compared (both sides not run here yet)
    coverage: dict[str, Any] | None = None


def diff_path(root: Path, path: str) -> str:
    """A path of the diff (relative, no ``..``): not resolved, so a symlink the change adds is shown
    as the link it is, wherever it points."""
    del root
    return check_relative(path).strip("/") or "."


class ReviewCommands:
    """The sandboxed ``run_command`` of a gate session, at the head (``root``) or the base."""

    def __init__(self, root: Path, budget: Budget, review: ReviewRange) -> None:
        self.root = root
        self.budget = budget
        self.review = review
        self.sandbox = (sandbox.sandbox_of(review.sandbox) if review.sandbox is not None
                        else sandbox.detect_sandbox())
        self.python = review.python or sys.executable
        self._private: tempfile.TemporaryDirectory[str] | None = None
        self._base: Path | None = None
        self._tests: dict[str, TestRun] = {}  # the test command's last run, at head and at base

    def close(self) -> None:
        if self._base is not None:
            git.remove_worktree(self.root, self._base, timeout=self.budget.command_timeout_seconds,
                                max_bytes=self.budget.gate_git_output_max_bytes)
            self._base = None
        if self._private is not None:
            self._private.cleanup()
            self._private = None

    def _held(self) -> Path:
        if self._private is None:
            self._private = tempfile.TemporaryDirectory(prefix="hopline-review-")
        return Path(self._private.name)

    def base_checkout(self) -> Path:
        """The base commit checked out beside the head (made once, read-only, removed at close)."""
        if self._base is None:
            path = self._held() / "base"
            try:
                git.add_worktree(self.root, path, self.review.base,
                                 timeout=self.budget.command_timeout_seconds,
                                 max_bytes=self.budget.gate_git_output_max_bytes)
            except git.GitError as exc:
                raise ToolError(f"the base checkout could not be made: {exc}") from None
            self._base = path
            share_tree(path, writable=False)
        return self._base

    def _interpreted(self, argv: list[str]) -> list[str]:
        """``python`` is the project's interpreter (or the agent's), ``pytest`` its ``-m pytest``; an
        analyzer is hopline's own, installed beside the agent's interpreter, when it is there."""
        if argv[0] in PYTHON_NAMES:
            return [self.python, *argv[1:]]
        if argv[0] in PYTEST_NAMES and not self.review.fix:
            return [self.python, "-m", "pytest", *argv[1:]]
        if argv[0] in ANALYZER_PROGRAMS and os.path.isfile(beside := os.path.join(
                os.path.dirname(sys.executable), argv[0])):
            return [beside, *argv[1:]]
        return argv

    def is_analyzer(self, argv: list[str]) -> bool:
        """``argv`` (as run) is one of the gate's analyzers: its module under the interpreter, or its
        program installed beside hopline's."""
        module = len(argv) > 2 and argv[0] == self.python and argv[1] == "-m" and argv[2] in ANALYZER_MODULES
        return module or (os.path.basename(argv[0]) in ANALYZER_PROGRAMS
                          and os.path.dirname(argv[0]) == os.path.dirname(sys.executable))

    def environment(self, argv: list[str], cwd: Path, private: Path,
                    limits: sandbox.Limits) -> dict[str, str]:
        """The sandboxed command's environment. An analyzer imports nothing of the checkout (the
        working directory is not on its ``sys.path``: ``PYTHONSAFEPATH``), so it reads the compiled
        bytecode of the interpreter's own modules where they are installed, instead of compiling each
        again into the empty ``PYTHONPYCACHEPREFIX``; anything else (the PR's tests, ``py_compile``)
        keeps the prefix, so no bytecode from the checkout is read and none is written into it."""
        env = sandbox.sandbox_environment(tool_environment(os.environ), self.sandbox.kind, private, cwd,
                                          limits)
        # A shell line (the dev agent's, a make target) finds the project's interpreter first
        env["PATH"] = os.pathsep.join([os.path.dirname(self.python), env["PATH"]])
        if self.is_analyzer(argv):
            del env["PYTHONPYCACHEPREFIX"]
            env["PYTHONSAFEPATH"] = "1"
        return env

    def _git(self, *args: str) -> str:
        try:
            return git.run_git(self.root, args, timeout=self.budget.command_timeout_seconds,
                               max_bytes=self.budget.command_output_max_bytes).text
        except git.GitError as exc:
            raise ToolError(str(exc)) from None

    def _coverage_plan(self, argv: list[str]) -> list[str]:
        """The changed Python source files to measure; :class:`ToolError` when coverage cannot run
        this command (it is not the interpreter's)."""
        if argv[0] != self.python or len(argv) < 2:
            shown = shlex.join(self.review.test_command or ())
            raise ToolError(f"coverage cannot run: the test command ({shown}) is not a Python command: "
                            "coverage runs python -m pytest, pytest or python -m unittest")
        review = self.review
        return coverage_run.changed_python(self._git(*git.diff_args(review.base, review.head, stat=True)))

    async def run(self, command: str, at: str, coverage: bool = False) -> ReviewRun:
        """``command`` checked against the policy (a fix session: any shell line, at the head
        only), then run in the sandbox at ``at`` (head, base); ``coverage``: the head's test
        command under coverage (see the module docstring)."""
        if not self.sandbox.available and self.review.sandbox != "none":
            raise ToolError(f"refused: no sandbox runs here, and a gate runs a pull request's code only "
                            f"in one ({self.sandbox.detail}); the operator may allow it with "
                            "--allow-unsandboxed")
        if at not in ("head", "base") or (self.review.fix and at != "head"):
            raise ToolError("argument 'at' must be 'head'" + ("" if self.review.fix else " or 'base'"))
        cwd = self.root if at == "head" else self.base_checkout()
        if self.review.fix:
            argv = ["/bin/sh", "-c", command]
        else:
            argv = check_review_command(command, cwd, self.review.test_command)
        is_test = (not self.review.fix and self.review.test_command is not None
                   and argv == list(self.review.test_command))
        if coverage and not (is_test and at == "head"):
            raise ToolError("coverage is for the gate's test command at the head")
        argv = self._interpreted(argv)
        limits = sandbox.Limits.of(self.budget)
        # one per command: the calls of one answer run at once (unsandboxed, it is their TMPDIR)
        private = Path(tempfile.mkdtemp(prefix=f"tmp-{at}-", dir=self._held()))
        out = sandbox.results_dir(self.sandbox.kind, private)
        runner = runner_of(argv) if is_test else None
        results: list[str] = []
        if runner == "pytest":
            argv = [*argv, *pytest_report_args(f"{out}/{JUNIT_FILE}")]
            results.append(JUNIT_FILE)
        binds = [(d, d) for d in interpreter_dirs(self.python)] if self.review.python else []
        measured: list[str] = []
        if coverage:
            measured = self._coverage_plan(argv)
            package = coverage_package()
            if measured:
                if package is not None:
                    binds.append((package, f"{COVERAGE_LIB}/coverage"))
                argv = coverage_run.runner_argv([*argv, *(["-p", "no:cov"] if runner == "pytest" else [])],
                                                COVERAGE_LIB, out, measured)
                results.append(coverage_run.REPORT_FILE)
        kept = Path(self.review.cache) if self.review.cache else None
        scan = secrets_cache.scan_of(kept, argv, self.python, cwd)
        if scan is not None:
            return await self._scan_secrets(scan, argv, cwd, private, limits, binds)
        run = await self._sandboxed(argv, cwd, private, limits, binds, results)
        return self._read(argv, at, run, runner, measured if coverage else None)

    async def _scan_secrets(self, scan: secrets_cache.SecretsScan, argv: list[str], cwd: Path, private: Path,
                            limits: sandbox.Limits, binds: list[tuple[str, str]]) -> ReviewRun:
        """detect-secrets over the files the gate run has not scanned yet, its report whole
        (:mod:`.secrets_cache`); a scan that fails is said as it is."""
        if scan.argv:
            run = await self._sandboxed(scan.argv, cwd, private, limits, binds, [])
            if run.exit_code != 0 or run.dropped_bytes:
                return ReviewRun(scan.argv, run)
            report = scan.report(run.text)
        else:
            run = CommandRun("", 0, 0, self.budget.gate_test_timeout_seconds)
            report = scan.report(None)
        if report is not None:
            return ReviewRun(scan.argv, dataclasses.replace(run, text=report))  # [] when none ran
        return ReviewRun(argv, await self._sandboxed(argv, cwd, private, limits, binds, []))

    async def _sandboxed(self, argv: list[str], cwd: Path, private: Path, limits: sandbox.Limits,
                         binds: list[tuple[str, str]], results: list[str]) -> CommandRun:
        env = self.environment(argv, cwd, private, limits)
        pipe = ResultsPipe(self.budget.command_output_max_bytes) if results else None
        wrapped = sandbox.wrap(self.sandbox.kind, argv, cwd, private, limits, writable=self.review.fix,
                               binds=binds, results=results)
        try:
            with pids_cap(limits.processes, sandbox.preexec(limits)) as (cap, preexec):
                run = await run_captured(wrapped, cwd=cwd, env=env,
                                         timeout=self.budget.gate_test_timeout_seconds,
                                         capture=self.budget.command_output_max_bytes, preexec=preexec,
                                         results=pipe)
        except OSError as exc:
            raise ToolError(f"{shlex.quote(argv[0])} could not be started ({type(exc).__name__}): is it "
                            "installed?") from None
        finally:
            if pipe is not None:
                pipe.close()
        return dataclasses.replace(run, refused_processes=cap.refused, process_limit=limits.processes)

    def _read(self, argv: list[str], at: str, run: CommandRun, runner: str | None,
              measured: list[str] | None) -> ReviewRun:
        if runner is None:
            return ReviewRun(argv, run)
        files = sandbox.read_results(run.results)
        roots = [str(self.root), str(self._base or self.root)]
        tests = analyze(argv if not measured else [argv[0], *argv[argv.index("--") + 1:]], run.text,
                        run.exit_code, files.get(JUNIT_FILE), roots)
        self._tests[at] = tests
        removed = None
        other = self._tests.get("base" if at == "head" else "head")
        if other is not None and tests.ran and other.ran and tests.knows_tests and other.knows_tests:
            base, head = (tests, other) if at == "base" else (other, tests)
            removed = removed_tests(base, head)
        coverage: dict[str, Any] | None = None
        if measured is not None:
            coverage = self._coverage(files, measured, tests, run)
        return ReviewRun(argv, run, tests, removed, coverage)

    def _coverage(self, files: dict[str, bytes], measured: list[str], tests: TestRun,
                  run: CommandRun) -> dict[str, Any]:
        if not measured:
            return {"error": None, "files": {}}
        if run.timed_out or not tests.ran:
            return {"error": "the tests did not run under coverage: "
                             + ("killed at their timeout" if run.timed_out else str(tests.did_not_run)),
                    "files": {}}
        if coverage_run.REPORT_FILE not in files:
            said = tests.did_not_run or f"exit code {run.exit_code}"
            return {"error": f"coverage wrote no report ({said})", "files": {}}
        review = self.review
        diff = self._git("diff", "--no-color", "--no-ext-diff", "--no-textconv", "--unified=0",
                         git.check_commit(review.base, "base"), git.check_commit(review.head, "head"), "--",
                         *measured)
        report = coverage_run.change_coverage(files[coverage_run.REPORT_FILE], coverage_run.added_lines(diff),
                                              measured)
        return {"error": None, "files": report}
