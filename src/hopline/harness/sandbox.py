"""The sandbox every command a gate runs on a pull request's code runs in (SPEC T-7).

What the command gets: the file system of :mod:`hopline.harness.sandbox_mounts` (an allow-list:
the system's directories, a few files of ``/etc``, the interpreters, its checkout read-only, a
private writable tmpfs on ``/tmp`` for HOME, TMPDIR and every cache), no network (a network
namespace of its own: loopback only), its own PID, IPC and UTS namespaces, an allow-listed
environment (:func:`sandbox_environment`), rlimits on CPU time, memory, processes and file size,
each a row of the budget (``HOPLINE_SANDBOX_*``), and no capability. When hopline runs as root it
runs as ``nobody`` (uid and gid 65534, no supplementary group): the sandbox is built with root's
rights, then ``setpriv`` drops the user as the last step before the command runs, so the host sees
a process of uid 65534 (a user namespace alone would map it to root).

Two real tools give it, tried in order by :func:`detect_sandbox` (each by running it once, since a
container may forbid user namespaces): bubblewrap (``bwrap``, Debian's ``bubblewrap``), then
util-linux ``unshare`` (mount, network, PID, IPC and UTS namespaces, and a user namespace when not
root; its setup script builds the same root as bwrap's on a tmpfs and ``chroot``s into it). When
neither runs, :data:`NO_SANDBOX`: a gate refuses to run the pull request's code unless the operator
allowed it (``hopline gate --allow-unsandboxed``).

What a run leaves for hopline to read (a JUnit XML report, a coverage report) stays in its private
tmpfs; the command runs under a small shell (:data:`_WRAPPER`) that, once the command ended, writes
the files asked for to a pipe hopline gave it (as its standard input) and reads up to a byte limit
(:func:`read_results`). The command itself runs with that descriptor closed, /dev/null its input.

RLIMIT_NPROC counts per user, and the kernel does not apply it to root's processes: as root the
process ceiling is a pids cgroup of the command's own (:mod:`hopline.harness.sandbox_pids`), which
also counts the forks it refused; RLIMIT_NPROC applies (to nobody) only when there is no such cgroup.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
import resource
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Literal

from hopline.budget import Budget
from hopline.harness.sandbox_mounts import (
    SANDBOX_TMP,
    SANDBOX_UID,
    bwrap_mount_args,
    drops_user,
    mounts,
    unshare_mount_args,
)
from hopline.harness.sandbox_pids import pids_cgroup_root

SandboxKind = Literal["bwrap", "unshare", "none"]
RESULTS_DIR = ".hopline-out"  # under the command's TMPDIR: the files it leaves for hopline
# What a sandboxed command keeps of the caller's environment: a program's search path and the locale.
_KEPT_ENV = frozenset({"PATH", "LANG", "LANGUAGE", "TERM", "TZ"})
_PROBE_TIMEOUT = 20.0
_SYSTEM_PATH = ("/usr/local/bin", "/usr/bin", "/bin")
_DROP_CAPS = ("--no-new-privs", "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all")
_RESULT_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")

# The unshare backend's setup, run as root (of a new user namespace when hopline is not root): a
# tmpfs made on an empty directory of the caller's becomes the new root; every entry of the mount
# list is made in it in order (binds, read-only unless "rw"; symlinks; the /tmp tmpfs); a /proc of
# the new PID namespace (the host's when the kernel refuses one), a /dev of a few devices; the new
# root made read-only; then chroot, and the command with no capability left (and as nobody when
# hopline runs as root). Parents it makes for a bind are 0711: traversable, not listable.
# (-n: no mount table is written.) Arguments: the new root, the working directory, the uid to drop
# to ("" to keep it), chroot's path, setpriv's (in /usr: the new root has it), the mount list
# (sandbox_mounts.unshare_mount_args), the command.
_UNSHARE_SETUP = r"""
new="$1"; cwd="$2"; drop="$3"; chroot="$4"; setpriv="$5"; n="$6"; shift 6
umask 022
mount --make-rprivate / 2>/dev/null
mount -n -t tmpfs -o mode=0755,nosuid,nodev tmpfs "$new" || exit 125
parents() { (umask 066 && mkdir -p "$new$(dirname -- "$1")") || exit 125; }
while [ "$n" -gt 0 ]; do
  kind="$1"; src="$2"; dst="$3"; shift 3; n=$((n - 1)); at="$new$dst"
  parents "$dst"
  case "$kind" in
    link) ln -s "$src" "$at" || exit 125;;
    tmpfs) mkdir -p "$at" && mount -n -t tmpfs -o "size=$src,mode=1777,nosuid,nodev" tmpfs "$at" || exit 125;;
    *) if [ -d "$src" ]; then (umask 066 && mkdir -p "$at"); else : > "$at"; fi || exit 125
       mount -n --rbind "$src" "$at" || exit 125
       if [ "$kind" = ro ]; then
         mount -n -o remount,bind,ro "$at" 2>/dev/null || mount -n -o remount,bind,ro,nosuid,nodev "$at" \
           2>/dev/null || mount -n -o remount,bind,ro,nosuid,nodev,noexec "$at" || exit 125
       fi;;
  esac
