"""The sandbox every command a gate runs on a pull request's code runs in (SPEC T-7).

What the command gets: its checkout read-only, a private writable tmpfs (``/tmp``: HOME, TMPDIR and
every cache), no network (a network namespace of its own: loopback only), its own PID, IPC and UTS
namespaces, an allow-listed environment (:func:`sandbox_environment`), and rlimits on CPU time,
memory, processes and file size, each a row of the budget (``HOPLINE_SANDBOX_*``). The rest of the
file system it sees is the system's directories and the Python the agent runs, read-only.

Two real tools give it, tried in order by :func:`detect_sandbox` (each by running it once, since a
container may forbid user namespaces): bubblewrap (``bwrap``, Debian's ``bubblewrap``), then
util-linux ``unshare`` (user, mount, network and PID namespaces; the whole mount tree remounted
read-only, a tmpfs mounted, every capability dropped with ``setpriv`` before the command runs).
When neither runs, :data:`NO_SANDBOX`: a gate refuses to run the pull request's code unless the
operator allowed it (``hopline gate --allow-unsandboxed``).

RLIMIT_NPROC counts per user, and the kernel does not apply it to root's processes (uid 0 outside
the namespaces): as root the process ceiling is a pids cgroup of the command's own
(:mod:`hopline.harness.sandbox_pids`), which also counts the forks it refused.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Literal

from hopline.budget import Budget
from hopline.harness.sandbox_pids import pids_cgroup_root

SandboxKind = Literal["bwrap", "unshare", "none"]
SANDBOX_TMP = "/tmp"  # the private tmpfs, inside the sandbox
SANDBOX_HOME = SANDBOX_TMP + "/home"
# Where the system's programs and libraries are: bound read-only (a symlink, as /bin -> usr/bin on
# Debian, is recreated as the same symlink).
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")
# What a sandboxed command keeps of the caller's environment: a program's search path and the locale.
_KEPT_ENV = frozenset({"PATH", "LANG", "LANGUAGE", "TERM", "TZ"})
_PROBE_TIMEOUT = 20.0

# The unshare backend's setup, run as root of the new user namespace: every mount read-only (its
# flags kept: a locked nosuid or nodev cannot be cleared); the private tmpfs made on an empty
# directory of the caller's ($HOPLINE_SANDBOX_TMP), the paths under /tmp the command needs (the
# runtime's, then the checkout) bound into it at their place, and the whole moved onto /tmp (as
# bwrap's --tmpfs /tmp then --ro-bind); outside /tmp, a writable checkout is bound onto itself and
# made writable again; then the command with no capability left.
# (-n: /etc is read-only by then, no mount table is written.)
# Arguments: "rw" or "ro", the number of paths to keep, the paths (the checkout last), the command.
_UNSHARE_SETUP = r"""
mount --make-rprivate / 2>/dev/null
while read -r _id _parent _dev _root mp opts _rest; do
  case "$mp" in /proc|/proc/*|/sys|/sys/*|/dev/pts|/dev/pts/*) continue;; esac
  extra=""
  case ",$opts," in *,nosuid,*) extra="$extra,nosuid";; esac
  case ",$opts," in *,nodev,*) extra="$extra,nodev";; esac
  case ",$opts," in *,noexec,*) extra="$extra,noexec";; esac
  mount -n -o "remount,bind,ro$extra" "$(printf '%b' "$mp")" 2>/dev/null
done < /proc/self/mountinfo
t="$HOPLINE_SANDBOX_TMP"
mount -n -t tmpfs -o "size=$HOPLINE_SANDBOX_SIZE,nosuid,nodev,mode=700" tmpfs "$t" || exit 125
mkdir -p "$t/home" || exit 125
mode="$1"; n="$2"; shift 2
while [ "$n" -gt 0 ]; do
  p="$1"; shift; n=$((n - 1)); want=ro
  [ "$n" -eq 0 ] && want="$mode"
  case "$p" in
    /tmp/*) at="$t${p#/tmp}"; mkdir -p "$at" || exit 125; mount -n --rbind "$p" "$at" || exit 125;;
    *) [ "$want" = rw ] || continue; at="$p"; mount -n --bind "$p" "$at" || exit 125;;
  esac
  mount -n -o "remount,bind,$want" "$at" 2>/dev/null || mount -n -o "remount,bind,$want,nosuid,nodev" "$at" \
    || exit 125
done
mount -n --move "$t" /tmp || exit 125
cd "$HOPLINE_SANDBOX_CWD" || exit 125
unset HOPLINE_SANDBOX_SIZE HOPLINE_SANDBOX_CWD HOPLINE_SANDBOX_TMP
exec setpriv --no-new-privs --inh-caps=-all --ambient-caps=-all --bounding-set=-all -- "$@"
"""

@dataclasses.dataclass(frozen=True)
class Sandbox:
    """Which sandbox runs PR code here, and in words what it gives (or why there is none)."""

    kind: SandboxKind
    detail: str

    @property
    def available(self) -> bool:
        return self.kind != "none"

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "detail": self.detail}


NO_SANDBOX_REASON = "neither bubblewrap (bwrap) nor util-linux unshare can run here"


@dataclasses.dataclass(frozen=True)
class Limits:
    """The rlimits of one sandboxed command, from the budget's rows."""

    cpu_seconds: int
    memory_bytes: int
    processes: int
    file_bytes: int
    tmpfs_bytes: int

    @classmethod
    def of(cls, budget: Budget) -> Limits:
        return cls(math.ceil(budget.sandbox_cpu_seconds), budget.sandbox_memory_bytes,
                   budget.sandbox_max_processes, budget.sandbox_file_max_bytes, budget.sandbox_tmpfs_bytes)

    def apply(self) -> None:
        """Set them on the calling process (a child's, before it execs: inherited by all it runs)."""
        for which, value in ((resource.RLIMIT_CPU, self.cpu_seconds), (resource.RLIMIT_AS, self.memory_bytes),
                             (resource.RLIMIT_NPROC, self.processes),
                             (resource.RLIMIT_FSIZE, self.file_bytes),
                             (resource.RLIMIT_CORE, 0)):
            resource.setrlimit(which, (value, value))


def _system_binds() -> list[str]:
    args: list[str] = []
    for path in _SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return args


def _runtime_dirs() -> list[str]:
    """The Python the agent runs (its prefix and the base installation it comes from), read-only."""
    seen: list[str] = []
    for path in (sys.prefix, sys.base_prefix, sys.exec_prefix,
                 os.path.dirname(os.path.realpath(sys.executable))):
        real = os.path.realpath(path)
        if os.path.isdir(real) and not any(real == s or real.startswith(s + "/") for s in seen) \
                and not any(real == d or real.startswith(d + "/") for d in _SYSTEM_DIRS):
            seen.append(real)
    return seen


def bwrap_argv(argv: Sequence[str], root: Path, limits: Limits, writable: bool = False) -> list[str]:
    """``argv`` under bubblewrap: ``root`` read-only (and the working directory; ``writable``: the
    dev agent's checkout, the one writable place besides ``/tmp``), ``/tmp`` a private tmpfs, the
    sandbox's own root remounted read-only, every namespace unshared, every capability dropped."""
    args = ["bwrap", "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session",
            "--cap-drop", "ALL", *_system_binds()]
    args += ["--proc", "/proc", "--dev", "/dev", "--size", str(limits.tmpfs_bytes), "--tmpfs", SANDBOX_TMP,
             "--dir", SANDBOX_HOME]
    # After the tmpfs, so that a Python (a venv) or a checkout under /tmp is bound over it, not hidden
    for path in _runtime_dirs():
        args += ["--ro-bind", path, path]
    args += ["--bind" if writable else "--ro-bind", str(root), str(root), "--remount-ro", "/",
             "--chdir", str(root), "--", *argv]
    return args


def unshare_argv(argv: Sequence[str], root: Path, private: Path, writable: bool = False) -> list[str]:
    """``argv`` under util-linux unshare with :data:`_UNSHARE_SETUP`; ``private`` (an empty
    directory of the caller's, named by the environment: HOPLINE_SANDBOX_TMP) is where its tmpfs
    is made before it is moved onto /tmp."""
    del private
    kept = [p for p in _runtime_dirs() if p.startswith(SANDBOX_TMP + "/")] + [str(root)]
    return ["unshare", "--user", "--map-root-user", "--mount", "--net", "--pid", "--ipc", "--uts", "--fork",
            "--kill-child", "--", "sh", "-c", _UNSHARE_SETUP, "hopline-sandbox", "rw" if writable else "ro",
            str(len(kept)), *kept, *argv]


def sandbox_environment(environ: Mapping[str, str], kind: SandboxKind, private: Path,
                        root: Path, limits: Limits) -> dict[str, str]:
    """The allow-listed environment of a sandboxed command: the locale and the absolute entries of
    ``PATH`` (never the checkout's own programs), HOME, TMPDIR and every cache in the private tmpfs."""
    base = {k: v for k, v in environ.items() if k in _KEPT_ENV or k.startswith("LC_")}
    search = base.get("PATH", os.defpath).split(os.pathsep)
    base["PATH"] = os.pathsep.join(p for p in search if os.path.isabs(p))
    tmp = str(private) if kind == "none" else SANDBOX_TMP
    home = tmp + "/home"
    dirs = {"HOME": home, "TMPDIR": tmp, "TEMP": tmp, "TMP": tmp, "XDG_CACHE_HOME": home + "/.cache",
            "XDG_CONFIG_HOME": home + "/.config", "XDG_DATA_HOME": home + "/.local/share",
            "XDG_STATE_HOME": home + "/.local/state", "PYTHONPYCACHEPREFIX": tmp + "/pycache",
            "MYPY_CACHE_DIR": tmp + "/mypy", "RUFF_CACHE_DIR": tmp + "/ruff",
            "CARGO_TARGET_DIR": tmp + "/cargo-target", "GOCACHE": tmp + "/go-cache",
            "GOTMPDIR": tmp, "npm_config_cache": tmp + "/npm"}
    out = {**base, **dirs, "PYTEST_ADDOPTS": "-p no:cacheprovider", "PYTHONDONTWRITEBYTECODE": "1"}
    if kind == "unshare":
        out.update({"HOPLINE_SANDBOX_TMP": str(private), "HOPLINE_SANDBOX_CWD": str(root),
                    "HOPLINE_SANDBOX_SIZE": str(limits.tmpfs_bytes)})
    elif kind == "none":  # the operator allowed it: at least the caches stay out of the real home
        for key in ("HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME"):
            Path(out[key]).mkdir(parents=True, exist_ok=True)
    return out


def wrap(kind: SandboxKind, argv: Sequence[str], root: Path, private: Path, limits: Limits,
         writable: bool = False) -> list[str]:
    """The command line that runs ``argv`` in the sandbox of ``kind`` (``none``: as it is);
    ``writable``: ``root`` is writable (the dev agent's checkout during ``--fix``)."""
    if kind == "bwrap":
        return bwrap_argv(argv, root, limits, writable)
    if kind == "unshare":
        return unshare_argv(argv, root, private, writable)
    return list(argv)


def preexec(limits: Limits) -> Callable[[], None]:
    """What the child runs before it execs: the rlimits (inherited through bwrap or unshare)."""
    return limits.apply


def _probe(kind: SandboxKind) -> str | None:
    """None when a read-only, network-less sandbox of ``kind`` runs a program here; else why not."""
    tool = {"bwrap": "bwrap", "unshare": "unshare"}[kind]
    if shutil.which(tool) is None or (kind == "unshare" and shutil.which("setpriv") is None):
        return f"{tool} is not installed"
    root = Path(os.path.realpath(os.getcwd() if os.access(os.getcwd(), os.R_OK) else "/"))
    private = Path(os.environ.get("TMPDIR", "/tmp"))
    limits = Limits.of(Budget.defaults())
    probe = [sys.executable, "-c", "import socket,sys\ntry:\n socket.create_connection(('192.0.2.1', 9), 1)"
             "\nexcept OSError: sys.exit(0)\nsys.exit(3)"]
    try:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="hopline-sandbox-probe-", dir=private) as held:
            env = sandbox_environment(os.environ, kind, Path(held), root, limits)
            done = subprocess.run(wrap(kind, probe, root, Path(held), limits), env=env, cwd=root,
                                  stdin=subprocess.DEVNULL, capture_output=True, timeout=_PROBE_TIMEOUT,
                                  preexec_fn=preexec(limits), check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{tool} could not run ({type(exc).__name__})"
    if done.returncode != 0:
        first = done.stderr.decode("utf-8", "replace").strip().splitlines()
        return f"{tool} exited {done.returncode}" + (f": {first[-1][:160]}" if first else "")
    return None


def _process_ceiling() -> str:
    """What enforces the process ceiling here, in words (see the module docstring)."""
    if os.geteuid() != 0:
        return "processes by RLIMIT_NPROC"
    if pids_cgroup_root() is not None:
        return "processes by a pids cgroup"
    return "processes NOT limited (root, and no writable pids cgroup here)"


@functools.cache
def detect_sandbox() -> Sandbox:
    """The first sandbox that runs here (bwrap, then unshare), probed once per process."""
    reasons: list[str] = []
    backends: tuple[tuple[SandboxKind, str], ...] = (("bwrap", "bubblewrap"),
                                                     ("unshare", "util-linux unshare"))
    for kind, what in backends:
        failed = _probe(kind)
        if failed is None:
            return Sandbox(kind, f"{what}: the checkout read-only, a private tmpfs, no network, the "
                                 f"environment allow-listed, rlimits on CPU, memory and file size, "
                                 f"{_process_ceiling()}")
        reasons.append(failed)
    return Sandbox("none", f"{NO_SANDBOX_REASON} ({'; '.join(reasons)})")


def sandbox_of(kind: str) -> Sandbox:
    """The sandbox a gate named for its sessions: that kind, checked to run here too."""
    found = detect_sandbox()
    if kind == "none":
        return Sandbox("none", "the operator allowed unsandboxed runs (--allow-unsandboxed)")
    if kind == found.kind:
        return found
    if kind in ("bwrap", "unshare") and _probe(kind) is None:  # type: ignore[arg-type]
        return Sandbox(kind, kind)  # type: ignore[arg-type]
    return Sandbox("none", f"the gate's sandbox {kind!r} does not run here")
