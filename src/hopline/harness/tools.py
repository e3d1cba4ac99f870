"""The harness's tools over one workspace (SPEC H-7).

Every path is resolved (symlinks included) and must stay inside the workspace root. Each tool
returns the full output (bounded by the budget's capture limits, for the user and ACP
``tool_call_update``) and the text for the model, capped at ``budget.tool_result_max_bytes`` with
head and tail kept and a marker saying how many bytes were cut and how to read more.

Outputs that are not files (command output, listings, search results) are kept, when cut, in a
private spill directory outside the workspace and readable through ``read_file`` at the virtual
path ``@output/<id>``, so "read more" is always possible and the workspace is never written by a
read-only agent.

``git_diff`` shows the change under review: a gate session's ``base..head`` (commit ids the gate run
gives in ``session/new``, :class:`ReviewRange`), else the uncommitted changes against ``HEAD``; whole
(cut and kept like any long output), one file's, or the changed files with their line counts. In a
gate session ``run_command`` runs test runners and linters only (:data:`REVIEW_COMMANDS`: each with
the options of its allow-list, its operands inside the checkout, no variable assignment), without a
shell, with a temporary HOME, TMPDIR and caches (:func:`review_environment`).

``run_command`` runs with the agent's environment less every credential hopline knows
(:data:`CREDENTIAL_ENV`) and every setting of hopline's own (``HOPLINE_*``: the data and sidecar
directories among them): what the model runs never sees a token or where hopline keeps its stores
(SPEC D-11). Under the daemon the agent's own environment holds no credential either (an allow-list,
and per-session credentials travel in the ACP request); ``list_files`` and ``search_workspace`` read
files only, never the environment. That hides the stores; it does not wall them off: a command the
model runs has the agent's OS user, so real isolation takes a separate user or a sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import re
import shlex
import signal
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

from hopline.budget import CEILINGS, Budget, HoplineError
from hopline.harness import git
from hopline.harness.events import ToolKind
from hopline.vocabulary import CREDENTIAL_ENV, HOPLINE_ENV_PREFIX

OUTPUT_PREFIX = "@output/"
SKIPPED_DIRS = frozenset({".git", "__pycache__", ".venv", "node_modules", ".mypy_cache", ".pytest_cache"})
# Chaining, redirection, substitution, escapes: a review command is one program with its arguments.
_SHELL_SYNTAX = re.compile(r"[;&|<>`$(){}\\\n\r]")
# A variable assignment (``make test PYTEST=rm``, ``CC=x go test``): never part of a review command.
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


# The session/new _meta key that makes a session a gate session: {"base", "head"} (commit ids).
REVIEW_META = "hopline.review"


@dataclasses.dataclass(frozen=True)
class ReviewRange:
    """A gate session's change under review: two commit ids (hex, so never read as options)."""

    base: str
    head: str

    def __post_init__(self) -> None:
        git.check_commit(self.base, "base")
        git.check_commit(self.head, "head")


# --- the review command policy (a gate session's run_command) -------------------------------------
# Each command of a review is a fixed argv prefix, the options it may take (a fixed set: an option
# not listed is refused, so nothing that writes a file, loads a plugin or runs another program
# passes), and what its operands may be. Values and operands are checked here; paths must resolve
# inside the checkout.

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


