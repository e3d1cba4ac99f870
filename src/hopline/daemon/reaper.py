"""A session's whole process tree ends with it (SPEC D-2, T-4).

An agent child is started in its own session and process group, and made a *child subreaper*
(``prctl(PR_SET_CHILD_SUBREAPER)``, set between fork and exec, kept across exec): a descendant
whose parent exits is reparented to the agent, not to PID 1, so a grandchild that calls
``setsid()`` (leaving the agent's process group) is still a descendant of the agent while the agent
lives. Stopping a child first ends the descendants that left its process group (frozen with
``SIGSTOP`` as the tree is walked again until no new one shows up, so none forks away meanwhile,
then ``SIGKILL``), then stops the child as before, and ends what is left of its group. A tree is
read from ``/proc`` (Linux); elsewhere only the process group is signalled, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

log = logging.getLogger("hopline.daemon.reaper")

PR_SET_CHILD_SUBREAPER = 36
CLOSE_RANGE_CLOEXEC = 1 << 2  # close_range(2): mark the range close-on-exec instead of closing it
PROC = "/proc"
# Walks of a tree while freezing it: a process that forks faster than this many walks is frozen by
# the next stop's walk, or ends with its process group.
FREEZE_ROUNDS = 8

_libc: ctypes.CDLL | None = None
_close_range: Callable[..., int] | None = None


def _prctl_subreaper() -> None:
    """Run in the child between fork and exec: make it a subreaper of its descendants, and let it
    inherit no descriptor but its stdio. uvloop leaves the child's ends of its stdio socketpairs
    open in it under their own numbers too: a child that closed its stdout would still hold it
    open, and the daemon would never see the end of its output. Marked close-on-exec here, they
    go at exec (``dup2`` makes 0, 1 and 2 without the mark, whichever runs first)."""
    if _libc is not None:
        _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    if _close_range is not None and _close_range(3, 0xFFFFFFFF, CLOSE_RANGE_CLOEXEC) == 0:
        return
    with contextlib.suppress(OSError):  # an older kernel or libc: each descriptor /proc lists
        for name in os.listdir("/proc/self/fd"):
            if int(name) > 2:
                with contextlib.suppress(OSError):
                    os.set_inheritable(int(name), False)


def subreaper_preexec() -> Callable[[], None] | None:
    """The ``preexec_fn`` that makes a started child a subreaper, or None where prctl is missing."""
    global _libc, _close_range
    if not os.path.isdir(PROC):
        return None
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
            _libc.prctl  # noqa: B018 - raises AttributeError where there is no prctl
        except (OSError, AttributeError):
            _libc = None
            return None
        _close_range = getattr(_libc, "close_range", None)  # glibc 2.34 and later
    return _prctl_subreaper


def _parents() -> dict[int, list[int]]:
    """pid -> its children's pids, from one pass over /proc (processes that end meanwhile skipped)."""
    children: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir(PROC):
            if not name.isdigit():
                continue
            try:
                with open(f"{PROC}/{name}/stat", "rb") as handle:
                    stat = handle.read()
            except OSError:
                continue
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses; the last ")" ends it
            fields = stat[stat.rfind(b")") + 2:].split()
            if len(fields) > 1:
                children.setdefault(int(fields[1]), []).append(int(name))
    return children


def descendants(pid: int) -> set[int]:
    """Every live descendant of ``pid`` (not ``pid`` itself)."""
    children = _parents()
    found: set[int] = set()
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def _signal_all(pids: Iterable[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _escaped(pid: int) -> set[int]:
    """Descendants of ``pid`` outside its process group (their own group or session)."""
    out = set()
    for child in descendants(pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(child) != pid:
                out.add(child)
    return out


def end_escaped(pid: int) -> int:
    """End every descendant of ``pid`` (a process-group leader) that left its group: each is
    stopped as found (``SIGSTOP``; the tree walked again until no new one shows up, so none forks
    away meanwhile), then all are killed. The group itself ends by the group's signals. Returns
    how many were ended."""
    frozen: set[int] = set()
    for _ in range(FREEZE_ROUNDS):
        new = _escaped(pid) - frozen
        if not new:
            break
        _signal_all(new, signal.SIGSTOP)
        frozen |= new
    _signal_all(frozen, signal.SIGKILL)
    if frozen:
        log.warning("agent descendants that left its process group ended", extra={"processes": len(frozen)})
    return len(frozen)


async def end_tree(proc: asyncio.subprocess.Process, ended: Callable[[], Awaitable[Any]],
                   signals: Sequence[signal.Signals | None], grace: float) -> None:
    """End a child's process tree (the child leads its process group): the descendants that left
    its group, then each of ``signals`` to its group (None: its stdin closed, a polite end) until
    ``ended()`` returns within ``grace`` seconds, then whatever is left of its group."""
    await asyncio.to_thread(end_escaped, proc.pid)
    for sig in signals:
        if sig is None:
            if proc.stdin is not None:
                with contextlib.suppress(Exception):
                    proc.stdin.close()
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
        try:
            await asyncio.wait_for(asyncio.shield(ended()), grace)
            break
        except TimeoutError:
            continue
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # what is left of its group once it exited
