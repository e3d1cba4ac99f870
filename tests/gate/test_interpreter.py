"""Which interpreter runs a gate's tests (gate/interpreter): --python, the base's .hopline/gate.toml,
the repository's own .venv/ (not one the pull request tracks), else hopline's; and the ones refused,
each with the setting to change. Real git repositories, real virtual environments, the real sandbox."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hopline.budget import Budget
from hopline.gate import interpreter, testcmd
from hopline.harness.sandbox import detect_sandbox
from hopline.harness.sandbox_mounts import drops_user
from hopline.scripted.sample_pull_request import git

from .conftest import make_repo

BUDGET = Budget.defaults()


def venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    return path / "bin" / "python"


def test_the_interpreter_is_given_configured_found_or_hopline_s(tmp_path: Path) -> None:
    config = {".hopline/gate.toml": '[gate]\npython = "env/bin/python"\n'}
    repo, base, _ = make_repo(tmp_path / "repo", config, {"a.py": "A = 1\n"})
    python = venv(repo / "env")
    given = interpreter.choose(str(python), repo, base, BUDGET, tmp_path / "data")
    assert (given.path, given.source) == (str(python), "given")
    configured = interpreter.choose(None, repo, base, BUDGET, tmp_path / "data")
    assert (configured.path, configured.source) == (str(python), ".hopline/gate.toml")

    plain, plain_base, _ = make_repo(tmp_path / "plain", {"a.py": "A = 1\n"}, {"a.py": "A = 2\n"})
    assert interpreter.choose(None, plain, plain_base, BUDGET) == interpreter.HOPLINE_OWN
    found = venv(plain / ".venv")
    chosen = interpreter.choose(None, plain, plain_base, BUDGET)
    assert (chosen.path, chosen.source) == (str(found), ".venv")
    git(plain, "add", "--force", ".venv/pyvenv.cfg")  # the pull request's own .venv: never taken by itself
    assert interpreter.choose(None, plain, plain_base, BUDGET) == interpreter.HOPLINE_OWN


def test_an_interpreter_that_would_bring_in_what_the_sandbox_must_not_see_is_refused(tmp_path: Path) -> None:
    repo, base, _ = make_repo(tmp_path / "repo", {"a.py": "A = 1\n"}, {"a.py": "A = 2\n"})
    (tmp_path / "bin").mkdir()
    python = tmp_path / "bin" / "python3"  # its installation would be tmp_path, which holds the data dir
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    with pytest.raises(testcmd.TestCommandError, match="would bind the daemon's data directory into the "):
        interpreter.choose(str(python), repo, base, BUDGET, tmp_path / "data")
    with pytest.raises(testcmd.TestCommandError, match=r"is not an executable file \(--python\)"):
        interpreter.choose(str(tmp_path / "nothing"), repo, base, BUDGET)
    bad = make_repo(tmp_path / "bad", {".hopline/gate.toml": '[gate]\npython = ""\n'}, {"a.py": "A = 2\n"})
    with pytest.raises(testcmd.TestCommandError, match=r"\[gate\] python must be a path"):
        interpreter.choose(None, bad[0], bad[1], BUDGET)


def test_an_interpreter_nobody_cannot_run_is_a_clear_error(tmp_path: Path) -> None:
    kind = detect_sandbox().kind
    if kind == "none" or not drops_user():
        pytest.skip("needs a sandbox, as root")
    python = venv(tmp_path / "closed")
    found = interpreter.Interpreter(str(python), "given", "--python")
    interpreter.check_runs(found, kind, str(python))  # readable by others: it starts
    os.chmod(tmp_path / "closed", 0o700)  # root's alone now
    with pytest.raises(testcmd.TestCommandError) as refused:
        interpreter.check_runs(found, kind, str(python))
    said = str(refused.value)
    assert "does not start in the sandbox as nobody (uid 65534)" in said
    assert "chmod o+rx" in said and said.endswith("--python")