done
mkdir -p "$new/proc" "$new/dev" || exit 125
mount -n -t proc -o nosuid,nodev,noexec proc "$new/proc" 2>/dev/null || mount -n --rbind /proc "$new/proc" \
  || exit 125
mount -n -t tmpfs -o mode=0755,nosuid tmpfs "$new/dev" || exit 125
for d in null zero full random urandom tty; do
  : > "$new/dev/$d" && mount -n --bind "/dev/$d" "$new/dev/$d" || exit 125
done
mkdir -m 1777 "$new/dev/shm" && mount -n -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$new/dev/shm" || exit 125
ln -s /proc/self/fd "$new/dev/fd" && ln -s /proc/self/fd/0 "$new/dev/stdin" \
  && ln -s /proc/self/fd/1 "$new/dev/stdout" && ln -s /proc/self/fd/2 "$new/dev/stderr" || exit 125
mount -n -o remount,bind,ro,nosuid,nodev "$new" || exit 125
enter='cd "$1" || exit 125; shift; exec "$@"'
caps="--no-new-privs --inh-caps=-all --ambient-caps=-all --bounding-set=-all"
if [ -n "$drop" ]; then
  exec "$chroot" "$new" /bin/sh -c "$enter" hopline-sandbox "$cwd" "$setpriv" --reuid="$drop" \
    --regid="$drop" --clear-groups $caps -- "$@"
fi
exec "$chroot" "$new" /bin/sh -c "$enter" hopline-sandbox "$cwd" "$setpriv" $caps -- "$@"
"""

# Run as the sandbox's user, in the sandbox: HOME and the results directory made in the private
# tmpfs; the results pipe, which hopline gives as standard input (dash redirects only descriptors
# 0 to 9, and a pipe passed under its own number may be 15), moved to 3 and /dev/null made the
# input; the command run with 3 closed; then each file asked for (a regular file, not a link)
# written to 3 after a line "hopline-result NAME SIZE"; the command's exit status.
# Arguments: the results directory, the number of names, the names, the command.
_WRAPPER = r"""
out="$1"; n="$2"; shift 2
names=""
while [ "$n" -gt 0 ]; do names="$names $1"; shift; n=$((n - 1)); done
mkdir -p "$HOME" "$out" 2>/dev/null
exec 3>&0 0</dev/null
"$@" 3>&-
rc=$?
for name in $names; do
  f="$out/$name"
  if [ -f "$f" ] && [ ! -h "$f" ]; then
    size=$(wc -c < "$f")
    printf 'hopline-result %s %s\n' "$name" $size >&3 && head -c "$size" "$f" >&3
  fi
done
exit $rc
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

    def apply(self, processes: bool = True) -> None:
        """Set them on the calling process (a child's, before it execs: inherited by all it runs);
        ``processes``: RLIMIT_NPROC too (not when a pids cgroup is the ceiling)."""
        for which, value in ((resource.RLIMIT_CPU, self.cpu_seconds), (resource.RLIMIT_AS, self.memory_bytes),
                             (resource.RLIMIT_FSIZE, self.file_bytes), (resource.RLIMIT_CORE, 0)):
            resource.setrlimit(which, (value, value))
        if processes:
            resource.setrlimit(resource.RLIMIT_NPROC, (self.processes, self.processes))


def results_dir(kind: SandboxKind, private: Path) -> str:
    """Where, as the command sees it, it leaves the files hopline reads back (its private tmp)."""
    return f"{private if kind == 'none' else SANDBOX_TMP}/{RESULTS_DIR}"


def _inside(argv: Sequence[str], kind: SandboxKind, private: Path, results: Sequence[str]) -> list[str]:
    """``argv`` under :data:`_WRAPPER`, asking for ``results`` (file names in :func:`results_dir`),
    written to its standard input (the write end of the caller's results pipe)."""
    for name in results:
        if not _RESULT_NAME.fullmatch(name):
            raise ValueError(f"not a result file name: {name!r}")
    return ["/bin/sh", "-c", _WRAPPER, "hopline-sandbox", results_dir(kind, private), str(len(results)),
            *results, *argv]


def _drop() -> list[str]:
    """What runs the command as nobody: setpriv, the last step in the sandbox (hopline is root)."""
    ids = f"{SANDBOX_UID}"
    return [_setpriv(), f"--reuid={ids}", f"--regid={ids}", "--clear-groups", *_DROP_CAPS, "--"]


