"""Benchmark 6: ``POST /session`` with the warm pool (D-9) against without, for a slow-start agent.

The agent is ``bench/stream_agent.py`` with ``STREAM_AGENT_START_DELAY`` (1 s here, 0.5 s with
``--quick``): an agent that loads a lot before it can answer ``initialize``, as qwen does. Two
``hopline serve`` daemons on the same agent command, ``HOPLINE_WARM_CHILDREN=1`` and ``=0``. For
each, sessions are created one at a time; before each ``POST /session`` the pool daemon is given
the time to refill (its ``/daemon/status`` shows a ready child), so every create measures the pool's
steady state, and the no-pool daemon measures a fresh spawn every time. The clock runs from the
request to the ``sessionId`` answer. Verdict: median with pool / median without (lower is better).

Then back to back (issue 28): a daemon with ``HOPLINE_WARM_CHILDREN=2`` takes 8 creates one right
after the other, never waiting for a refill; the pool refills as each child is taken, 2 starting at
once, and a create that finds none ready waits for a starting one. Verdict: the slowest of the 8
under 0.5 s, with the pool's misses (creates it could not serve) printed beside it.
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
BACK_TO_BACK_POOL = "2"
BACK_TO_BACK_CREATES = 8
BACK_TO_BACK_MAX_S = 0.5  # each of the back-to-back creates
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


async def _back_to_back(d: daemon_driver.Daemon, count: int) -> tuple[list[float], dict[str, Any]]:
    """``count`` creates one right after the other once the pool is full; their times and the pool."""
    times: list[float] = []
    async with httpx.AsyncClient(timeout=120) as client:
        deadline = time.monotonic() + REFILL_TIMEOUT_S
        while (await client.get(f"{d.url}/daemon/status", headers=d.headers)).json()[
                "warmChildren"]["ready"] < int(BACK_TO_BACK_POOL):
            if time.monotonic() > deadline:
                raise RuntimeError("the warm pool did not fill in time")
            await asyncio.sleep(POLL_S)
        for _ in range(count):
            start = time.perf_counter()
            await daemon_driver.create_session(client, d)
            times.append(time.perf_counter() - start)
        pool = (await client.get(f"{d.url}/daemon/status", headers=d.headers)).json()["warmChildren"]
    return times, pool


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
    _run_back_to_back(settings, result)
    return result


def _run_back_to_back(settings: Settings, result: BenchResult) -> None:
    """With `hopline agent` itself (its own start, seconds of imports): what a user of `hopline
    serve` sees."""
    agent = [daemon_driver.PYTHON, "-m", "hopline", "agent"]
    env = {"HOPLINE_WARM_CHILDREN": BACK_TO_BACK_POOL}
    with daemon_driver.daemon(settings, agent, env=env, name="warm-back-to-back") as d:
        times, pool = asyncio.run(_back_to_back(d, BACK_TO_BACK_CREATES))
    result.figures["backToBack"] = {"pool": int(BACK_TO_BACK_POOL), "creates": len(times),
                                    "seconds": times, "maxSeconds": max(times), "misses": pool.get("misses")}
    say(f"  back to back: {len(times)} creates, pool {BACK_TO_BACK_POOL}: max {max(times) * 1000:.1f} ms, "
        f"median {statistics.median(times) * 1000:.1f} ms, misses {pool.get('misses')}")
    name = f"slowest of {len(times)} back-to-back creates, pool of {BACK_TO_BACK_POOL}"
    result.verdicts.append(Verdict(name, max(times), BACK_TO_BACK_MAX_S, False, unit="s"))
