"""``python -m bench [--only relay,observer,...] [--quick] [--keep]``: run the benchmarks.

Each benchmark prints its figures and one verdict line per target; everything goes to
``bench/results.json`` (a benchmark not run this time keeps its last entry, with its own date).
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from bench.common import BENCH_DIR, BenchResult, Settings, machine, say

BENCHMARKS: dict[str, str] = {
    "relay": "bench.relay",
    "observer": "bench.observer",
    "loop": "bench.loop",
    "gateway": "bench.gateway",
    "sidecars": "bench.sidecars",
    "streaming": "bench.streaming",
    "warm_pool": "bench.warm_pool",
    "scaling": "bench.scaling",
    "scaleout": "bench.scaleout",
    "durability": "bench.durability",
    "memory": "bench.memory",
}
RESULTS = BENCH_DIR / "results.json"


def _load_previous() -> dict[str, Any]:
    try:
        data = json.loads(RESULTS.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--only", default="", help="comma-separated: " + ",".join(BENCHMARKS))
    parser.add_argument("--quick", action="store_true", help="smaller sizes and counts (< 2 minutes)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    parser.add_argument("--no-write", action="store_true", help="do not write bench/results.json")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")

    workdir = Path(tempfile.mkdtemp(prefix="hopline-bench-"))
    settings = Settings(quick=args.quick, workdir=workdir)
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    info = machine()
    say(f"hopline bench {'(quick) ' if args.quick else ''}{now}  cores={info.get('cores')} "
        f"memory={info.get('memoryGiB')} GiB (free {info.get('freeGiB')})  python={info.get('python')}")
    results: dict[str, BenchResult] = {}
    failed = False
    try:
        for name in names:
            say(f"\n== {name} ==")
            started_at = time.perf_counter()
            try:
                result: BenchResult = importlib.import_module(BENCHMARKS[name]).run(settings)
            except Exception as exc:  # one broken benchmark must not hide the others
                traceback.print_exc()
                result = BenchResult(name, skipped=f"error: {type(exc).__name__}: {exc}")
                failed = True
            result.seconds = time.perf_counter() - started_at
            for note in result.notes:
                say(f"  note: {note}")
            if result.skipped:
                say(f"  SKIPPED: {result.skipped}")
            for verdict in result.verdicts:
                say(verdict.line())
            say(f"  ({result.seconds:.1f} s)")
            results[name] = result
    finally:
        if args.keep:
            say(f"scratch kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    if not args.no_write:
        data = _load_previous()
        benches = data.get("benchmarks") if isinstance(data.get("benchmarks"), dict) else {}
        for name, result in results.items():
            benches[name] = {"date": now, "quick": args.quick, "machine": info, **result.to_json()}
        data.update({"date": now, "quick": args.quick, "machine": info,
                     "benchmarks": {n: benches[n] for n in BENCHMARKS if n in benches}})
        RESULTS.write_text(json.dumps(data, indent=2, default=str) + "\n")
        say(f"\nresults written to {RESULTS.relative_to(BENCH_DIR.parent)}")
        from bench import report

        report.main()
    say("\nsummary:")
    for name, result in results.items():
        for verdict in result.verdicts:
            say(f"{name}:{verdict.line()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
