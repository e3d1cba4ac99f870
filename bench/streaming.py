"""Benchmark 6: streaming end to end (SPEC G-5) — the relay's added latency per streamed character.

The strict OpenAI-compatible server of the tests (``tests/strict_openai.py``) runs in this process
and streams a fixed reply in word deltas, paced (a think time before the first delta, then a pause
between deltas longer than the relay needs, so deltas never queue and each one measures latency,
not throughput). ``hopline serve`` runs as a user starts it, with ``HOPLINE_PROVIDER=openai``
pointed at it: provider SSE -> gateway (embedded) NDJSON -> ``hopline agent`` (HttpModel, tool loop)
-> ACP pipe -> daemon (journal, bus) -> SSE -> the Python SDK (``DaemonClient.events``) here.

Both ends are timed with this process's ``time.perf_counter()``: the server notes when each text
delta was flushed to its socket, the client when the matching ``agent_message_chunk`` event was
parsed. Figures: time to the first streamed character at the client against the provider's time to
its first delta (both from the prompt's POST), and the added latency of every delta (median, p90,
max). Targets: the median added latency per delta <= 10 ms, and as many chunks at the client as
deltas sent (each delta relayed on its own, none buffered into a later one). A second phase
streams a burst (no pause between deltas) to show the relay's rate: chunks per second at the
client and how long after the provider's last delta the last chunk arrives (not a verdict).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from typing import Any

from bench.common import PYTHON, REPO_ROOT, BenchResult, Settings, Verdict, say
from bench.daemon_driver import daemon

TARGET_ADDED_MS = 10.0
THINK_SECONDS = 0.2  # the fake model's time to its first delta
PAUSE_SECONDS = 0.04  # between two deltas
REPLY_WORDS = 24
BURST_WORDS = 2000


def _reply(words_count: int) -> str:
    words = ["relay", "latency", "of", "one", "streamed", "delta", "through", "every", "hop"]
    return " ".join(words[i % len(words)] for i in range(words_count)) + "."


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


async def _prompts(url: str, token: str, server: Any, count: int) -> list[dict[str, Any]]:
    from hopline.client import DaemonClient

    runs: list[dict[str, Any]] = []
    async with DaemonClient(url, token) as client:
        session_id = await client.create_session(cwd=str(REPO_ROOT), permission_mode="auto")
        for _ in range(count):
            arrived: list[float] = []
            posted = 0.0
            prompt_id: str | None = None
            before = len(server.text_delta_at)
            events = client.events(session_id, last_event_id=None)
            try:
                async for event in events:
                    if event.type == "replay_complete" and prompt_id is None:
                        posted = time.perf_counter()
                        prompt_id = await client.prompt(session_id, "gate this change")
                    elif event.update_kind == "agent_message_chunk" and event.prompt_id == prompt_id:
                        arrived.append(time.perf_counter())
                    elif event.is_turn_end and event.prompt_id == prompt_id:
                        if event.type != "turn_complete":
                            raise RuntimeError(f"the turn failed: {event.data}")
                        break
            finally:
                await events.aclose()
            [written] = server.text_delta_at[before:]
            runs.append({"posted": posted, "written": list(written), "arrived": arrived})
        await client.delete_session(session_id)
    return runs


def run(settings: Settings) -> BenchResult:
    result = BenchResult("streaming")
    sys.path.insert(0, str(REPO_ROOT / "tests"))
    from strict_openai import Reply, StrictOpenAI

    count = settings.pick(12, 4)
    with StrictOpenAI() as server:
        server.reply = Reply(_reply(REPLY_WORDS), [])
        server.first_delta_delay = THINK_SECONDS
        server.delta_delay = PAUSE_SECONDS
        env = {"HOPLINE_PROVIDER": "openai", "OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "sk-bench",
               "HOPLINE_MODEL": "bench-model"}
        with daemon(settings, [PYTHON, "-m", "hopline", "agent"], env=env, name="streaming") as d:
            runs = asyncio.run(asyncio.wait_for(_prompts(d.url, d.token, server, count), 300))
            server.reply = Reply(_reply(settings.pick(BURST_WORDS, BURST_WORDS // 4)), [])
            server.delta_delay = 0.0
            [burst] = asyncio.run(asyncio.wait_for(_prompts(d.url, d.token, server, 1), 300))
    first_provider = [(r["written"][0] - r["posted"]) * 1e3 for r in runs]
    first_client = [(r["arrived"][0] - r["posted"]) * 1e3 for r in runs]
    added = [(a - w) * 1e3 for r in runs for w, a in zip(r["written"], r["arrived"], strict=False)]
    sent = sum(len(r["written"]) for r in [*runs, burst])
    received = sum(len(r["arrived"]) for r in [*runs, burst])
    first_added = [c - p for c, p in zip(first_client, first_provider, strict=True)]
    say(f"  {count} prompts x {len(runs[0]['written'])} deltas; think {THINK_SECONDS * 1e3:.0f} ms, "
        f"pause {PAUSE_SECONDS * 1e3:.0f} ms")
    say(f"  time to first delta at the provider: median {statistics.median(first_provider):.1f} ms "
        f"(from the prompt's POST: daemon -> agent -> gateway -> provider, plus the think time)")
    say(f"  time to first character at the client: median {statistics.median(first_client):.1f} ms; "
        f"added by the relay: median {statistics.median(first_added):.1f} ms")
    say(f"  added latency per delta ({len(added)} deltas): median {statistics.median(added):.1f} ms, "
        f"p90 {_percentile(added, 0.9):.1f} ms, max {max(added):.1f} ms; chunks {received} of {sent} deltas")
    burst_seconds = burst["arrived"][-1] - burst["arrived"][0]
    burst_rate = (len(burst["arrived"]) - 1) / burst_seconds if burst_seconds > 0 else float("inf")
    burst_lag = (burst["arrived"][-1] - burst["written"][-1]) * 1e3
    provider_rate = (len(burst["written"]) - 1) / max(1e-9, burst["written"][-1] - burst["written"][0])
    say(f"  burst of {len(burst['written'])} deltas: provider {provider_rate:.0f} deltas/s, client "
        f"{burst_rate:.0f} chunks/s; last chunk {burst_lag:.0f} ms after the provider's last delta; "
        f"chunks {len(burst['arrived'])} of {len(burst['written'])}")
    result.figures = {
        "burstDeltas": len(burst["written"]), "burstChunks": len(burst["arrived"]),
        "burstProviderDeltasPerSecond": provider_rate, "burstClientChunksPerSecond": burst_rate,
        "burstLastChunkLagMs": burst_lag,
        "prompts": count, "deltasPerPrompt": len(runs[0]["written"]), "thinkMs": THINK_SECONDS * 1e3,
        "pauseMs": PAUSE_SECONDS * 1e3,
        "providerFirstDeltaMsMedian": statistics.median(first_provider),
        "clientFirstCharMsMedian": statistics.median(first_client),
        "firstCharAddedMsMedian": statistics.median(first_added),
        "addedMsMedian": statistics.median(added), "addedMsP90": _percentile(added, 0.9),
        "addedMsMax": max(added), "deltasSent": sent, "chunksReceived": received,
    }
    result.verdicts.append(Verdict("relay-added latency per streamed delta, median", statistics.median(added),
                                   TARGET_ADDED_MS, False, unit=" ms",
                                   note=f"first character: +{statistics.median(first_added):.1f} ms over the "
                                        "provider's first delta"))
    result.verdicts.append(Verdict("chunks at the client / deltas sent", received / sent if sent else None,
                                   1.0, True, unit="", note=f"{received} of {sent}"))
    result.notes.append("both clocks are this process's perf_counter: the provider runs in-process, the "
                        "client is the SDK; the daemon and its agent are separate processes")
    return result
