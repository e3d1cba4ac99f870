"""The process ceiling of a sandboxed command when hopline runs as root (SPEC T-7).

RLIMIT_NPROC counts per user, and the kernel exempts root's user (uid 0 outside the namespaces,
which bwrap and ``unshare --map-root-user`` keep) from it. So as root each sandboxed command gets a
pids cgroup of its own (cgroup v1's ``pids`` hierarchy, or v2 where ``pids`` is enabled below the
caller's cgroup) whose ``pids.max`` is the budget's ``HOPLINE_SANDBOX_MAX_PROCESSES``: the child
joins it before it execs, so the command and everything it starts count. Its ``pids.events``
says how many forks the ceiling refused (the gate's finding), and whatever is still in it at the
end is killed before the cgroup is removed.

Not root: RLIMIT_NPROC holds, no cgroup is made. Root with no writable pids cgroup: the ceiling
is not enforced, and :func:`pids_cgroup_root` says so (None).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

_COUNTER = itertools.count()
_RMDIR_ATTEMPTS = 200  # 10 ms apart, each after a kill of what is left: the kernel reaps them


def _own_cgroups() -> dict[str, str]:
    """``{controller or "" for v2: path}`` of this process."""
    out: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                out[name] = path
    return out


def _mounts() -> list[tuple[str, str, str]]:
    """``(mount point, fs type, super options)`` of every mount."""
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split()
            sep = fields.index("-")
            found.append((fields[4].replace("\\040", " "), fields[sep + 1], fields[sep + 3]))
    return found


def pids_cgroup_root() -> Path | None:
    """The cgroup directory under which this process may make a pids cgroup, or None."""
    own = _own_cgroups()
    for point, fstype, options in _mounts():
        if fstype == "cgroup" and "pids" in options.split(",") and "pids" in own:
            where = Path(point + own["pids"])
        elif fstype == "cgroup2" and "" in own:
            where = Path(point + own[""])
            with contextlib.suppress(OSError):
                if "pids" not in (where / "cgroup.subtree_control").read_text().split():
                    continue
        else:
            continue
        if where.is_dir() and os.access(where, os.W_OK):
            return where
    return None


class PidsCap:
    """One command's pids cgroup (or nothing, see the module docstring)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.path: Path | None = None
        self.refused = 0  # forks the ceiling refused
        if os.geteuid() != 0:
            return
        root = pids_cgroup_root()
        if root is None:
            return
        path = root / f"hopline-sandbox-{os.getpid()}-{next(_COUNTER)}"
        try:
            path.mkdir()
            (path / "pids.max").write_text(f"{limit}\n")
        except OSError:
            with contextlib.suppress(OSError):
                path.rmdir()
            return
        self.path = path

    def join(self) -> None:
        """Run in the child before it execs: move it into the cgroup."""
        if self.path is not None:
            fd = os.open(self.path / "cgroup.procs", os.O_WRONLY)
            try:
                os.write(fd, b"0\n")
            finally:
                os.close(fd)

    def close(self) -> None:
        """Read how many forks were refused, kill what is left, remove the cgroup."""
        if self.path is None:
            return
        with contextlib.suppress(OSError, ValueError):
            for line in (self.path / "pids.events").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "max":
                    self.refused = int(value)
        for _ in range(_RMDIR_ATTEMPTS):
            with contextlib.suppress(OSError):
                for pid in (self.path / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(int(pid), signal.SIGKILL)
            try:
                self.path.rmdir()
                break
            except OSError:
                time.sleep(0.01)
        self.path = None


@contextlib.contextmanager
def pids_cap(limit: int, before: Callable[[], None]) -> Iterator[tuple[PidsCap, Callable[[], None]]]:
    """A :class:`PidsCap` and the preexec that runs ``before`` (the rlimits), then joins it."""
    cap = PidsCap(limit)

    def preexec() -> None:
        before()
        cap.join()

    try:
        yield cap, preexec
    finally:
        cap.close()
