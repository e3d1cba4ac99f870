"""git for the gate: revisions, the merge base, the read-only head checkout, the git_diff tool and
the review command policy, on real repositories with real commits."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import sys
from pathlib import Path

import pytest

from hopline.budget import Budget
from hopline.errors import RepoError
from hopline.harness.git import Checkout, check_revision, default_base, resolve_commit, run_git
from hopline.harness.tools import ReviewRange, ToolError, Workspace
from hopline.scripted.sample_pull_request import git

from .conftest import make_repo, worktrees

pytestmark = pytest.mark.e2e  # every test here starts real processes (git, daemons, agents)

BUDGET = Budget.defaults()


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, str, str]:
    return make_repo(tmp_path / "repo", {"src/app.py": "x = 1\n", "README.md": "hi\n"},
                     {"src/app.py": "x = 2\ny = 3\n", "tests/test_app.py": "def test(): pass\n"})


@pytest.mark.parametrize("bad", ["-p", "--output=/tmp/x", "main..feature", "a b", "", "x" * 256, "ma\nin"])
def test_a_revision_that_could_be_an_option_or_a_range_is_refused(bad: str) -> None:
    with pytest.raises(RepoError):
        check_revision(bad, "base")


def test_revisions_resolve_and_the_base_defaults_to_the_merge_base(repo: tuple[Path, str, str]) -> None:
    root, base, head = repo
    assert resolve_commit(root, BUDGET, "HEAD", "head") == head
    assert resolve_commit(root, BUDGET, "HEAD~1", "base") == base
    with pytest.raises(RepoError, match="not a commit"):
        resolve_commit(root, BUDGET, "no-such-branch", "base")
    assert default_base(root, BUDGET, head) == (base, "main")
    git(root, "branch", "--quiet", "--set-upstream-to=main")  # an upstream wins over main
    (root / "extra.txt").write_text("on main\n")
    git(root, "checkout", "--quiet", "main")
    git(root, "add", "--all")
    git(root, "commit", "--quiet", "-m", "main moves on")
    git(root, "checkout", "--quiet", "feature")
    assert default_base(root, BUDGET, head) == (base, "@{upstream}")


def test_the_head_checkout_is_read_only_takes_a_commit_and_is_removed(repo: tuple[Path, str, str],
                                                                      tmp_path: Path) -> None:
    root, _, head = repo
    checkout = Checkout.create(root, tmp_path / "work" / "checkout", head, BUDGET)
    assert worktrees(root)[1:] == [str(checkout.path)]
    for path in (checkout.path, checkout.path / "src", checkout.path / "src" / "app.py"):
        assert not path.stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH), path
    assert checkout.stage_all() == []  # no change, nothing to commit
    checkout.writable()
    (checkout.path / "src" / "app.py").write_text("x = 3\n")
    assert checkout.stage_all() == ["src/app.py"]
    fixed = checkout.commit_staged("the dev agent's fix")
    assert git(root, "rev-parse", f"{fixed}~1") == head  # a detached commit on head
    checkout.read_only()
    checkout.remove()
    assert worktrees(root) == [str(root)] and not checkout.path.exists()
    assert git(root, "cat-file", "-t", fixed) == "commit"  # the fix stays reachable by its id


def test_git_output_is_read_up_to_its_limit_and_the_rest_is_counted(repo: tuple[Path, str, str]) -> None:
    root, _, head = repo
    size = len(git(root, "show", f"{head}:src/app.py")) + 1  # "x = 2\ny = 3\n"
    at_limit = run_git(root, ["show", f"{head}:src/app.py"], timeout=10, max_bytes=size)
    assert (len(at_limit.text), at_limit.truncated_bytes) == (size, 0)
    over = run_git(root, ["show", f"{head}:src/app.py"], timeout=10, max_bytes=size - 1)
    assert (len(over.text), over.truncated_bytes) == (size - 1, 1)


def test_the_gate_s_own_git_output_is_read_whole_up_to_its_ceiling(repo: tuple[Path, str, str]) -> None:
    root, _, head = repo
    exact = BUDGET.replace(gate_git_output_max_bytes=len(head) + 1)  # a commit id and its newline
    assert resolve_commit(root, exact, "HEAD", "head") == head
    over = BUDGET.replace(gate_git_output_max_bytes=len(head))
    with pytest.raises(RepoError, match="git rev-parse printed 41 bytes, over the limit of 40 "
                                        r"\(GATE_GIT_OUTPUT_MAX_BYTES\)"):
        resolve_commit(root, over, "HEAD", "head")


def test_git_diff_shows_the_change_under_review(repo: tuple[Path, str, str]) -> None:
    root, base, head = repo
    tools = Workspace(root, BUDGET, review=ReviewRange(base, head))
    stat_text = tools.git_diff({"stat": True})
    assert stat_text.splitlines() == ["added\tremoved\tpath", "2\t1\tsrc/app.py", "1\t0\ttests/test_app.py"]
    one = tools.git_diff({"path": "src/app.py"})
    assert "+y = 3" in one and "tests/test_app.py" not in one
    whole = tools.git_diff({})
    assert "+y = 3" in whole and "+def test(): pass" in whole
    with pytest.raises(ToolError, match=r"'\.\.' part is refused"):
        tools.git_diff({"path": "../outside"})
    with pytest.raises(ValueError, match="commit id"):
        ReviewRange("--output=/tmp/x", head)
    # outside a gate: the uncommitted changes against HEAD
    (root / "README.md").write_text("hi there\n")
    plain = Workspace(root, BUDGET)
    assert "+hi there" in plain.git_diff({}) and "src/app.py" not in plain.git_diff({})


def test_a_long_diff_is_cut_for_the_model_and_kept_for_read_more(tmp_path: Path) -> None:
    big = "".join(f"line {i}\n" for i in range(20_000))
    root, base, head = make_repo(tmp_path / "big", {"a.txt": "x\n"}, {"a.txt": big})
    budget = BUDGET.replace(tool_result_max_bytes=4096)
    tools = Workspace(root, budget, review=ReviewRange(base, head))
    outcome = asyncio.run(tools.run("git_diff", {"path": "a.txt"}, "call_1"))
    assert len(outcome.model_output.encode()) <= 4096 < len(outcome.output.encode())
    assert "read_file path='@output/" in outcome.model_output
    tools.close()


@pytest.mark.parametrize("kind", ["bwrap", "unshare"])
def test_an_allowed_review_command_runs_homed_in_a_temporary_directory(
        repo: tuple[Path, str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """The checked argv runs (no shell), in either sandbox, with HOME, TMPDIR and caches in its
    private /tmp that goes with the session, none of hopline's settings (not even unshare's setup
    variables), and no cache written into the checkout (bound through when it is under /tmp itself)."""
    root, base, head = repo
    (root / "tests" / "test_env.py").write_text(
        "import json, os\n"
        "def test_env():\n"
        "    names = ('HOME', 'TMPDIR', 'XDG_CACHE_HOME', 'PYTEST_ADDOPTS', 'PYTHONPYCACHEPREFIX')\n"
        "    print('ENV=' + json.dumps({k: os.environ.get(k) for k in names}))\n"
        "    print('HOPLINE=' + ','.join(sorted(k for k in os.environ if k.startswith('HOPLINE_'))))\n")
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("HOPLINE_DATA_DIR", str(tmp_path / "hopline-data"))
    gate = Workspace(root, BUDGET, review=ReviewRange(base, head, sandbox=kind))
    ran = asyncio.run(gate.run("run_command", {"command": "python -m pytest -q -s tests/test_env.py"}, "c1"))
    assert ran.status == "completed" and "1 passed" in ran.output, ran.output
    assert "[exit code 0]" in ran.output
    env = json.loads(next(line for line in ran.output.splitlines() if line.startswith("ENV="))[4:])
    assert ran.meta is not None and ran.meta["hopline.command"]["sandbox"] == kind
    assert ran.meta["hopline.command"]["exitCode"] == 0
    assert (env["HOME"], env["TMPDIR"]) == ("/tmp/home", "/tmp")  # HOME and caches in its private /tmp
    assert env["HOME"] != os.environ.get("HOME")
    assert all(Path(env[k]).is_relative_to(env["TMPDIR"]) for k in ("XDG_CACHE_HOME", "PYTHONPYCACHEPREFIX"))
    assert env["PYTEST_ADDOPTS"] == "-p no:cacheprovider"
    assert "HOPLINE=\n" in ran.output + "\n"  # none of hopline's settings
    assert not (root / ".pytest_cache").exists() and not list(root.rglob("__pycache__"))
    gate.close()


def test_the_review_policy_applies_in_a_gate_session_only(repo: tuple[Path, str, str]) -> None:
    root, base, head = repo
    gate = Workspace(root, BUDGET, review=ReviewRange(base, head))
    refused = asyncio.run(gate.run("run_command", {"command": "touch made"}, "c1"))
    assert refused.status == "failed" and "tests and linters only" in refused.output
    assert not (root / "made").exists()
    plain = Workspace(root, BUDGET)
    ran = asyncio.run(plain.run("run_command", {"command": "touch made"}, "c2"))
    assert ran.status == "completed" and (root / "made").exists()
    os.remove(root / "made")


def test_a_session_new_review_meta_is_two_commit_ids() -> None:
    from acp import RequestError

    from hopline.harness.acp.requests import review_of

    good = {"base": "a" * 40, "head": "b" * 7}
    assert review_of(good) == good
    full = {**good, "testCommand": ["python", "-m", "pytest"], "sandbox": "bwrap"}
    assert review_of(full) == full
    for bad in ({"base": "a" * 40}, {"base": "main", "head": "b" * 40},
                {"base": "--output=x", "head": "b" * 40}, {"base": "a" * 40, "head": "b" * 40, "extra": 1},
                ["a", "b"], {"base": 1, "head": 2}):
        with pytest.raises(RequestError):
            review_of(bad)
