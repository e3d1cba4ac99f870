"""What a tool gives back, what it refuses, and where its paths may lead."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from hopline.errors import ToolError
from hopline.harness.loop_events import ToolKind

SKIPPED_DIRS = frozenset({".git", "__pycache__", ".venv", "node_modules", ".mypy_cache", ".pytest_cache"})


@dataclasses.dataclass(frozen=True)
class ToolOutcome:
    output: str  # for the user, bounded by capture limits
    model_output: str  # for the model, capped at tool_result_max_bytes
    status: Literal["completed", "failed"]
    raw_output: Any = None
    meta: dict[str, Any] | None = None  # the tool message's _meta (hopline.cut, hopline.command)


@dataclasses.dataclass(frozen=True)
class ToolInfo:
    kind: ToolKind
    title: str
    locations: list[str]


def resolve_inside(root: Path, path: str) -> Path:
    """The real path of ``path`` inside ``root``, or ToolError (no escape of any kind)."""
    check_relative(path)
    candidate = (root / path).resolve()  # follows symlinks, collapses ..
    if candidate != root and not candidate.is_relative_to(root):
        raise ToolError("path escapes the workspace (via .. or a symlink) and is refused")
    return candidate


def check_relative(path: str) -> str:
    """``path`` when it is relative and names nothing above its root by itself (no NUL, no leading
    ``/`` or ``~``, no ``..`` part); it is not resolved: a symlink it names stays a symlink."""
    if "\x00" in path:
        raise ToolError("path contains a NUL byte")
    if os.path.isabs(path) or path.startswith("~"):
        raise ToolError("absolute paths are refused: paths are relative to the workspace root")
    if ".." in Path(path).parts:
        raise ToolError("a path with a '..' part is refused")
    return path


def walk_files(base: Path) -> Iterator[Path]:
    """Every file under ``base`` (symlinks not followed, :data:`SKIPPED_DIRS` skipped), sorted."""
    for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_DIRS)
        for filename in sorted(filenames):
            yield Path(dirpath, filename)
