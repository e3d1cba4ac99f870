"""Benchmark 8: many sessions at once, and a slow client's memory (SPEC P, issue 17).

* Scaling: 20 sessions streaming at once through one daemon (``hopline serve``), each its own
  agent child and SSE reader, against one session alone on the same daemon: events per second
  delivered to the clients, and the ratio (on 2 cores: the daemon's event loop is one thread, so
  the ratio says how much of the cores the one loop and the journal's writer get). The daemon's
  RSS per live session is its RSS with the 20 sessions open and streamed, over its RSS before
  they were created, divided by 20 (the agent children are not counted).
* Slow client: one session streams 64 MiB of 1 MiB frames (and 16 and 256 MiB: does the growth
  follow the stream?) to an SSE reader that takes 1 MiB then
  sleeps 50 ms (about 20 MB/s, far below the relay). The daemon evicts it as a slow client, it
  resumes with ``Last-Event-ID`` (from the journal), and so on until it has every frame. The
  daemon's peak RSS growth over the run must stay under the bounds that hold the stream in memory:
  the journal writer's queue, the session's ring and one subscriber queue (their budget values) -
  not grow with the 64 MiB stream.
* Fair shares (SPEC T-6, issue #26): another session's prompt round trip while one floods,
  ``bench/fair_share.py``; target p50 under 50 ms.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from bench import daemon_driver
from bench.common import HOST, BenchResult, Settings, Verdict, say
from bench.fair_share import FAIR_P50_TARGET_MS, fair_share
from bench.frames import frame_count, write_stream
from bench.gateway import RssSampler
from bench.sse_client import SseCounter, stream_sse
from hopline.budget import Budget

KiB = 1024
MiB = 1024 * KiB
TIMEOUT_S = 180.0
SESSIONS = 20
SLOW_READ_BYTES = 1 * MiB
SLOW_PAUSE_S = 0.05


async def _stream_sessions(d: daemon_driver.Daemon, sessions: int, frames: int) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=2 * sessions + 8)
    async with httpx.AsyncClient(timeout=httpx.Timeout(TIMEOUT_S, connect=10.0), limits=limits) as client:
        ids = [await daemon_driver.create_session(client, d) for _ in range(sessions)]
        started = time.perf_counter()
        outcomes = await asyncio.gather(*(daemon_driver.stream_prompt(client, d, sid, frames) for sid in ids))
        seconds = time.perf_counter() - started
        rss = _rss(d.pid)
        for sid in ids:
            await client.delete(f"{d.url}/session/{sid}", headers=d.headers)
    events = sum(o["events"] for o in outcomes)
    return {"sessions": sessions, "framesPerSession": frames, "seconds": seconds, "events": events,
            "eventsPerSecond": events / seconds, "evictions": sum(o["evictions"] for o in outcomes),
            "rssWithSessionsBytes": rss}


def _rss(pid: int) -> int:
    import psutil

    return int(psutil.Process(pid).memory_info().rss)


def scaling(settings: Settings) -> dict[str, Any]:
    frame_bytes = 1 * KiB
    frames = settings.pick(4096, 1024)
    path = settings.workdir / f"scaling-{frame_bytes}.ndjson"
    write_stream(path, frame_bytes, frames)
    with daemon_driver.daemon(settings, daemon_driver.stream_agent(path), launch="serve", name="scaling",
                              env={"HOPLINE_WARM_CHILDREN": "0",
                                   "HOPLINE_MAX_LIVE_SESSIONS": str(SESSIONS + 4)}) as d:
        asyncio.run(asyncio.wait_for(_stream_sessions(d, 1, frames), TIMEOUT_S))  # warm-up
        baseline = _rss(d.pid)
        one = asyncio.run(asyncio.wait_for(_stream_sessions(d, 1, frames), TIMEOUT_S))
        many = asyncio.run(asyncio.wait_for(_stream_sessions(d, SESSIONS, frames), TIMEOUT_S))
    return {"frameBytes": frame_bytes, "one": one, "many": many,
            "scaling": many["eventsPerSecond"] / one["eventsPerSecond"],
            "rssBaselineBytes": baseline,
            "rssPerSessionBytes": max(0, many["rssWithSessionsBytes"] - baseline) / SESSIONS}


async def _slow_reader(d: daemon_driver.Daemon, frames: int, text: str = "go") -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(TIMEOUT_S, connect=10.0)) as client:
        sid = await daemon_driver.create_session(client, d)
        counter = SseCounter()
        last_id: int | None = None
        evictions = 0
        prompted = False
        while counter.marked < frames:
            headers = dict(d.headers)
            if last_id is not None:
                headers["last-event-id"] = str(last_id)
            evicted_before = counter.names.get("client_evicted", 0)
            reads = stream_sse(HOST, d.port, f"/session/{sid}/events", counter.feed_from, headers)
            try:
                async for nbytes in reads:
                    last_id = counter.last_id if counter.last_id is not None else last_id
                    if not prompted and counter.names.get("replay_complete"):
                        prompted = True
                        (await client.post(f"{d.url}/session/{sid}/prompt", json={"text": text},
                                           headers=d.headers)).raise_for_status()
                    if counter.marked >= frames or counter.names.get("client_evicted", 0) > evicted_before:
                        break
                    await asyncio.sleep(SLOW_PAUSE_S * nbytes / SLOW_READ_BYTES)
            finally:
                await reads.aclose()
            evictions += counter.names.get("client_evicted", 0) > evicted_before
        await client.delete(f"{d.url}/session/{sid}", headers=d.headers)
    return {"frames": counter.marked, "evictions": evictions, "sseBytes": counter.bytes_received}


def slow_client(settings: Settings, total: int) -> dict[str, Any]:
    frame_bytes = 1 * MiB
    frames = frame_count(frame_bytes, total, 1 << 16)
    path = settings.workdir / f"slow-{total}.ndjson"
    write_stream(path, frame_bytes, frames)
    env = {"HOPLINE_SIDECAR_THRESHOLD_BYTES": "12mb"}  # the frames cross every hop whole
    warm_frames = 4
    warm = settings.workdir / "slow-warm.ndjson"
    write_stream(warm, frame_bytes, warm_frames)
    with daemon_driver.daemon(settings, daemon_driver.stream_agent(path), launch="serve", name="slow",
                              env=env) as d:
        # One small stream first: the baseline then holds what any session's first use loads.
        asyncio.run(asyncio.wait_for(_slow_reader(d, warm_frames, f"stream {warm}"), TIMEOUT_S))
        time.sleep(0.3)
        with RssSampler(d.pid, interval=0.005) as rss:
            started = time.perf_counter()
            out = asyncio.run(asyncio.wait_for(_slow_reader(d, frames), TIMEOUT_S))
            seconds = time.perf_counter() - started
    budget = Budget.from_env(env)
    bound = budget.journal_queue_max_bytes + budget.ring_max_bytes + budget.sse_queue_max_bytes
    return {"frameBytes": frame_bytes, "streamBytes": frames * frame_bytes, "seconds": seconds,
            "rssBaselineBytes": rss.baseline, "rssPeakBytes": rss.peak, "rssPeakGrowthBytes": rss.growth,
            "boundBytes": bound, **out}


def run(settings: Settings) -> BenchResult:
    result = BenchResult("scaling")
    if (missing := daemon_driver.available()) is not None:
        result.notes.append(f"not measured: {missing}")
        return result
    scale = scaling(settings)
    result.figures["scaling"] = scale
    one, many = scale["one"], scale["many"]
    say(f"  1 KiB frames, {one['framesPerSession']} per session: 1 session {one['eventsPerSecond']:,.0f} "
        f"events/s; {SESSIONS} at once {many['eventsPerSecond']:,.0f} events/s (x{scale['scaling']:.2f}, "
        f"{many['evictions']} evictions); daemon RSS {scale['rssPerSessionBytes'] / MiB:.2f} MiB per session "
        f"(baseline {scale['rssBaselineBytes'] / MiB:.0f} MiB)")
    result.notes.append(f"{SESSIONS} sessions at once against one: events/s ratio {scale['scaling']:.2f} "
                        "(no target; the SSE readers are one Python process too)")
    fair = fair_share(settings)
    result.figures["fairShare"] = fair
    during, quiet = fair["duringFlood"], fair["quiet"]
    say(f"  fair shares: another session's prompt round trip while one floods {fair['floodUpdates']:,} tiny "
        f"updates: p50 {during['p50Ms']:.1f} ms, p99 {during['p99Ms']:.1f} ms "
        f"over {during['prompts']} prompts "
        f"(no flood: p50 {quiet['p50Ms']:.1f} ms, p99 {quiet['p99Ms']:.1f} ms)")
    result.verdicts.append(Verdict("another session's prompt round trip p50 during a 300,000-update flood",
                                   during["p50Ms"], FAIR_P50_TARGET_MS, False, unit="ms",
                                   note=f"p99 {during['p99Ms']:.0f} ms; without the flood p50 "
                                        f"{quiet['p50Ms']:.1f} ms"))
    # 64 MiB is the stream; 256 MiB shows whether the growth follows the stream's length.
    totals = settings.pick((16 * MiB, 64 * MiB, 256 * MiB), (16 * MiB,))
    runs = [slow_client(settings, total) for total in totals]
    result.figures["slowClient"] = runs
    rate = SLOW_READ_BYTES / SLOW_PAUSE_S / 1e6
    for slow in runs:
        say(f"  slow client (~{rate:.0f} MB/s), {slow['streamBytes'] // MiB} MiB of 1 MiB frames: "
            f"{slow['seconds']:.1f} s, {slow['evictions']} evictions and resumes; daemon RSS growth "
            f"{slow['rssPeakGrowthBytes'] / MiB:.1f} MiB (journal queue + ring + subscriber queue = "
            f"{slow['boundBytes'] / MiB:.0f} MiB)")
    judged = next((r for r in runs if r["streamBytes"] == 64 * MiB), runs[-1])
    note = "; ".join(f"{r['rssPeakGrowthBytes'] / MiB:.1f} MiB over a {r['streamBytes'] // MiB} MiB stream"
                     for r in runs)
    name = (f"slow client, {judged['streamBytes'] // MiB} MiB stream: daemon RSS growth "
            "/ (journal queue + ring + SSE queue)")
    result.verdicts.append(Verdict(name, judged["rssPeakGrowthBytes"] / judged["boundBytes"], 1.0, False,
                                   note=note))
    return result
