"""git, read-only and bounded: the one place hopline runs ``git`` (the ``git_diff`` tool, the base
checkout of a review, and the gate's: the commits under review, the merge base, the head checkout
and the dev agent's commits in it).

Every call runs ``git`` with an argument list (never a shell), in a given directory, with the tool
environment (no hopline credential, :func:`hopline.harness.tools.env.tool_environment`), no pager and
no terminal prompt, killed after the budget's command timeout; its output is read up to a byte limit
and the rest is counted, never buffered.

No program of the reviewed repository runs (SPEC T-7): every call disables hooks
(``core.hooksPath=/dev/null``), the file-system monitor, external diff and textconv; a checkout
(:func:`add_worktree`) also blanks every filter driver that any configuration names (clean, smudge,
process), so a ``.gitattributes`` of the pull request selects nothing that runs.

A gate run's revisions come from a client: they are checked before git sees them (no option, no
whitespace), then resolved to commit ids; only commit ids go further. Its head checkout (a ``git
worktree``) is read-only while the gates read it and removed at the end. Blocking: call it off the
loop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import subprocess
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from hopline.budget import CEILINGS_BY_KEY, Budget
from hopline.errors import GitError, RepoError
from hopline.harness.sandbox_mounts import share_tree

# A commit id as hopline passes it to git: full or abbreviated hex, so it can never read as an option.
COMMIT_RE = re.compile(r"^[0-9a-f]{4,64}$")
_GIT_ENV = {"GIT_TERMINAL_PROMPT": "0", "GIT_PAGER": "cat", "PAGER": "cat", "LC_ALL": "C",
            "GIT_OPTIONAL_LOCKS": "0", "GIT_EXTERNAL_DIFF": "", "GIT_NO_REPLACE_OBJECTS": "1"}
# Set on every call: what of a repository's configuration could run a program of its own.
SAFE_CONFIG: tuple[str, ...] = ("-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false",
                                "-c", "diff.external=", "-c", "core.pager=cat", "-c", "core.editor=true",
                                "-c", "sequence.editor=true", "-c", "gpg.program=false",
                                "-c", "commit.gpgsign=false", "-c", "core.sshCommand=false")
# Paths as they are (UTF-8), not octal-quoted: a path git prints names the file an analyzer reads.
_PLAIN_PATHS = ("-c", "core.quotePath=false")
_DRIVER_RE = re.compile(r"^(filter|diff|merge)\.(.+)\."
                        r"(clean|smudge|process|required|textconv|command|driver)$")


@dataclasses.dataclass(frozen=True)
class GitOutput:
    text: str
    truncated_bytes: int  # bytes of output past the limit, counted and not kept


def _environment(environ: Mapping[str, str]) -> dict[str, str]:
    from hopline.harness.tools.env import tool_environment

    return {**tool_environment(environ), **_GIT_ENV}


def run_git(cwd: Path, args: Sequence[str], *, timeout: float, max_bytes: int,
            environ: Mapping[str, str] | None = None) -> GitOutput:
    """``git args`` in ``cwd``: stdout up to ``max_bytes`` (the rest counted), or :class:`GitError`."""
    with tempfile.TemporaryFile() as errors:  # a file, so a chatty stderr never blocks git
        try:
            proc = subprocess.Popen(["git", *SAFE_CONFIG, *_PLAIN_PATHS, *args], cwd=cwd,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=errors, env=_environment(os.environ if environ is None
                                                                    else environ))
        except OSError as exc:
            raise GitError(f"git could not be started ({type(exc).__name__})") from None
        assert proc.stdout is not None
        kept = bytearray()
        dropped = 0
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        try:
            while chunk := proc.stdout.read(64 * 1024):
                room = max(max_bytes - len(kept), 0)
                kept += chunk[:room]
                dropped += len(chunk) - min(room, len(chunk))
            code = proc.wait()
        finally:
            timer.cancel()
            proc.stdout.close()
        errors.seek(0)
        stderr = errors.read(4096)
    if code != 0:
        first = stderr.decode("utf-8", "replace").strip().splitlines()
        reason = ("killed after its timeout" if code < 0
                  else first[0][:200] if first else f"exit code {code}")
        raise GitError(f"git {args[0] if args else ''} failed: {reason}")
    return GitOutput(kept.decode("utf-8", "replace"), dropped)


def check_commit(value: str, what: str) -> str:
    """``value`` when it is a commit id (hex), else ValueError naming ``what``."""
    if not isinstance(value, str) or not COMMIT_RE.fullmatch(value):
        raise ValueError(f"{what} must be a commit id (hex), not a name or an option")
    return value


WHOLE_FILE_CONTEXT = "--unified=1000000"  # a diff with the whole file as context: both sides in one hunk
NO_CONTEXT = "--unified=0"  # hunks of changed lines only: their headers say which lines a change adds


def diff_args(base: str, head: str, *, path: str | None = None, stat: bool = False,
              whole: bool = False, added: bool = False) -> list[str]:
    """``git diff`` of ``base..head`` (commit ids), whole or of one path (``whole``: with the whole
    file as context; ``added``: with none), or its per-file counts."""
    args = ["diff", "--no-color", "--no-ext-diff", "--no-textconv", "--find-renames",
            check_commit(base, "base"), check_commit(head, "head")]
    if stat:
        args.insert(1, "--numstat")
    elif whole or added:
        args.insert(1, WHOLE_FILE_CONTEXT if whole else NO_CONTEXT)
    args.append("--")
    if path is not None:
        args.append(path)
    return args


def driver_overrides(cwd: Path, *, timeout: float, max_bytes: int) -> list[str]:
    """``-c`` options that blank every filter, diff and merge driver any configuration of ``cwd``'s
    repository names (system, global, local, worktree; reading the configuration runs nothing)."""
    try:
        out = run_git(cwd, ["config", "--null", "--get-regexp", r"^(filter|diff|merge)\."], timeout=timeout,
                      max_bytes=max_bytes)
    except GitError:  # no such key: exit code 1
        return []
    blanks: list[str] = []
    for entry in out.text.split("\0"):
        key = entry.split("\n", 1)[0]
        match = _DRIVER_RE.match(key)
        if match is not None:
            value = "false" if match.group(3) == "required" else ""
            blanks += ["-c", f"{key}={value}"]
    return blanks


def add_worktree(repo: Path, path: Path, commit: str, *, timeout: float, max_bytes: int) -> None:
    """``commit`` checked out (detached) in a new worktree of ``repo`` at ``path``: no hook, filter,
    textconv or external diff of the repository runs (see the module docstring)."""
    check_commit(commit, "commit")
    blanks = driver_overrides(repo, timeout=timeout, max_bytes=max_bytes)
    run_git(repo, [*blanks, "-c", "core.autocrlf=false", "worktree", "add", "--detach", "--quiet", str(path),
                   commit], timeout=timeout, max_bytes=max_bytes)


def remove_worktree(repo: Path, path: Path, *, timeout: float, max_bytes: int) -> None:
    """The worktree at ``path`` removed (forced; its directories made writable first, so that a
    read-only checkout goes too), or its directory deleted; then git's records of worktrees that
    are gone pruned, so none is left "prunable"."""
    import shutil
    import stat

    for dirpath, dirnames, _ in os.walk(path):
        for name in [".", *dirnames]:
            with contextlib.suppress(OSError):
                folder = Path(dirpath, name)
                if not folder.is_symlink():
                    folder.chmod(folder.stat().st_mode | stat.S_IWUSR | stat.S_IXUSR)
    try:
        run_git(repo, ["worktree", "remove", "--force", str(path)], timeout=timeout, max_bytes=max_bytes)
    except GitError:
        shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(GitError):
        run_git(repo, ["worktree", "prune"], timeout=timeout, max_bytes=max_bytes)


# --- the gate's side ------------------------------------------------------------------------------

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
