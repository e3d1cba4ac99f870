"""What a sandboxed command sees of the file system (SPEC T-7): one list of mounts, the same for
bubblewrap and for util-linux unshare (:mod:`hopline.harness.sandbox` turns it into either).

An allow-list, never the host's tree: the system's programs and libraries (``/usr`` and the
directories beside it), read-only; from ``/etc`` only what a test run needs (:data:`ETC_ENTRIES`); a
private writable tmpfs on ``/tmp``; the Python that runs hopline's agent and the project's own
interpreter (:func:`interpreter_dirs`), read-only; the checkout, read-only unless the dev agent
works in it. Nothing else: no home directory, no ``/root``, no ``/var``, no daemon data directory
(the checkout inside it is bound alone, its parents created empty in the sandbox's own root).

As root the command runs as :data:`SANDBOX_UID` (``nobody``): the sandbox is built with root's
rights, then the user is dropped as the last step before the command (``setpriv``), so a file the
binds bring in that only root may read (``/etc/shadow`` is not even bound) stays unreadable.
"""

from __future__ import annotations

import configparser
import dataclasses
import os
import stat
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

SANDBOX_UID = 65534  # nobody, nogroup: the host user PR code runs as when hopline runs as root
SANDBOX_TMP = "/tmp"  # the private tmpfs, inside the sandbox
SANDBOX_HOME = SANDBOX_TMP + "/home"
# Where the system's programs and libraries are: bound read-only (a symlink, as /bin -> usr/bin on
# Debian, is recreated as the same symlink).
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt")
# What of /etc a test run needs: users and groups (getpwuid, ~), name resolution's files, the CA
# certificates and OpenSSL's configuration, the time zone, the dynamic linker's cache, and the
# Debian alternatives' symlinks (cc, awk, java...). Never shadow, sudoers, ssh keys or ssl/private.
ETC_ENTRIES = ("/etc/passwd", "/etc/group", "/etc/hosts", "/etc/resolv.conf", "/etc/nsswitch.conf",
               "/etc/localtime", "/etc/timezone", "/etc/ssl/certs", "/etc/ssl/openssl.cnf",
               "/etc/ca-certificates", "/etc/pki/tls/certs", "/etc/pki/ca-trust", "/etc/ld.so.cache",
               "/etc/alternatives")
# Where hopline's own coverage package is bound for a project whose interpreter lacks it.
COVERAGE_LIB = "/run/hopline/lib"

MountKind = Literal["ro", "rw", "link", "tmpfs"]


@dataclasses.dataclass(frozen=True)
class Mount:
    """One entry: ``ro``/``rw`` bind ``source`` at ``target``; ``link``: a symlink at ``target`` to
    ``source``; ``tmpfs``: a tmpfs of ``source`` bytes at ``target``, writable by everyone (sticky)."""

    kind: MountKind
    source: str
    target: str


def drops_user() -> bool:
    """Whether the sandbox runs the command as :data:`SANDBOX_UID`: when hopline runs as root. Not
    root, hopline's own unprivileged uid runs it (bwrap and unshare map it in a user namespace)."""
    return os.geteuid() == 0


def _under(path: str, dirs: Iterable[str]) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in dirs)


def _venv_home(prefix: str) -> str | None:
    """The ``home`` of a virtual environment's ``pyvenv.cfg`` (the base interpreter's directory)."""
    config = Path(prefix, "pyvenv.cfg")
    if not config.is_file():
        return None
    parser = configparser.ConfigParser()
    try:
        parser.read_string("[venv]\n" + config.read_text(errors="replace"))
    except (configparser.Error, OSError):
        return None
    home = parser.get("venv", "home", fallback="").strip()
    return home if os.path.isabs(home) else None


def interpreter_dirs(python: str) -> list[str]:
    """The directories a Python interpreter needs, without running it: its virtual environment (the
    directory above ``bin/``, with a ``pyvenv.cfg``) and the installation it comes from (the
    ``home`` the venv names, and where the executable really is), each as the prefix above its
    ``bin/``; none that the system directories hold already."""
    found: list[str] = []
    prefix = os.path.dirname(os.path.dirname(os.path.abspath(python)))
    real = os.path.realpath(python)
    if os.path.basename(real).startswith("python"):  # an interpreter, not a wrapper script elsewhere
        found.append(os.path.dirname(os.path.dirname(real)))
    home = _venv_home(prefix)
    if home is not None:
        found.append(os.path.realpath(prefix))
        if any(name.startswith("python") for name in _names(home)):  # a venv's base interpreter is there
            found.append(os.path.realpath(os.path.dirname(home)))
    return _outermost(p for p in found if os.path.isdir(p))


