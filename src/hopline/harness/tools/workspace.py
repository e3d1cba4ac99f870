"""The harness's tools over one workspace (SPEC H-7).

Every path is resolved (symlinks included) and must stay inside the workspace root. Each tool
returns the full output (bounded by the budget's capture limits, for the user and ACP
``tool_call_update``) and the text for the model, capped at ``budget.tool_result_max_bytes`` with
head and tail kept and a marker saying how many bytes were cut and how to read more; the same facts
go structured in the tool message's ``_meta`` (:mod:`hopline.harness.tools.capping`).

Outputs that are not files (command output, listings, search results) are kept, when cut, in a
private spill directory outside the workspace and readable through ``read_file`` at the virtual
path ``@output/<id>``, so "read more" is always possible and the workspace is never written by a
read-only agent.

``git_diff`` shows the change under review: a gate session's ``base..head`` (:class:`ReviewRange`),
else the uncommitted changes against ``HEAD``; whole, one file's, or the changed files with their
line counts. In a gate session ``run_command`` runs test runners and linters only, in the sandbox
(:mod:`hopline.harness.tools.reviewing`). Elsewhere it runs a shell line with the agent's
environment less every credential and every ``HOPLINE_*`` setting (SPEC D-11).

One table, :data:`TOOLS`, says for each tool its kind, its title and what runs it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import tempfile
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

from hopline.budget import Budget
from hopline.errors import ToolError
from hopline.harness import git
from hopline.harness.loop_events import ToolKind
from hopline.harness.testresults import same_behaviour, sides_of_diff
from hopline.harness.tools.capping import Cut, cap_with_cut
from hopline.harness.tools.commands import run_captured, shown_run
from hopline.harness.tools.env import tool_environment
from hopline.harness.tools.results import ToolInfo, ToolOutcome, resolve_inside, walk_files
from hopline.harness.tools.reviewing import ReviewCommands, ReviewRange, ReviewRun, diff_path
from hopline.harness.tools.test_said import tests_record, tests_said
from hopline.vocabulary import META_COMMAND, META_CUT, META_DIFF, META_TESTS

OUTPUT_PREFIX = "@output/"


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


def _path_of(args: dict[str, Any]) -> list[str]:
    path = args.get("path")
    return [path] if isinstance(path, str) else []


@dataclasses.dataclass(frozen=True)
class ToolSpec:
    """One tool: its ACP kind, its title for a call's arguments, and what runs it."""

    kind: ToolKind
    title: Callable[[Workspace, dict[str, Any]], str]
    run: Callable[[Workspace, dict[str, Any], str], Awaitable[ToolOutcome]]


