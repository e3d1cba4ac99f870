"""One daemon per data directory (SPEC C-4): an exclusive ``flock`` on ``daemon.lock`` in it, held for the
daemon process's life.

The kernel releases the lock when the process ends, however it ends, so a lock left by a dead
daemon is free again at once. The file holds the holder's pid and, once it listens, its URL: a
second daemon (or ``hopline store check --repair``) says who holds the directory. With a shared
PostgreSQL store each daemon still has a local data directory of its own, and locks it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Any

import orjson

from hopline.errors import DataDirBusy

LOCK_FILE = "daemon.lock"
_HOLDER_MAX_BYTES = 4096  # what a holder writes: its pid and URL as a small JSON object


def holder_text(holder: dict[str, Any]) -> str:
    """``pid 1234, http://127.0.0.1:8765``: who holds a lock, as its file says."""
    pid = holder.get("pid")
    who = f"pid {pid}" if isinstance(pid, int) else "its pid not yet written"
    return f"{who}, {holder.get('url') or 'its URL not yet known: it is starting'}"


def read_holder(root: Path) -> dict[str, Any]:
    """What the lock file says of its holder (``{}`` when it says nothing readable)."""
    try:
        with open(root / LOCK_FILE, "rb") as file:
            value = orjson.loads(file.read(_HOLDER_MAX_BYTES))
    except (OSError, orjson.JSONDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


class DataDirLock:
    """The exclusive lock on a data directory; :meth:`acquire` takes it or raises
    :class:`DataDirBusy`. Keep the object for as long as the process serves the directory."""

    def __init__(self, root: Path, fd: int) -> None:
        self.root = root
        self._fd = fd
        self._holder: dict[str, Any] = {"pid": os.getpid()}

    @classmethod
    def acquire(cls, root: Path) -> DataDirLock:
        root.mkdir(parents=True, exist_ok=True)
        # O_CLOEXEC (Python's default): an agent child never inherits the lock, so it cannot keep it
        # after its daemon is gone.
        fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = read_holder(root)
            raise DataDirBusy(f"another hopline daemon ({holder_text(holder)}) is serving the data "
                              f"directory {root}; stop it, or give this one another --data-dir",
                              holder) from None
        except BaseException:
            os.close(fd)
            raise
        lock = cls(root, fd)
        lock._write()
        return lock

    def publish(self, url: str) -> None:
        """Say where the holder listens (a refused daemon names it)."""
        self._holder["url"] = url
        self._write()

    def _write(self) -> None:
        data = orjson.dumps(self._holder)
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)

    def release(self) -> None:
        """Give the directory up before the process ends (the tests' in-process daemons)."""
        if self._fd < 0:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
        os.close(self._fd)  # closing the last descriptor releases the flock
        self._fd = -1


def holder_if_locked(root: Path) -> dict[str, Any] | None:
    """The holder when a live process holds ``root``'s lock, else None (the lock is not taken)."""
    path = root / LOCK_FILE
    if not path.exists():
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return read_holder(root)
    finally:
        os.close(fd)  # a shared lock taken here goes with the descriptor
    return None
