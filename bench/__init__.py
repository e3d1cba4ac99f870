"""hopline benchmarks (SPEC P): ratios measured in one run, written to ``bench/results.json``.

Run from the repo root: ``python -m bench`` (all), ``python -m bench --only relay,observer``,
``python -m bench --quick`` (short run). See ``bench/README.md``.
"""
