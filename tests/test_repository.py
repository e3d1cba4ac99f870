"""The checkout itself: no file carries an unresolved merge, the bench's results parse, and the
README's images are there."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_MARKERS = (b"<<<<<<< ", b">>>>>>> ", b"||||||| ")


def _tracked_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [ROOT / name for name in out.decode().split("\0") if name]


def test_no_tracked_file_holds_a_merge_conflict_marker() -> None:
    conflicted = []
    for path in _tracked_files():
        if not path.is_file() or path.suffix in {".png"}:
            continue
        for number, line in enumerate(path.read_bytes().splitlines(), 1):
            if line.startswith(_MARKERS):
                conflicted.append(f"{path.relative_to(ROOT)}:{number}")
    assert conflicted == []


def test_bench_results_parse() -> None:
    results = json.loads((ROOT / "bench" / "results.json").read_text())
    assert set(results["benchmarks"]) >= {"relay", "observer", "streaming", "warm_pool"}


def test_every_image_the_readme_shows_is_tracked() -> None:
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", (ROOT / "README.md").read_text())
    assert "docs/console.png" in images and "docs/console-gate.png" in images
    tracked = {str(path.relative_to(ROOT)) for path in _tracked_files()}
    assert [image for image in images if image not in tracked] == []
