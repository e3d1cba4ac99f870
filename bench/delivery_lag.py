"""Delivery lag (issue #27): how long an agent's output takes to reach a reader, owner or not.

Each session's agent (``bench/stream_agent.py``, a ``paced COUNT MS`` prompt) emits ``COUNT``
``agent_message_chunk`` frames ``MS`` apart, each carrying the wall time it was written to the pipe
(``t=<ns>``). A reader (:class:`hopline.client.DaemonClient`, which resumes on eviction) subscribed
to a daemon, the session's owner or another daemon on the same store, notes when each frame
arrives: lag = arrival - stamp, one machine, one clock. All sessions run at once."""

from __future__ import annotations

import asyncio
import re
import statistics
import time
from typing import Any

from bench import daemon_driver
from hopline.client import DaemonClient

STAMP = re.compile(r"t=(\d+)")


async def _read(reader: DaemonClient, session_id: str, count: int, lags: list[float],
                ready: asyncio.Event) -> int:
    """Lags of the session's paced frames as ``reader`` sees them; the evictions it resumed from."""
    seen = evictions = 0
    stream = reader.events(session_id, last_event_id=0)
    try:
        async for event in stream:
            ready.set()
            if event.type == "client_evicted":
                evictions += 1
                continue
            match = STAMP.search(str(event.data)) if event.type == "session_update" else None
            if match is not None:
                lags.append(time.time() - int(match.group(1)) / 1e9)
                seen += 1
                if seen >= count:
                    break
    finally:
        await stream.aclose()
    return evictions


async def measure(owner: daemon_driver.Daemon, reader_at: daemon_driver.Daemon, *, sessions: int,
                  count: int, pace_ms: float) -> dict[str, Any]:
    """p50/p99 lag (ms) of ``sessions`` paced streams owned by ``owner``, read at ``reader_at``."""
    lags: list[float] = []
    async with DaemonClient(owner.url, owner.token) as writer, \
            DaemonClient(reader_at.url, reader_at.token) as reader:
        ids = [await writer.create_session() for _ in range(sessions)]
        readies = [asyncio.Event() for _ in ids]
        readers = [asyncio.create_task(_read(reader, sid, count, lags, ready))
                   for sid, ready in zip(ids, readies, strict=True)]
        await asyncio.wait_for(asyncio.gather(*(ready.wait() for ready in readies)), 60)
        for sid in ids:
            await writer.prompt(sid, f"paced {count} {pace_ms}")
        evictions = await asyncio.wait_for(asyncio.gather(*readers), 60 + count * pace_ms / 1000 * 4)
        reconnects = reader.reconnects
    ms = sorted(lag * 1000 for lag in lags)
    return {"sessions": sessions, "events": count, "paceMs": pace_ms, "received": len(ms),
            "p50Ms": statistics.median(ms), "p99Ms": ms[min(len(ms) - 1, int(len(ms) * 0.99))],
            "evictions": sum(evictions), "readerReconnects": reconnects}
