"""`hopline simulate` as a user runs it: a real child process, JSON on stdout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

pytestmark = pytest.mark.e2e  # every test here starts real processes

KiB = 1024


def simulate(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "hopline", "simulate", "--json", *args], capture_output=True,
                          text=True, timeout=120, env=full_env)
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_naive_dev_is_refused_before_any_compaction_default_rules_are_not() -> None:
    env = {"HOPLINE_TRANSPORT_MAX_BODY_BYTES": "256kb"}
    common = ("--profile", "dev", "--iterations", "12", "--tools-per-iteration", "2",
              "--tool-bytes", str(20 * KiB))
    code, naive = simulate(*common, "--naive", env=env)
    assert code == 1
    summary = naive["summary"]
    assert summary["gatewayLimitBytes"] == 100 * KiB  # the incident's implicit limit, whatever the env
    refused = naive["iterations"][-1]
    assert refused["bodyBytes"] > 100 * KiB
    assert not any(r["compacted"] for r in naive["iterations"])
    assert {r["estimateSource"] for r in naive["iterations"]} == {"content"}
    # the naive estimate saw almost nothing of the write_file arguments
    assert refused["estimateTokens"] * 4 < refused["bodyBytes"] // 4

    code, fixed = simulate(*common, env=env)
    assert code == 0
    ceiling = fixed["summary"]["ceilingBytes"]
    assert ceiling == 256 * KiB
    assert all(r["bodyBytes"] <= ceiling for r in fixed["iterations"])
    assert fixed["summary"]["compactions"] > 0
    assert fixed["summary"]["maxBodyBytes"] <= ceiling
    assert fixed["summary"]["orphanToolMessages"] == 0
    assert {r["trigger"] for r in fixed["iterations"] if r["compacted"]} == {"transport"}
    assert "usage" in {r["estimateSource"] for r in fixed["iterations"]}


def test_gate_default_run_reports_rows_and_summary() -> None:
    code, report = simulate("--iterations", "20", "--tool-bytes", str(100 * KiB),
                            env={"HOPLINE_TRANSPORT_MAX_BODY_BYTES": "256kb"})
    assert code == 0
    rows = report["iterations"]
    assert [r["iteration"] for r in rows] == list(range(1, 21))
    assert set(rows[0]) == {"iteration", "bodyBytes", "estimateTokens", "effectiveWindowTokens", "compacted",
                            "trigger", "estimateSource"}
    assert rows[0]["estimateSource"] == "bytes" and rows[-1]["estimateSource"] in ("usage", "bytes")
    assert all(r["effectiveWindowTokens"] == 64 * KiB for r in rows)
    summary = report["summary"]
    assert summary["stopReason"] == "end_turn" and summary["failures"] == []
    assert summary["maxBodyBytes"] == max(r["bodyBytes"] for r in rows) <= 256 * KiB


def test_naive_on_defaults_fails_like_the_seed_with_origin_code() -> None:
    # The whole incident, as `demo --naive`: the 100 KB gateway and the content-only estimate.
    code, report = simulate("--naive")
    assert code == 1
    summary = report["summary"]
    assert summary["stopReason"] == "failed" and summary["compactions"] == 0
    failure = summary["failures"][-1]
    assert failure["origin"] == "code" and failure["status"] == 413 and failure["hop"] == "gateway.llm_turn"
    assert failure["limit"] == 100 * KiB < failure["observed"] == summary["maxBodyBytes"]


def test_the_model_window_comes_from_the_env_and_the_flag_wins() -> None:
    env = {"HOPLINE_MODEL_CONTEXT_WINDOW": "50000"}
    _, from_env = simulate("--iterations", "2", env=env)
    assert {r["effectiveWindowTokens"] for r in from_env["iterations"]} == {50_000}
    _, from_flag = simulate("--iterations", "2", "--context-window", "20000", env=env)
    assert {r["effectiveWindowTokens"] for r in from_flag["iterations"]} == {20_000}
