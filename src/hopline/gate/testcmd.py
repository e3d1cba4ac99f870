"""The test command a gate runs: given (``--test-cmd``), or the base's ``.hopline/gate.toml``, or
detected from the head checkout with one table (:data:`DETECTORS`).

``.hopline/gate.toml`` is read from the *base* commit, never from the pull request's head: a PR
does not choose what verifies it. Its form::

    [gate]
    test_command = "python -m pytest -rA --tb=short tests"   # or a list of arguments
    python = ".venv/bin/python"   # the interpreter that runs it (:mod:`hopline.gate.interpreter`)
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import tomllib
from collections.abc import Callable
from pathlib import Path

from hopline.budget import Budget
from hopline.errors import GitError, InputError
from hopline.harness.git import run_git

GATE_CONFIG = ".hopline/gate.toml"
PYTEST_COMMAND = ("python", "-m", "pytest", "-rA", "--tb=short", "-q", "--color", "no")
_SCANNED_FILES = 50  # test files read to tell unittest's from pytest's, and the bytes of each
_SCANNED_BYTES = 64 * 1024
_PYTEST_STYLE = re.compile(r"^\s*(?:import pytest|from pytest\b)|^(?:async )?def test", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class TestCommand:
    """The argv a gate runs, where it came from, and the file that named it (for a finding)."""

    argv: tuple[str, ...]
    source: str  # "given", GATE_CONFIG, or a detector's name
    file: str  # what a finding about the command names: the config or the file it was detected from

    def to_json(self) -> dict[str, object]:
        return {"argv": list(self.argv), "shown": shlex.join(self.argv), "source": self.source,
                "file": self.file}


def _test_files(root: Path) -> tuple[str, list[Path]] | None:
    """The tests folder and its first test files (``test_*.py``), if the checkout has one."""
    for folder in ("tests", "test"):
        if (root / folder).is_dir():
            files = sorted((root / folder).rglob("test_*.py"))[:_SCANNED_FILES]
            if files:
                return folder, files
    return None


def _unittest_only(files: list[Path]) -> bool:
    """Every test file is unittest's (it imports unittest, and neither pytest nor a bare test function)."""
    for path in files:
        try:
            text = path.read_text(errors="replace")[:_SCANNED_BYTES]
        except OSError:
            return False
        if "unittest" not in text or _PYTEST_STYLE.search(text):
            return False
    return True


def _pytest(root: Path) -> str | None:
    for name in ("pytest.ini", "conftest.py"):
        if (root / name).is_file():
            return name
    configs = (("pyproject.toml", "[tool.pytest"), ("setup.cfg", "[tool:pytest]"), ("tox.ini", "[pytest]"))
    for name, marker in configs:
        path = root / name
        if path.is_file() and marker in path.read_text(errors="replace"):
            return name
    found = _test_files(root)
    return found[0] if found is not None and not _unittest_only(found[1]) else None


def _unittest(root: Path) -> tuple[str, tuple[str, ...]] | None:
    """A tests folder whose test files are all unittest's: discovered from it, verbose (the tests'
    names are read), from the root when it is a package (so that ``tests/__init__.py`` runs)."""
    found = _test_files(root)
    if found is None or not _unittest_only(found[1]):
        return None
    folder = found[0]
    top = ("-t", ".") if (root / folder / "__init__.py").is_file() else ()
    return folder, ("python", "-m", "unittest", "discover", "-v", "-s", folder, *top)


def _file(name: str) -> Callable[[Path], str | None]:
    return lambda root: name if (root / name).is_file() else None


def _make_test(root: Path) -> str | None:
    for name in ("Makefile", "makefile", "GNUmakefile"):
        path = root / name
        if path.is_file() and re.search(r"^test\s*:", path.read_text(errors="replace"), re.MULTILINE):
            return name
    return None


def _npm_test(root: Path) -> str | None:
    try:
        scripts = json.loads((root / "package.json").read_text()).get("scripts") or {}
    except (OSError, ValueError, AttributeError):
        return None
    return "package.json" if isinstance(scripts, dict) and "test" in scripts else None


# The one table: in order, what marks a kind of project and the command that tests it.
DETECTORS: tuple[tuple[str, Callable[[Path], str | None], tuple[str, ...]], ...] = (
    ("pytest", _pytest, PYTEST_COMMAND),
    ("go", _file("go.mod"), ("go", "test", "./...")),
    ("cargo", _file("Cargo.toml"), ("cargo", "test", "--offline")),
    ("npm", _npm_test, ("npm", "test")),
    ("make", _make_test, ("make", "test")),
)


def detect(root: Path) -> TestCommand | None:
    """The first row of :data:`DETECTORS` that matches the checkout at ``root`` (pytest first; a
    tests folder of unittest's alone is run by unittest, which every Python has)."""
    for name, marks, argv in DETECTORS:
        found = marks(root)
        if found is not None:
            return TestCommand(argv, name, found)
        if name == "pytest" and (unit := _unittest(root)) is not None:
            return TestCommand(unit[1], "unittest", unit[0])
    return None


class TestCommandError(InputError):
    """A given or configured test command that cannot be used (the message says why)."""


def _parse(value: object, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        try:
            argv = tuple(shlex.split(value))
        except ValueError:
            raise TestCommandError(f"{where}: the test command does not parse as a command line") from None
    elif isinstance(value, list) and all(isinstance(a, str) for a in value):
        argv = tuple(value)
    else:
        raise TestCommandError(f"{where}: the test command must be a string or a list of strings")
    if not argv or not all(argv):
        raise TestCommandError(f"{where}: the test command is empty")
    return argv


def configured(repo: Path, base: str, budget: Budget) -> TestCommand | None:
    """``[gate] test_command`` of ``.hopline/gate.toml`` at the base commit, if it has one."""
    try:
        out = run_git(repo, ["show", f"{base}:{GATE_CONFIG}"], timeout=budget.command_timeout_seconds,
                      max_bytes=budget.gate_git_output_max_bytes)
    except GitError:
        return None
    try:
        config = tomllib.loads(out.text)
    except tomllib.TOMLDecodeError as exc:
        raise TestCommandError(f"{GATE_CONFIG} at the base does not parse: {exc}") from None
    value = (config.get("gate") or {}).get("test_command")
    return None if value is None else TestCommand(_parse(value, GATE_CONFIG), GATE_CONFIG, GATE_CONFIG)


def choose(given: str | None, repo: Path, base: str, checkout: Path, budget: Budget) -> TestCommand | None:
    """The given command, else the base's configuration, else what the head checkout looks like."""
    if given is not None:
        return TestCommand(_parse(given, "--test-cmd"), "given", ".")
    return configured(repo, base, budget) or detect(checkout)
