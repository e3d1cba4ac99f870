"""detect-secrets' results kept per file for a gate run's later rounds (harness/tools/secrets_cache):
a scan runs only over the files whose path and bytes the run has not scanned, and its report is
the one a scan over all of them prints."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from hopline.budget import Budget
from hopline.harness.tools import ReviewRange, Workspace

from .conftest import make_repo

BUDGET = Budget.defaults()
HEAD = {"a.txt": 'password = "correct-horse-battery-staple"\n', "b.txt": 'AWS = "AKIAIOSFODNN7EXAMPLE"\n',
        "c.txt": "nothing to see\n"}


def _scan(repo: Path, base: str, head: str, cache: Path | None,
          files: str) -> tuple[dict[str, Any], list[str]]:
    """A new session's scan: the report's results, and the files the command that ran named."""
    tools = Workspace(repo, BUDGET, review=ReviewRange(base, head, cache=str(cache) if cache else None))
    try:
        outcome = asyncio.run(tools.run("run_command", {"command": f"python -m detect_secrets scan {files}"},
                                        "c"))
    finally:
        tools.close()
    assert outcome.meta is not None and outcome.meta["hopline.command"]["exitCode"] == 0, outcome.output
    argv = outcome.meta["hopline.command"]["argv"] or []  # None: no command ran
    text = outcome.output.rsplit("\n[exit code", 1)[0]
    return json.loads(text)["results"], argv[argv.index("scan") + 1:] if argv else []


def test_a_file_scanned_before_with_the_same_bytes_is_not_scanned_again(tmp_path: Path) -> None:
    repo, base, head = make_repo(tmp_path / "repo", {"a.txt": "one\n"}, HEAD)
    cache = tmp_path / "secrets"
    cache.mkdir()
    first, ran = _scan(repo, base, head, cache, "a.txt b.txt")
    assert ran == ["a.txt", "b.txt"] and set(first) == {"a.txt", "b.txt"}
    whole, ran = _scan(repo, base, head, None, "a.txt b.txt c.txt")  # no cache: every file
    assert ran == ["a.txt", "b.txt", "c.txt"]
    kept, ran = _scan(repo, base, head, cache, "a.txt b.txt c.txt")
    assert ran == ["c.txt"] and kept == whole  # the report a scan over all three prints
    (repo / "b.txt").write_text("AWS = None\n")  # new bytes: scanned again, its finding gone
    again, ran = _scan(repo, base, head, cache, "a.txt b.txt c.txt")
    assert ran == ["b.txt"] and set(again) == {"a.txt"} and again["a.txt"] == whole["a.txt"]
    every, ran = _scan(repo, base, head, cache, "a.txt c.txt")  # every file kept: nothing runs
    assert ran == [] and every == {"a.txt": whole["a.txt"]}
    assert len(list(cache.glob("*.json"))) == 5  # the report's header and one per (path, bytes)


def test_a_symlink_or_an_option_runs_the_scan_as_asked(tmp_path: Path) -> None:
    repo, base, head = make_repo(tmp_path / "repo", {"a.txt": "one\n"}, HEAD)
    cache = tmp_path / "secrets"
    cache.mkdir()
    os.symlink("a.txt", repo / "link.txt")
    for files in ("a.txt link.txt", "a.txt link.txt", "--slim a.txt"):
        _, ran = _scan(repo, base, head, cache, files)
        assert ran == files.split()
    assert not list(cache.glob("*.json"))
