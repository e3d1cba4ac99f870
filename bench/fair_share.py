"""Fair shares (SPEC T-6, issue #26): one session floods 300,000 tiny updates through one daemon
(``hopline serve``) while another sends prompts one after the other; the other's prompt round trip
(``POST /prompt`` to its ``turn_complete`` on its SSE stream) is measured, p50 and p99, against the
same round trip with no flood. Target: p50 under 50 ms during the flood."""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import httpx

from bench import daemon_driver
from bench.common import HOST, Settings
from bench.frames import write_stream
from bench.sse_client import SseCounter, stream_body

FLOOD_FRAME_BYTES = 200  # a tiny agent_message_chunk line
TIMEOUT_S = 300.0
FAIR_P50_TARGET_MS = 50.0


async def _round_trips(client: httpx.AsyncClient, d: daemon_driver.Daemon, sid: str, text: str,
                       until: asyncio.Event | None, most: int) -> list[float]:
    """Prompts one after the other on ``sid``; each one's time to its turn_complete."""
    counter = SseCounter(b"turn_complete")
    body = stream_body(HOST, d.port, f"/session/{sid}/events", dict(d.headers))
    times: list[float] = []
    try:
        chunks = aiter(body)
        while not counter.names.get("replay_complete"):
            counter.feed(await anext(chunks))
        done = counter.names.get("turn_complete", 0)
        while len(times) < most and (until is None or not until.is_set()):
            started = time.perf_counter()
            accepted = await client.post(f"{d.url}/session/{sid}/prompt", json={"text": text},
                                         headers=d.headers)
            accepted.raise_for_status()
            while counter.names.get("turn_complete", 0) <= done:
                counter.feed(await anext(chunks))
            done = counter.names["turn_complete"]
            times.append(time.perf_counter() - started)
    finally:
        await body.aclose()
    return times


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

        async def flood() -> dict[str, Any]:
            try:
                return await daemon_driver.stream_prompt(client, d, flooder, floods,
                                                         text=f"stream {flood_path}")
            finally:
                flood_done.set()

        flooding = asyncio.create_task(flood())
        await asyncio.sleep(0.2)  # the flood is under way (its reader subscribed, the child writing)
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
