"""Fixtures for the gate tests: real git repositories with real commits (made here, in tmp_path), real
`hopline serve` daemons on 127.0.0.1 (hopline's agent, or a test agent on the ACP SDK), and a reader
that follows a gate run's event stream to its end."""

from __future__ import annotations

import asyncio
import json
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from client.shapes import assert_shape
from daemon.support import Daemon, running_daemon
from hopline.client import DaemonClient, GateRun, GateSummary
from hopline.scripted.sample_pull_request import git

GATE_AGENT = Path(__file__).parent / "agents" / "gate_agent.py"
SARIF_SCHEMA = Path(__file__).parent / "sarif" / "sarif-schema-2.1.0.json"


def gate_agent_cmd(**modes: str | int | float) -> str:
    """The test agent's command: ``hang="appsec"``, ``garbage="qa_automation,..."``, ``invalid=...``,
    ``big="appsec", big_bytes=100_000``, ``hold_until=2, slow=0.2``."""
    args = [sys.executable, str(GATE_AGENT)]
    for mode, value in modes.items():
        args += [f"--{mode.replace('_', '-')}", str(value)]
    return shlex.join(args)


def make_repo(root: Path, base_files: dict[str, str],
              head_files: dict[str, str | None]) -> tuple[Path, str, str]:
    """A repository with ``main`` = ``base_files`` and a branch ``feature`` (checked out) whose one
    commit writes ``head_files`` (None deletes a file): ``(root, base, head)``."""
    root.mkdir(parents=True, exist_ok=True)
    git(root, "init", "--quiet", "--initial-branch=main")
    for path, text in base_files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    git(root, "add", "--all")
    git(root, "commit", "--quiet", "-m", "base")
    base = git(root, "rev-parse", "HEAD")
    git(root, "checkout", "--quiet", "-b", "feature")
    for path, text in head_files.items():
        if text is None:
            (root / path).unlink()
            continue
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    git(root, "add", "--all")
    git(root, "commit", "--quiet", "-m", "head")
    return root, base, git(root, "rev-parse", "HEAD")


def worktrees(repo: Path) -> list[str]:
    """The worktrees git knows for ``repo`` (its own first)."""
    return [line.split(" ", 1)[1] for line in git(repo, "worktree", "list", "--porcelain").splitlines()
            if line.startswith("worktree ")]


def validate_sarif(document: dict[str, Any]) -> None:
    """Raises unless ``document`` is valid against the vendored SARIF 2.1.0 schema (draft-04)."""
    schema = json.loads(SARIF_SCHEMA.read_text())
    jsonschema.Draft4Validator.check_schema(schema)
    jsonschema.Draft4Validator(schema).validate(document)


async def follow(daemon: Daemon, gate_id: str) -> tuple[dict[str, Any], list[Any]]:
    """Every event of a run up to ``gate_complete``, and the run's result."""
    events: list[Any] = []
    async with DaemonClient(daemon.url, daemon.token) as client:
        stream = client.gate_events(gate_id)
        try:
            async for event in stream:
                events.append(event)
                if event.type == "gate_complete":
                    break
        finally:
            await stream.aclose()
        result = await client.gate(gate_id)
        assert_shape(result, GateRun)  # every run a test follows holds the SDK's typed answer
        for summary in await client.gates():
            assert_shape(summary, GateSummary)
        return dict(result), events


def run_gate(daemon: Daemon, repo: Path, **options: Any) -> tuple[dict[str, Any], list[Any]]:
    """Start a run (``POST /gate`` through the SDK) and follow it to its end."""
    async def go() -> tuple[dict[str, Any], list[Any]]:
        async with DaemonClient(daemon.url, daemon.token) as client:
            gate_id = await client.start_gate(str(repo), **options)
        return await follow(daemon, gate_id)

    return asyncio.run(go())


def items_of(events: list[Any], agent: str) -> list[str]:
    """The item types one agent went through, in order (repeats of a type folded)."""
    out: list[str] = []
    for event in events:
        if (event.type == "gate_item" and event.data.get("agent") == agent
                and (not out or out[-1] != event.data["item"])):
            out.append(event.data["item"])
    return out


@pytest.fixture(scope="module")
def hopline_gate_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """`hopline serve` with hopline's own agent and the offline scripted model."""
    with running_daemon(tmp_path_factory.mktemp("gate-daemon"), agent_cmd=None) as daemon:
        yield daemon
