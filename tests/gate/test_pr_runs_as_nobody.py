"""Issue #47: a pull request's code runs as nobody, and sees none of the host's secrets. `hopline gate
--url` (a real process) against a real `hopline serve` with hopline's agent, once with bubblewrap and
once with util-linux unshare (no bwrap on the daemon's PATH), with hopline running as root.

The PR adds a test that tries to read what it must not: a root-owned 0600 file in a directory the
sandbox binds (hopline's own Python prefix), /etc/shadow, /root and a file in it, ~/.ssh, /home, and
the daemon's data directory with a world-readable file in it; and that checks what a test run needs
(its uid is not 0 on the host, /etc/passwd is there, its checkout is readable, its HOME writable).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon.support import Daemon, running_daemon

from .conftest import make_repo
from .test_fix_sandbox import _path_without_bwrap
from .test_tests_must_run import BASE, invocation, no_worktree_left, validate_sarif

pytestmark = pytest.mark.e2e

PROBE = '''import json
import os
import pathlib

# As JSON: a literal path under /tmp in a test is the analyzers' own finding (bandit's B108)
UNREADABLE = json.loads({files!r})
UNLISTABLE = json.loads({dirs!r})


def test_the_host_is_out_of_reach() -> None:
    reached = []
    for path in UNREADABLE:
        try:
            pathlib.Path(path).read_bytes()
            reached.append(path)
        except OSError:
            pass
    for path in UNLISTABLE:
        try:
            os.listdir(path)
            reached.append(path)
        except OSError:
            pass
    status = pathlib.Path("/proc/self/status").read_text().splitlines()
    uids = next(line for line in status if line.startswith("Uid:")).split()[1:]
    gids = next(line for line in status if line.startswith("Gid:")).split()[1:]
    assert uids == ["65534"] * 4 and gids == ["65534"] * 4, (uids, gids)
    assert os.getgroups() in ([], [65534])
    assert "root:" in pathlib.Path("/etc/passwd").read_text()  # what a test run needs is there
    assert "UNREADABLE" in pathlib.Path(__file__).read_text()  # its checkout is readable
    pathlib.Path(os.environ["HOME"], "scratch").write_text("its private tmp is writable")
    assert not reached, reached
'''


@pytest.fixture(scope="module", params=["bwrap", "unshare"])
def root_daemon(request: pytest.FixtureRequest) -> Iterator[tuple[str, Daemon, dict[str, str]]]:
    """A daemon run by root: with bwrap, or with no bwrap on its PATH (unshare)."""
    if os.geteuid() != 0:
        pytest.skip("not root: the sandbox keeps hopline's own unprivileged uid")
    kind = request.param
    if shutil.which(kind) is None:
        pytest.skip(f"{kind} is not installed")
    env: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="hopline-nobwrap-", dir="/var/tmp") as farm, \
            tempfile.TemporaryDirectory(prefix=f"hopline-nobody-{kind}-") as tmp:
        if kind == "unshare":
            env["PATH"] = _path_without_bwrap(Path(farm))
        env["TMPDIR"] = str(Path(tmp, "tmp"))  # where its agents keep base checkouts and cut outputs
        Path(env["TMPDIR"]).mkdir()
        with running_daemon(Path(tmp), agent_cmd=None, env=env) as daemon:
            yield kind, daemon, env


def test_pr_code_runs_as_nobody_and_reads_no_secret(root_daemon: tuple[str, Daemon, dict[str, str]],
                                                    tmp_path: Path) -> None:
    kind, daemon, env = root_daemon
    token = secrets.token_hex(8)
    bound = Path(sys.prefix) / f"hopline-canary-{token}"  # hopline's Python: bound into the sandbox
    in_root = Path("/root") / f"hopline-canary-{token}"
    in_data = daemon.data_dir / f"hopline-canary-{token}"
    for path, mode in ((bound, 0o600), (in_root, 0o600), (in_data, 0o644)):
        path.write_text(f"secret {token}")
        path.chmod(mode)
    files = [str(bound), "/etc/shadow", str(in_root), str(in_data)]
    dirs = ["/root", "/root/.ssh", "/home", str(daemon.data_dir)]
    repo, base, head = make_repo(tmp_path / "repo", BASE,
                                 {"tests/test_probe.py": PROBE.format(files=json.dumps(files),
                                                                      dirs=json.dumps(dirs))})
    sarif = tmp_path / "gate.sarif"
    try:
        assert all(Path(p).read_text() == f"secret {token}" for p in (bound, in_root, in_data))  # root can
        done = subprocess.run([sys.executable, "-m", "hopline", "gate", "--url", daemon.url, "--json",
                               "--sarif", str(sarif), "--base", base, "--head", head],
                              cwd=repo, env={**os.environ, **env, "HOPLINE_SERVER_TOKEN": daemon.token},
                              capture_output=True, text=True, timeout=300)
    finally:
        for path in (bound, in_root, in_data):
            path.unlink()
    result = json.loads(done.stdout)
    assert result["sandbox"]["kind"] == kind and "as nobody (uid 65534)" in result["sandbox"]["detail"]
    qa = next(a for a in result["agents"] if a["agent"] == "qa_automation")
    errors = [(a["agent"], f["rule"], f["message"]) for a in result["agents"] for f in a["findings"]
              if f["severity"] == "error"]
    assert errors == [] and done.returncode == 0, errors  # the probe ran, and reached nothing
    [head_run] = [r for r in qa["testRuns"] if r["at"] == "head"]
    assert head_run["ran"] is True and head_run["counts"] == {"passed": 3}
    assert token not in done.stdout + sarif.read_text()
    document = json.loads(sarif.read_text())
    validate_sarif(document)
    assert invocation(document, "qa_automation")["executionSuccessful"] is True
    no_worktree_left(repo)  # the base checkout a session made to compare the tests included
    assert not list((daemon.data_dir / "gate").iterdir())
    assert not list(Path(env["TMPDIR"]).glob("hopline-*"))  # the agents closed their sessions' tools
