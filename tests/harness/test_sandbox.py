"""The sandbox itself (SPEC T-7), both backends: what a command sees of the file system, which user
it runs as, and the report files it hands back. Real bwrap and util-linux unshare; as root the
command runs as nobody; not root (a user of this host, uid 1000, made with setpriv) the sandbox keeps
that uid in a user namespace, as before."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from hopline.budget import Budget
from hopline.harness import sandbox, sandbox_mounts
from hopline.harness.tools.commands import ResultsPipe

LIMITS = sandbox.Limits.of(Budget.defaults())
# What the command reports: its ids, what it can read and list, where it can write, and its report file
PROBE = """
grep -E '^(Uid|Gid|Groups|CapEff):' /proc/self/status
for f in /etc/passwd /etc/shadow /etc/ssl/private /root/.ssh /home "$SECRET" checkout.txt; do
  if [ -r "$f" ] && { [ -d "$f" ] && ls "$f" >/dev/null 2>&1 || cat "$f" >/dev/null 2>&1; }; then
    echo "READ $f"
  fi
done
ls /root >/dev/null 2>&1 && echo "READ /root"
echo scratch > "$HOME/scratch" && echo "HOME writable"
: > /dev/shm/semaphore && echo "SHM writable"
touch made-here 2>/dev/null && echo "CHECKOUT writable"
echo '<report/>' > "$TMPDIR/.hopline-out/report.xml"
exit 3
"""


def _kinds() -> list[str]:
    return [k for k in ("bwrap", "unshare") if shutil.which(k)]


def _run(kind: str, root: Path, private: Path, *, user: list[str] = (), env: dict[str, str] | None = None,
         secret: str = "") -> tuple[int, str, dict[str, bytes]]:
    argv = sandbox.wrap(kind, ["/bin/sh", "-c", PROBE], root, private, LIMITS,  # type: ignore[arg-type]
                        results=["report.xml"])
    environ = sandbox.sandbox_environment({"PATH": "/usr/bin:/bin"}, kind, private, root,  # type: ignore[arg-type]
                                          LIMITS)
    environ["SECRET"] = secret
    pipe = ResultsPipe(1 << 20)
    try:
        done = subprocess.run([*user, *argv], env={**environ, **(env or {})}, cwd=root, stdin=pipe.write_fd,
                              capture_output=True, text=True, timeout=60, check=False)
        os.close(pipe.write_fd)
        pipe.write_fd = -1
        data = b""
        os.set_blocking(pipe.read_fd, True)
        while chunk := os.read(pipe.read_fd, 65536):
            data += chunk
    finally:
        pipe.close()
    return done.returncode, done.stdout + done.stderr, sandbox.read_results(data)


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    root.mkdir()
    (root / "checkout.txt").write_text("the pull request's file\n")
    sandbox_mounts.share_tree(root, writable=False)
    return root


@pytest.mark.parametrize("kind", _kinds())
def test_as_root_the_command_runs_as_nobody_on_an_allow_list(kind: str, checkout: Path,
                                                             tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("not root")
    secret = Path(sandbox_mounts.runtime_dirs()[0]) / f"hopline-canary-{os.getpid()}"  # a bound directory
    secret.write_text("root only")
    secret.chmod(0o600)
    try:
        (tmp_path / "private").mkdir()
        code, output, results = _run(kind, checkout, tmp_path / "private", secret=str(secret))
    finally:
        secret.unlink()
    assert code == 3, output  # the command's own exit status, through the wrapper
    assert "Uid:\t65534\t65534\t65534\t65534" in output and "Gid:\t65534\t65534\t65534\t65534" in output
    assert "CapEff:\t0000000000000000" in output
    assert [line for line in output.splitlines() if line.startswith("READ")] == ["READ /etc/passwd",
                                                                               "READ checkout.txt"]
    assert "HOME writable" in output and "CHECKOUT writable" not in output
    assert "SHM writable" in output  # multiprocessing's semaphores (detect-secrets uses them)
    assert results == {"report.xml": b"<report/>\n"}
    assert not (checkout / "made-here").exists()


@pytest.mark.parametrize("kind", _kinds())
def test_not_root_the_command_keeps_hopline_s_uid_in_a_user_namespace(
        kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """hopline run by a user of this host (setpriv to uid 1000): the sandbox is built in a user
    namespace, the command keeps that uid (root of the namespace, no capability), as before."""
    if os.geteuid() != 0:
        pytest.skip("needs root to become another user for the test")
    try:
        user = pwd.getpwuid(1000)
    except KeyError:
        pytest.skip("no user 1000 on this host")
    monkeypatch.setattr(sandbox_mounts, "drops_user", lambda: False)
    monkeypatch.setattr(sandbox, "drops_user", lambda: False)
    monkeypatch.setattr(sandbox_mounts, "runtime_dirs", lambda: [])  # root's Python is not the user's
    with tempfile.TemporaryDirectory(prefix="hopline-user-") as held:
        root, private = Path(held, "checkout"), Path(held, "private")
        root.mkdir()
        private.mkdir()
        (root / "checkout.txt").write_text("the pull request's file\n")
        for path in (Path(held), root, private, root / "checkout.txt"):
            os.chown(path, user.pw_uid, user.pw_gid)
        root.chmod(0o555)
        become = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups", "--"]
        code, output, results = _run(kind, root, private, user=become)
    assert code == 3, output
    assert "CapEff:\t0000000000000000" in output
    # its own uid (bwrap), or root of its user namespace (unshare --map-root-user): never host root
    mapped = {"\t".join(["Uid:", *[str(user.pw_uid)] * 4]), "Uid:\t0\t0\t0\t0"}
    assert any(line in mapped for line in output.splitlines()), output
    assert [line for line in output.splitlines() if line.startswith("READ")] == ["READ /etc/passwd",
                                                                               "READ checkout.txt"]
    assert "HOME writable" in output and "CHECKOUT writable" not in output
    assert results == {"report.xml": b"<report/>\n"}


def test_a_report_is_read_whole_or_not_at_all() -> None:
    framed = b"hopline-result junit.xml 5\n<a/>\nhopline-result big.json 100\n{}"
    assert sandbox.read_results(framed) == {"junit.xml": b"<a/>\n"}  # the second was cut at the limit
    assert sandbox.read_results(b"garbage\n") == {}
    with pytest.raises(ValueError):
        sandbox.wrap("bwrap", ["true"], Path("/"), Path("/tmp"), LIMITS, results=["../etc/passwd"])


def test_an_interpreter_is_bound_by_its_venv_and_its_installation(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    dirs = sandbox_mounts.interpreter_dirs(str(venv / "bin" / "python"))
    assert dirs[0] == str(venv.resolve()) or str(venv.resolve()) in dirs
    assert all(not d.startswith(("/usr/", "/bin")) for d in dirs)  # the system's are bound already