REVIEW_COMMANDS: tuple[ReviewCommand, ...] = (
    _PYTEST, _as(_PYTEST, "python", "-m", "pytest"), _as(_PYTEST, "python3", "-m", "pytest"),
    _UNITTEST, _as(_UNITTEST, "python3", "-m", "unittest"),
    _DISCOVER, _as(_DISCOVER, "python3", "-m", "unittest", "discover"),
    ReviewCommand(("ruff", "check"),
                  flags=_flags("-q", "--quiet", "--no-cache", "--statistics", "--exit-zero", "--preview",
                               "--no-fix"),
                  valued={**_LINT_CODES, **_RUFF_COMMON,
                          "--output-format": _one_of("concise", "full", "json", "json-lines", "junit",
                                                     "grouped", "github", "gitlab", "pylint", "rdjson",
                                                     "azure", "sarif")}),
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


def check_review_command(command: str, root: Path) -> list[str]:
    """The argv of ``command`` when it is a test runner or linter of :data:`REVIEW_COMMANDS` with
    options of its allow-list and operands inside ``root``; else :class:`ToolError` saying why."""
    refused = ("a gate agent runs tests and linters only (" + ", ".join(c.shown for c in REVIEW_COMMANDS)
               + "), one command with no shell syntax and no variable assignment")
    if _SHELL_SYNTAX.search(command):
        raise ToolError(f"refused: {refused}")
    try:
        argv = shlex.split(command)
    except ValueError:
        raise ToolError(f"refused: {refused}") from None
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


def resolve_inside(root: Path, path: str) -> Path:
    """The real path of ``path`` inside ``root``, or ToolError (no escape of any kind)."""
    if "\x00" in path:
        raise ToolError("path contains a NUL byte")
    if os.path.isabs(path) or path.startswith("~"):
        raise ToolError("absolute paths are refused: paths are relative to the workspace root")
    candidate = (root / path).resolve()  # follows symlinks, collapses ..
    if candidate != root and not candidate.is_relative_to(root):
        raise ToolError("path escapes the workspace (via .. or a symlink) and is refused")
    return candidate


def tool_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment a tool's command runs with: ``environ`` less every credential
    (:data:`CREDENTIAL_ENV`) and every setting of hopline's own (``HOPLINE_*``, the budget's
    variables): where hopline keeps its stores, its tokens and its limits are nothing a tool needs."""
    return {k: v for k, v in environ.items()
            if k not in CREDENTIAL_ENV and not k.startswith(HOPLINE_ENV_PREFIX) and k not in _CEILING_ENV}


_CEILING_ENV = frozenset(c.env for c in CEILINGS if c.env)
# What a review command keeps of the agent's environment: a program's search path and the locale.
_REVIEW_BASE_ENV = frozenset({"PATH", "LANG", "LANGUAGE", "TERM", "TZ", "USER", "LOGNAME"})


def review_environment(environ: Mapping[str, str], home: Path) -> dict[str, str]:
    """The environment of a review command: the locale and the absolute entries of ``PATH`` (never
    the checkout's own programs), with ``home`` (a temporary directory) as HOME, TMPDIR and every
    cache, so that what a test runner or linter writes by default stays out of the real home and
    ``/tmp``, and out of the checkout (pytest's cache is off)."""
    base = {k: v for k, v in tool_environment(environ).items()
            if k in _REVIEW_BASE_ENV or k.startswith("LC_")}
    search = base.get("PATH", os.defpath).split(os.pathsep)
    base["PATH"] = os.pathsep.join(p for p in search if os.path.isabs(p))
    cache = home / "home" / ".cache"
    dirs = {"HOME": home / "home", "TMPDIR": home / "tmp", "XDG_CACHE_HOME": cache,
            "XDG_CONFIG_HOME": home / "home" / ".config", "XDG_DATA_HOME": home / "home" / ".local" / "share",
            "XDG_STATE_HOME": home / "home" / ".local" / "state", "PYTHONPYCACHEPREFIX": cache / "pycache",
            "MYPY_CACHE_DIR": cache / "mypy", "RUFF_CACHE_DIR": cache / "ruff",
            "CARGO_TARGET_DIR": cache / "cargo-target"}
    for path in dirs.values():
        path.mkdir(parents=True, exist_ok=True)
    return {**base, **{k: str(v) for k, v in dirs.items()}, "TEMP": str(dirs["TMPDIR"]),
            "TMP": str(dirs["TMPDIR"]), "PYTEST_ADDOPTS": "-p no:cacheprovider"}


class ToolError(HoplineError):
    """An expected tool failure: its message goes to the model as a failed result."""


@dataclasses.dataclass(frozen=True)
class ToolOutcome:
    output: str  # for the user, bounded by capture limits
    model_output: str  # for the model, capped at tool_result_max_bytes
    status: Literal["completed", "failed"]
    raw_output: Any = None


@dataclasses.dataclass(frozen=True)
class ToolInfo:
    kind: ToolKind
    title: str
    locations: list[str]


def _utf8_head(data: bytes, size: int) -> str:
    return data[:max(0, size)].decode("utf-8", errors="ignore")


def _utf8_tail(data: bytes, size: int) -> str:
    return data[len(data) - max(0, size):].decode("utf-8", errors="ignore") if size > 0 else ""


def cap_for_model(text: str, limit: int, *, read_more: str | Callable[[int, int], str]) -> str:
    """``text`` if it fits ``limit`` UTF-8 bytes; else head + marker + tail, at most ``limit`` bytes.

    ``read_more`` (a format string with ``{offset}`` and ``{cut}``, or a function of them) tells the
    model how to read the cut part: ``offset`` is the first byte cut, ``cut`` the bytes cut.
    """
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    marker_room = 0
    for _ in range(3):  # the marker's length depends on the numbers it prints
        keep = max(0, limit - marker_room)
        head_size = keep * 3 // 4  # the head usually matters more (what a log or file starts with)
        tail_size = keep - head_size
        cut = len(data) - head_size - tail_size
        marker = (f"\n\n[hopline: {cut} bytes cut from the middle of this {len(data)}-byte result "
                  f"(tool result cap {limit} bytes). "
                  + (read_more(head_size, cut) if callable(read_more)
                     else read_more.format(offset=head_size, cut=cut)) + "]\n\n")
        marker_bytes = len(marker.encode("utf-8"))
        if marker_bytes <= marker_room:
            break
        marker_room = marker_bytes
    if marker_room >= limit:  # a cap smaller than the marker: the head alone
        return _utf8_head(data, limit)
    return _utf8_head(data, head_size) + marker + _utf8_tail(data, tail_size)


def _walk_files(base: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_DIRS)
        for filename in sorted(filenames):
            yield Path(dirpath, filename)


def tool_schemas(names: tuple[str, ...] | list[str]) -> list[dict[str, Any]]:
    """OpenAI function-format schemas of the named tools, in the given order."""
    return [_SCHEMAS[name] for name in names]


def _fn(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required,
                       "additionalProperties": False}}}


