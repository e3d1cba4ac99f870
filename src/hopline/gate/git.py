"""The gate run's git: the commits under review, the merge base, and the head checkout (a ``git
worktree``, read-only while the gates read it, removed at the end). Blocking: call it off the loop.

Everything goes through :func:`hopline.harness.git.run_git` (argument lists, bounded output, the
command timeout). Revisions from a client are checked before git sees them (no option, no
whitespace), then resolved to commit ids; only commit ids go further.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
from pathlib import Path

from hopline.budget import CEILINGS_BY_KEY, Budget, HoplineError
from hopline.harness.git import GitError, run_git

# A revision a client may name: a ref, a commit id, HEAD~2, main@{upstream}... never an option.
REVISION_RE = re.compile(r"^[A-Za-z0-9._/@{}^~:+][A-Za-z0-9._/@{}^~:+-]{0,254}$")
DEFAULT_BRANCH = "main"
_COMMITTER = ["-c", "user.name=hopline dev agent", "-c", "user.email=dev-agent@hopline.invalid",
              "-c", "commit.gpgsign=false"]


class RepoError(HoplineError, ValueError):
    """The repository or a revision cannot be used; the message says which, never a path."""


def _git(cwd: Path, budget: Budget, *args: str) -> str:
    """What ``git args`` prints (a few lines: an id, a name), whole: more than
    ``gate_git_output_max_bytes`` is a :class:`RepoError` saying so, never a cut id."""
    limit = budget.gate_git_output_max_bytes
    out = run_git(cwd, args, timeout=budget.command_timeout_seconds, max_bytes=limit)
    if out.truncated_bytes:
        raise RepoError(f"git {args[0]} printed {limit + out.truncated_bytes} bytes, over the limit of "
                       f"{limit} ({CEILINGS_BY_KEY['gate_git_output_max_bytes'].name})")
    return out.text.strip()


def check_revision(value: str, what: str) -> str:
    if not REVISION_RE.fullmatch(value) or ".." in value:
        raise RepoError(f"{what} is not a revision git can name (letters, digits, ._/@{{}}^~:+-; "
                        "no leading '-', no '..')")
    return value


def repository_root(path: Path, budget: Budget) -> Path:
    """The top of the git work tree holding ``path``."""
    if not path.is_absolute() or not path.is_dir():
        raise RepoError("repo must be an absolute path to an existing directory")
    try:
        return Path(_git(path, budget, "rev-parse", "--show-toplevel"))
    except GitError:
        raise RepoError("repo is not inside a git work tree") from None


def resolve_commit(repo: Path, budget: Budget, revision: str, what: str) -> str:
    check_revision(revision, what)
    try:
        return _git(repo, budget, "rev-parse", "--verify", "--quiet", "--end-of-options",
                    f"{revision}^{{commit}}")
    except GitError:
        raise RepoError(f"{what} {revision!r} is not a commit of this repository") from None


def default_base(repo: Path, budget: Budget, head: str) -> tuple[str, str]:
    """The merge base of ``head`` with the upstream of the current branch, or with ``main``:
    ``(commit id, what it was computed from)``."""
    for candidate in ("@{upstream}", DEFAULT_BRANCH):
        with contextlib.suppress(GitError):
            target = _git(repo, budget, "rev-parse", "--verify", "--quiet", "--end-of-options",
                          f"{candidate}^{{commit}}")
            try:
                return _git(repo, budget, "merge-base", target, head), candidate
            except GitError:
                raise RepoError(f"head has no merge base with {candidate}: give base") from None
    raise RepoError(f"no upstream branch and no {DEFAULT_BRANCH!r} branch to take the merge base with: "
                    "give base")


def _chmod_tree(root: Path, *, writable: bool) -> None:
    """Files and directories of the checkout without (or with back) their write bits; ``.git``
    (a file pointing at the repository) is left alone."""
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in [*filenames, *dirnames]:
            path = Path(dirpath, name)
            if path.is_symlink() or (Path(dirpath) == root and name == ".git"):
                continue
            mode = path.lstat().st_mode
            write = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH
            path.chmod((mode | stat.S_IWUSR) if writable else (mode & ~write))
    mode = root.stat().st_mode
    root.chmod((mode | stat.S_IWUSR) if writable else (mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)))


class Checkout:
    """``head`` checked out in a worktree of ``repo`` at ``path`` (detached); read-only unless the dev
    agent works in it; :meth:`remove` takes it away whatever state it is in."""

    def __init__(self, repo: Path, path: Path, budget: Budget) -> None:
        self.repo = repo
        self.path = path
        self.budget = budget

    @classmethod
    def create(cls, repo: Path, path: Path, head: str, budget: Budget) -> Checkout:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            _git(repo, budget, "worktree", "add", "--detach", "--quiet", str(path), head)
        except GitError as exc:
            raise RepoError(f"the head checkout could not be made: {exc}") from None
        checkout = cls(repo, path, budget)
        checkout.read_only()
        return checkout

    def read_only(self) -> None:
        _chmod_tree(self.path, writable=False)

    def writable(self) -> None:
        _chmod_tree(self.path, writable=True)

    def commit_all(self, message: str) -> str | None:
        """Commit whatever the dev agent changed (a detached commit in the checkout): its id, or None
        when nothing changed. Hooks do not run: the commit is the agent's, the review judges it."""
        _git(self.path, self.budget, "add", "--all")
        try:
            _git(self.path, self.budget, "diff", "--cached", "--quiet")
            return None
        except GitError:
            pass  # there are staged changes
        _git(self.path, self.budget, *_COMMITTER, "commit", "--quiet", "--no-verify", "-m", message)
        return _git(self.path, self.budget, "rev-parse", "HEAD")

    def remove(self) -> None:
        if self.path.exists():
            with contextlib.suppress(OSError):
                self.writable()
        try:
            _git(self.repo, self.budget, "worktree", "remove", "--force", str(self.path))
        except GitError:
            shutil.rmtree(self.path, ignore_errors=True)
            with contextlib.suppress(GitError):
                _git(self.repo, self.budget, "worktree", "prune")
