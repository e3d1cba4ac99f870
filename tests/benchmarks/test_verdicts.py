"""The benchmarks' verdict rule (issue 30): a figure counts only when the A/A spread is under a
third of its margin to the target (else NOISY, never PASS), and the quartiles behind it. Pure:
no timing, no process."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root holds bench/
from bench.common import Verdict, aa_spread, interleaved, quartiles


def test_quartiles_of_odd_and_even_counts_stay_inside_the_range() -> None:
    assert quartiles([3.0, 1.0, 2.0]) == (1.5, 2.0, 2.5)
    assert quartiles([1.0, 2.0, 3.0, 4.0, 5.0]) == (2.0, 3.0, 4.0)
    q1, med, q3 = quartiles([1.0, 2.0, 3.0, 4.0])
    assert (q1, med, q3) == (1.75, 2.5, 3.25)
    assert quartiles([7.0]) == (7.0, 7.0, 7.0)


def test_quartiles_of_nothing_is_an_error() -> None:
    with pytest.raises(ValueError):
        quartiles([])


def test_aa_spread_covers_scatter_and_bias() -> None:
    assert aa_spread([1.0, 1.0, 1.0]) == 0.0
    # symmetric scatter: the band reaches 0.98 .. 1.02
    assert aa_spread([0.96, 0.98, 1.0, 1.02, 1.04]) == pytest.approx(0.02)
    # a bias with no scatter is a spread too: two identical daemons that differ by 5 %
    assert aa_spread([1.05, 1.05, 1.05]) == pytest.approx(0.05)
    assert aa_spread([0.9, 0.91, 0.92]) == pytest.approx(0.095)


def test_pass_when_over_the_target_and_the_spread_is_under_a_third_of_the_margin() -> None:
    v = Verdict("daemon vs naive relay, 1 KiB frames", 2.4, 2.0, True, spread=0.13)
    assert v.margin == pytest.approx(0.4)
    assert v.status == "PASS"
    assert v.line().startswith("  [PASS] daemon vs naive relay, 1 KiB frames: 2.4x")


def test_miss_when_under_the_target_and_the_spread_is_small() -> None:
    v = Verdict("daemon vs raw pipe, 1 MiB frames", 0.13, 0.25, True, spread=0.013)
    assert v.status == "MISS"
    assert "[MISS]" in v.line() and "A/A spread" in v.line()


def test_noisy_at_exactly_a_third_of_the_margin_and_above() -> None:
    # margin 0.75, a third of it 0.25 (exact in binary): a spread of 0.25 does not count (strictly under)
    assert Verdict("x", 1.75, 1.0, True, spread=0.25).status == "NOISY"
    assert Verdict("x", 1.75, 1.0, True, spread=0.2499).status == "PASS"
    assert Verdict("x", 0.25, 1.0, True, spread=0.25).status == "NOISY"
    assert Verdict("x", 0.25, 1.0, True, spread=0.2499).status == "MISS"


def test_noisy_is_never_pass_even_far_over_the_target() -> None:
    v = Verdict("x", 5.0, 1.0, True, spread=2.0)
    assert v.passed is True
    assert v.status == "NOISY"
    assert v.to_json()["verdict"] == "NOISY"


def test_lower_is_better_targets() -> None:
    assert Verdict("cost", 0.4, 1.0, False, unit="%", spread=0.1).status == "PASS"
    assert Verdict("cost", 1.4, 1.0, False, unit="%", spread=0.1).status == "MISS"
    assert Verdict("cost", 0.8, 1.0, False, unit="%", spread=0.1).status == "NOISY"


def test_on_the_target_with_any_spread_is_noisy() -> None:
    assert Verdict("x", 1.0, 1.0, True, spread=0.0).status == "NOISY"


def test_nan_spread_is_noisy_and_no_spread_keeps_the_plain_rule() -> None:
    assert Verdict("x", 3.0, 1.0, True, spread=math.nan).status == "NOISY"
    assert Verdict("x", 3.0, 1.0, True).status == "PASS"
    assert Verdict("x", 0.5, 1.0, True).status == "MISS"


def test_not_measured_is_skip() -> None:
    v = Verdict("x", None, 1.0, True, spread=0.01)
    assert v.status == "SKIP"
    assert v.to_json()["verdict"] == "SKIP" and v.to_json()["margin"] is None


def test_the_readme_table_lists_every_verdict_with_its_spread_and_date() -> None:
    from bench.report import BEGIN, END, render_table, replace_between_markers

    results = {"benchmarks": {
        "relay": {"date": "2026-12-01T22:00:00+00:00", "quick": False, "verdicts": [
            Verdict("daemon vs naive relay, 1 KiB frames", 2.4, 2.0, True, spread=0.5).to_json(),
            Verdict("daemon vs raw pipe, 1 MiB frames", 0.13, 0.25, True, spread=0.01).to_json()]},
        "gateway": {"date": "2026-12-01T13:58:43+00:00", "quick": True, "verdicts": [
            Verdict("413", 1.0, 1.0, True, unit="").to_json()]},
        "scaleout": {"date": "2026-12-01T13:58:43+00:00", "skipped": "no PostgreSQL", "verdicts": []}}}
    table = render_table(results)
    lines = table.splitlines()
    assert len(lines) == 2 + 4
    assert ("| relay | daemon vs naive relay, 1 KiB frames: >= 2x | 2.4x | 0.5x | **NOISY** "
            "| 2026-12-01 22:00 |") in lines
    assert "**MISS**" in lines[3] and "0.01x" in lines[3]
    assert lines[4].endswith("| **PASS** | 2026-12-01 13:58 (quick) |")
    assert "**SKIP**" in lines[5]
    readme = f"intro\n{BEGIN}\nold table\n{END}\nafter\n"
    updated = replace_between_markers(readme, table)
    assert "old table" not in updated and updated.startswith("intro\n")
    assert updated.endswith(f"{END}\nafter\n")
    assert replace_between_markers("no markers", "T").endswith(f"{BEGIN}\nT\n{END}\n")


def test_interleaved_rounds_start_at_the_next_name_each_round() -> None:
    rounds = list(interleaved(["a", "b", "c"], 4))
    assert rounds == ["a", "b", "c", "b", "c", "a", "c", "a", "b", "a", "b", "c"]
