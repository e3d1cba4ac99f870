"""`gate --fix`: the dev agent's run_command runs in the gate's sandbox, and how it ran is recorded in
the review (issue #29, SPEC T-7). Real `hopline serve` daemons, hopline's agent with the offline
scripted dev agent (it runs the gate's test command after its fix), real git repositories, the real
bwrap and util-linux unshare.

The probe is a test the pull request adds: it fails unless the command that runs it sees no network
(the daemon's own port, reachable on the host, is not), writes nothing outside the checkout, has a
/tmp of its own (a file the host has in /tmp is not there), and carries none of the daemon's secrets
(a canary the operator passes to the agent with --agent-env does not reach the command).
"""

from __future__ import annotations

import dataclasses
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
from hopline.harness.sandbox_pids import pids_cgroup_root

from .conftest import make_repo, run_gate, worktrees
from .test_verifies import BASE, CALC, by_agent

pytestmark = pytest.mark.e2e  # real daemons, agents, sandboxes

CANARY_ENV = "GATE_CANARY_SECRET"
PLANTED = CALC + "\n\ndef debug(text: str) -> object:\n    value = eval(text)\n    return None\n"
PROBE = '''import os
import pathlib
import socket

PORT = {port}
CANARY = {canary!r}
HOST_TMP = {host_tmp!r}
OUTSIDE = {outside!r}


def test_the_command_runs_in_the_sandbox() -> None:
    leaks = []
    try:
        socket.create_connection(("127.0.0.1", PORT), 2).close()
        leaks.append("network")
    except OSError:
        pass
    for target in OUTSIDE:
        try:
            pathlib.Path(target).write_text("escaped")
            leaks.append("wrote " + target)
        except OSError:
            pass
    if os.path.exists(HOST_TMP):
        leaks.append("the host's /tmp")
    pathlib.Path("/tmp", "scratch").write_text("a private /tmp is writable")
    if {canary_env!r} in os.environ or any(CANARY in value for value in os.environ.values()):
        leaks.append("the canary")
    assert not leaks, leaks
'''

# A test that starts processes until one is refused (64 at most: bounded where nothing refuses)
SPAWN = '''import os


def test_spawn() -> None:
    r, w = os.pipe()
    children = []
    for _ in range(64):
        try:
            pid = os.fork()
        except BlockingIOError:
            break
        if pid == 0:
            os.close(w)
            os.read(r, 1)
            os._exit(0)
        children.append(pid)
    os.close(w)
    for pid in children:
        os.waitpid(pid, 0)
'''


def _path_without_bwrap(farm: Path) -> str:
    """A PATH like this host's with no bwrap on it: one directory of links to every other program."""
    for folder in [os.path.dirname(sys.executable), *os.environ["PATH"].split(os.pathsep)]:
        if not os.path.isdir(folder):
            continue
        for entry in os.scandir(folder):
            if entry.name != "bwrap" and not (farm / entry.name).exists() and os.access(entry.path, os.X_OK):
                (farm / entry.name).symlink_to(os.path.realpath(entry.path))
    return str(farm)


@dataclasses.dataclass(frozen=True)
class FixDaemon:
    daemon: Daemon
    kind: str  # the sandbox it has: bwrap, or unshare with no bwrap on its PATH
    canary: str  # the value of CANARY_ENV in its environment