_SCHEMAS: dict[str, dict[str, Any]] = {
    "read_file": _fn("read_file", "Read a file of the workspace (or a cut tool output at @output/<id>). "
                     "Use offset/limit (bytes) to read more of a long file.",
                     {"path": {"type": "string"}, "offset": {"type": "integer", "minimum": 0},
                      "limit": {"type": "integer", "minimum": 1}}, ["path"]),
    "list_files": _fn("list_files", "List files under a directory of the workspace, with sizes.",
                      {"path": {"type": "string"}}, []),
    "search_workspace": _fn("search_workspace", "Search text (or a regex) in the workspace's files.",
                            {"query": {"type": "string"}, "path": {"type": "string"},
                             "regex": {"type": "boolean"}}, ["query"]),
    "run_command": _fn("run_command", "Run a shell command in the workspace root (timeout, output capped).",
                       {"command": {"type": "string"}}, ["command"]),
    "write_file": _fn("write_file", "Write a file of the workspace (creates parent directories).",
                      {"path": {"type": "string"}, "content": {"type": "string"}}, ["path", "content"]),
    "git_diff": _fn("git_diff", "The change under review as a unified diff (a gate's base..head, else the "
                    "uncommitted changes): whole, one file's (path), or the changed files with their added "
                    "and removed line counts (stat). A long diff is cut; read the rest as the marker says.",
                    {"path": {"type": "string"}, "stat": {"type": "boolean"}}, []),
}
TOOL_NAMES: tuple[str, ...] = tuple(_SCHEMAS)


def _str_arg(args: dict[str, Any], key: str, default: str | None = None) -> str:
    value = args.get(key, default)
    if not isinstance(value, str):
        raise ToolError(f"argument {key!r} must be a string")
    return value


def _int_arg(args: dict[str, Any], key: str, default: int | None) -> int | None:
    value = args.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ToolError(f"argument {key!r} must be a non-negative integer")
    return value


