"""A session's whole process tree ends with it (SPEC D-2, T-4; issue #26).

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

import contextlib
import ctypes
import logging
import os
import signal
from collections.abc import Callable, Iterable

log = logging.getLogger("hopline.daemon.reaper")

PR_SET_CHILD_SUBREAPER = 36
PROC = "/proc"
# Walks of a tree while freezing it: a process that forks faster than this many walks is frozen by
# the next stop's walk, or ends with its process group.
FREEZE_ROUNDS = 8

_libc: ctypes.CDLL | None = None


def _prctl_subreaper() -> None:
    """Run in the child between fork and exec: make it a subreaper of its descendants."""
    if _libc is not None:
        _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def subreaper_preexec() -> Callable[[], None] | None:
    """The ``preexec_fn`` that makes a started child a subreaper, or None where prctl is missing."""
    global _libc
    if not os.path.isdir(PROC):
        return None
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
            _libc.prctl  # noqa: B018 - raises AttributeError where there is no prctl
        except (OSError, AttributeError):
            _libc = None
            return None
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
