"""Benchmark 6: ``POST /session`` with the warm pool (D-9) against without, for a slow-start agent.

The agent is ``bench/stream_agent.py`` with ``STREAM_AGENT_START_DELAY`` (1 s here, 0.5 s with
``--quick``): an agent that loads a lot before it can answer ``initialize``, as qwen does. Two
``hopline serve`` daemons on the same agent command, ``HOPLINE_WARM_CHILDREN=1`` and ``=0``. For
each, sessions are created one at a time; before each ``POST /session`` the pool daemon is given
the time to refill (its ``/daemon/status`` shows a ready child), so every create measures the pool's
steady state, and the no-pool daemon measures a fresh spawn every time. The clock runs from the
request to the ``sessionId`` answer. Verdict: median with pool / median without (lower is better).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import httpx

from bench import daemon_driver
from bench.common import BenchResult, Settings, Verdict, say

TARGET_RATIO = 0.25  # with the pool, POST /session costs at most a quarter of a cold start
POLL_S = 0.05
REFILL_TIMEOUT_S = 60.0


async def _wait_ready(client: httpx.AsyncClient, d: daemon_driver.Daemon) -> None:
    deadline = time.monotonic() + REFILL_TIMEOUT_S
    while time.monotonic() < deadline:
        status = (await client.get(f"{d.url}/daemon/status", headers=d.headers)).json()
        if (status.get("warmChildren") or {}).get("ready", 0) >= 1:
            return
        await asyncio.sleep(POLL_S)
    raise RuntimeError("the warm pool did not refill in time")


async def _creates(d: daemon_driver.Daemon, count: int, pooled: bool) -> list[float]:
    times: list[float] = []
    async with httpx.AsyncClient(timeout=120) as client:
        for _ in range(count):
            if pooled:
                await _wait_ready(client, d)
            start = time.perf_counter()
            await daemon_driver.create_session(client, d)
            times.append(time.perf_counter() - start)
    return times


def run(settings: Settings) -> BenchResult:
    result = BenchResult("warm_pool")
    missing = daemon_driver.available()
    if missing is not None:
        result.notes.append(f"not measured: {missing}")
        result.verdicts.append(Verdict("POST /session with pool / without", None, TARGET_RATIO, False))
        return result
    delay = settings.pick(1.0, 0.5)
    count = settings.pick(8, 4)
    stream = settings.workdir / "warm-pool-empty.ndjson"
    stream.write_bytes(b"")
    agent = daemon_driver.stream_agent(stream)
    figures: dict[str, Any] = {"agentStartDelaySeconds": delay, "sessions": count}
    for name, warm in (("withPool", "1"), ("withoutPool", "0")):
        # The agent's delay reaches it only by name: a child's environment is an allow-list (D-11).
        env = {"HOPLINE_WARM_CHILDREN": warm, "STREAM_AGENT_START_DELAY": str(delay),
               "HOPLINE_AGENT_ENV": "STREAM_AGENT_START_DELAY"}
        with daemon_driver.daemon(settings, agent, env=env, name=f"warm-{warm}") as d:
            times = asyncio.run(_creates(d, count, pooled=warm != "0"))
        figures[name] = {"medianSeconds": statistics.median(times), "minSeconds": min(times),
                         "maxSeconds": max(times)}
        say(f"  {name:>12}: POST /session median {statistics.median(times) * 1000:8.1f} ms "
            f"(min {min(times) * 1000:.1f}, max {max(times) * 1000:.1f}, {count} sessions)")
    ratio = figures["withPool"]["medianSeconds"] / figures["withoutPool"]["medianSeconds"]
    figures["ratio"] = ratio
    result.figures.update(figures)
    result.verdicts.append(Verdict("POST /session with pool / without (slow-start agent)", ratio,
                                   TARGET_RATIO, False))
    result.notes.append(f"agent start delay {delay} s; the pool daemon refills between creates "
                        "(steady state), the other spawns and initializes a child per create")
    return result