def _setpriv() -> str:
    """setpriv's own path (under /usr, which the sandbox binds): the sandbox's PATH may name
    directories it does not have."""
    return os.path.realpath(shutil.which("setpriv") or "/usr/bin/setpriv")


def bwrap_argv(argv: Sequence[str], root: Path, limits: Limits, writable: bool = False,
               binds: Sequence[tuple[str, str]] = ()) -> list[str]:
    """``argv`` under bubblewrap: the mounts of :func:`~hopline.harness.sandbox_mounts.mounts`, the
    sandbox's own root remounted read-only, every namespace unshared; not root: in a user namespace
    with every capability dropped; root: no user namespace (it would map the command to root), and
    nobody's uid, dropped by setpriv inside."""
    plan = mounts(root, limits.tmpfs_bytes, writable=writable, binds=binds)
    if drops_user():
        args = ["bwrap", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
                "--unshare-cgroup-try", "--die-with-parent", "--new-session"]
        tail = _drop()
    else:
        args = ["bwrap", "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session",
                "--cap-drop", "ALL"]
        tail = []
    # /dev/shm writable by the command (multiprocessing's semaphores): bwrap's own is root's
    return [*args, *bwrap_mount_args(plan), "--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs",
            "/dev/shm", "--remount-ro", "/", "--chdir", str(root), "--", *tail, *argv]


def unshare_argv(argv: Sequence[str], root: Path, private: Path, limits: Limits, writable: bool = False,
                 binds: Sequence[tuple[str, str]] = ()) -> list[str]:
    """``argv`` under util-linux unshare with :data:`_UNSHARE_SETUP`; ``private`` (an empty
    directory of the caller's) is where the new root's tmpfs is made."""
    plan = mounts(root, limits.tmpfs_bytes, writable=writable, binds=binds)
    user = [] if drops_user() else ["--user", "--map-root-user"]
    chroot = shutil.which("chroot") or "/usr/sbin/chroot"
    return ["unshare", *user, "--mount", "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child", "--",
            "sh", "-c", _UNSHARE_SETUP, "hopline-sandbox", str(private), str(root),
            str(SANDBOX_UID) if drops_user() else "", chroot, _setpriv(), *unshare_mount_args(plan), *argv]


def sandbox_environment(environ: Mapping[str, str], kind: SandboxKind, private: Path,
                        root: Path, limits: Limits) -> dict[str, str]:
    """The allow-listed environment of a sandboxed command: the locale and the absolute entries of
    ``PATH`` (never the checkout's own programs), HOME, TMPDIR and every cache in the private tmpfs."""
    del root, limits
    base = {k: v for k, v in environ.items() if k in _KEPT_ENV or k.startswith("LC_")}
    search = [p for p in base.get("PATH", os.defpath).split(os.pathsep) if os.path.isabs(p)]
    # the system's own last: the sandbox has them, whatever the caller's PATH names
    base["PATH"] = os.pathsep.join([*search, *(p for p in _SYSTEM_PATH if p not in search)])
    tmp = str(private) if kind == "none" else SANDBOX_TMP
    home = tmp + "/home"
    dirs = {"HOME": home, "TMPDIR": tmp, "TEMP": tmp, "TMP": tmp, "XDG_CACHE_HOME": home + "/.cache",
            "XDG_CONFIG_HOME": home + "/.config", "XDG_DATA_HOME": home + "/.local/share",
            "XDG_STATE_HOME": home + "/.local/state", "PYTHONPYCACHEPREFIX": tmp + "/pycache",
            "MYPY_CACHE_DIR": tmp + "/mypy", "RUFF_CACHE_DIR": tmp + "/ruff",
            "CARGO_TARGET_DIR": tmp + "/cargo-target", "GOCACHE": tmp + "/go-cache",
            "GOTMPDIR": tmp, "npm_config_cache": tmp + "/npm"}
    out = {**base, **dirs, "PYTEST_ADDOPTS": "-p no:cacheprovider", "PYTHONDONTWRITEBYTECODE": "1"}
    if kind == "none":  # the operator allowed it: at least the caches stay out of the real home
        for key in ("HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME"):
            Path(out[key]).mkdir(parents=True, exist_ok=True)
    return out


def wrap(kind: SandboxKind, argv: Sequence[str], root: Path, private: Path, limits: Limits,
         writable: bool = False, binds: Sequence[tuple[str, str]] = (),
         results: Sequence[str] = ()) -> list[str]:
    """The command line that runs ``argv`` in the sandbox of ``kind`` (``none``: as it is, still
    under the wrapper); ``writable``: ``root`` is writable (the dev agent's checkout during
    ``--fix``); ``binds``: more read-only ``(host, sandbox)`` paths; ``results``: the file names of
    :func:`results_dir` written, once the command ended, to the standard input the caller gives it
    (the write end of a pipe; :func:`read_results`)."""
    inside = _inside(argv, kind, private, results)
    if kind == "bwrap":
        return bwrap_argv(inside, root, limits, writable, binds)
    if kind == "unshare":
        return unshare_argv(inside, root, private, limits, writable, binds)
    return inside


