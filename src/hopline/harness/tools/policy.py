"""Which commands a gate session's ``run_command`` may run: one table (:data:`REVIEW_COMMANDS`).

Each command of a review is a fixed argv prefix, the options it may take (a fixed set: an option
not listed is refused, so nothing that writes a file, loads a plugin or runs another program
passes), and what its operands may be. Values and operands are checked here; paths must resolve
inside the checkout. The test command a gate detected or was given (:mod:`hopline.gate.testcmd`)
is allowed as it is, argument for argument. Every one of them runs in the sandbox
(:mod:`hopline.harness.sandbox`): the table says what a reviewer means to run, the sandbox bounds
what the pull request's code can do while it runs.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from hopline.errors import ToolError
from hopline.harness.tools.results import resolve_inside

# Chaining, redirection, substitution, escapes: a review command is one program with its arguments.
_SHELL_SYNTAX = re.compile(r"[;&|<>`$(){}\\\n\r]")
# A variable assignment (``make test PYTEST=rm``, ``CC=x go test``): never part of a review command.
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")

ValueCheck = Callable[[str, Path], None]
Operands = Literal["nodes", "paths", "modules", "packages", "filters", "none"]


def _matching(pattern: str, what: str) -> ValueCheck:
    compiled = re.compile(pattern)

    def check(value: str, root: Path) -> None:
        if not compiled.fullmatch(value):
            raise ToolError(f"{value[:80]!r} is not {what}")
    return check


def _one_of(*choices: str) -> ValueCheck:
    return _matching("|".join(map(re.escape, choices)), "one of " + ", ".join(choices))


def _path_value(value: str, root: Path) -> None:
    resolve_inside(root, value)


_INT = _matching(r"\d{1,6}", "a whole number")
_NUMBER = _matching(r"\d{1,6}(?:\.\d{1,3})?", "a number")
_CODES = _matching(r"[A-Za-z0-9_,\-]{1,400}", "a list of rule codes")
_NAMES = _matching(r"[A-Za-z0-9_ .:\-\[\]]{1,200}", "an expression of test names")
_REGEX = _matching(r"[A-Za-z0-9_^.*+?/\-\[\]]{1,200}", "a test-name pattern")
_MODULE_RE = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*"
_MODULE = _matching(_MODULE_RE, "a module name")
_PY_VERSION = _matching(r"py3\d{1,2}", "a target version such as py312")
_RUST_NAME = _matching(r"[A-Za-z0-9_\-]{1,100}", "a package or target name")


@dataclasses.dataclass(frozen=True)
class ReviewCommand:
    prefix: tuple[str, ...]
    flags: frozenset[str] = frozenset()  # options without a value
    valued: Mapping[str, ValueCheck] = dataclasses.field(default_factory=dict)  # an option and its value
    operands: Operands = "paths"

    @property
    def shown(self) -> str:
        return " ".join(self.prefix)


def _flags(*names: str) -> frozenset[str]:
    return frozenset(names)


_PYTEST = ReviewCommand(
    ("pytest",),
    flags=_flags("-q", "--quiet", "-v", "-vv", "--verbose", "-x", "--exitfirst", "-s", "-l", "--showlocals",
                 "--co", "--collect-only", "--strict-markers", "--no-header", "--disable-warnings",
                 "--runxfail", "--full-trace"),
    valued={"-k": _NAMES, "-m": _NAMES, "--tb": _one_of("auto", "long", "short", "line", "native", "no"),
            "--maxfail": _INT, "-r": _matching(r"[fEsxXpPaAwN]{1,12}", "report characters"),
            "--durations": _INT, "--color": _one_of("yes", "no", "auto")},
    operands="nodes")
_UNITTEST = ReviewCommand(("python", "-m", "unittest"),
                          flags=_flags("-v", "-q", "-f", "--failfast", "-b", "--buffer", "--locals"),
                          valued={"-k": _NAMES}, operands="modules")
_DISCOVER = dataclasses.replace(
    _UNITTEST, prefix=("python", "-m", "unittest", "discover"), operands="none",
    valued={"-k": _NAMES, "-s": _path_value, "-t": _path_value,
            "-p": _matching(r"[A-Za-z0-9_*?.\-]{1,100}", "a file name pattern")})
# Compiles the named files (their bytecode goes to PYTHONPYCACHEPREFIX, in the sandbox's tmpfs).
_PY_COMPILE = ReviewCommand(("python", "-m", "py_compile"), flags=_flags("-q", "--quiet"), operands="paths")
_LINT_CODES = {"--select": _CODES, "--ignore": _CODES, "--extend-select": _CODES, "--extend-ignore": _CODES}
_RUFF_COMMON = {"--line-length": _INT, "--target-version": _PY_VERSION}
_CARGO = ReviewCommand(
    ("cargo", "test"),
    flags=_flags("-q", "--quiet", "-v", "--verbose", "--lib", "--bins", "--tests", "--all-targets",
                 "--workspace", "--all-features", "--no-default-features", "--release", "--offline",
                 "--locked", "--frozen"),
    valued={"-p": _RUST_NAME, "--package": _RUST_NAME, "-j": _INT, "--jobs": _INT,
            "--features": _matching(r"[A-Za-z0-9_,/\-]{1,200}", "a list of features")},
    operands="filters")
_MAKE = ReviewCommand(("make", "test"), flags=_flags("-s", "--silent", "--quiet", "-k", "--keep-going"),
                      valued={"-j": _INT, "--jobs": _INT}, operands="none")
_NPM = ReviewCommand(("npm", "test"), flags=_flags("-s", "--silent", "--if-present"), operands="none")


def _as(spec: ReviewCommand, *prefix: str, **changes: Any) -> ReviewCommand:
    return dataclasses.replace(spec, prefix=prefix, **changes)


def _also_as_module(spec: ReviewCommand, module: str) -> tuple[ReviewCommand, ...]:
    """``spec`` as its program, and as ``python -m <module>`` and ``python3 -m <module>`` (the
    interpreter the agent runs: what the gate's own analyzers are called as)."""
    rest = spec.prefix[1:]
    return (spec, _as(spec, "python", "-m", module, *rest), _as(spec, "python3", "-m", module, *rest))


# The gate's analyzers (hopline.harness.analyzers): report formats that go to standard output only,
# no option that writes a file, loads a plugin or reads a baseline.
_RUFF_CHECK = ReviewCommand(
    ("ruff", "check"),
    flags=_flags("-q", "--quiet", "--no-cache", "--statistics", "--exit-zero", "--preview", "--no-fix",
                 "--isolated", "--ignore-noqa"),
    valued={**_LINT_CODES, **_RUFF_COMMON,
            "--output-format": _one_of("concise", "full", "json", "json-lines", "junit", "grouped", "github",
                                       "gitlab", "pylint", "rdjson", "azure", "sarif")})
_PLUGIN = _matching(r"[A-Za-z0-9_]{1,80}", "a plugin's class name")
_DETECT_SECRETS = ReviewCommand(
    ("detect-secrets", "scan"), flags=_flags("-n", "--no-verify", "--force-use-all-plugins", "--slim"),
    valued={"--disable-plugin": _PLUGIN, "--base64-limit": _NUMBER, "--hex-limit": _NUMBER})
_REPORT = _one_of("json", "txt", "screen", "csv")
_BANDIT = ReviewCommand(
    ("bandit",), flags=_flags("-q", "--quiet", "--silent", "--exit-zero", "-r", "--recursive", "-l", "-ll",
                              "-lll", "-i", "-ii", "-iii"),
    valued={"-f": _REPORT, "--format": _REPORT,
            "-s": _CODES, "--skip": _CODES, "-t": _CODES, "--tests": _CODES,
            "--severity-level": _one_of("all", "low", "medium", "high"),
            "--confidence-level": _one_of("all", "low", "medium", "high")})
_SEMGREP = ReviewCommand(
    ("semgrep", "scan"), flags=_flags("--json", "-q", "--quiet", "--disable-version-check", "--error"),
    valued={"--metrics": _one_of("off"), "--config": _path_value, "-c": _path_value,
            "--severity": _one_of("INFO", "WARNING", "ERROR")})


REVIEW_COMMANDS: tuple[ReviewCommand, ...] = (
    _PYTEST, _as(_PYTEST, "python", "-m", "pytest"), _as(_PYTEST, "python3", "-m", "pytest"),
    _UNITTEST, _as(_UNITTEST, "python3", "-m", "unittest"),
    _PY_COMPILE, _as(_PY_COMPILE, "python3", "-m", "py_compile"),
    _DISCOVER, _as(_DISCOVER, "python3", "-m", "unittest", "discover"),
    *_also_as_module(_RUFF_CHECK, "ruff"), *_also_as_module(_DETECT_SECRETS, "detect_secrets"),
    *_also_as_module(_BANDIT, "bandit"), *_also_as_module(_SEMGREP, "semgrep"),
    ReviewCommand(("ruff", "format", "--check"),
                  flags=_flags("--diff", "-q", "--quiet", "--no-cache", "--preview"), valued=_RUFF_COMMON),
    ReviewCommand(("mypy",),
                  flags=_flags("--strict", "--ignore-missing-imports", "--no-incremental",
                               "--show-error-codes", "--pretty", "--no-error-summary",
                               "--show-column-numbers", "--warn-unused-ignores", "--check-untyped-defs",
                               "--disallow-untyped-defs", "--no-implicit-optional", "--namespace-packages",
                               "--explicit-package-bases"),
                  valued={"--python-version": _matching(r"3\.\d{1,2}", "a version such as 3.12"),
                          "-p": _MODULE, "--package": _MODULE, "-m": _MODULE, "--module": _MODULE}),
    ReviewCommand(("flake8",),
                  flags=_flags("--count", "--statistics", "-q", "--quiet", "--show-source", "--exit-zero"),
                  valued={**_LINT_CODES, "--max-line-length": _INT, "--max-complexity": _INT}),
    ReviewCommand(("pylint",), flags=_flags("-E", "--errors-only"),
                  valued={"--disable": _CODES, "--enable": _CODES, "-j": _INT, "--jobs": _INT,
                          "--output-format": _one_of("text", "parseable", "colorized", "json", "json2",
                                                     "msvs"),
                          "--score": _one_of("y", "n", "yes", "no"), "--fail-under": _NUMBER}),
    ReviewCommand(("black", "--check"),
                  flags=_flags("--diff", "-q", "--quiet", "-v", "--verbose", "--color", "--no-color",
                               "--preview"),
                  valued={"-l": _INT, "--line-length": _INT, "-t": _PY_VERSION,
                          "--target-version": _PY_VERSION}),
    _MAKE, _as(_MAKE, "make", "lint"), _as(_MAKE, "make", "check"),
    _NPM, _as(_NPM, "npm", "run", "test"), _as(_NPM, "npm", "run", "lint"),
    ReviewCommand(("go", "test"),
                  flags=_flags("-v", "-short", "-failfast", "-race", "-cover", "-json", "-benchmem"),
                  valued={"-run": _REGEX, "-bench": _REGEX, "-count": _INT, "-parallel": _INT,
                          "-timeout": _matching(r"\d{1,6}(?:ns|us|ms|s|m|h)", "a duration such as 90s"),
                          "-tags": _CODES, "-cpu": _matching(r"[0-9,]{1,50}", "a list of counts")},
                  operands="packages"),
    ReviewCommand(("go", "vet"), flags=_flags("-json"), valued={"-tags": _CODES}, operands="packages"),
    _CARGO, _as(_CARGO, "cargo", "clippy", operands="none"),
)
_REVIEW_BY_LENGTH = sorted(REVIEW_COMMANDS, key=lambda c: -len(c.prefix))


def _check_operand(kind: Operands, value: str, root: Path) -> None:
    if kind == "none":
        raise ToolError(f"{value[:80]!r}: this command takes no operand")
    if kind == "filters":
        _matching(r"[A-Za-z0-9_:]{1,200}", "a test-name filter")(value, root)
    elif kind == "modules" and re.fullmatch(_MODULE_RE, value):
        return
    elif kind == "packages":
        if value != "." and not value.startswith("./"):
            raise ToolError(f"{value[:80]!r}: packages are relative paths (., ./..., ./pkg/...)")
        resolve_inside(root, value.removesuffix("...").removesuffix("/") or ".")
    else:  # a path, or a pytest node id (path::test[param])
        resolve_inside(root, value.split("::", 1)[0] if kind == "nodes" else value)


def check_review_command(command: str, root: Path, test_command: Sequence[str] | None = None) -> list[str]:
    """The argv of ``command`` when it is the gate's ``test_command`` as it is, or a test runner or
    linter of :data:`REVIEW_COMMANDS` with options of its allow-list and operands inside ``root``;
    else :class:`ToolError` saying why."""
    refused = ("a gate agent runs tests and linters only (" + ", ".join(c.shown for c in REVIEW_COMMANDS)
               + (f", or the gate's test command {shlex.join(test_command)}" if test_command else "")
               + "), one command with no shell syntax and no variable assignment")
    try:
        argv = shlex.split(command)
    except ValueError:
        raise ToolError(f"refused: {refused}") from None
    if test_command and argv == list(test_command):
        return argv
    if _SHELL_SYNTAX.search(command):
        raise ToolError(f"refused: {refused}")
    spec = next((c for c in _REVIEW_BY_LENGTH if tuple(argv[:len(c.prefix)]) == c.prefix), None)
    if spec is None:
        raise ToolError(f"refused: {refused}")
    allowed = ", ".join(sorted([*spec.flags, *spec.valued])) or "none"
    args = argv[len(spec.prefix):]
    index = 0
    try:
        while index < len(args):
            arg = args[index]
            index += 1
            if _ASSIGNMENT.match(arg):
                raise ToolError(f"{arg.split('=', 1)[0]}=...: variable assignments are refused")
            if not arg.startswith("-"):
                _check_operand(spec.operands, arg, root)
                continue
            if arg in spec.flags:
                continue
            name, value = arg, None
            if "=" in arg:
                name, value = arg.split("=", 1)
            elif arg not in spec.valued and len(arg) > 2 and arg[:2] in spec.valued:
                name, value = arg[:2], arg[2:]  # -kEXPR
            check = spec.valued.get(name)
            if check is None:
                raise ToolError(f"option {name[:80]} is not one {spec.shown} takes in a review "
                                f"(allowed: {allowed})")
            if value is None:
                if index >= len(args):
                    raise ToolError(f"option {name} needs a value")
                value = args[index]
                index += 1
            check(value, root)
    except ToolError as exc:
        raise ToolError(f"refused: {exc}; {refused}") from None
    return argv


