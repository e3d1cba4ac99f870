"""The gate run's git: the commits under review, the merge base, and the head checkout (a ``git
worktree``, read-only while the gates read it, removed at the end). Blocking: call it off the loop.

Everything goes through :func:`hopline.harness.git.run_git` (argument lists, bounded output, the
command timeout, no hook or filter of the repository: :func:`hopline.harness.git.add_worktree`).
Revisions from a client are checked before git sees them (no option, no whitespace), then resolved
to commit ids; only commit ids go further.
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

from hopline.budget import CEILINGS_BY_KEY, Budget
from hopline.errors import GitError, RepoError
from hopline.harness.git import add_worktree, driver_overrides, remove_worktree, run_git
from hopline.harness.sandbox_mounts import share_tree

# A revision a client may name: a ref, a commit id, HEAD~2, main@{upstream}... never an option.
REVISION_RE = re.compile(r"^[A-Za-z0-9._/@{}^~:+][A-Za-z0-9._/@{}^~:+-]{0,254}$")
DEFAULT_BRANCH = "main"
_COMMITTER = ["-c", "user.name=hopline dev agent", "-c", "user.email=dev-agent@hopline.invalid",
              "-c", "commit.gpgsign=false"]


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


def resolve_range(path: Path, base: str | None, head: str | None,
                  budget: Budget) -> tuple[Path, str, str, str]:
    """The repository's root holding ``path`` and the commits under review: ``(root, base, head,
    where the base came from)`` (``given``, or what :func:`default_base` took the merge base with)."""
    root = repository_root(path, budget)
    head_id = resolve_commit(root, budget, head or "HEAD", "head")
    if base is not None:
        return root, resolve_commit(root, budget, base, "base"), head_id, "given"
    base_id, base_from = default_base(root, budget, head_id)
    return root, base_id, head_id, base_from


def changes_nothing(repo: Path, budget: Budget, base: str, head: str) -> bool:
    """True when ``base`` and ``head`` hold the same tree: an empty range, nothing to review."""
    return base == head or _git(repo, budget, "rev-parse", f"{base}^{{tree}}") == _git(
        repo, budget, "rev-parse", f"{head}^{{tree}}")


class Checkout:
    """``head`` checked out in a worktree of ``repo`` at ``path`` (detached); read-only unless the dev
    agent works in it; :meth:`remove` takes it away whatever state it is in."""

    def __init__(self, repo: Path, path: Path, budget: Budget) -> None:
        self.repo = repo
        self.path = path
        self.budget = budget
        self._blanks: list[str] | None = None  # the repository's filter drivers, blanked (git add, reset)

    def _in_checkout(self, *args: str) -> str:
        """``git args`` in the checkout with every filter driver of the repository blanked."""
        if self._blanks is None:
            self._blanks = driver_overrides(self.path, timeout=self.budget.command_timeout_seconds,
                                            max_bytes=self.budget.gate_git_output_max_bytes)
        return _git(self.path, self.budget, *self._blanks, *args)

    @classmethod
    def create(cls, repo: Path, path: Path, head: str, budget: Budget) -> Checkout:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            add_worktree(repo, path, head, timeout=budget.command_timeout_seconds,
                         max_bytes=budget.gate_git_output_max_bytes)
        except GitError as exc:
            raise RepoError(f"the head checkout could not be made: {exc}") from None
        checkout = cls(repo, path, budget)
        checkout.read_only()
        return checkout

    def read_only(self) -> None:
        share_tree(self.path, writable=False)

    def writable(self) -> None:
        share_tree(self.path, writable=True)

    def stage_all(self) -> list[str]:
        """Stage whatever the dev agent changed; the paths staged (none: it changed nothing)."""
        self._in_checkout("add", "--all")
        names = self._in_checkout("diff", "--cached", "--name-only", "-z")
        return [n for n in names.split("\0") if n]

    def changed_since(self, base: str) -> list[str]:
        """The paths that exist now (staged) and differ from ``base``: what a fix check compiles."""
        names = self._in_checkout("diff", "--cached", "--name-only", "--diff-filter=d", "-z", base)
        return [n for n in names.split("\0") if n]

    def commit_staged(self, message: str) -> str:
        """Commit what is staged (a detached commit in the checkout): its id. Hooks do not run: the
        commit is the agent's, the review judges it."""
        self._in_checkout(*_COMMITTER, "commit", "--quiet", "--no-verify", "-m", message)
        return _git(self.path, self.budget, "rev-parse", "HEAD")

    def discard(self) -> None:
        """The dev agent's refused changes taken back: the checkout is its last commit again."""
        self._in_checkout("reset", "--quiet", "--hard")
        self._in_checkout("clean", "--quiet", "-fd")

    def remove(self) -> None:
        if self.path.exists():
            with contextlib.suppress(OSError):
                self.writable()
        remove_worktree(self.repo, self.path, timeout=self.budget.command_timeout_seconds,
                        max_bytes=self.budget.gate_git_output_max_bytes)
