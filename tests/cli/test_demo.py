"""`hopline demo`: a gate run that ends clean (every gate passes after the dev agent's fix, 0 413s,
compactions, sidecars), and the naive run that reproduces the original incident's 413 (K-5) with the
dev session kept awaiting_gate."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from hopline.cli.demo import (
    DEMO_EXPLORE_ITERATIONS,
    DEMO_TOOLS_PER_ITERATION,
    gateway_statuses,
    print_summary,
    stack_env,
)
from hopline.scripted.model import ScriptedModel
from strict_openai import StrictOpenAI

from .conftest import run_cli

METRICS = """# HELP hopline_gateway_requests_total Gateway requests by response status
# TYPE hopline_gateway_requests_total counter
hopline_gateway_requests_total{status="200"} 73.0
hopline_gateway_requests_total{status="413"} 2.0
"""
FIXED = [("idle", "awaiting_gate"), ("awaiting_gate", "working"), ("working", "awaiting_gate"),
         ("awaiting_gate", "idle")]


def test_the_demo_stack_runs_its_four_gates_at_once_unless_the_caller_says(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HOPLINE_GATE_CONCURRENCY", raising=False)
    assert stack_env(False) == {"HOPLINE_GATE_CONCURRENCY": "4"}
    naive = stack_env(True)
    assert naive["HOPLINE_GATE_CONCURRENCY"] == "4" and naive["API_JSON_BODY_LIMIT"] == "100kb"
    monkeypatch.setenv("HOPLINE_GATE_CONCURRENCY", "1")  # the caller's setting holds
    assert "HOPLINE_GATE_CONCURRENCY" not in stack_env(False)


def test_gateway_statuses_read_from_prometheus_text() -> None:
    assert gateway_statuses(METRICS) == {"200": 73, "413": 2}
    assert gateway_statuses("") == {}


@pytest.mark.e2e
def test_demo_gate_run_passes_after_the_fix_with_no_413_and_compacts() -> None:
    result = run_cli(["demo", "--json"], timeout=600)  # a deadline: the analyzers add to a loaded machine
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    assert (summary["mode"], summary["state"], summary["exitCode"]) == ("gate", "done", 0)
    assert summary["roundsRun"] == 2
    first = {g["agent"]: g["verdict"] for g in summary["gates"] if g["round"] == 1}
    assert first == {"qa_automation": "pass", "qa_performance_security": "fail", "qa_strategy": "fail",
                     "appsec": "fail"}
    assert set(summary["verdicts"].values()) == {"pass"}
    # qa_automation really ran the sample's tests (unittest's: they run from a plain install), in the
    # sandbox, in both rounds; the fix was verified; qa_strategy measured the change's coverage
    assert summary["sandbox"]["kind"] in ("bwrap", "unshare")
    assert summary["testCommand"]["source"] == "unittest"
    assert [r["round"] for r in summary["testRuns"]] == [1, 2]
    assert all("ran `python -m unittest discover -v" in r["summary"] and "Ran " in r["summary"]
               for r in summary["testRuns"])
    strategy = [g for g in summary["gate"]["history"][0]["agents"] if g["agent"] == "qa_strategy"]
    assert {f["rule"] for f in strategy[0]["findings"]} == {"untested-change", "todo-added"}
    assert all(f["line"] for f in strategy[0]["findings"])  # untested lines, by coverage
    [fix] = summary["devTurns"]
    assert fix["commit"] and fix["verification"]["ok"] and fix["verification"]["headTests"]["exitCode"] == 0
    assert [(c["previous"], c["state"]) for c in summary["devStates"]] == FIXED
    assert summary["devStayedAwaiting"]
    assert summary["gateway413s"] == 0 and summary["turnError"] is None
    assert summary["gatewayResponses"].get("200", 0) >= summary["iterations"]
    assert summary["compactions"]["count"] >= 8  # every gate compacted, in both rounds
    for gate in summary["gates"]:
        assert gate["http413s"] == 0 and gate["compactions"] >= 1
        assert gate["iterations"] > DEMO_EXPLORE_ITERATIONS
        assert 0 < gate["maxBodyBytes"] <= gate["ceilingBytes"]
    assert 0 < summary["largestBodyBytes"] <= summary["engineCeilingBytes"] <= summary["gatewayLimitBytes"]
    # Large tool outputs went to sidecars, so no pipe frame reached the large-frame threshold.
    assert summary["sidecars"]["bytesKeptOffWire"] > 0 and summary["sidecars"]["seenInEvents"] > 0
    assert 0 < summary["largestPipeFrame"]["bytes"] < 256 * 1024
    assert summary["largeFrames"]["logged"] == 0
    # The sample carries a defect only an analyzer finds (a shell command built from input: ruff's S602),
    # and the summary names the analyzers that ran, with the gates they ran for
    first_round = [f for a in summary["gate"]["history"][0]["agents"] for f in a["findings"]]
    shell = [f for f in first_round if f["file"] == "src/sample/cache.py" and f["rule"] == "ruff/S602"]
    assert len(shell) == 1 and shell[0]["severity"] == "error"
    assert {f["rule"] for f in first_round if f["line"] == shell[0]["line"]} == {"ruff/S602"}
    analyzers = summary["analyzers"]
    assert analyzers["ruff"]["status"] == analyzers["detect-secrets"]["status"] == "ran"
    assert analyzers["ruff"]["agents"] == ["qa_performance_security", "appsec"]

    console = Console(record=True, width=140, force_terminal=True)  # the tables
    print_summary(console, summary)
    table = console.export_text()
    for label in ("hopline gate —", "compactions", "largest llm-turn body", "engine ceiling",
                  "gateway limit", "largest pipe frame", "large-frame records", "kept off the wire", "413s",
                  "idle → awaiting_gate → working → awaiting_gate → idle", "round 1 (head ",
                  "ruff (qa_performance_security, appsec: ", "detect-secrets (appsec: "):
        assert label in table


@pytest.mark.e2e
def test_demo_naive_reproduces_the_413_and_the_dev_session_stays_awaiting_gate() -> None:
    result = run_cli(["demo", "--naive", "--json"], timeout=180)
    assert result.returncode == 1, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    assert summary["mode"] == "naive"
    assert summary["gateway413s"] >= 4  # every gate, on every attempt
    error = summary["turnError"]
    assert (error["origin"], error["status"], error["hop"]) == ("code", 413, "gateway.llm_turn")
    assert error["limit"] == 100 * 1024 < error["observed"]
    # The incident: the content-only estimate never asked for a compaction before the 413.
    assert summary["compactions"]["count"] == 0
    assert set(summary["verdicts"].values()) == {"error"}  # a dead gate is an error, never a pass
    assert all(g["attempt"] == 2 for g in summary["gates"])  # each was retried once
    # K-2: the dev session waited in awaiting_gate until every gate had ended, then moved on
    assert [(c["previous"], c["state"]) for c in summary["devStates"]] == [
        ("idle", "awaiting_gate"), ("awaiting_gate", "idle")]
    assert summary["devStayedAwaiting"] and summary["exitCode"] == 2
    console = Console(record=True, width=200, force_terminal=True)  # the tables
    print_summary(console, summary)
    shown = console.export_text()  # each gate's body against the limit that refused it, not 8 MiB
    assert shown.count("/ 100 KiB (gateway.llm_turn refused it)") >= 4 and "/ 8 MiB" not in shown


@pytest.mark.e2e
def test_demo_runs_whole_through_a_strict_openai_compatible_provider() -> None:
    # The provider refuses any field outside the chat-completions schema (400), like the real APIs;
    # our hints never reach it, so it is told the demo's plan by its own settings.
    model = ScriptedModel(seed=0, tools_per_iteration=DEMO_TOOLS_PER_ITERATION,
                          iterations=DEMO_EXPLORE_ITERATIONS)
    with StrictOpenAI(model) as server:
        env = {"HOPLINE_PROVIDER": "openai", "OPENAI_BASE_URL": server.base_url,
               "OPENAI_API_KEY": "sk-strict", "HOPLINE_MODEL": "strict-model"}
        result = run_cli(["demo", "--json"], env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    assert server.rejections == []
    assert summary["exitCode"] == 0 and set(summary["verdicts"].values()) == {"pass"}
    assert [(c["previous"], c["state"]) for c in summary["devStates"]] == FIXED
    # every compaction's summary came from the model, through the strict endpoint
    assert summary["compactions"]["count"] >= 1 and server.summaries >= summary["compactions"]["count"]
    assert len(server.requests) == summary["gatewayResponses"]["200"]
    assert all(body["stream"] is True and body["model"] == "strict-model" for body in server.requests)
    assert {h["authorization"] for h in server.headers} == {"Bearer sk-strict"}
    assert summary["gateway413s"] == 0