class Workspace:
    """Tools confined to ``root``; ``allow_write`` enables write_file (the dev profile); ``review``
    makes it a gate session's: git_diff shows that range, run_command runs tests and linters only,
    sandboxed."""

    def __init__(self, root: Path, budget: Budget, *, allow_write: bool = False,
                 review: ReviewRange | None = None) -> None:
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise ValueError("the workspace root is not a directory")
        self.budget = budget
        self.allow_write = allow_write
        # A fix session (review.fix) is the dev agent's: its diff is its own uncommitted change,
        # and only its commands are the gate's, sandboxed with the checkout writable.
        self.review = review if review is not None and not review.fix else None
        self.commands = ReviewCommands(self.root, budget, review) if review is not None else None
        self._spill: tempfile.TemporaryDirectory[str] | None = None
        self._spill_count = 0
        self._spill_lock = threading.Lock()  # a review's calls keep their outputs from threads at once

    @property
    def reads_only(self) -> bool:
        """A gate review's tools: they read the checkout, and its commands run in the sandbox over it
        read-only, so the calls of one answer may run at once."""
        return self.review is not None and not self.allow_write

    def close(self) -> None:
        if self.commands is not None:
            self.commands.close()
        if self._spill is not None:
            self._spill.cleanup()
        self._spill = None

    # --- paths -----------------------------------------------------------------------------------

    def resolve(self, path: str) -> Path:
        """The real path of ``path`` inside the workspace, or ToolError (no escape of any kind)."""
        return resolve_inside(self.root, path)

    def relative(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix() or "."

    # --- dispatch --------------------------------------------------------------------------------

    def describe(self, name: str, args: dict[str, Any]) -> ToolInfo:
        """Kind, title and locations of a call, for ``ToolCallStarted``."""
        spec = TOOLS.get(name)
        if spec is None:
            return ToolInfo("other", name, [])
        return ToolInfo(spec.kind, spec.title(self, args), _path_of(args) if name != "list_files"
                        else [str(args.get("path") or ".")])

    async def run(self, name: str, args: dict[str, Any], call_id: str) -> ToolOutcome:
        """Run one tool; expected failures become failed outcomes, anything else propagates."""
        spec = TOOLS.get(name)
        try:
            if spec is None:
                raise ToolError(f"unknown tool {name!r}")
            return await spec.run(self, args, call_id)
        except ToolError as exc:
            return self.error(str(exc))

    def error(self, message: str) -> ToolOutcome:
        text = f"error: {message}"
        capped, _ = cap_with_cut(text, self.budget.tool_result_max_bytes, read_more="")
        return ToolOutcome(text, capped, "failed", meta={"hopline.error": True})

    def spilled(self, call_id: str, text: str, ok: bool = True,
                meta: dict[str, Any] | None = None) -> ToolOutcome:
        """``text`` as an outcome: whole when it fits, else capped with the whole kept at ``@output/``."""
        limit = self.budget.tool_result_max_bytes
        status: Literal["completed", "failed"] = "completed" if ok else "failed"
        if len(text.encode("utf-8")) <= limit:
            return ToolOutcome(text, text, status, meta=meta)
        with self._spill_lock:
            if self._spill is None:
                self._spill = tempfile.TemporaryDirectory(prefix="hopline-tool-output-")
            self._spill_count += 1
            count = self._spill_count
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", call_id)[:64] or "call"
        spill_name = f"{count}-{safe}"
        Path(self._spill.name, spill_name).write_text(text, encoding="utf-8")
        read_more = (f"The full output is kept: read_file path='{OUTPUT_PREFIX}{spill_name}' "
                     "offset={offset} limit={cut}.")
        capped, cut = cap_with_cut(text, limit, read_more=read_more, path=OUTPUT_PREFIX + spill_name)
        return ToolOutcome(text, capped, status, meta={**(meta or {}), **_cut_meta(cut)})

    # --- tools -----------------------------------------------------------------------------------

    def read_file(self, args: dict[str, Any]) -> ToolOutcome:
        shown = _str_arg(args, "path")
        offset = _int_arg(args, "offset", 0) or 0
        capture = self.budget.command_output_max_bytes
        limit = min(_int_arg(args, "limit", None) or capture, capture)
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
        if offset + len(data) < size:  # a page ends on a whole character: the next starts on one
            data = whole_characters(data)
        text = data.decode("utf-8", errors="replace")
        end = offset + len(data)
        if end < size:
            text += f"\n[file continues: {size - end} more bytes; read_file path={shown!r} offset={end}]"

        def read_more(cut_at: int, cut: int) -> str:  # cut_at is relative to this read
            return f"Read the cut part with read_file path={shown!r} offset={offset + cut_at} limit={cut}."

        model, cut = cap_with_cut(text, self.budget.tool_result_max_bytes, read_more=read_more, path=shown,
                                  source_offset=offset)
        meta = {**_cut_meta(cut), "hopline.read": {"path": shown, "offset": offset, "bytes": len(data),
                                                   "fileBytes": size}}
        return ToolOutcome(text, model, "completed", {"path": shown, "offset": offset, "bytes": len(data),
                                                       "fileBytes": size}, meta=meta)

    def list_files(self, args: dict[str, Any]) -> str:
        base = self.resolve(_str_arg(args, "path", "."))
        if not base.is_dir():
            raise ToolError("not a directory")
        capture = self.budget.command_output_max_bytes
        lines: list[str] = []
        used = 0
        for full in walk_files(base):
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
                match = re.compile(query).search
            except re.error as exc:
                raise ToolError(f"bad regex: {exc}") from None
        else:
            def match(line: str) -> bool:  # type: ignore[misc]
                return query in line
        budget = self.budget
        line_clip = max(80, budget.tool_result_max_bytes // 64)
        lines: list[str] = []
        used = skipped = 0
        for path in [base] if base.is_file() else walk_files(base):
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

    def git_diff_outcome(self, args: dict[str, Any], call_id: str) -> ToolOutcome:
        """:meth:`git_diff`, and for one file's whole diff whether the file's behaviour is the same at
        both ends (its AST, docstrings, comments and annotations aside), read from the whole text
        before any cut for the model (``_meta["hopline.diff"]``, and a line for a model)."""
        text = self.git_diff(args)
        path = args.get("path")
        if args.get("whole") is not True or not isinstance(path, str) or text == "(no changes)":
            return self.spilled(call_id, text)
        sides = None if "more bytes of the diff not captured" in text[-400:] else sides_of_diff(text)
        same = None if sides is None else same_behaviour(*sides)
        facts = {"path": path, "sameBehaviour": same, "compared": sides is not None}
        if same:
            text += ("\n[hopline: this file's behaviour is the same at base and head: its AST is equal once "
                     "docstrings, comments and annotations are stripped]")
        return self.spilled(call_id, text, meta={META_DIFF: facts})

    def git_diff(self, args: dict[str, Any]) -> str:
        """The change under review (see the module docstring), captured up to the output budget. A
        path is a path of the diff, never resolved: a symlink the change adds shows as a link."""
        path = args.get("path")
        if path is not None:
            path = diff_path(self.root, _str_arg(args, "path"))
        stat, whole, added = (args.get(k, False) for k in ("stat", "whole", "added"))
        if not all(isinstance(v, bool) for v in (stat, whole, added)):
            raise ToolError("arguments 'stat', 'whole' and 'added' must be booleans")
        budget = self.budget
        if self.review is not None:
            argv = git.diff_args(self.review.base, self.review.head, path=path, stat=stat, whole=whole,
                                 added=added)
        else:  # the uncommitted changes of the workspace's repository
            argv = ["diff", "--no-color", "--no-ext-diff", "--no-textconv", "--find-renames", "HEAD", "--"]
            if stat:
                argv.insert(1, "--numstat")
            elif whole or added:
                argv.insert(1, git.WHOLE_FILE_CONTEXT if whole else git.NO_CONTEXT)
            if path is not None:
                argv.append(path)
        try:
            out = git.run_git(self.root, argv, timeout=budget.command_timeout_seconds,
                              max_bytes=budget.command_output_max_bytes)
        except git.GitError as exc:
            raise ToolError(str(exc)) from None
        text = out.text
        if added and not stat:
            text = added_lines_listing(text)
        elif stat and text:
            text = "added\tremoved\tpath\n" + text
        if out.truncated_bytes:
            text += (f"\n[{out.truncated_bytes} more bytes of the diff not captured "
                     f"(HOPLINE_COMMAND_OUTPUT_MAX_BYTES={budget.command_output_max_bytes}); "
                     "ask for one file with path]")
        return text or "(no changes)"

    async def run_command(self, args: dict[str, Any], call_id: str) -> ToolOutcome:
        """Run ``command`` in the root; output captured up to the budget, killed on timeout. A gate
        session's runs test runners and linters only, in the sandbox, at the head or the base."""
        command = _str_arg(args, "command")
        budget = self.budget
        capture = budget.command_output_max_bytes
        at = _str_arg(args, "at", "head")
        coverage = args.get("coverage", False)
        if not isinstance(coverage, bool):
            raise ToolError("argument 'coverage' must be a boolean")
        if self.commands is None:
            if at != "head" or coverage:
                raise ToolError("at='base' and coverage are for a gate review only")
            try:
                run = await run_captured(command, cwd=self.root, env=tool_environment(os.environ),
                                         timeout=budget.command_timeout_seconds, capture=capture)
            except OSError as exc:
                raise ToolError(f"the command could not be started ({type(exc).__name__})") from None
            review = ReviewRun([], run)
            kind = None
        else:
            review = await self.commands.run(command, at, coverage)
            run = review.run
            kind = self.commands.sandbox.kind
        meta: dict[str, Any] = {META_COMMAND: {"at": at, "exitCode": run.exit_code, "timedOut": run.timed_out,
                                               "droppedBytes": run.dropped_bytes, "sandbox": kind,
                                               "refusedProcesses": run.refused_processes,
                                               "argv": review.argv[1:] or None}}
        tests = tests_record(review)
        if tests is not None:
            meta[META_TESTS] = tests
        said = dataclasses.replace(run, text=run.text + tests_said(review))
        outcome = self.spilled(call_id, shown_run(said, capture=capture), not run.timed_out, meta)
        # What a client (the gate's record of a run) reads of it: how it ended, where, what it showed
        raw: dict[str, Any] = {"exitCode": run.exit_code, "timedOut": run.timed_out,
                               "sandbox": kind or "none", "refusedProcesses": run.refused_processes,
                               "bytes": len(outcome.output.encode("utf-8")),
                               "modelBytes": len(outcome.model_output.encode("utf-8"))}
        if tests is not None:
            raw.update(at=at, command=command, coverage=coverage,
                       tests={k: tests[k] for k in ("runner", "ran", "didNotRun", "counts", "summary")})
        return dataclasses.replace(outcome, raw_output=raw)

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


_HUNK_NEW_SIDE = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@")
ADDED_HEADER = "added lines (path, then first-last ranges)"


def added_lines_listing(diff: str) -> str:
    """Per file of a ``--unified=0`` diff, the lines it adds as ranges (``src/a.py\t3-9,12``): a
    line-based listing, small whatever the size of the change."""
    lines = [ADDED_HEADER]
    current: str | None = None
    ranges: list[str] = []

    def flush() -> None:
        if current is not None and ranges:
            lines.append(f"{current}\t{','.join(ranges)}")

    for raw in diff.splitlines():
        if raw.startswith("diff --git "):
            flush()
            current, ranges = None, []
        elif raw.startswith("+++ "):
            target = raw[4:].strip()
            current = None if target == "/dev/null" else (target[2:] if target.startswith("b/") else target)
        elif (match := _HUNK_NEW_SIDE.match(raw)) is not None:
            first, count = int(match.group(1)), int(match.group(2) or 1)
            if count:
                ranges.append(str(first) if count == 1 else f"{first}-{first + count - 1}")
    flush()
    return "\n".join(lines)


def whole_characters(data: bytes) -> bytes:
    """``data`` less a UTF-8 sequence its last (at most 3) bytes start and do not finish."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:
            return data
        if byte >= 0xC0:  # a lead byte: its sequence is 2, 3 or 4 bytes long
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return data if back >= need else data[:-back]
    return data


def _cut_meta(cut: Cut | None) -> dict[str, Any]:
    return {META_CUT: cut.to_json()} if cut is not None else {}


def _diff_title(ws: Workspace, args: dict[str, Any]) -> str:
    shown = f"{ws.review.base[:12]}..{ws.review.head[:12]}" if ws.review else "HEAD..worktree"
    path = args.get("path") if isinstance(args.get("path"), str) else None
    return f"Diff {shown}" + (" (stat)" if args.get("stat") is True else (f" {path}" if path else ""))


async def _threaded(ws: Workspace, call_id: str, produce: Callable[[], str]) -> ToolOutcome:
    return await asyncio.to_thread(lambda: ws.spilled(call_id, produce()))


TOOLS: dict[str, ToolSpec] = {
    "read_file": ToolSpec("read", lambda ws, a: f"Read {a.get('path')}",
                          lambda ws, a, c: asyncio.to_thread(ws.read_file, a)),
    "list_files": ToolSpec("search", lambda ws, a: f"List {a.get('path') or '.'}",
                           lambda ws, a, c: _threaded(ws, c, lambda: ws.list_files(a))),
    "search_workspace": ToolSpec("search", lambda ws, a: f"Search {str(a.get('query'))[:80]!r}",
                                 lambda ws, a, c: _threaded(ws, c, lambda: ws.search_workspace(a))),
    "run_command": ToolSpec("execute", lambda ws, a: f"Run {str(a.get('command'))[:80]}",
                            lambda ws, a, c: ws.run_command(a, c)),
    "write_file": ToolSpec("edit", lambda ws, a: f"Write {a.get('path')}",
                           lambda ws, a, c: asyncio.to_thread(ws.write_file, a)),
    "git_diff": ToolSpec("read", _diff_title, lambda ws, a, c: asyncio.to_thread(ws.git_diff_outcome, a, c)),
}
