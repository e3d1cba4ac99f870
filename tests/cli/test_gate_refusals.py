"""`hopline gate` refuses a repository it cannot review before any stack starts (exit 2, one line
naming what is wrong and the directory), with the rules the daemon answers a 422 by."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from .conftest import run_cli

pytestmark = pytest.mark.e2e  # every test here starts real processes (the CLI, git)


def refused(args: list[str], cwd: Path | None = None) -> str:
    result = run_cli(["gate", *args], cwd=cwd, env={"HOPLINE_URL": ""})
    assert result.returncode == 2, result.stdout + result.stderr
    output = result.stdout + result.stderr
    assert "starting the embedded stack" not in output and "422" not in output
    return result.stderr


def test_a_missing_directory_is_refused_before_any_stack_starts(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    assert refused(["--repo", str(missing)]) == (
        f"hopline gate: repo must be an absolute path to an existing directory (--repo {missing})\n")


def test_a_directory_outside_git_is_refused_before_any_stack_starts(tmp_path: Path) -> None:
    assert refused(["--repo", str(tmp_path)]) == (
        f"hopline gate: repo is not inside a git work tree (--repo {tmp_path})\n")


def test_a_bad_revision_is_refused_before_any_stack_starts(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    for command in (["init", "-q", "-b", "main"], ["-c", "user.name=t", "-c", "user.email=t@t",
                                                   "commit", "-q", "--allow-empty", "-m", "one"]):
        subprocess.run(["git", *command], cwd=repo, check=True, capture_output=True)
    assert "head 'no-such-branch' is not a commit of this repository" in refused(
        ["--repo", str(repo), "--head", "no-such-branch"])
    assert "base 'v9' is not a commit of this repository" in refused(["--base", "v9"], cwd=repo)
