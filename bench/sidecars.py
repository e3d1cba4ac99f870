"""Benchmark 5: sidecar projection (SPEC S-1) — cost per MiB moved, and daemon memory with and without.

* Projection cost, in process: ``project_update`` of finished ``tool_call_update`` updates whose
  text content is 5 MiB (each distinct, so none is deduplicated), into a real ``SidecarStore``
  (files + SQLite index, fsync) under the scratch directory. Shown next to the cost the daemon pays
  for the same update anyway (one ``orjson.dumps``).
* Daemon memory: 20 sessions, each one prompt whose agent emits 60 ``tool_call_update`` outputs of
  256 KiB, all sessions at once, each watched by an SSE client; peak and final RSS of the daemon
  process (psutil), sidecars on versus off. ``hopline serve`` has no sidecar flag, so both runs use
  ``bench/daemon_server.py``, which passes ``create_daemon_app(sidecars=True|False)``.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import httpx
import orjson

from bench import daemon_driver
from bench.common import BenchResult, Settings, Verdict, say
from bench.frames import BENCH_SESSION_ID, tool_call_update
from bench.gateway import RssSampler
from hopline.budget import Budget, KiB, MiB

PROJECT_BYTES = 5 * MiB
OUTPUT_BYTES = 256 * KiB
TIMEOUT_S = 300.0


def _distinct_update(index: int, nbytes: int) -> dict[str, Any]:
    message = tool_call_update(nbytes, index)
    block = message["params"]["update"]["content"][0]["content"]
    block["text"] = f"{index:012d}" + block["text"][12:]
    update: dict[str, Any] = message["params"]["update"]
    return update


def projection_cost(settings: Settings) -> dict[str, Any]:
    from hopline.sidecars import SidecarStore, project_update

    budget = Budget.defaults()
    count = settings.pick(20, 6)
    updates = [_distinct_update(i, PROJECT_BYTES) for i in range(count)]
    store = SidecarStore(settings.workdir / "sidecar-projection", budget)
    try:
        project_s = []
        for update in updates:
            started = time.perf_counter()
            projected = project_update(update, "bench-daemon-session", store, budget)
            project_s.append(time.perf_counter() - started)
            if projected is update or len(orjson.dumps(projected)) > 64 * KiB:
                raise RuntimeError("the update was not moved to a sidecar")
        dumps_s = []
        for update in updates:
            started = time.perf_counter()
            orjson.dumps(update)
            dumps_s.append(time.perf_counter() - started)
    finally:
        store.close()
    mib = PROJECT_BYTES / MiB
    per_mib = statistics.median(project_s) / mib
    return {"updates": count, "updateTextBytes": PROJECT_BYTES,
            "msPerMiB": per_mib * 1e3, "MiBps": 1 / per_mib,
            "msPerUpdateMedian": statistics.median(project_s) * 1e3,
            "dumpsMsPerMiB": statistics.median(dumps_s) / mib * 1e3}


def _tool_stream(path: Any, outputs: int) -> int:
    with open(path, "wb") as out:
        for i in range(outputs):
            message = tool_call_update(OUTPUT_BYTES, i, BENCH_SESSION_ID)
            block = message["params"]["update"]["content"][0]["content"]
            block["text"] = f"{i:012d}" + block["text"][12:]
            out.write(orjson.dumps(message) + b"\n")
    return int(path.stat().st_size)


async def _sessions(d: daemon_driver.Daemon, sessions: int, outputs: int, path: Any) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=4 * sessions + 8)
    async with httpx.AsyncClient(timeout=httpx.Timeout(TIMEOUT_S, connect=10.0), limits=limits) as client:
        ids = [await daemon_driver.create_session(client, d) for _ in range(sessions)]
        outcomes = await asyncio.gather(*(
            daemon_driver.stream_prompt(client, d, sid, outputs, text=f"stream {path}",
                                        marker=b"tool_call_update")
            for sid in ids))
        status = await daemon_driver.status(client, d)
        for sid in ids:
            await client.delete(f"{d.url}/session/{sid}", headers=d.headers)
    return {"sseBytes": sum(o["sseBytes"] for o in outcomes),
            "evictions": sum(o["evictions"] for o in outcomes),
            "seconds": max(o["seconds"] for o in outcomes),
            "pipe": status.get("runtime", {}).get("perf", {}).get("pipe")}


def daemon_memory(settings: Settings, sidecars: bool) -> dict[str, Any]:
    sessions = settings.pick(20, 5)
    outputs = settings.pick(60, 20)
    path = settings.workdir / f"tool-stream-{outputs}.ndjson"
    if not path.exists():
        _tool_stream(path, outputs)
    agent = daemon_driver.stream_agent(path)
    with daemon_driver.daemon(settings, agent, launch="bench", sidecars=sidecars,
                              name=f"sidecars-{'on' if sidecars else 'off'}") as d:
        time.sleep(0.3)
        with RssSampler(d.pid, interval=0.01) as rss:
            out = asyncio.run(asyncio.wait_for(_sessions(d, sessions, outputs, path), TIMEOUT_S))
        final = rss.process.memory_info().rss
    sidecar_dir = d.data_dir / "sidecars"
    disk = sum(p.stat().st_size for p in sidecar_dir.rglob("*") if p.is_file()) if sidecar_dir.exists() else 0
    return {"sessions": sessions, "outputsPerSession": outputs, "outputBytes": OUTPUT_BYTES,
            "rssBaselineBytes": rss.baseline, "rssPeakBytes": rss.peak, "rssPeakGrowthBytes": rss.growth,
            "rssFinalBytes": final, "sidecarDiskBytesAfterDelete": disk, **out}


def run(settings: Settings) -> BenchResult:
    result = BenchResult("sidecars")
    cost = projection_cost(settings)
    result.figures["projection"] = cost
    say(f"  project_update of {cost['updates']} x 5 MiB tool_call_update: {cost['msPerMiB']:.2f} ms per MiB "
        f"({cost['MiBps']:.0f} MiB/s; {cost['msPerUpdateMedian']:.1f} ms per update); orjson.dumps of the "
        f"same update: {cost['dumpsMsPerMiB']:.2f} ms per MiB")
    missing = daemon_driver.available()
    if missing is not None:
        result.notes.append(f"daemon memory not measured: {missing}")
        return result
    runs = {}
    for sidecars in (False, True):
        name = "on" if sidecars else "off"
        try:
            out = daemon_memory(settings, sidecars)
        except Exception as exc:  # keep the projection figures when the daemon part breaks
            result.notes.append(f"daemon memory run (sidecars {name}) failed: {type(exc).__name__}: "
                                f"{str(exc)[:300]}")
            result.verdicts.append(Verdict("daemon RSS peak growth, sidecars on / off", None, 1.0, False))
            return result
        runs[name] = out
        say(f"  daemon, sidecars {name:>3}: {out['sessions']} sessions x {out['outputsPerSession']} x "
            f"256 KiB in {out['seconds']:.1f} s; RSS peak growth {out['rssPeakGrowthBytes'] / MiB:.1f} MiB "
            f"(baseline {out['rssBaselineBytes'] / MiB:.0f} MiB, "
            f"final {out['rssFinalBytes'] / MiB:.0f} MiB); "
            f"SSE {out['sseBytes'] / MiB:.1f} MiB, evictions {out['evictions']}")
    result.figures["daemonMemory"] = runs
    on, off = runs["on"], runs["off"]
    growth_ratio = (on["rssPeakGrowthBytes"] / off["rssPeakGrowthBytes"]
                    if off["rssPeakGrowthBytes"] > 0 else None)
    result.figures["rssPeakGrowthOnOverOff"] = growth_ratio
    result.verdicts.append(Verdict("daemon RSS peak growth, sidecars on / off", growth_ratio, 1.0, False,
                                   note="sidecars must not cost the daemon memory"))
    result.notes.append("the sidecar A/B uses bench/daemon_server.py with create_daemon_app(sidecars=...): "
                        "`hopline serve` has no flag for it")
    return result
