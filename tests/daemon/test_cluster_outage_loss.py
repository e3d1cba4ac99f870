"""A store outage past the retry window while a turn streams, with a reader on each of two daemons
(issue #27 item 3, SPEC T-1): what the owner could not store is said to every reader on every daemon.
The owner's reader hears of each refused event in a ``frame_dropped`` (naming the id it leaves as a
gap); the turn then ends with the storage ``turn_error`` (``refusedEvents``, ``degraded``), which is
journaled once the store is back,
so the other daemon's reader gets it too, with the same count. Every event either reached both
readers, once each, or is one of those gaps."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from services import PostgresCluster

from .test_cluster import CLUSTER_TOKEN, Stream, two_daemons
from .test_storage_faults_e2e import _env

pytestmark = pytest.mark.e2e


def _turn_end(prompt_id: str) -> Any:  # either end of the turn (test_cluster.ends names one kind)
    return lambda e: e.type in ("turn_complete", "turn_error") and e.data.get("promptId") == prompt_id


async def test_an_outage_past_the_retry_window_is_counted_to_every_reader_on_every_daemon(
        tmp_path: Path, postgres_cluster: PostgresCluster, pg_url: str) -> None:
    env = {**_env(tmp_path), "HOPLINE_STORE_URL": pg_url, "HOPLINE_CLUSTER_TOKEN": CLUSTER_TOKEN,
           "HOPLINE_WARM_CHILDREN": "0", "HOPLINE_STORE_OUTAGE_RETRY_SECONDS": "1",
           # the outage stays within the lease: past lease x (1 - margin) the owner steps down and
           # ends the turn owner_stepped_down instead (test_cluster_partition covers that)
           "HOPLINE_OWNER_LEASE_SECONDS": "60"}
    with two_daemons(tmp_path, env) as (owner, other):
        async with owner.client(timeout=60) as client:
            session_id = (await client.post("/session", json={})).json()["sessionId"]
            here, there = Stream(owner, session_id), Stream(other, session_id)
            try:
                for stream in (here, there):
                    await stream.wait_for(lambda e: e.type == "replay_complete")
                accepted = await client.post(f"/session/{session_id}/prompt",
                                             json={"text": "paced 400 64 20"})
                assert accepted.status_code == 202, accepted.text
                prompt_id = accepted.json()["promptId"]
                await there.wait_for(lambda e: e.type == "session_update"
                                     and e.data.get("promptId") == prompt_id)
                await asyncio.to_thread(postgres_cluster.stop_server)
                try:  # the fault: an outage past the commit's retry window, the agent still writing
                    await here.wait_for(lambda e: e.type == "frame_dropped", timeout=60)
                finally:
                    await asyncio.to_thread(postgres_cluster.start_server)
                ends = [await stream.wait_for(_turn_end(prompt_id), timeout=120) for stream in (here, there)]
                dropped = [e for e in here.events if e.type == "frame_dropped"]
                assert dropped and {e.data["reason"] for e in dropped} == {"journal_write_failed"}
                for end in ends:
                    assert (end.type, end.data["reason"]) == ("turn_error", "storage")
                    assert end.data["degraded"]
                    assert end.data["refusedEvents"] == len(dropped)
                assert ends[0].id == ends[1].id  # the one journaled end, on both daemons
                updates = [[e.id for e in stream.events
                            if e.type == "session_update" and e.data.get("promptId") == prompt_id]
                           for stream in (here, there)]
                assert updates[0] == updates[1]  # what was stored reached both readers, once each
                # Each refused event's id is a gap: the owner's reader is told which, the other
                # daemon's reader how many (the turn's refusedEvents); no other id is missing.
                lost = {e.data["eventId"] for e in dropped}
                for stream in (here, there):
                    gaps = set(range(1, stream.ids[-1] + 1)) - set(stream.ids)
                    assert gaps == lost and stream.ids == sorted(set(stream.ids))
                    assert "client_evicted" not in [e.type for e in stream.events]
            finally:
                for stream in (here, there):
                    await stream.close()