def _names(folder: str) -> list[str]:
    try:
        return os.listdir(folder)
    except OSError:
        return []


def runtime_dirs() -> list[str]:
    """The Python the agent runs (its prefix and the base installation it comes from)."""
    return _outermost(os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix,
                                                    os.path.dirname(os.path.dirname(sys.executable)))
                      if os.path.isdir(p))


def _outermost(paths: Iterable[str]) -> list[str]:
    """``paths`` without duplicates, those inside another, and those the system directories hold."""
    unique = sorted(set(paths), key=len)
    out: list[str] = []
    for path in unique:
        if path != "/" and not _under(path, out) and not _under(path, SYSTEM_DIRS):
            out.append(path)
    return out


def coverage_package() -> str | None:
    """The directory of hopline's own ``coverage`` package, if it is installed."""
    try:
        import coverage
    except ImportError:
        return None
    return os.path.dirname(os.path.realpath(coverage.__file__))


def mounts(root: Path, tmpfs_bytes: int, *, writable: bool = False,
           binds: Sequence[tuple[str, str]] = ()) -> list[Mount]:
    """Every mount of a sandboxed command, in order (a mount's parents come before it): see the
    module docstring. ``binds``: more read-only ``(host path, sandbox path)`` pairs."""
    plan: list[Mount] = []
    for path in (*SYSTEM_DIRS, *ETC_ENTRIES):
        if os.path.islink(path):
            plan.append(Mount("link", os.readlink(path), path))
        elif os.path.exists(path):
            plan.append(Mount("ro", path, path))
    # After the tmpfs, so that a Python (a venv) or a checkout under /tmp is bound over it, not hidden
    plan.append(Mount("tmpfs", str(tmpfs_bytes), SANDBOX_TMP))
    for path in runtime_dirs():
        plan.append(Mount("ro", path, path))
    for source, target in binds:
        plan.append(Mount("ro", source, target))
    plan.append(Mount("rw" if writable else "ro", str(root), str(root)))
    return plan


def _parents(target: str) -> list[str]:
    parts = target.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def bwrap_mount_args(plan: Sequence[Mount]) -> list[str]:
    """The plan as bubblewrap's arguments; the parents a mount needs are made first, 0711
    (traversable, not listable: bwrap would make them 0700, closed to nobody)."""
    args: list[str] = []
    made: set[str] = set()
    binds: list[str] = []
    for mount in plan:
        for parent in _parents(mount.target):
            if parent not in made and not _under(parent, binds):
                args += ["--perms", "0711", "--dir", parent]
                made.add(parent)
        made.add(mount.target)
        if mount.kind in ("ro", "rw"):
            binds.append(mount.target)
        if mount.kind == "link":
            args += ["--symlink", mount.source, mount.target]
        elif mount.kind == "tmpfs":
            args += ["--size", mount.source, "--perms", "1777", "--tmpfs", mount.target]
        else:
            args += ["--ro-bind" if mount.kind == "ro" else "--bind", mount.source, mount.target]
    return args


def unshare_mount_args(plan: Sequence[Mount]) -> list[str]:
    """The plan as the unshare setup script's arguments: the count, then kind, source, target."""
    args = [str(len(plan))]
    for mount in plan:
        args += [mount.kind, mount.source, mount.target]
    return args


def _mode(mode: int, writable: bool, nobody: bool) -> int:
    write = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH
    if nobody:  # read (and search) for others; write for them only while the dev agent works
        mode |= stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(mode) or mode & stat.S_IXUSR else 0)
        return (mode | stat.S_IWUSR | stat.S_IWOTH) if writable else (mode & ~write)
    return (mode | stat.S_IWUSR) if writable else (mode & ~write)


def share_tree(root: Path, *, writable: bool) -> None:
    """A checkout's files and directories without (or with back) their write bits; its ``.git``
    (a file pointing at the repository) left alone. When the sandbox runs as nobody (hopline is
    root), the checkout is readable by others, and writable by them while the dev agent works in it
    (its commands write there as nobody: keep its parent closed to other users); once read-only
    again, what nobody wrote is root's."""
    nobody = drops_user()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in [*filenames, *dirnames]:
            path = Path(dirpath, name)
            if Path(dirpath) == root and name == ".git":
                continue
            if nobody and not writable:
                os.lchown(path, os.geteuid(), os.getegid())
            if not path.is_symlink():
                path.chmod(_mode(path.lstat().st_mode, writable, nobody))
    root.chmod(_mode(root.stat().st_mode, writable, nobody))
