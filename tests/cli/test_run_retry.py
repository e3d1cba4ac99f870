"""`hopline run --url` through a connection that loses the prompt's answer (SPEC T-12): the CLI sends
its writes through the SDK, with an Idempotency-Key, and retries the lost one: the turn runs once.

A real daemon (the tests' ACP agent, which writes every prompt it gets to a file) behind a TCP proxy
that forwards the prompt whole and closes the CLI's socket at the first byte of its answer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from daemon.support import running_daemon
from lossy_proxy import AnswerDroppingProxy

from .conftest import run_cli

pytestmark = pytest.mark.e2e


def test_run_retries_a_prompt_whose_answer_was_lost_and_it_runs_once(tmp_path: Path) -> None:
    log = tmp_path / "prompts.log"
    env = {"HOPLINE_AGENT_ENV": "BIG_AGENT_PROMPT_LOG", "BIG_AGENT_PROMPT_LOG": str(log),
           "HOPLINE_WARM_CHILDREN": "0"}
    with running_daemon(tmp_path, env=env) as daemon, \
            AnswerDroppingProxy(int(daemon.url.rsplit(":", 1)[1])) as proxy:
        proxy.arm(rb"^POST /session/\w+/prompt HTTP")
        result = run_cli(["run", "hello once", "--json", "--url", proxy.url], cwd=tmp_path,
                         env={"HOPLINE_SERVER_TOKEN": daemon.token})
        assert result.returncode == 0, result.stderr[-2000:]
        sent = [line for line in proxy.requests if line.endswith(b"/prompt")]
        assert proxy.dropped == 1 and len(sent) == 2  # the lost send and its retry
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert lines[-1]["type"] == "final" and lines[-1]["stopReason"] == "end_turn"
    assert [e["type"] for e in lines[:-1]].count("turn_complete") == 1
    assert log.read_text().splitlines() == ["hello once"]
