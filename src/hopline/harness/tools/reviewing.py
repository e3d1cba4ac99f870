"""A gate session's own tools: ``git_diff`` over the change under review and ``run_command`` in the
sandbox, at the head (the session's checkout) or at the base (a checkout made on first use).

:class:`ReviewRange` is what ``session/new``'s ``_meta["hopline.review"]`` carries: the two commit
ids, the gate's test command (allowed as it is besides :data:`~hopline.harness.tools.policy.REVIEW_COMMANDS`)
and the sandbox the gate chose (``none`` only when the operator allowed unsandboxed runs). With
``fix`` it is the dev agent's session of a ``--fix`` run instead: its ``run_command`` runs any shell
line, in the same sandbox, with the checkout writable (the one place it may write besides its
private ``/tmp``).
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
from hopline.harness import git, sandbox
from hopline.harness.sandbox_pids import pids_cap
from hopline.harness.tools.commands import CommandRun, run_captured
from hopline.harness.tools.env import tool_environment
from hopline.harness.tools.policy import check_review_command
from hopline.harness.tools.results import ToolError, check_relative

PYTHON_NAMES = frozenset({"python", "python3"})
# Analyzers run as the programs installed beside the agent's interpreter (its venv), when they are
ANALYZER_PROGRAMS = frozenset({"ruff", "detect-secrets", "bandit", "semgrep"})


@dataclasses.dataclass(frozen=True)
class ReviewRange:
    """A gate session's change under review: two commit ids (hex, so never read as options), the
    test command the gate runs (an argv), and the sandbox kind PR code runs in."""

    base: str
    head: str
    test_command: tuple[str, ...] | None = None
    sandbox: str | None = None  # None: the best one that runs here
    fix: bool = False  # the dev agent's session of a --fix run (see the module docstring)

    def __post_init__(self) -> None:
        git.check_commit(self.base, "base")
        git.check_commit(self.head, "head")
        if self.sandbox is not None and self.sandbox not in ("bwrap", "unshare", "none"):
            raise ValueError("sandbox must be bwrap, unshare or none")

    @classmethod
    def from_meta(cls, value: dict[str, Any]) -> ReviewRange:
        """From ``_meta["hopline.review"]``; ValueError saying what is wrong."""
        extra = set(value) - {"base", "head", "testCommand", "sandbox", "fix"}
        if extra or not {"base", "head"} <= set(value):
            raise ValueError("an object with base and head (and optionally testCommand, sandbox, fix)")
        if not isinstance(value.get("fix", False), bool):
            raise ValueError("fix must be a boolean")
        command = value.get("testCommand")
        if command is not None and (not isinstance(command, list) or not command
                                    or not all(isinstance(a, str) and a for a in command)):
            raise ValueError("testCommand must be a non-empty list of strings")
        return cls(value["base"], value["head"], tuple(command) if command else None, value.get("sandbox"),
                   value.get("fix", False))

    def to_meta(self) -> dict[str, Any]:
        out: dict[str, Any] = {"base": self.base, "head": self.head}
        if self.test_command:
            out["testCommand"] = list(self.test_command)
        if self.sandbox is not None:
            out["sandbox"] = self.sandbox
        if self.fix:
            out["fix"] = True
        return out


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
        self._private: tempfile.TemporaryDirectory[str] | None = None
        self._base: Path | None = None

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
            for dirpath, dirnames, filenames in os.walk(path):
                for name in [*dirnames, *filenames]:
                    full = Path(dirpath, name)
                    if not full.is_symlink() and name != ".git":
                        full.chmod(full.lstat().st_mode & ~0o222)
            self._base = path
        return self._base

    async def run(self, command: str, at: str) -> tuple[list[str], CommandRun]:
        """``command`` checked against the policy (a fix session: any shell line, at the head
        only), then run in the sandbox at ``at`` (head, base)."""
        if not self.sandbox.available and self.review.sandbox != "none":
            raise ToolError(f"refused: no sandbox runs here, and a gate runs a pull request's code only in "
                            f"one "
                            f"({self.sandbox.detail}); the operator may allow it with --allow-unsandboxed")
        if at not in ("head", "base") or (self.review.fix and at != "head"):
            raise ToolError("argument 'at' must be 'head'" + ("" if self.review.fix else " or 'base'"))
        cwd = self.root if at == "head" else self.base_checkout()
        if self.review.fix:
            argv = ["sh", "-c", command]
        else:
            argv = check_review_command(command, cwd, self.review.test_command)
        if argv[0] in PYTHON_NAMES:  # the interpreter the agent runs (its test runner installed)
            argv = [sys.executable, *argv[1:]]
        elif argv[0] in ANALYZER_PROGRAMS and os.path.isfile(beside := os.path.join(
                os.path.dirname(sys.executable), argv[0])):
            argv = [beside, *argv[1:]]
        limits = sandbox.Limits.of(self.budget)
        private = self._held() / f"tmp-{at}"
        private.mkdir(exist_ok=True)
        env = sandbox.sandbox_environment(tool_environment(os.environ), self.sandbox.kind, private, cwd,
                                          limits)
        if self.review.fix:  # its shell finds the agent's interpreter first, as a gate's python is it
            env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env["PATH"]])
        wrapped = sandbox.wrap(self.sandbox.kind, argv, cwd, private, limits, writable=self.review.fix)
        try:
            with pids_cap(limits.processes, sandbox.preexec(limits)) as (cap, preexec):
                run = await run_captured(wrapped, cwd=cwd, env=env,
                                         timeout=self.budget.gate_test_timeout_seconds,
                                         capture=self.budget.command_output_max_bytes, preexec=preexec)
        except OSError as exc:
            raise ToolError(f"{shlex.quote(argv[0])} could not be started ({type(exc).__name__}): is it "
                            "installed?") from None
        return argv, dataclasses.replace(run, refused_processes=cap.refused, process_limit=limits.processes)