def read_results(data: bytes) -> dict[str, bytes]:
    """The files a wrapped command wrote to descriptor 3 (:data:`_WRAPPER`'s framing); a file cut
    short (over the reader's limit) is left out."""
    out: dict[str, bytes] = {}
    at = 0
    while at < len(data):
        end = data.find(b"\n", at)
        if end < 0:
            break
        head = data[at:end].split()
        if len(head) != 3 or head[0] != b"hopline-result" or not head[2].isdigit():
            break
        size = int(head[2])
        body = data[end + 1:end + 1 + size]
        if len(body) < size:
            break
        out[head[1].decode("ascii", "replace")] = body
        at = end + 1 + size
    return out


def preexec(limits: Limits) -> Callable[[], None]:
    """What the child runs before it execs: the rlimits (inherited through bwrap or unshare). As
    root with a pids cgroup, the cgroup is the process ceiling: RLIMIT_NPROC, which would count every
    process of nobody on the host, is left alone so the cgroup counts the forks it refuses."""
    processes = not (os.geteuid() == 0 and pids_cgroup_root() is not None)
    return functools.partial(limits.apply, processes)


def try_run(kind: SandboxKind, argv: Sequence[str], root: Path | None = None,
            binds: Sequence[tuple[str, str]] = (), timeout: float = _PROBE_TIMEOUT) -> str | None:
    """Run ``argv`` once in the sandbox of ``kind`` at ``root`` (None: an empty directory) and
    blocking: None when it exits 0, else why not (its exit code and its last line of error)."""
    tool = {"bwrap": "bwrap", "unshare": "unshare", "none": "the command"}[kind]
    limits = Limits.of(Budget.defaults())
    try:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="hopline-sandbox-probe-",
                                         dir=os.environ.get("TMPDIR", "/tmp")) as held:
            private, cwd = Path(held, "tmp"), root or Path(held, "root")
            private.mkdir()
            if root is None:
                cwd.mkdir(mode=0o755)
                cwd.chmod(0o755)
            env = sandbox_environment(os.environ, kind, private, cwd, limits)
            done = subprocess.run(wrap(kind, argv, cwd, private, limits, binds=binds), env=env, cwd=cwd,
                                  stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout,
                                  preexec_fn=preexec(limits), check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{tool} could not run ({type(exc).__name__})"
    if done.returncode != 0:
        said = (done.stderr + done.stdout).decode("utf-8", "replace").strip().splitlines()
        return f"{tool} exited {done.returncode}" + (f": {said[-1][:200]}" if said else "")
    return None


def _probe(kind: SandboxKind) -> str | None:
    """None when a read-only, network-less sandbox of ``kind`` runs a program here; else why not."""
    tool = {"bwrap": "bwrap", "unshare": "unshare"}[kind]
    needed = [tool, *(["setpriv", "chroot"] if kind == "unshare" else ["setpriv"] if drops_user() else [])]
    missing = [name for name in needed
               if shutil.which(name) is None and not os.path.exists(f"/usr/sbin/{name}")]
    if missing:
        return f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed"
    # The system's shell, so that an interpreter nobody cannot run is said as such where a gate
    # checks it (gate.interpreter), not as "no sandbox"; as root, the command must not be root.
    probe = ["/bin/sh", "-c", '[ "$(id -u)" != 0 ] || [ "$0" = keep ] || exit 4',
             "drop" if drops_user() else "keep"]
    return try_run(kind, probe)


def _process_ceiling() -> str:
    """What enforces the process ceiling here, in words (see the module docstring)."""
    if os.geteuid() != 0:
        return "processes by RLIMIT_NPROC"
    if pids_cgroup_root() is not None:
        return "processes by a pids cgroup"
    return "processes by RLIMIT_NPROC of nobody (no writable pids cgroup here: shared by every sandbox)"


@functools.cache
def detect_sandbox() -> Sandbox:
    """The first sandbox that runs here (bwrap, then unshare), probed once per process."""
    reasons: list[str] = []
    backends: tuple[tuple[SandboxKind, str], ...] = (("bwrap", "bubblewrap"),
                                                     ("unshare", "util-linux unshare"))
    for kind, what in backends:
        failed = _probe(kind)
        if failed is None:
            user = f"as nobody (uid {SANDBOX_UID}), " if drops_user() else ""
            return Sandbox(kind, f"{what}: {user}the checkout read-only, a private tmpfs, no network, "
                                 f"only a few files of /etc, the environment allow-listed, rlimits on CPU, "
                                 f"memory and file size, {_process_ceiling()}")
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
