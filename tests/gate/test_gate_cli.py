"""`hopline gate` and `hopline status` on the command line, and a daemon that starts after one died
mid-run: its left-over checkout is removed."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from daemon.support import Daemon, running_daemon
from hopline.budget import Budget
from hopline.client import DaemonClient
from hopline.gate.run import CHECKOUT_DIR, RUN_FILE
from hopline.harness.git import Checkout
from hopline.scripted.sample_pull_request import make_sample_pull_request

from .conftest import follow, make_repo, validate_sarif, worktrees

pytestmark = pytest.mark.e2e  # every test here starts real processes (git, daemons, agents)

HOPLINE = [sys.executable, "-m", "hopline"]


def cli(args: list[str], cwd: Path, token: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    if token is not None:
        env["HOPLINE_SERVER_TOKEN"] = token
    return subprocess.run([*HOPLINE, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=240)


def test_hopline_gate_on_the_embedded_stack_with_every_default(tmp_path: Path) -> None:
    repo, _, _ = make_repo(tmp_path / "repo",
                           {"pyproject.toml": '[tool.pytest.ini_options]\npythonpath = ["src"]\n',
                            "src/m.py": "A = 1\n", "tests/test_m.py": "def test(): pass\n"},
                           {"src/m.py": "A = 2\n",
                            "tests/test_m.py": "import m\n\n\ndef test(): assert m.A == 2\n"})
    done = cli(["gate"], cwd=repo)  # --repo: here; --base: the merge base with main; --head: HEAD
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # no terminal: plain lines, one per gate, then the run's line (the table is for a terminal)
    for text in ("sandbox: ", "qa_automation: pass, 0 findings", "appsec: pass, 0 findings", " 0 413s",
                 "1 round(s), exit 0"):
        assert text in done.stdout
    assert worktrees(repo) == [str(repo)]


def test_hopline_gate_json_and_sarif_against_a_daemon(hopline_gate_daemon: Daemon, tmp_path: Path) -> None:
    repo, base, head = make_sample_pull_request(tmp_path / "pr", log_bytes=4096, logs=1, failing_log=True)
    sarif = tmp_path / "out" / "gate.sarif"
    sarif.parent.mkdir()
    done = cli(["gate", "--url", hopline_gate_daemon.url, "--json", "--sarif", str(sarif),
                "--repo", str(repo), "--base", "main", "--head", "feature"], cwd=tmp_path,
               token=hopline_gate_daemon.token)
    assert done.returncode == 1, done.stderr[-3000:]  # gates failed
    result = json.loads(done.stdout)
    assert (result["base"], result["head"]) == (base, head)
    assert sorted(a["verdict"] for a in result["agents"]) == ["fail"] * 4
    document = json.loads(sarif.read_text())
    validate_sarif(document)
    assert sum(len(run["results"]) for run in document["runs"]) == sum(len(a["findings"])
                                                                       for a in result["agents"])
    assert str(repo) not in sarif.read_text()  # locations are relative to the repository's root


def test_a_failed_summarizer_reaches_the_gate_and_demo_summaries_and_json(tmp_path: Path) -> None:
    """#15 item 4 through the gate: a provider that refuses every summarization request (400) makes
    each compaction fall back to the extractive summary; the gate's per-agent report, `hopline gate
    --json`, its summary table and the demo's summary all say so, with origin and status."""
    from rich.console import Console

    from hopline.cli.demo import build_summary, print_summary
    from hopline.cli.gate import print_result
    from hopline.scripted.model import ScriptedModel
    from strict_openai import StrictOpenAI

    repo, _, _ = make_sample_pull_request(tmp_path / "large", logs=2)
    model = ScriptedModel(seed=0, tools_per_iteration=3, iterations=12)
    with StrictOpenAI(model) as server:
        server.refuse_summaries = True
        env = {"HOPLINE_PROVIDER": "openai", "OPENAI_BASE_URL": server.base_url,
               "OPENAI_API_KEY": "sk-strict", "HOPLINE_MODEL": "strict-model"}
        with running_daemon(tmp_path, agent_cmd=None, env=env) as daemon:
            done = cli(["gate", "--url", daemon.url, "--json", "--agent", "qa_automation", "--repo",
                        str(repo), "--base", "main", "--head", "feature"], cwd=tmp_path, token=daemon.token)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    result = json.loads(done.stdout)
    [agent] = result["agents"]
    assert agent["compactions"] >= 1 and server.rejections  # the summaries were asked for, and refused
    assert agent["summarizers"] == {"extractive": agent["compactions"]}
    assert agent["summarizerErrors"] == [{"origin": "code", "status": 400, "hop": "gateway.provider"}] * (
        agent["compactions"])
    console = Console(record=True, width=200, force_terminal=True)  # the table (off a TTY: plain lines)
    print_result(console, result)
    assert f"{agent['compactions']} (summarizer extractive x{agent['compactions']} (origin code HTTP 400))" \
        in console.export_text()
    summary = build_summary(naive=False, result=result, status={}, statuses={}, budget=Budget.defaults(),
                            elapsed=1.0)
    assert summary["compactions"]["summarizerErrors"] == agent["summarizerErrors"]
    assert summary["gates"][0]["summarizerErrors"] == agent["summarizerErrors"]
    demo = Console(record=True, width=200)
    print_summary(demo, summary)
    assert "summarizer extractive x" in demo.export_text().split("every hop's budget", 1)[1]


def test_hopline_status_shows_gate_runs_and_the_dev_state(hopline_gate_daemon: Daemon,
                                                          tmp_path: Path) -> None:
    daemon = hopline_gate_daemon
    repo, base, head = make_repo(tmp_path / "repo", {"a.py": "A = 1\n"}, {"a.py": "A = 2\n"})

    async def go() -> str:
        async with DaemonClient(daemon.url, daemon.token) as client:
            dev = await client.create_session(cwd=str(repo), profile="dev")
            gate_id = await client.start_gate(str(repo), base=base, head=head, dev_session_id=dev,
                                              agents=["qa_strategy"])
        await follow(daemon, gate_id)
        return gate_id

    gate_id = asyncio.run(go())
    shown = cli(["status", "--url", daemon.url], cwd=tmp_path, token=daemon.token)
    assert shown.returncode == 0, shown.stderr
    assert "devState" in shown.stdout and "gate runs" in shown.stdout and gate_id in shown.stdout
    status = json.loads(cli(["status", "--url", daemon.url, "--json"], cwd=tmp_path,
                            token=daemon.token).stdout)
    run = next(g for g in status["gates"] if g["gateId"] == gate_id)
    # a.py changes and no test does; with no test command coverage cannot tell: a warning, saying why
    assert run["devState"] == "idle" and run["verdicts"] == {"qa_strategy": "pass"}
    assert [s["devState"] for s in status["sessions"] if s["sessionId"] == run["devSessionId"]] == ["idle"]
    # the tables tie the gate run's dev state to its session: a short id prefix in both (never the cwd)
    prefix = run["devSessionId"][:8] + "…"
    session_rows = [line for line in shown.stdout.splitlines() if prefix in line]
    assert len(session_rows) == 2 and all("idle" in line for line in session_rows), shown.stdout
    assert run["devSessionId"] not in shown.stdout and str(repo) not in shown.stdout


def test_a_daemon_removes_the_checkout_a_dead_daemon_left(tmp_path: Path) -> None:
    repo, _, head = make_repo(tmp_path / "repo", {"a.py": "A = 1\n"}, {"a.py": "A = 2\n"})
    data = tmp_path / "data"
    run_dir = data / "gate" / "g_0123456789abcdef01234567"
    Checkout.create(repo, run_dir / CHECKOUT_DIR, head, Budget.defaults())
    (run_dir / RUN_FILE).write_text(json.dumps({"repo": str(repo)}))
    assert len(worktrees(repo)) == 2
    with running_daemon(tmp_path, data_dir=data, agent_cmd=None) as daemon:
        assert worktrees(repo) == [str(repo)] and not run_dir.exists()
        assert "left-over gate checkouts removed" in daemon.log_text()
