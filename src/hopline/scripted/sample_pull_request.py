"""A sample pull request for ``hopline demo`` and the tests: a git repository whose ``main`` is the
sample project and whose branch ``feature`` adds one commit with a change worth reviewing.

The change adds large test logs (all tests pass; their diff makes the gates' tool outputs large, as a
legitimate PR's often are) and one planted issue per gate agent's domain but the QA automation
gate's: ``eval(`` (performance and security, by ruff's S307), an AWS key id and a password
(application security, by detect-secrets), a shell command built from input that only an analyzer
finds (application security, by ruff's S602: no rule of hopline's own matches it), a new module with
no test and a TODO (strategy). Its tests are the standard library's unittest (the gate detects
``python -m unittest discover``), so they run with what a plain install of hopline has.
``failing_log`` adds a failing test to a log too (QA automation). Deterministic for a given seed.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from hopline.scripted.sample_workspace import DEFAULT_FILE_BYTES, make_sample_workspace, write_test_logs

BRANCH = "feature"
_IDENTITY = {"GIT_AUTHOR_NAME": "hopline sample", "GIT_AUTHOR_EMAIL": "sample@hopline.invalid",
             "GIT_COMMITTER_NAME": "hopline sample", "GIT_COMMITTER_EMAIL": "sample@hopline.invalid",
             "GIT_AUTHOR_DATE": "2026-08-19T10:00:00Z", "GIT_COMMITTER_DATE": "2026-08-19T10:00:00Z"}

CACHE_MODULE = '''"""A cache in front of the sample service's parser."""

import subprocess

_CACHE: dict[str, object] = {}


def parse(text: str) -> object:
    """The cached value of ``text``."""
    # TODO: evict old entries once the cache is large
    result: object = _CACHE.get(text, text)
    result = eval(text)  # quick parse of the literal
    subprocess.run(f"logger -t sample-cache parsed {text}", shell=True)
    _CACHE[text] = result
    return result
'''
SETTINGS_MODULE = '''"""Settings of the sample service."""

AWS_ACCESS_KEY_ID = "AKIAIOSFODNN7EXAMPLE"
password = "correct-horse-battery-staple"
TIMEOUT_SECONDS = 30
'''

PYPROJECT = '''[project]
name = "sample"
version = "0.1.0"
'''


def git(repo: Path, *args: str) -> str:
    """Run git in ``repo`` with a fixed identity and dates (the sample's commits are reproducible)."""
    env = {**os.environ, **_IDENTITY, "GIT_CONFIG_NOSYSTEM": "1", "HOME": str(repo)}
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True,
                          text=True).stdout.strip()


def make_sample_pull_request(root: Path, *, log_bytes: int = DEFAULT_FILE_BYTES, logs: int = 4,
                             seed: int = 0, failing_log: bool = False) -> tuple[Path, str, str]:
    """The repository under ``root`` (created), checked out on ``feature``: ``(root, base, head)``."""
    root.mkdir(parents=True, exist_ok=True)
    make_sample_workspace(root, seed=seed, logs=0)
    (root / "pyproject.toml").write_text(PYPROJECT)  # its tests are unittest's: they run with any Python
    git(root, "init", "--quiet", "--initial-branch=main")
    git(root, "add", "--all")
    git(root, "commit", "--quiet", "-m", "the sample service")
    base = git(root, "rev-parse", "HEAD")
    git(root, "checkout", "--quiet", "-b", BRANCH)
    (root / "src" / "sample" / "cache.py").write_text(CACHE_MODULE)
    (root / "src" / "sample" / "settings.py").write_text(SETTINGS_MODULE)
    write_test_logs(root / "logs", count=logs, file_bytes=log_bytes, seed=seed,
                    failure_rate=0.02 if failing_log else 0.0)
    git(root, "add", "--all")
    git(root, "commit", "--quiet", "-m", "cache the parser; settings; test logs")
    return root, base, git(root, "rev-parse", "HEAD")
