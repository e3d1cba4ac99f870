"""Fair shares (SPEC T-6, issue #26): one session floods 300,000 tiny updates through one daemon
(``hopline serve``) while another sends prompts one after the other; the other's prompt round trip
(``POST /prompt`` to its ``turn_complete`` on its SSE stream) is measured, p50 and p99, against the
same round trip with no flood. Target: p50 under 50 ms during the flood.

The flood's reader is a client process of its own, as another user's would be: read in this
process, its 300,000 SSE events would hold this event loop, and the round trips measured here would
be this client's own delay, not the daemon's."""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import statistics
import time
from typing import Any

import httpx

from bench import daemon_driver
from bench.common import HOST, Settings
from bench.frames import write_stream
from bench.sse_client import SseCounter, stream_sse

FLOOD_FRAME_BYTES = 200  # a tiny agent_message_chunk line
TIMEOUT_S = 300.0
FAIR_P50_TARGET_MS = 50.0
FLOOD_UNDER_WAY_EVENTS = 1000


async def _round_trips(client: httpx.AsyncClient, d: daemon_driver.Daemon, sid: str, text: str,
                       until: asyncio.Event | None, most: int) -> list[float]:
    """Prompts one after the other on ``sid``; each one's time to its turn_complete."""
    counter = SseCounter(b"turn_complete")
    reads = stream_sse(HOST, d.port, f"/session/{sid}/events", counter.feed_from, dict(d.headers))
    times: list[float] = []
    try:
        while not counter.names.get("replay_complete"):
            await anext(reads)
        done = counter.names.get("turn_complete", 0)
        while len(times) < most and (until is None or not until.is_set()):
            started = time.perf_counter()
            accepted = await client.post(f"{d.url}/session/{sid}/prompt", json={"text": text},
                                         headers=d.headers)
            accepted.raise_for_status()
            while counter.names.get("turn_complete", 0) <= done:
                await anext(reads)
            done = counter.names["turn_complete"]
            times.append(time.perf_counter() - started)
    finally:
        await reads.aclose()
    return times


def _flood_client(d: daemon_driver.Daemon, session_id: str, frames: int, text: str) -> dict[str, Any]:
    """The flooding session's own client (another process): prompt it and read all its events."""
    async def read() -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=httpx.Timeout(TIMEOUT_S, connect=10.0)) as client:
            return await daemon_driver.stream_prompt(client, d, session_id, frames, text=text)
    return asyncio.run(read())


async def _flood_under_way(client: httpx.AsyncClient, d: daemon_driver.Daemon, session_id: str,
                           flooding: asyncio.Future[Any]) -> None:
    """Return once the flood's events are being journaled (its client has started and prompted)."""
    deadline = time.monotonic() + TIMEOUT_S
    while not flooding.done() and time.monotonic() < deadline:
        status = (await client.get(f"{d.url}/daemon/status", headers=d.headers)).json()
        last = {s["sessionId"]: s.get("lastEventId") or 0 for s in status["sessions"]}
        if last.get(session_id, 0) > FLOOD_UNDER_WAY_EVENTS:
            return
        await asyncio.sleep(0.01)
    raise RuntimeError("the flood did not start")


def _quantiles(times: list[float]) -> dict[str, Any]:
    ordered = sorted(times)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"prompts": len(times), "p50Ms": statistics.median(ordered) * 1000, "p99Ms": p99 * 1000,
            "maxMs": ordered[-1] * 1000}


async def _measure(d: daemon_driver.Daemon, flood_path: str, ping_path: str, floods: int) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=16)
    async with httpx.AsyncClient(timeout=httpx.Timeout(TIMEOUT_S, connect=10.0), limits=limits) as client:
        flooder = await daemon_driver.create_session(client, d)
        other = await daemon_driver.create_session(client, d)
        quiet = await _round_trips(client, d, other, f"stream {ping_path}", None, 50)
        flood_done = asyncio.Event()
        spawn = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn) as pool:
            flooding = asyncio.get_running_loop().run_in_executor(
                pool, _flood_client, d, flooder, floods, f"stream {flood_path}")
            flooding.add_done_callback(lambda _: flood_done.set())
            await _flood_under_way(client, d, flooder, flooding)
            during = await _round_trips(client, d, other, f"stream {ping_path}", flood_done, 100_000)
            flooded = await flooding
        for sid in (flooder, other):
            await client.delete(f"{d.url}/session/{sid}", headers=d.headers)
    return {"floodUpdates": floods, "floodSeconds": flooded["seconds"], "quiet": _quantiles(quiet),
            "duringFlood": _quantiles(during) if during else None}


def fair_share(settings: Settings) -> dict[str, Any]:
    floods = settings.pick(300_000, 60_000)
    flood_path = settings.workdir / f"flood-{floods}.ndjson"
    ping_path = settings.workdir / "ping-1.ndjson"
    write_stream(flood_path, FLOOD_FRAME_BYTES, floods)
    write_stream(ping_path, FLOOD_FRAME_BYTES, 1)
    with daemon_driver.daemon(settings, daemon_driver.stream_agent(ping_path), launch="serve", name="fair",
                              env={"HOPLINE_WARM_CHILDREN": "0"}) as d:
        return asyncio.run(asyncio.wait_for(_measure(d, str(flood_path), str(ping_path), floods), TIMEOUT_S))
