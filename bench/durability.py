"""Benchmark: what durable-by-default costs (issue 49, SPEC T-1): ``HOPLINE_STORE_SYNC=full`` (the
default: SQLite ``synchronous=FULL``, each transaction's segment records ``fdatasync``-ed before it
commits) against ``normal`` (synced at checkpoints only), relaying 1 KiB and 1 MiB frames.

Three ``hopline serve`` daemons on the same stream files (``bench/relay.py``'s settings: the
sidecar threshold raised so every byte crosses every hop, no warm pool): ``full``, ``fullAgain``
(the A/A pair) and ``normal``, in interleaved rounds. Per round: the daemon's CPU seconds (its
process: the journal's writer and the event loop; the sync's waits are not CPU) and the wall time
from the prompt to the last frame at the client; the figures are medians and quartiles of the
per-round FULL/NORMAL ratios, each verdict counted only when the A/A spread is under a third of
its margin (else ``NOISY``). The scratch directory is on the machine's disk (an fsync to tmpfs
would cost nothing and say nothing).
"""

from __future__ import annotations

import contextlib
from typing import Any

from bench import daemon_driver
from bench.common import BenchResult, Settings, Verdict, aa_spread, interleaved, quartiles, rate, say
from bench.frames import frame_count, write_stream
from bench.relay import RELAY_ENV, size_label

KiB = 1024
MiB = 1024 * KiB
SIZES = (1 * KiB, 1 * MiB)
PATHS = ("full", "fullAgain", "normal")
# What durability may cost, FULL over NORMAL: the syncs are waits, so the daemon's CPU moves little;
# the wall time may double before a relay would rather lose the last commits on a power loss.
TARGET_CPU = 1.25
TARGET_WALL = 2.0


def _band(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    q1, med, q3 = quartiles(values)
    return {"median": med, "q1": q1, "q3": q3}


def _ratios(runs: dict[str, list[dict[str, Any]]], num: str, den: str, key: str) -> list[float]:
    out = []
    for a, b in zip(runs[num], runs[den], strict=True):
        if _value(a, key) and _value(b, key):
            out.append(_value(a, key) / _value(b, key))
    return out


def _value(run: dict[str, Any], key: str) -> float:
    return float(run["seconds"]) if key == "wall" else float((run.get("cpu") or {}).get("server", 0.0))


def _summary(runs: dict[str, list[dict[str, Any]]], nbytes: int, frames: int) -> dict[str, Any]:
    row: dict[str, Any] = {"frames": frames, "bytes": nbytes, "rounds": len(runs["full"]), "paths": {}}
    for name, items in runs.items():
        row["paths"][name] = {
            "daemonCpuMsPerMiB": _band([1000 * _value(r, "cpu") / (nbytes / MiB) for r in items]),
            "wallMsPerMiB": _band([1000 * _value(r, "wall") / (nbytes / MiB) for r in items]),
            "MBps": _band([rate(nbytes, r["seconds"]) for r in items])}
    for key in ("cpu", "wall"):
        row[f"{key}FullOverNormal"] = _band(_ratios(runs, "full", "normal", key))
        aa = _ratios(runs, "full", "fullAgain", key)
        row[f"{key}AaSpread"] = aa_spread(aa) if aa else None
    row["runs"] = runs
    return row


def run(settings: Settings) -> BenchResult:
    result = BenchResult("durability")
    missing = daemon_driver.available()
    if missing is not None:
        result.skipped = missing
        return result
    total = settings.pick(128 * MiB, 16 * MiB)
    max_frames = settings.pick(65536, 8192)
    rounds = settings.pick(7, 3)
    files = []
    for size in SIZES:
        count = frame_count(size, total, max_frames)
        path = settings.workdir / f"durability-{size}.ndjson"
        files.append((size, path, count, write_stream(path, size, count)))
    rows: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        agent = daemon_driver.stream_agent(files[0][1])
        daemons = {name: stack.enter_context(daemon_driver.daemon(
            settings, agent, launch="serve", name=f"durability-{name}",
            env={**RELAY_ENV, "HOPLINE_STORE_SYNC": "normal" if name == "normal" else "full"}))
            for name in PATHS}
        for d in daemons.values():  # warm-up: first session, imports, caches
            daemon_driver.relay_on(d, files[0][1], files[0][2])
        for size, path, count, nbytes in files:
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in PATHS}
            for name in interleaved(list(PATHS), rounds):
                runs[name].append(daemon_driver.relay_on(daemons[name], path, count))
            rows[size_label(size)] = row = {"frameBytes": size, **_summary(runs, nbytes, count)}
            _print(size_label(size), row)
            _verdicts(result, size_label(size), row)
    result.figures["sizes"] = rows
    result.figures["unit"] = ("daemonCpuMsPerMiB: CPU milliseconds of the daemon's process per MiB relayed; "
                              "wallMsPerMiB: prompt to last frame at the client; *FullOverNormal: per-round "
                              "ratios FULL/NORMAL, median and quartiles; *AaSpread: FULL against FULL")
    result.notes.append(f"{rounds} interleaved rounds per size, {total // MiB} MiB per run; daemons on "
                        f"{settings.workdir} (a disk: the syncs are real)")
    return result


def _print(label: str, row: dict[str, Any]) -> None:
    def band(key: str) -> str:
        b = row.get(key)
        return f"{b['median']:.2f}x ({b['q1']:.2f}..{b['q3']:.2f})" if b else "n/a"

    def path(name: str, key: str) -> str:
        b = row["paths"][name][key]
        return f"{b['median']:.1f}" if b else "n/a"

    say(f"  {label:>6} x{row['frames']:>6} | daemon CPU ms/MiB full {path('full', 'daemonCpuMsPerMiB')} "
        f"normal {path('normal', 'daemonCpuMsPerMiB')} | wall ms/MiB full {path('full', 'wallMsPerMiB')} "
        f"normal {path('normal', 'wallMsPerMiB')} | FULL/NORMAL CPU {band('cpuFullOverNormal')} "
        f"wall {band('wallFullOverNormal')} | A/A spread CPU {row['cpuAaSpread']:.1%} "
        f"wall {row['wallAaSpread']:.1%}")


def _verdicts(result: BenchResult, label: str, row: dict[str, Any]) -> None:
    for key, what, target in (("cpu", "daemon CPU per MiB", TARGET_CPU), ("wall", "wall time", TARGET_WALL)):
        band, spread = row.get(f"{key}FullOverNormal"), row.get(f"{key}AaSpread")
        measured = band["median"] if band else None
        note = f"quartiles {band['q1']:.2f}..{band['q3']:.2f}" if band else ""
        result.verdicts.append(Verdict(
            f"HOPLINE_STORE_SYNC full vs normal, {what}, {label} frames", measured, target, False,
            note=note, spread=spread * measured if spread is not None and measured is not None else None))
