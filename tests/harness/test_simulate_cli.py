"""`hopline simulate` as a user runs it: a real child process, JSON on stdout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

KiB = 1024


def simulate(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "hopline", "simulate", "--json", *args], capture_output=True,
                          text=True, timeout=120, env=full_env)
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_naive_dev_passes_the_ceiling_before_any_compaction_default_rules_do_not() -> None:
    env = {"HOPLINE_TRANSPORT_MAX_BODY_BYTES": "256kb"}
    common = ("--profile", "dev", "--iterations", "12", "--tools-per-iteration", "2",
              "--tool-bytes", str(20 * KiB))
    _, naive = simulate(*common, "--naive", env=env)
    ceiling = naive["summary"]["ceilingBytes"]
    assert ceiling == 256 * KiB
    over = [r for r in naive["iterations"] if r["bodyBytes"] > ceiling]
    assert over, naive["iterations"]
    first_over = over[0]["iteration"]
    assert not any(r["compacted"] for r in naive["iterations"] if r["iteration"] <= first_over)
    # the naive estimate saw almost nothing of the arguments
    assert over[0]["estimateTokens"] * 4 < over[0]["bodyBytes"] // 4

    code, fixed = simulate(*common, env=env)
    assert code == 0
    assert all(r["bodyBytes"] <= ceiling for r in fixed["iterations"])
    assert fixed["summary"]["compactions"] > 0
    assert fixed["summary"]["maxBodyBytes"] <= ceiling
    assert fixed["summary"]["orphanToolMessages"] == 0
    assert {r["trigger"] for r in fixed["iterations"] if r["compacted"]} == {"transport"}


def test_gate_default_run_reports_rows_and_summary() -> None:
    code, report = simulate("--iterations", "20", "--tool-bytes", str(100 * KiB),
                            env={"HOPLINE_TRANSPORT_MAX_BODY_BYTES": "256kb"})
    assert code == 0
    rows = report["iterations"]
    assert [r["iteration"] for r in rows] == list(range(1, 21))
    assert set(rows[0]) == {"iteration", "bodyBytes", "estimateTokens", "effectiveWindowTokens", "compacted",
                            "trigger"}
    assert all(r["effectiveWindowTokens"] == 64 * KiB for r in rows)
    summary = report["summary"]
    assert summary["stopReason"] == "end_turn" and summary["failures"] == []
    assert summary["maxBodyBytes"] == max(r["bodyBytes"] for r in rows) <= 256 * KiB


def test_failed_turn_exits_non_zero_with_origin() -> None:
    # a gateway narrower than the ceiling under naive rules: the seed's 413, origin code
    code, report = simulate("--profile", "dev", "--iterations", "10", "--naive", "--tools-per-iteration", "2",
                            env={"API_JSON_BODY_LIMIT": "100kb"})
    assert code == 1
    assert report["summary"]["stopReason"] == "failed"
    assert report["summary"]["failures"][-1]["origin"] == "code"
    assert "413" in report["summary"]["failures"][-1]["message"]
