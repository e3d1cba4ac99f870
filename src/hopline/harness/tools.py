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
gate session ``run_command`` runs test runners and linters only (:data:`REVIEW_COMMANDS`).

``run_command`` runs with the agent's environment less every credential hopline knows
(:data:`CREDENTIAL_ENV`): what the model runs never sees a token (SPEC D-11). Under the daemon the
agent's own environment holds none either (an allow-list, and per-session credentials travel in
the ACP request); ``list_files`` and ``search_workspace`` read files only, never the environment.
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

from hopline.budget import Budget, HoplineError
from hopline.harness import git
from hopline.harness.events import ToolKind
from hopline.vocabulary import CREDENTIAL_ENV

OUTPUT_PREFIX = "@output/"
SKIPPED_DIRS = frozenset({".git", "__pycache__", ".venv", "node_modules", ".mypy_cache", ".pytest_cache"})
# What a gate agent may run (a read-only review): test runners and linters, as argv prefixes.
REVIEW_COMMANDS: tuple[tuple[str, ...], ...] = (
    ("pytest",), ("python", "-m", "pytest"), ("python3", "-m", "pytest"), ("python", "-m", "unittest"),
    ("python3", "-m", "unittest"), ("ruff", "check"), ("ruff", "format", "--check"), ("mypy",),
    ("flake8",), ("pylint",), ("black", "--check"), ("make", "test"), ("make", "lint"), ("make", "check"),
    ("npm", "test"), ("npm", "run", "test"), ("npm", "run", "lint"), ("go", "test"), ("go", "vet"),
    ("cargo", "test"), ("cargo", "clippy"),
)
# Options that make a linter write (fixes, formatting) or a tool write a file.
_WRITING_OPTIONS = ("--fix", "--unsafe-fixes", "--write", "--in-place", "--output")
# Chaining, redirection, substitution, escapes: a review command is one program with its arguments.
_SHELL_SYNTAX = re.compile(r"[;&|<>`$(){}\\\n\r]")


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


def check_review_command(command: str) -> None:
    """ToolError unless ``command`` is a test runner or a linter of :data:`REVIEW_COMMANDS`, alone."""
    shown = ", ".join(" ".join(prefix) for prefix in REVIEW_COMMANDS)
    refused = f"a gate agent runs tests and linters only ({shown}), one command with no shell syntax"
    if _SHELL_SYNTAX.search(command):
        raise ToolError(f"refused: {refused}")
    try:
        argv = shlex.split(command)
    except ValueError:
        raise ToolError(f"refused: {refused}") from None
    if not any(tuple(argv[:len(prefix)]) == prefix for prefix in REVIEW_COMMANDS):
        raise ToolError(f"refused: {refused}")
    for arg in argv:
        if arg.split("=", 1)[0] in _WRITING_OPTIONS:
            raise ToolError(f"refused: {arg.split('=', 1)[0]} writes files; {refused}")


def tool_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment a tool's command runs with: ``environ`` less :data:`CREDENTIAL_ENV`."""
    return {k: v for k, v in environ.items() if k not in CREDENTIAL_ENV}


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

    def close(self) -> None:
        if self._spill is not None:
            self._spill.cleanup()
            self._spill = None

    # --- paths -----------------------------------------------------------------------------------

    def resolve(self, path: str) -> Path:
        """The real path of ``path`` inside the workspace, or ToolError (no escape of any kind)."""
        if "\x00" in path:
            raise ToolError("path contains a NUL byte")
        if os.path.isabs(path) or path.startswith("~"):
            raise ToolError("absolute paths are refused: paths are relative to the workspace root")
        candidate = (self.root / path).resolve()  # follows symlinks, collapses ..
        if candidate != self.root and not candidate.is_relative_to(self.root):
            raise ToolError("path escapes the workspace (via .. or a symlink) and is refused")
        return candidate

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
        session's runs test runners and linters only (:func:`check_review_command`)."""
        if self.review is not None:
            check_review_command(command)
        budget = self.budget
        capture = budget.command_output_max_bytes
        proc = await asyncio.create_subprocess_shell(
            command, cwd=self.root, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, start_new_session=True, env=tool_environment(os.environ))
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
