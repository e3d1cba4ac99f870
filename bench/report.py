"""``python -m bench.report``: bench/README.md's table of every target with its last verdict, and
bench/relay.png (throughput and CPU per MiB against frame size: raw pipe, naive relay, floor relay,
daemon).

Both are made from bench/results.json (``python -m bench`` calls this after writing it), so the
README shows what the last run of each benchmark measured, with its date and its A/A spread.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from bench.common import BENCH_DIR

RESULTS = BENCH_DIR / "results.json"
README = BENCH_DIR / "README.md"
PLOT = BENCH_DIR / "relay.png"
BEGIN = "<!-- verdicts:begin (made by python -m bench.report from results.json) -->"
END = "<!-- verdicts:end -->"


def _number(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    return f"{value:.3g}{unit}"


def verdict_rows(results: dict[str, Any]) -> list[dict[str, str]]:
    """One row per verdict of every benchmark in ``results`` (the bench/results.json shape)."""
    rows = []
    for bench, entry in (results.get("benchmarks") or {}).items():
        date = str(entry.get("date", ""))[:16].replace("T", " ")
        quick = " (quick)" if entry.get("quick") else ""
        if entry.get("skipped"):
            rows.append({"benchmark": bench, "target": "-", "measured": "-", "spread": "-",
                         "verdict": "SKIP", "date": date + quick, "name": str(entry["skipped"])[:80]})
        for v in entry.get("verdicts") or []:
            unit = v.get("unit", "")
            spread = v.get("spread")
            rows.append({"benchmark": bench, "name": v["name"], "target": f"{v['op']} {v['target']:g}{unit}",
                         "measured": _number(v.get("measured"), unit),
                         "spread": _number(spread, unit) if spread is not None else "-",
                         "verdict": v.get("verdict", "?"), "date": date + quick})
    return rows


def render_table(results: dict[str, Any]) -> str:
    lines = ["| benchmark | target | measured | A/A spread | verdict | run (UTC) |",
             "|---|---|---|---|---|---|"]
    for row in verdict_rows(results):
        name = row["name"].replace("|", "/")
        lines.append(f"| {row['benchmark']} | {name}: {row['target']} | {row['measured']} | {row['spread']} "
                     f"| **{row['verdict']}** | {row['date']} |")
    return "\n".join(lines)


def replace_between_markers(text: str, block: str) -> str:
    """``text`` with what lies between the markers replaced by ``block`` (markers appended if absent)."""
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        return f"{head}{BEGIN}\n{block}\n{END}{tail}"
    return f"{text.rstrip()}\n\n{BEGIN}\n{block}\n{END}\n"


def _size_label(nbytes: int) -> str:
    return f"{nbytes // 2**20} MiB" if nbytes >= 2**20 else f"{nbytes // 2**10} KiB"


def plot_relay(results: dict[str, Any], path: Path) -> str | None:
    """Draw the relay's throughput and CPU per MiB against frame size; None, or why not."""
    relay = (results.get("benchmarks") or {}).get("relay") or {}
    sizes = (relay.get("figures") or {}).get("sizes") or {}
    if not sizes:
        return "no relay figures in results.json"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[bench]')"
    rows = sorted(sizes.values(), key=lambda r: r["frameBytes"])
    xs = [r["frameBytes"] for r in rows]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 7), sharex=True)
    for name, label in (("raw", "raw pipe (cat)"), ("naive", "naive relay"),
                        ("floor", "floor relay (only the work)"), ("daemon", "hopline daemon")):
        for axis, key in ((top, "MBps"), (bottom, "cpuMsPerMiB")):
            bands = [((r.get("paths") or {}).get(name) or {}).get(key) for r in rows]
            if key == "cpuMsPerMiB":
                bands = [b.get("total") if b else None for b in bands]
            points = [(x, b) for x, b in zip(xs, bands, strict=True) if b]
            if not points:
                continue
            px = [x for x, _ in points]
            med = [b["median"] for _, b in points]
            err = [[b["median"] - b["q1"] for _, b in points], [b["q3"] - b["median"] for _, b in points]]
            axis.errorbar(px, med, yerr=err, marker="o", capsize=3, label=label)
    top.set_ylabel("throughput, MB/s (median, quartiles)")
    bottom.set_ylabel("CPU ms per MiB relayed\n(all processes of the path)")
    bottom.set_xlabel("frame size")
    for axis in (top, bottom):
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.grid(True, which="both", alpha=0.3)
    bottom.set_xticks(xs, [_size_label(x) for x in xs])
    top.legend()
    top.set_title(f"relay, {str(relay.get('date', ''))[:16]} UTC{' (quick)' if relay.get('quick') else ''}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return None


def main(results_path: Path = RESULTS, readme: Path = README, plot: Path = PLOT) -> int:
    results = json.loads(results_path.read_text())
    readme.write_text(replace_between_markers(readme.read_text(), render_table(results)))
    why_not = plot_relay(results, plot)
    plotted = f"; no plot: {why_not}" if why_not else f", {plot.name}"
    print(f"verdict table written to {readme.name}{plotted}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
