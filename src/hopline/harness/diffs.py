"""A change as git describes it: which paths are tests or source, the lines a unified diff adds
(with their new-file line numbers), and ``git diff --numstat``'s files. Pure: no I/O."""

from __future__ import annotations

import dataclasses
import re
from pathlib import PurePosixPath
from typing import Any

_HUNK_RE = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,\d+)? @@")
# Where a cut result's text marker starts: a diff read through one loses its line count there (the
# numbers of the cut are in the tool message's _meta, never parsed out of this text).
CAP_MARKER = "[hopline: "

SOURCE_SUFFIXES = frozenset({".py", ".js", ".ts", ".tsx", ".jsx", ".go", ".rs", ".java", ".rb", ".php",
                             ".c", ".cc", ".cpp", ".h", ".hpp", ".cs", ".kt", ".swift", ".sh", ".ex",
                             ".exs"})


def is_test_path(path: str) -> bool:
    parts = PurePosixPath(path).parts
    name = parts[-1] if parts else ""
    return (any(p in ("tests", "test", "spec", "__tests__") for p in parts[:-1])
            or name.startswith("test_") or bool(re.search(r"[._-](test|spec)\.[a-z]+$", name)))


def is_source_path(path: str) -> bool:
    return PurePosixPath(path).suffix in SOURCE_SUFFIXES and not is_test_path(path)


@dataclasses.dataclass(frozen=True)
class AddedLine:
    path: str
    line: int | None  # in the new file; None in a cut part read without its hunk header
    text: str


def parse_diff(text: str, *, path: str | None = None) -> list[AddedLine]:
    """The lines a unified diff adds, with their new-file line numbers where the hunk header is seen.

    ``path`` names the file of a piece read without its ``diff --git`` header (a cut part); a cap
    marker inside the text loses the line count until the next hunk header."""
    out: list[AddedLine] = []
    current = path
    line: int | None = None
    for raw in text.splitlines():
        if raw.startswith("diff --git "):
            current, line = None, None
        elif raw.startswith("+++ "):
            target = raw[4:].strip()
            current = None if target == "/dev/null" else (target[2:] if target.startswith("b/") else target)
        elif raw.startswith("--- ") and line is None:
            continue
        elif (match := _HUNK_RE.match(raw)) is not None:
            line = int(match.group(1))
        elif raw.startswith(CAP_MARKER) or raw.startswith("[file continues"):
            line = None
        elif raw.startswith("+"):
            if current is not None:
                out.append(AddedLine(current, line, raw[1:]))
            if line is not None:
                line += 1
        elif raw.startswith(" ") and line is not None:
            line += 1
    return out


def parse_numstat(text: str) -> list[list[Any]]:
    """``git diff --numstat`` lines as ``[path, added, removed]`` (binary files count 0)."""
    files: list[list[Any]] = []
    for raw in text.splitlines():
        parts = raw.split("\t")
        if len(parts) != 3 or not (parts[0].isdigit() or parts[0] == "-"):
            continue
        path = parts[2]
        if " => " in path:  # a rename: the new name ("{a => b}/c" or "a => b")
            path = re.sub(r"\{[^{}]* => ([^{}]*)\}", r"\1", path)
            path = path.split(" => ")[-1].replace("//", "/")
        files.append([path, int(parts[0]) if parts[0].isdigit() else 0,
                      int(parts[1]) if parts[1].isdigit() else 0])
    return files
