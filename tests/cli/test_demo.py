"""`hopline demo`: the gate run ends clean (0 413s, compactions), the naive run reproduces the 413."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from hopline.budget import Budget
from hopline.cli.demo import DEMO_TOOLS_PER_ITERATION, gateway_statuses, print_summary
from hopline.harness.scripted import ScriptedModel
from strict_openai import StrictOpenAI

from .conftest import run_cli

METRICS = """# HELP hopline_gateway_requests_total Gateway requests by response status
# TYPE hopline_gateway_requests_total counter
hopline_gateway_requests_total{status="200"} 73.0
hopline_gateway_requests_total{status="413"} 2.0
"""


def test_gateway_statuses_read_from_prometheus_text() -> None:
    assert gateway_statuses(METRICS) == {"200": 73, "413": 2}
    assert gateway_statuses("") == {}


@pytest.mark.e2e
def test_demo_gate_run_has_no_413_and_compacts() -> None:
    result = run_cli(["demo", "--json"], timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    assert summary["mode"] == "gate"
    assert summary["gateway413s"] == 0
    assert summary["gatewayResponses"].get("200", 0) >= summary["iterations"]
    assert summary["compactions"]["count"] >= 1
    assert set(summary["compactions"]["triggers"]) <= {"model", "transport"}
    assert summary["iterations"] == summary["maxIterations"] == 60
    assert summary["stopReason"] == "end_turn"
    assert 0 < summary["largestBodyBytes"] <= summary["engineCeilingBytes"] <= summary["gatewayLimitBytes"]
    # Large tool outputs went to sidecars, so no pipe frame reached the large-frame threshold.
    assert summary["sidecars"]["bytesKeptOffWire"] > 0 and summary["sidecars"]["seenInEvents"] > 0
    assert 0 < summary["largestPipeFrame"]["bytes"] < 256 * 1024
    assert summary["largeFrames"]["logged"] == 0
    assert summary["turnError"] is None

    console = Console(record=True, width=120)
    print_summary(console, summary)
    table = console.export_text()
    for label in ("compactions", "largest llm-turn body", "engine ceiling", "gateway limit",
                  "largest pipe frame", "large-frame records", "sidecars (store)", "kept off the wire",
                  "413s"):
        assert label in table


@pytest.mark.e2e
def test_demo_naive_reproduces_the_413_with_origin_code() -> None:
    result = run_cli(["demo", "--naive", "--json"], timeout=120)
    assert result.returncode == 1, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    assert summary["mode"] == "naive"
    assert summary["gateway413s"] >= 1
    error = summary["turnError"]
    assert error["origin"] == "code"
    assert error["hop"] == "gateway.llm_turn"
    assert error["limitBytes"] == 100 * 1024
    assert error["observedBytes"] > error["limitBytes"]
    # The incident: the content-only estimate never asked for a compaction before the 413.
    assert summary["compactions"]["count"] == 0
    assert summary["largestBodyBytes"] == error["observedBytes"]


@pytest.mark.e2e
def test_demo_runs_whole_through_a_strict_openai_compatible_provider() -> None:
    # The provider refuses any field outside the chat-completions schema (400), like the real APIs;
    # our hints never reach it, so it is told the demo's plan by its own settings.
    gate = Budget.defaults().gate_max_iterations
    model = ScriptedModel(seed=0, tools_per_iteration=DEMO_TOOLS_PER_ITERATION, iterations=gate - 1)
    with StrictOpenAI(model) as server:
        env = {"HOPLINE_PROVIDER": "openai", "OPENAI_BASE_URL": server.base_url,
               "OPENAI_API_KEY": "sk-strict", "HOPLINE_MODEL": "strict-model"}
        result = run_cli(["demo", "--json"], env=env, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    assert server.rejections == []
    assert summary["iterations"] == summary["maxIterations"] == gate
    assert summary["stopReason"] == "end_turn" and summary["turnError"] is None
    compactions = summary["compactions"]
    # every compaction's summary came from the model, through the strict endpoint
    assert compactions["count"] >= 1 and compactions["summarizers"] == {"model": compactions["count"]}
    assert compactions["summarizerErrors"] == []
    assert server.summaries >= compactions["count"]
    assert len(server.requests) == summary["gatewayResponses"]["200"]
    assert all(body["stream"] is True and body["model"] == "strict-model" for body in server.requests)
    assert {h["authorization"] for h in server.headers} == {"Bearer sk-strict"}
    assert summary["gateway413s"] == 0
