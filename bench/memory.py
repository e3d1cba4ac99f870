"""Benchmark: the daemon's memory stays flat over many prompts (SPEC T-12).

A daemon (``bench/daemon_server.py``, the app ``hopline serve`` runs) with the echo agent
(``bench/stream_agent.py``: a prompt ``echo TEXT`` answers one chunk) and 8 sessions, driven by the
Python SDK as a client would: one event stream per session, each prompt posted (with its
Idempotency-Key) and its turn's end awaited on the stream. 1,000 warm-up prompts, a probe, 20,000
more, a probe, every session deleted, a probe. A probe is SIGUSR1 to the daemon: it collects
garbage and writes its RSS and, when tracing, tracemalloc's figures (``--memory-probe``).

Two daemons, one after the other: one traced by ``tracemalloc`` from its start (its traced total,
and the allocation sites that grew since the warm-up, the first thing to read when the target is
missed), one untraced for the RSS (tracemalloc's own tables would count in it).

Targets: the traced total after the deletes within 1 MiB of the warm-up's, and RSS growth, warm-up
to the end, under 50 bytes per prompt.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sysconfig
import time
from pathlib import Path
from typing import Any

from bench import daemon_driver
from bench.common import REPO_ROOT, BenchResult, Settings, Verdict, say

SESSIONS = 8
TRACED_TARGET_BYTES = 1024 * 1024  # the traced total after the deletes, within this of the warm-up's
RSS_TARGET_BYTES_PER_PROMPT = 50.0
PROBE_TIMEOUT_S = 60.0
TURN_TIMEOUT_S = 60.0


def _probe(pid: int, path: Path) -> dict[str, Any]:
    """SIGUSR1 to the daemon; its next line in ``path``."""
    before = path.read_text().count("\n") if path.exists() else 0
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + PROBE_TIMEOUT_S
    while time.monotonic() < deadline:
        lines = path.read_text().splitlines() if path.exists() else []
        if len(lines) > before:
            line: dict[str, Any] = json.loads(lines[before])
            return line
        time.sleep(0.1)
    raise RuntimeError("the daemon did not answer its memory probe")


async def _prompts(client: Any, session_id: str, count: int, stream: Any) -> None:
    for number in range(count):
        prompt_id = await client.prompt(session_id, f"echo {number} of {session_id[:8]}")
        while True:
            event = await asyncio.wait_for(stream.__anext__(), TURN_TIMEOUT_S)
            if event.is_turn_end and event.prompt_id == prompt_id:
                if event.type != "turn_complete":
                    raise RuntimeError(f"a turn ended with {event.type}: {event.data}")
                break


async def _drive(d: daemon_driver.Daemon, probes: Path, warm_up: int, more: int) -> dict[str, Any]:
    from hopline.client import DaemonClient

    async with DaemonClient(d.url, d.token) as client:
        sessions = [await client.create_session(cwd=str(REPO_ROOT)) for _ in range(SESSIONS)]
        streams = [client.events(sid, last_event_id=0) for sid in sessions]

        async def run(total: int) -> float:
            started = time.perf_counter()
            share = total // SESSIONS
            await asyncio.gather(*(_prompts(client, sid, share, stream)
                                   for sid, stream in zip(sessions, streams, strict=True)))
            return time.perf_counter() - started

        warm_seconds = await run(warm_up)
        warm = await asyncio.to_thread(_probe, d.pid, probes)
        seconds = await run(more)
        loaded = await asyncio.to_thread(_probe, d.pid, probes)
        for stream in streams:
            await stream.aclose()
        for sid in sessions:
            await client.delete_session(sid)
    # the client's connections closed: nothing of it is held in the daemon any more
    deleted = await asyncio.to_thread(_probe, d.pid, probes)
    return {"warm": warm, "loaded": loaded, "deleted": deleted, "warmUpSeconds": warm_seconds,
            "seconds": seconds}


def _one_daemon(settings: Settings, *, traced: bool, warm_up: int, more: int) -> dict[str, Any]:
    stream = settings.workdir / "memory-empty.ndjson"
    stream.write_bytes(b"")
    probes = settings.workdir / f"memory-probes-{'traced' if traced else 'rss'}.jsonl"
    extra = ("--memory-probe", str(probes), *(("--tracemalloc",) if traced else ()))
    env = {"HOPLINE_WARM_CHILDREN": "0"}
    with daemon_driver.daemon(settings, daemon_driver.stream_agent(stream), launch="bench", env=env,
                              extra_args=extra, name=f"memory-{'traced' if traced else 'rss'}") as d:
        return asyncio.run(_drive(d, probes, warm_up, more))


_PLACES = ((str(REPO_ROOT) + "/", ""), (sysconfig.get_paths()["purelib"] + "/", "<site-packages>/"),
           (sysconfig.get_paths()["stdlib"] + "/", "<stdlib>/"))


def _site(where: list[str]) -> list[str]:
    """An allocation site's traceback, paths relative (no machine's directories in the results)."""
    lines = []
    for line in where:
        for prefix, short in _PLACES:
            line = line.replace(prefix, short)
        lines.append(re.sub(r'"/[^"]*/(site-packages|lib/python3\.\d+)/', r'"<\1>/', line))
    return lines


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


def run(settings: Settings) -> BenchResult:
    result = BenchResult("memory")
    missing = daemon_driver.available()
    if missing is not None:
        result.notes.append(f"not measured: {missing}")
        return result
    warm_up = settings.pick(1_000, 200)
    more = settings.pick(20_000, 2_000)
    traced = _one_daemon(settings, traced=True, warm_up=warm_up, more=more)
    untraced = _one_daemon(settings, traced=False, warm_up=warm_up, more=more)
    held = traced["deleted"]["traced"] - traced["warm"]["traced"]
    rss_growth = untraced["deleted"]["rss"] - untraced["warm"]["rss"]
    per_prompt = rss_growth / more
    say(f"  traced (tracemalloc): warm-up {_mib(traced['warm']['traced'])}, after {more} prompts "
        f"{_mib(traced['loaded']['traced'])}, sessions deleted {_mib(traced['deleted']['traced'])} "
        f"({held:+,} bytes)")
    say(f"  RSS (untraced daemon): warm-up {_mib(untraced['warm']['rss'])}, after {more} prompts "
        f"{_mib(untraced['loaded']['rss'])}, sessions deleted {_mib(untraced['deleted']['rss'])} "
        f"({per_prompt:+.1f} bytes per prompt); {more / untraced['seconds']:.0f} prompts/s")
    for site in traced["deleted"].get("grown", [])[:5]:
        say(f"    grown {site['bytes']:+,} bytes in {site['blocks']:+,} blocks at "
            f"{' <- '.join(reversed(site['where'][-3:]))[:300]}")
    result.figures.update({
        "sessions": SESSIONS, "warmUpPrompts": warm_up, "prompts": more,
        "traced": {key: traced[key]["traced"] for key in ("warm", "loaded", "deleted")},
        "tracedHeldBytes": held,
        "tracedGrownSites": [{**site, "where": _site(site["where"])}
                             for site in traced["deleted"].get("grown", [])[:10]],
        "rss": {key: untraced[key]["rss"] for key in ("warm", "loaded", "deleted")},
        "rssGrowthBytesPerPrompt": per_prompt,
        "rssLoadedGrowthBytesPerPrompt": (untraced["loaded"]["rss"] - untraced["warm"]["rss"]) / more,
        "promptsPerSecond": more / untraced["seconds"],
    })
    result.verdicts.append(Verdict(
        "tracemalloc's traced total after every session is deleted, minus the warm-up's", held,
        TRACED_TARGET_BYTES, False, unit=" B",
        note=f"{warm_up} warm-up prompts then {more}, {SESSIONS} sessions, echo agent"))
    result.verdicts.append(Verdict(
        "daemon RSS growth per prompt, warm-up to every session deleted", per_prompt,
        RSS_TARGET_BYTES_PER_PROMPT, False, unit=" B",
        note="an untraced daemon; growth over the 20,000 prompts after the warm-up"))
    return result