class Workspace:
    """Tools confined to ``root``; ``allow_write`` enables write_file (the dev profile); ``review``
    makes it a gate session's: git_diff shows that range, run_command runs tests and linters only."""

    def __init__(self, root: Path, budget: Budget, *, allow_write: bool = False,
                 review: ReviewRange | None = None) -> None:
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise ValueError("the workspace root is not a directory")
        self.budget = budget
        self.allow_write = allow_write
        self.review = review
        self._spill: tempfile.TemporaryDirectory[str] | None = None
        self._spill_count = 0
        self._review_home: tempfile.TemporaryDirectory[str] | None = None  # HOME, TMPDIR, caches of reviews

    def close(self) -> None:
        for held in (self._spill, self._review_home):
            if held is not None:
                held.cleanup()
        self._spill = self._review_home = None

    # --- paths -----------------------------------------------------------------------------------

    def resolve(self, path: str) -> Path:
        """The real path of ``path`` inside the workspace, or ToolError (no escape of any kind)."""
        return resolve_inside(self.root, path)

    def relative(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix() or "."

    def describe(self, name: str, args: dict[str, Any]) -> ToolInfo:
        """Kind, title and locations of a call, for ``ToolCallStarted``."""
        path = args.get("path") if isinstance(args.get("path"), str) else None
        if name == "read_file":
            return ToolInfo("read", f"Read {path}", [path] if path else [])
        if name == "list_files":
            return ToolInfo("search", f"List {path or '.'}", [path or "."])
        if name == "search_workspace":
            return ToolInfo("search", f"Search {str(args.get('query'))[:80]!r}", [path] if path else [])
        if name == "run_command":
            return ToolInfo("execute", f"Run {str(args.get('command'))[:80]}", [])
        if name == "write_file":
            return ToolInfo("edit", f"Write {path}", [path] if path else [])
        if name == "git_diff":
            shown = f"{self.review.base[:12]}..{self.review.head[:12]}" if self.review else "HEAD..worktree"
            what = " (stat)" if args.get("stat") is True else (f" {path}" if path else "")
            return ToolInfo("read", f"Diff {shown}{what}", [path] if path else [])
        return ToolInfo("other", name, [])

    # --- dispatch --------------------------------------------------------------------------------

    async def run(self, name: str, args: dict[str, Any], call_id: str) -> ToolOutcome:
        """Run one tool; expected failures become failed outcomes, anything else propagates."""
        try:
            if name == "read_file":
                return await asyncio.to_thread(self.read_file, args)
            if name == "list_files":
                return await asyncio.to_thread(self._spilled, call_id, self.list_files(args))
            if name == "search_workspace":
                return await asyncio.to_thread(self._spilled_search, call_id, args)
            if name == "run_command":
                text, ok = await self.run_command(_str_arg(args, "command"))
                return self._spilled(call_id, text, ok)
            if name == "write_file":
                return await asyncio.to_thread(self.write_file, args)
            if name == "git_diff":
                return await asyncio.to_thread(self._spilled, call_id, self.git_diff(args))
            raise ToolError(f"unknown tool {name!r}")
        except ToolError as exc:
            return self.error(str(exc))

    def error(self, message: str) -> ToolOutcome:
        text = f"error: {message}"
        capped = cap_for_model(text, self.budget.tool_result_max_bytes, read_more="")
        return ToolOutcome(text, capped, "failed")

    def _spilled_search(self, call_id: str, args: dict[str, Any]) -> ToolOutcome:
        return self._spilled(call_id, self.search_workspace(args))

    def _spilled(self, call_id: str, text: str, ok: bool = True) -> ToolOutcome:
        limit = self.budget.tool_result_max_bytes
        status: Literal["completed", "failed"] = "completed" if ok else "failed"
        if len(text.encode("utf-8")) <= limit:
            return ToolOutcome(text, text, status)
        if self._spill is None:
            self._spill = tempfile.TemporaryDirectory(prefix="hopline-tool-output-")
        self._spill_count += 1
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", call_id)[:64] or "call"
        spill_name = f"{self._spill_count}-{safe}"
        Path(self._spill.name, spill_name).write_text(text, encoding="utf-8")
        read_more = (f"The full output is kept: read_file path='{OUTPUT_PREFIX}{spill_name}' "
                     "offset={offset} limit={cut}.")
        return ToolOutcome(text, cap_for_model(text, limit, read_more=read_more), status)

    # --- tools -----------------------------------------------------------------------------------

    def read_file(self, args: dict[str, Any]) -> ToolOutcome:
        shown = _str_arg(args, "path")
        offset = _int_arg(args, "offset", 0) or 0
        capture = self.budget.command_output_max_bytes
        limit = _int_arg(args, "limit", None) or capture
        limit = min(limit, capture)
        if shown.startswith(OUTPUT_PREFIX):
            if self._spill is None:
                raise ToolError("no kept tool output by that name")
            name = shown[len(OUTPUT_PREFIX):]
            if "/" in name or name in ("", ".", ".."):
                raise ToolError("bad kept output name")
            path = Path(self._spill.name, name)
        else:
            path = self.resolve(shown)
        if not path.is_file():
            raise ToolError(f"not a file: {shown}")
        size = path.stat().st_size
        with path.open("rb") as fh:
            fh.seek(offset)
            data = fh.read(limit)
        text = data.decode("utf-8", errors="replace")
        end = offset + len(data)
        if end < size:
            text += f"\n[file continues: {size - end} more bytes; read_file path={shown!r} offset={end}]"

        def read_more(cut_at: int, cut: int) -> str:  # cut_at is relative to this read
            return f"Read the cut part with read_file path={shown!r} offset={offset + cut_at} limit={cut}."

        model = cap_for_model(text, self.budget.tool_result_max_bytes, read_more=read_more)
        return ToolOutcome(text, model, "completed", {"path": shown, "offset": offset, "bytes": len(data),
                                                       "fileBytes": size})

    def list_files(self, args: dict[str, Any]) -> str:
        base = self.resolve(_str_arg(args, "path", "."))
        if not base.is_dir():
            raise ToolError("not a directory")
        capture = self.budget.command_output_max_bytes
        lines: list[str] = []
        used = 0
        for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_DIRS)
            for filename in sorted(filenames):
                full = Path(dirpath, filename)
                try:
                    size = full.lstat().st_size
                except OSError:
                    continue
                line = f"{size}\t{self.relative(full)}"
                used += len(line) + 1
                if used > capture:
                    lines.append(f"[listing stopped at {capture} bytes (HOPLINE_COMMAND_OUTPUT_MAX_BYTES)]")
                    return "\n".join(lines)
                lines.append(line)
        return "\n".join(lines) if lines else "(no files)"

    def search_workspace(self, args: dict[str, Any]) -> str:
        query = _str_arg(args, "query")
        if not query:
            raise ToolError("empty query")
        base = self.resolve(_str_arg(args, "path", "."))
        if args.get("regex"):
            try:
                pattern = re.compile(query)
            except re.error as exc:
                raise ToolError(f"bad regex: {exc}") from None
            match = pattern.search
        else:
            def match(line: str) -> bool:  # type: ignore[misc]
                return query in line
        budget = self.budget
        line_clip = max(80, budget.tool_result_max_bytes // 64)
        lines: list[str] = []
        used = 0
        skipped = 0
        for path in [base] if base.is_file() else _walk_files(base):
            try:
                if path.is_symlink() or path.stat().st_size > budget.search_max_file_bytes:
                    skipped += 1
                    continue
                data = path.read_bytes()
            except OSError:
                continue
            if b"\x00" in data[:1024]:
                continue
            rel = self.relative(path)
            for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
                if not match(line):
                    continue
                entry = f"{rel}:{number}: {line[:line_clip]}"
                used += len(entry) + 1
                if len(lines) >= budget.search_max_matches or used > budget.command_output_max_bytes:
                    lines.append(f"[stopped at {len(lines)} matches (HOPLINE_SEARCH_MAX_MATCHES="
                                 f"{budget.search_max_matches}, output cap {budget.command_output_max_bytes} "
                                 "bytes)]")
                    return "\n".join(lines)
                lines.append(entry)
        if skipped:
            lines.append(f"[{skipped} files skipped: symlinks or over HOPLINE_SEARCH_MAX_FILE_BYTES="
                         f"{budget.search_max_file_bytes}]")
        return "\n".join(lines) if lines else "(no matches)"

    def git_diff(self, args: dict[str, Any]) -> str:
        """The change under review (see the module docstring), captured up to the output budget."""
        path = args.get("path")
        if path is not None:
            path = self.relative(self.resolve(_str_arg(args, "path")))
        stat = args.get("stat", False)
        if not isinstance(stat, bool):
            raise ToolError("argument 'stat' must be a boolean")
        budget = self.budget
        if self.review is not None:
            argv = git.diff_args(self.review.base, self.review.head, path=path, stat=stat)
        else:  # the uncommitted changes of the workspace's repository
            argv = ["diff", "--no-color", "--no-ext-diff", "--no-textconv", "--find-renames", "HEAD", "--"]
            if stat:
                argv.insert(1, "--numstat")
            if path is not None:
                argv.append(path)
        try:
            out = git.run_git(self.root, argv, timeout=budget.command_timeout_seconds,
                              max_bytes=budget.command_output_max_bytes)
        except git.GitError as exc:
            raise ToolError(str(exc)) from None
        text = out.text
        if stat and text:
            text = "added\tremoved\tpath\n" + text
        if out.truncated_bytes:
            text += (f"\n[{out.truncated_bytes} more bytes of the diff not captured "
                     f"(HOPLINE_COMMAND_OUTPUT_MAX_BYTES={budget.command_output_max_bytes}); "
                     "ask for one file with path]")
        return text or "(no changes)"

    async def run_command(self, command: str) -> tuple[str, bool]:
        """Run ``command`` in the root; output captured up to the budget, killed on timeout. A gate
        session's runs test runners and linters only (:func:`check_review_command`), without a
        shell, in :func:`review_environment`."""
        budget = self.budget
        capture = budget.command_output_max_bytes
        pipes: dict[str, Any] = {"cwd": self.root, "stdin": asyncio.subprocess.DEVNULL,
                                 "stdout": asyncio.subprocess.PIPE, "stderr": asyncio.subprocess.STDOUT,
                                 "start_new_session": True}
        if self.review is None:
            proc = await asyncio.create_subprocess_shell(command, env=tool_environment(os.environ), **pipes)
        else:  # the checked argv, run as is (no shell: no glob or ~ expansion), homed in a temporary dir
            argv = check_review_command(command, self.root)
            if self._review_home is None:
                self._review_home = tempfile.TemporaryDirectory(prefix="hopline-review-")
            env = review_environment(os.environ, Path(self._review_home.name))
            try:
                proc = await asyncio.create_subprocess_exec(*argv, env=env, **pipes)
            except OSError as exc:
                raise ToolError(f"{argv[0]} could not be started ({type(exc).__name__}): is it installed?") \
                    from None
        chunks: list[bytes] = []
        kept = 0
        dropped = 0

        async def pump() -> None:
            nonlocal kept, dropped
            assert proc.stdout is not None
            while True:
                chunk = await proc.stdout.read(64 * 1024)
                if not chunk:
                    break
                room = capture - kept
                if room > 0:
                    chunks.append(chunk[:room])
                    kept += min(room, len(chunk))
                dropped += max(0, len(chunk) - max(room, 0))
            await proc.wait()

        timed_out = False
        try:
            await asyncio.wait_for(pump(), budget.command_timeout_seconds)
        except TimeoutError:
            timed_out = True
            self._kill(proc)
            await proc.wait()
        except asyncio.CancelledError:
            self._kill(proc)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proc.wait(), 5)
            raise
        text = b"".join(chunks).decode("utf-8", errors="replace")
        if dropped:
            text += (f"\n[{dropped} more bytes of output not captured "
                     f"(HOPLINE_COMMAND_OUTPUT_MAX_BYTES={capture})]")
        if timed_out:
            text += (f"\n[killed: the command ran past its timeout of {budget.command_timeout_seconds} s "
                     "(HOPLINE_COMMAND_TIMEOUT)]")
            return text, False
        text += f"\n[exit code {proc.returncode}]"
        return text, True

    @staticmethod
    def _kill(proc: asyncio.subprocess.Process) -> None:
        # The shell runs in its own session: kill its whole process group (by the group's id).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()

    def write_file(self, args: dict[str, Any]) -> ToolOutcome:
        if not self.allow_write:
            raise ToolError("write_file is not available to this agent")
        shown = _str_arg(args, "path")
        content = _str_arg(args, "content")
        path = self.resolve(shown)
        if path == self.root or path.is_dir():
            raise ToolError("cannot write a directory")
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():
            raise ToolError("refusing to write through a symlink")
        data = content.encode("utf-8")
        path.write_bytes(data)
        text = f"wrote {len(data)} bytes to {shown}"
        return ToolOutcome(text, text, "completed", {"path": shown, "bytes": len(data)})
