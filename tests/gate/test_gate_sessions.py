"""A gate run over a third-party gate agent (the SDK test agent, tests/gate/agents/gate_agent.py)
behind a real `hopline serve`: a verdict longer than the sidecar threshold, sent in one chunk, is
read whole (not from its preview); ``HOPLINE_GATE_CONCURRENCY`` bounds the gate sessions at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.support import running_daemon

from .conftest import gate_agent_cmd, make_repo, run_gate

pytestmark = pytest.mark.e2e  # every test here starts real processes (git, daemons, agents)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root, _, _ = make_repo(tmp_path / "repo", {"a.py": "x = 1\n"}, {"a.py": "x = 2\n"})
    return root


def test_a_verdict_over_the_sidecar_threshold_is_read_whole(tmp_path: Path, repo: Path) -> None:
    size = 100_000  # one agent_message_chunk of ~100 KB: over the 64 KiB sidecar threshold
    with running_daemon(tmp_path, agent_cmd=gate_agent_cmd(big="appsec", big_bytes=size)) as daemon:
        result, _ = run_gate(daemon, repo, agents=["appsec"])
    [agent] = result["agents"]
    assert agent["sidecars"] >= 1 and agent["sidecarBytes"] > 64 * 1024  # the answer went to a sidecar
    # the whole answer parsed (its preview holds no JSON object): a pass, its summary cut at the ceiling
    assert (agent["verdict"], agent["attempt"], agent["verdictAsks"]) == ("pass", 1, 1), agent
    assert len(agent["summary"]) == 2000 and agent["summary"].endswith(f"({size} characters in all)")


@pytest.mark.parametrize("slots", [1, 2])
def test_at_most_gate_concurrency_gate_sessions_run_at_once(tmp_path: Path, repo: Path, slots: int) -> None:
    """Each test agent marks its prompt's start and end in one shared file (in the order they
    happen) and holds until ``slots`` prompts run at once: the file's running count never passes the
    setting, and reaches it."""
    running = tmp_path / "running.log"
    running.touch()
    env = {"HOPLINE_GATE_CONCURRENCY": str(slots), "GATE_AGENT_RUNNING": str(running)}
    with running_daemon(tmp_path, agent_cmd=gate_agent_cmd(hold_until=slots, slow=0.3), env=env,
                        args=("--agent-env", "GATE_AGENT_RUNNING")) as daemon:
        result, events = run_gate(daemon, repo)
    assert [a["verdict"] for a in result["agents"]] == ["pass"] * 4
    marks = running.read_text().split()
    assert marks.count("+") == marks.count("-") == 4
    level = peak = 0
    for mark in marks:
        level += 1 if mark == "+" else -1
        peak = max(peak, level)
    assert peak == slots
    queued = {e.data["agent"] for e in events if e.type == "gate_item" and e.data["item"] == "gate_queued"}
    assert len(queued) == 4  # every gate waited for a slot first
