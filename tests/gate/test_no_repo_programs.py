"""No hook, filter, textconv or external diff of the reviewed repository runs (issue #29, item 4),
and the sandbox every command on PR code runs in holds (SPEC T-7): one planted repository each."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest

from hopline.budget import Budget
from hopline.harness.git import Checkout
from hopline.harness.sandbox import Limits, detect_sandbox
from hopline.harness.sandbox_pids import pids_cgroup_root
from hopline.harness.tools import ReviewRange, Workspace
from hopline.scripted.sample_pull_request import git

from .conftest import make_repo, worktrees

BUDGET = Budget.defaults()


def _planted(tmp_path: Path) -> tuple[Path, str, str, Path]:
    canary = tmp_path / "ran"
    repo, base, head = make_repo(tmp_path / "repo", {"a.txt": "one\n", ".gitattributes": "*.txt filter=evil "
                                                                                         "diff=evil\n"},
                                 {"a.txt": "two\n"})
    return repo, base, head, canary


def test_a_post_checkout_hook_does_not_run(tmp_path: Path) -> None:
    repo, _, head, canary = _planted(tmp_path)
    hook = repo / ".git" / "hooks" / "post-checkout"
    hook.write_text(f"#!/bin/sh\ntouch {canary}\n")
    hook.chmod(0o755)
    git(repo, "checkout", "--quiet", "main")  # the hook works: git runs it on a plain checkout
    assert canary.exists()
    canary.unlink()
    checkout = Checkout.create(repo, tmp_path / "wt", head, BUDGET)
    try:
        assert (checkout.path / "a.txt").read_text() == "two\n" and not canary.exists()
        checkout.writable()
        (checkout.path / "b.txt").write_text("new\n")
        assert checkout.stage_all() == ["b.txt"]
        checkout.commit_staged("a commit: no pre-commit or post-commit hook either")
        assert not canary.exists()
    finally:
        checkout.remove()


@pytest.mark.parametrize("key", ["smudge", "clean", "process"])
def test_a_filter_driver_does_not_run(tmp_path: Path, key: str) -> None:
    repo, _, head, canary = _planted(tmp_path)
    git(repo, "config", f"filter.evil.{key}", f"sh -c 'touch {canary}; cat'")
    git(repo, "config", "filter.evil.required", "true")
    checkout = Checkout.create(repo, tmp_path / "wt", head, BUDGET)
    try:
        checkout.writable()
        (checkout.path / "c.txt").write_text("three\n")  # `git add` would run the clean filter
        checkout.stage_all()
        checkout.discard()
        assert (checkout.path / "a.txt").read_text() == "two\n"
        assert not canary.exists()
    finally:
        checkout.remove()


@pytest.mark.parametrize("setting", ["diff.evil.textconv", "diff.external", "diff.evil.command"])
def test_git_diff_runs_no_textconv_or_external_diff(tmp_path: Path, setting: str) -> None:
    repo, base, head, canary = _planted(tmp_path)
    git(repo, "config", setting, f"sh -c 'touch {canary}; cat'")
    checkout = Checkout.create(repo, tmp_path / "wt", head, BUDGET)
    try:
        tools = Workspace(checkout.path, BUDGET, review=ReviewRange(base, head))
        diff = tools.git_diff({"path": "a.txt"})
        assert "-one" in diff and "+two" in diff and not canary.exists()
        tools.close()
    finally:
        checkout.remove()


def _run(tools: Workspace, command: str, at: str = "head") -> tuple[str, dict[str, object]]:
    outcome = asyncio.run(tools.run("run_command", {"command": command, "at": at}, "c"))
    assert outcome.meta is not None
    return outcome.output, outcome.meta["hopline.command"]  # type: ignore[return-value]


@pytest.mark.parametrize("kind", ["bwrap", "unshare"])
def test_the_sandbox_holds_read_only_tree_tmpfs_no_network_rlimits(tmp_path: Path, kind: str) -> None:
    assert detect_sandbox().available, detect_sandbox().detail
    probe = ("import os, pathlib, socket\n"
             "def test_probe():\n"
             "    limits = pathlib.Path('/proc/self/limits').read_text()\n"
             "    print('LIMITS=' + ' | '.join(l for l in limits.splitlines() if l.startswith(('Max cpu', "
             "'Max address', 'Max processes', 'Max file size'))))\n"
             "    pathlib.Path(os.environ['TMPDIR'], 'scratch').write_text('ok')\n"
             "    for target in ('tests/made', os.path.expanduser('~root/made-by-pr')):\n"
             "        try:\n            pathlib.Path(target).write_text('x')\n            print('WROTE', "
             "target)\n"
             "        except OSError:\n            pass\n"
             "    try:\n        socket.create_connection(('192.0.2.1', 80), 1)\n        print('NETWORK')\n"
             "    except OSError:\n        pass\n")
    repo, base, head = make_repo(tmp_path / "repo", {"tests/test_probe.py": "def test_probe(): pass\n"},
                                 {"tests/test_probe.py": probe})
    budget = BUDGET.replace(sandbox_cpu_seconds=77, sandbox_max_processes=333,
                            sandbox_file_max_bytes=5 * 1024 * 1024, sandbox_memory_bytes=3 * 1024 ** 3)
    tools = Workspace(repo, budget, review=ReviewRange(base, head, sandbox=kind))
    try:
        output, command = _run(tools, "python -m pytest -q -s tests/test_probe.py")
        assert command["exitCode"] == 0 and command["sandbox"] == kind, output
        assert "WROTE" not in output and "NETWORK" not in output
        limits = next(line for line in output.splitlines() if line.startswith("LIMITS="))
        # as root with a pids cgroup, the cgroup is the process ceiling (the fork bomb's test below);
        # RLIMIT_NPROC, which would count every process of nobody on the host, is left alone
        cgroup = os.geteuid() == 0 and pids_cgroup_root() is not None
        processes = [] if cgroup else ["Max processes             333"]
        for expected in ("Max cpu time              77", *processes,
                         f"Max file size             {5 * 1024 * 1024}", f"Max address space         "
                                                                         f"{3 * 1024 ** 3}"):
            assert expected in limits, limits
        assert ("Max processes             333" in limits) is not cgroup
        assert not (repo / "tests" / "made").exists() and not Path("/root/made-by-pr").exists()
        base_output, base_command = _run(tools, "python -m pytest -q tests/test_probe.py", at="base")
        assert base_command["exitCode"] == 0 and "1 passed" in base_output
    finally:
        tools.close()
    assert worktrees(repo) == [str(repo)]  # the base checkout went with the session


@pytest.mark.parametrize("kind", ["bwrap", "unshare"])
def test_an_analyzer_runs_hopline_s_module_not_the_checkout_s(tmp_path: Path, kind: str) -> None:
    """A pull request that adds a package named like an analyzer's module does not replace the
    analyzer (``python -m`` would put the checkout first on ``sys.path``); its report is the real one.
    The analyzer reads its interpreter's bytecode (no pycache prefix), the PR's code keeps the prefix."""
    fake = "print('HIJACKED')\n"
    repo, base, head = make_repo(tmp_path / "repo", {"a.txt": "one\n"},
                                 {"a.txt": 'password = "correct-horse-battery-staple"\n',
                                  "detect_secrets/__init__.py": "", "detect_secrets/__main__.py": fake})
    tools = Workspace(repo, BUDGET, review=ReviewRange(base, head, sandbox=kind))
    try:
        output, command = _run(tools, "python -m detect_secrets scan a.txt")
        assert command["exitCode"] == 0 and command["sandbox"] == kind, output
        assert "HIJACKED" not in output and '"Secret Keyword"' in output, output
        commands = tools.commands
        assert commands is not None
        private, limits = tmp_path / "private", Limits.of(BUDGET)
        analyzer = commands.environment([commands.python, "-m", "bandit", "x.py"], repo, private, limits)
        assert "PYTHONPYCACHEPREFIX" not in analyzer and analyzer["PYTHONSAFEPATH"] == "1"
        for argv in ([commands.python, "-m", "py_compile", "x.py"], [commands.python, "-m", "pytest"]):
            tests = commands.environment(argv, repo, private, limits)
            assert "PYTHONSAFEPATH" not in tests and tests["PYTHONPYCACHEPREFIX"].endswith("/pycache")
    finally:
        tools.close()


def test_a_memory_hog_hits_its_rlimit(tmp_path: Path) -> None:
    hog = "def test_hog():\n    blob = bytearray(600 * 1024 * 1024)\n    assert blob\n"
    repo, base, head = make_repo(tmp_path / "repo", {"tests/test_hog.py": "def test_hog(): pass\n"},
                                 {"tests/test_hog.py": hog})
    tools = Workspace(repo, BUDGET.replace(sandbox_memory_bytes=256 * 1024 * 1024), review=ReviewRange(base,
                                                                                                       head))
    try:
        output, command = _run(tools, "python -m pytest -q tests/test_hog.py")
        assert command["exitCode"] != 0 and "MemoryError" in output
    finally:
        tools.close()


@pytest.mark.parametrize("kind", ["bwrap", "unshare"])
def test_a_fork_bomb_is_refused_by_the_process_ceiling_and_said_in_the_output(tmp_path: Path,
                                                                              kind: str) -> None:
    """The dev agent's shell (a fix session runs any line) forks sleepers past the ceiling: the
    sandbox refuses the processes past HOPLINE_SANDBOX_MAX_PROCESSES, the command ends with its
    shell (the sandbox's PID namespace takes the sleepers with it), the output and the record say
    how many forks were refused, and nothing of it is left (its pids cgroup is gone, the host
    starts processes)."""
    if os.geteuid() != 0:
        pytest.skip("not root: RLIMIT_NPROC holds, and only the pids cgroup hopline makes as root counts "
                    "the refused forks")
    cgroups = pids_cgroup_root()
    if cgroups is None:
        pytest.skip("no writable pids cgroup here: as root the process ceiling cannot be enforced")
    repo, base, head = make_repo(tmp_path / "repo", {"a.txt": "one\n"}, {"a.txt": "two\n"})
    tools = Workspace(repo, BUDGET.replace(sandbox_max_processes=16), allow_write=True,
                      review=ReviewRange(base, head, sandbox=kind, fix=True))
    try:
        # starts processes until a fork is refused (the shell then exits: "Cannot fork"), 64 at most
        bomb = "i=0; while [ $i -lt 64 ]; do sleep 600 & i=$((i + 1)); done; echo NOT REFUSED"
        outcome = asyncio.run(tools.run("run_command", {"command": bomb}, "c"))
    finally:
        tools.close()
    assert outcome.raw_output["sandbox"] == kind and outcome.raw_output["timedOut"] is False
    refused = outcome.raw_output["refusedProcesses"]
    assert refused > 0 and "NOT REFUSED" not in outcome.output, outcome.output
    assert (f"[the sandbox's process limit refused {refused} new processes "
            "(HOPLINE_SANDBOX_MAX_PROCESSES=16)]") in outcome.output
    assert not [p for p in cgroups.iterdir() if p.name.startswith(f"hopline-sandbox-{os.getpid()}-")]
    assert subprocess.run(["true"], check=False).returncode == 0
    assert "processes by a pids cgroup" in detect_sandbox().detail  # what `hopline gate` says at its start
