"""The interpreter a gate runs the project's tests with: the project's own, so that its test runner
and its dependencies are there (a plain install of hopline has no pytest).

In order: ``--python PATH`` (``POST /gate``'s ``python``); ``python = "..."`` in the base's
``.hopline/gate.toml`` (relative to the repository's root; read from the base, as the test command
is: a pull request does not choose what runs its tests); ``.venv/bin/python`` in the repository's
working tree, found by itself when git tracks nothing under ``.venv/`` (a virtual environment the
operator made, not a file of the pull request); else the interpreter hopline's agent runs.

The interpreter is bound read-only into the sandbox (:func:`~hopline.harness.sandbox_mounts.interpreter_dirs`:
its virtual environment and the installation it comes from, never anything else). One whose
directories would bring a home directory, ``/root``, ``/etc`` or the daemon's data directory into
the sandbox is refused, and so is one that does not run in the sandbox (as nobody, when hopline is
root: every directory above it must be searchable, and it readable, by others), each with a message
that names the setting to change.
"""

from __future__ import annotations

import dataclasses
import os
import pwd
import sys
import tomllib
from pathlib import Path

from hopline.budget import Budget
from hopline.errors import GitError
from hopline.gate.testcmd import GATE_CONFIG, TestCommandError
from hopline.harness.git import run_git
from hopline.harness.sandbox import SandboxKind, try_run
from hopline.harness.sandbox_mounts import SANDBOX_UID, drops_user, interpreter_dirs

VENV_PYTHON = ".venv/bin/python"
_NEVER_BOUND = ("/", "/root", "/home", "/etc", "/var", "/srv", "/mnt", "/media", "/run")


@dataclasses.dataclass(frozen=True)
class Interpreter:
    """The project's interpreter (``path``; None: the agent's own) and where it was named."""

    path: str | None
    source: str  # "given" (--python), GATE_CONFIG, ".venv", or "hopline"
    setting: str  # what to change to name another, for an error message

    def to_json(self) -> dict[str, object]:
        return {"path": self.path, "source": self.source}


HOPLINE_OWN = Interpreter(None, "hopline", "--python PATH (or python = in .hopline/gate.toml, or a .venv/)")


def _configured(repo: Path, base: str, budget: Budget) -> str | None:
    try:
        out = run_git(repo, ["show", f"{base}:{GATE_CONFIG}"], timeout=budget.command_timeout_seconds,
                      max_bytes=budget.gate_git_output_max_bytes)
    except GitError:
        return None
    try:
        value = (tomllib.loads(out.text).get("gate") or {}).get("python")
    except tomllib.TOMLDecodeError as exc:
        raise TestCommandError(f"{GATE_CONFIG} at the base does not parse: {exc}") from None
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise TestCommandError(f"{GATE_CONFIG}: [gate] python must be a path to an interpreter")
    return value


def _tracked(repo: Path, budget: Budget) -> bool:
    """Whether git tracks anything under ``.venv/``: then it is the pull request's, not a virtual
    environment the operator made, and it is not taken by itself."""
    try:
        out = run_git(repo, ["ls-files", "--", ".venv"], timeout=budget.command_timeout_seconds,
                      max_bytes=budget.gate_git_output_max_bytes)
    except GitError:
        return True
    return bool(out.text.strip())


def _homes() -> set[str]:
    homes = set()
    try:
        for entry in pwd.getpwall():
            if entry.pw_dir and entry.pw_dir != "/":
                homes.add(os.path.realpath(entry.pw_dir))
    except OSError:
        pass
    return homes


def _check_dirs(path: str, setting: str, data_dir: Path | None) -> None:
    """Refuse an interpreter whose bound directories would bring in what the sandbox must not see."""
    private = {os.path.realpath(p) for p in _NEVER_BOUND} | _homes()
    data = os.path.realpath(data_dir) if data_dir is not None else None
    for folder in interpreter_dirs(path):
        inside = data is not None and (data == folder or data.startswith(folder.rstrip("/") + "/"))
        if folder in private or inside or any(h.startswith(folder.rstrip("/") + "/") for h in private):
            what = "the daemon's data directory" if inside else folder
            raise TestCommandError(f"the interpreter {path} would bind {what} into the sandbox (its "
                                   f"installation is {folder}): use one in a virtual environment or its own "
                                   f"prefix ({setting})")


def choose(given: str | None, repo: Path, base: str, budget: Budget,
           data_dir: Path | None = None) -> Interpreter:
    """The interpreter of a gate run (see the module docstring); :class:`TestCommandError` when the
    one named cannot be used."""
    if given is not None:
        found = Interpreter(given, "given", "--python")
    elif (configured := _configured(repo, base, budget)) is not None:
        found = Interpreter(str(repo / configured), GATE_CONFIG, f"[gate] python in {GATE_CONFIG}")
    elif os.access(repo / VENV_PYTHON, os.X_OK) and not _tracked(repo, budget):
        found = Interpreter(str(repo / VENV_PYTHON), ".venv", "the repository's .venv/ (or --python)")
    else:
        return HOPLINE_OWN
    path = found.path
    assert path is not None
    if not os.path.isabs(path):
        raise TestCommandError(f"the interpreter {path} is not an absolute path ({found.setting})")
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        raise TestCommandError(f"the interpreter {path} is not an executable file ({found.setting})")
    _check_dirs(path, found.setting, data_dir)
    return found


def check_runs(interpreter: Interpreter, kind: SandboxKind, python: str) -> None:
    """The interpreter starts in the sandbox (as nobody, when hopline is root); else
    :class:`TestCommandError` saying what to change. Blocking."""
    binds = [(d, d) for d in interpreter_dirs(python)] if interpreter.path else []
    failed = try_run(kind, [python, "-c", "import sys"], binds=binds)
    if failed is None:
        return
    who = f" as nobody (uid {SANDBOX_UID}), which runs the pull request's code," if drops_user() else ""
    raise TestCommandError(f"the interpreter {python} does not start in the sandbox{who} ({failed}): it and "
                           "every directory above it must be readable and searchable by others "
                           f"(chmod o+rx), or name another: {interpreter.setting}")


def chosen(given: str | None, repo: Path, base: str, budget: Budget, data_dir: Path,
           kind: SandboxKind) -> Interpreter:
    """:func:`choose`, then :func:`check_runs` where a sandbox runs (blocking)."""
    found = choose(given, repo, base, budget, data_dir)
    if kind != "none":
        check_runs(found, kind, found.path or sys.executable)
    return found