@pytest.fixture(scope="module", params=["bwrap", "unshare"])
def fix_daemon(request: pytest.FixtureRequest) -> Iterator[FixDaemon]:
    """A daemon whose environment holds a canary it passes to its agents (--agent-env); for
    ``unshare``, with no bwrap on its PATH. Its data dir (where the checkout is made) is under /tmp,
    which the sandbox replaces with its own: the checkout is bound through."""
    kind = request.param
    env = {CANARY_ENV: "canary-" + secrets.token_hex(8)}
    # Outside /tmp: the unshare sandbox hides the host's /tmp, and its setup runs from this PATH
    with tempfile.TemporaryDirectory(prefix="hopline-nobwrap-", dir="/var/tmp") as farm, \
            tempfile.TemporaryDirectory(prefix=f"hopline-fix-{kind}-", dir="/tmp") as tmp:
        if kind == "unshare":
            if shutil.which("unshare") is None or shutil.which("setpriv") is None:
                pytest.skip("util-linux unshare/setpriv are not installed")
            env["PATH"] = _path_without_bwrap(Path(farm))
        elif shutil.which("bwrap") is None:
            pytest.skip("bubblewrap (bwrap) is not installed")
        with running_daemon(Path(tmp), agent_cmd=None, env=env, args=("--agent-env", CANARY_ENV)) as daemon:
            yield FixDaemon(daemon, kind, env[CANARY_ENV])


def test_the_dev_agent_s_command_runs_in_the_sandbox_and_is_recorded(fix_daemon: FixDaemon,
                                                                      tmp_path: Path) -> None:
    kind = fix_daemon.kind
    host_tmp = Path("/tmp") / f"hopline-host-only-{secrets.token_hex(6)}"
    outside = [tmp_path / "escaped", Path("/var/tmp") / f"hopline-escaped-{secrets.token_hex(6)}"]
    port = int(fix_daemon.daemon.url.rsplit(":", 1)[1].split("/")[0])
    probe = PROBE.format(port=port, canary=fix_daemon.canary,
                         host_tmp=str(host_tmp), outside=[str(p) for p in outside], canary_env=CANARY_ENV)
    repo, base, head = make_repo(tmp_path / "repo", BASE, {"src/calc.py": PLANTED,
                                                           "tests/test_probe.py": probe})
    host_tmp.write_text("the host's /tmp")
    try:
        result, events = run_gate(fix_daemon.daemon, repo, base=base, head=head, fix=True,
                                  agents=["qa_automation", "qa_performance_security"])
    finally:
        host_tmp.unlink()
    assert result["sandbox"]["kind"] == kind
    # round 1: the eval fails qa_performance_security; the dev agent fixes it and runs the tests
    [turn] = result["devTurns"]
    assert turn["commands"] == [{"sandbox": kind, "exitCode": 0, "timedOut": False, "refusedProcesses": 0}]
    assert turn.get("commit") and turn["verification"]["ok"] is True, turn
    assert result["exitCode"] == 0 and result["roundsRun"] == 2, result
    qa = by_agent(result)["qa_automation"]
    assert qa["verdict"] == "pass" and f"in the {kind} sandbox" in qa["summary"]
    assert any(e.type == "gate_fix" and e.data["commands"] == turn["commands"] for e in events)
    assert not any(p.exists() for p in outside)
    assert worktrees(repo) == [str(repo)]


def test_a_pr_that_forks_past_the_process_ceiling_fails_qa_automation(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("not root: RLIMIT_NPROC holds, and only the pids cgroup hopline makes as root counts "
                    "the refused forks")
    if pids_cgroup_root() is None:
        pytest.skip("no writable pids cgroup here: as root the process ceiling cannot be enforced")
    repo, base, head = make_repo(tmp_path / "repo", BASE, {"tests/test_spawn.py": SPAWN})
    (tmp_path / "daemon").mkdir()
    with running_daemon(tmp_path / "daemon", agent_cmd=None,
                        env={"HOPLINE_SANDBOX_MAX_PROCESSES": "16"}) as daemon:
        result, _ = run_gate(daemon, repo, base=base, head=head, agents=["qa_automation"])
    qa = by_agent(result)["qa_automation"]
    assert result["exitCode"] == 1 and qa["verdict"] == "fail", qa
    [refused] = [f for f in qa["findings"] if f["rule"] == "process-limit"]
    assert refused["severity"] == "error" and "the head run started more processes" in refused["message"]
    assert "HOPLINE_SANDBOX_MAX_PROCESSES" in refused["message"]
    assert subprocess.run(["true"], check=False).returncode == 0  # the host still starts processes
