"""Private files (SPEC T-3): the daemon's data dir is 0700 and every file in it 0600,
whatever the umask. The modes are set explicitly (``chmod`` after creating), because a permissive
umask only ever adds bits the creation mode asked for, and a directory made by ``mkdir(parents=...)``
takes the umask's bits for its parents."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path, *, tighten: bool = True) -> Path:
    """``path`` as a directory only its owner reads: created 0700 with its missing parents (each
    0700); an existing one with group or other bits loses them when ``tighten`` (the daemon's own
    directories; not a shared parent the operator named)."""
    missing: list[Path] = []
    current = path
    while not current.exists() and current.parent != current:
        missing.append(current)
        current = current.parent
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    for made in missing:
        with contextlib.suppress(FileNotFoundError):
            os.chmod(made, DIR_MODE)
    if not missing and tighten and path.stat().st_mode & 0o077:
        with contextlib.suppress(PermissionError):  # not ours to change
            os.chmod(path, DIR_MODE)
    return path


def private_file(path: Path) -> Path:
    """``path`` created empty if missing, and 0600 either way."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
    finally:
        os.close(fd)
    return path
