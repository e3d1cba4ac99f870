"""A failover of the store (SPEC T-10, X): two daemons on a primary with a streaming replica, the
daemons' URL naming both (``target_session_attrs=read-write``). The primary is killed (SIGKILL)
mid-turn and the replica promoted.

With the replica lagging (its WAL held back by a proxy that keeps the sockets open), the promoted
store lacks events that both daemons' readers were given. What the daemons still hold (their
rings, kept small here) is written back under its own ids; only the rest is lost, and that loss is
told to every reader on every daemon (``frame_dropped`` naming the ids) and to a fresh reader of
either daemon, whose replays (from the store) agree; no id is given twice. With a synchronous
replica the same failover loses nothing and nothing needs writing back."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services import ReplicatedPostgres, postgres_bin_dir

from .support import SseEvent
from .test_cluster import CLUSTER_TOKEN, Stream, two_daemons
from .test_cluster_faults import until

pytestmark = pytest.mark.e2e

LEASE_SECONDS = 6
RING = 40  # events a daemon's ring holds: the older ones of the lost stretch are held by no daemon


@contextlib.contextmanager
def replicated(synchronous: bool) -> Iterator[ReplicatedPostgres]:
    bin_dir = postgres_bin_dir()
    if bin_dir is None:
        pytest.skip("PostgreSQL is not installed")
    store = ReplicatedPostgres(bin_dir, synchronous=synchronous)
    try:
        yield store.start()
    finally:
        store.stop()


def env_of(store: ReplicatedPostgres) -> dict[str, str]:
    return {"HOPLINE_STORE_URL": store.url, "HOPLINE_CLUSTER_TOKEN": CLUSTER_TOKEN,
            "HOPLINE_OWNER_LEASE_SECONDS": str(LEASE_SECONDS), "HOPLINE_WARM_CHILDREN": "0",
            "HOPLINE_RING_MAX_EVENTS": str(RING), "HOPLINE_STORE_OUTAGE_RETRY_SECONDS": "60"}


def by_id(events: list[SseEvent]) -> dict[int, bytes]:
    return {e.id: repr(e.data).encode() for e in events if e.id is not None}


def told_missing(events: list[SseEvent]) -> list[int]:
    """The ids a reader was told it will never get (each ``frame_dropped`` naming a run of them)."""
    dropped = [e.data["missingIds"] for e in events
               if e.type == "frame_dropped" and e.data.get("reason") == "lost_past_commit_point"]
    return sorted(i for run in dropped for i in range(run["first"], run["last"] + 1))


async def run_failover(tmp_path: Path, store: ReplicatedPostgres, *, lag: bool) -> dict[str, Any]:
    """A turn streaming on A, a reader on A and one on B; the store fails over mid-turn (after the
    replica fell behind, with ``lag``). What each reader and a fresh reader of each daemon saw."""
    with two_daemons(tmp_path, env_of(store)) as (a, b):
        async with a.client(timeout=60) as client_a, b.client(timeout=60) as client_b:
            sid = (await client_a.post("/session", json={"cwd": str(tmp_path)})).json()["sessionId"]
            here, there = Stream(a, sid), Stream(b, sid)
            try:
                turn = await client_a.post(f"/session/{sid}/prompt", json={"text": "paced 400 64 15"})
                assert turn.status_code == 202, turn.text
                prompt_id = turn.json()["promptId"]
                chunk = lambda n: lambda e: e.type == "session_update" and f"chunk {n} " in str(e.data)  # noqa: E731
                await there.wait_for(chunk(20))
                await until(store.caught_up, what="the replica caught up")
                if lag:
                    store.lag()  # from here the replica gets nothing
                await there.wait_for(chunk(140))  # both readers were given these; the replica has none
                await asyncio.to_thread(store.fail_over)
                # the turn's end: its own, or the owner's step-down's when the promotion took longer
                # than the owner's lease allows (T-11: it stops acting rather than risk two agents)
                ended = lambda e: e.type in ("turn_complete", "turn_error") and e.data.get("promptId") == prompt_id  # noqa: E731,E501
                ends = [await s.wait_for(ended, timeout=120) for s in (here, there)]
                await asyncio.sleep(LEASE_SECONDS)  # every daemon saw the new server, reconciled and settled
                whole = [(await c.get("/daemon/status")).json() for c in (client_a, client_b)]
                statuses = [status["cluster"] for status in whole]
                sessions = [s for status in whole for s in status["sessions"] if s["sessionId"] == sid]
                fresh = [Stream(d, sid, last_event_id=0) for d in (a, b)]
                try:
                    for stream in fresh:
                        await stream.wait_for(lambda e: e.type == "replay_complete", timeout=60)
                    return {"live": [here.events, there.events], "fresh": [s.events for s in fresh],
                            "ends": ends, "statuses": statuses, "sessions": sessions}
                finally:
                    for stream in fresh:
                        await stream.close()
            finally:
                await here.close()
                await there.close()


async def test_a_lagging_replica_failover_writes_back_what_daemons_hold_and_tells_the_rest(
        tmp_path: Path) -> None:
    with replicated(synchronous=False) as store:
        seen = await run_failover(tmp_path, store, lag=True)
    # Told to every reader: the live ones on both daemons, and a fresh one on each.
    told = [told_missing(events) for events in seen["live"] + seen["fresh"]]
    assert told[0] and all(ids == told[0] for ids in told), told  # the same ids, to every reader
    assert len(set(told[0])) == len(told[0])  # each once
    lost = set(told[0])
    # What the daemons held (their rings) was written back: fewer lost than the replica missed.
    assert sum(s["failover"]["writtenBack"] for s in seen["statuses"]) > 0
    assert 0 < len(lost) < 120
    # Counted on the session where its daemon runs it (the owner, or an adopter after a step-down).
    assert max(s["lostEvents"] for s in seen["sessions"]) == len(lost), seen["sessions"]
    # The two fresh replays (from the store) are the same history; every id once, or told lost.
    replays = [by_id(events) for events in seen["fresh"]]
    assert replays[0] == replays[1]
    last = max(replays[0])
    assert set(replays[0]) | lost == set(range(1, last + 1)) and not set(replays[0]) & lost
    # No id was given twice: what a reader was given under an id is what the store holds under it.
    for events in seen["live"]:
        given = by_id(events)
        for event_id, data in given.items():
            assert replays[0].get(event_id, data) == data, f"id {event_id} names other content"


async def test_a_synchronous_replica_failover_loses_nothing(tmp_path: Path) -> None:
    with replicated(synchronous=True) as store:
        seen = await run_failover(tmp_path, store, lag=False)
    for events in seen["live"] + seen["fresh"]:
        assert not [e for e in events if e.type == "frame_dropped"], "a synchronous replica lost events"
    for status in seen["statuses"]:
        assert status["failover"]["writtenBack"] == 0 and status["failover"]["lostEvents"] == 0
    assert all(s["lostEvents"] == 0 for s in seen["sessions"])
    replays = [by_id(events) for events in seen["fresh"]]
    assert replays[0] == replays[1] and set(replays[0]) == set(range(1, max(replays[0]) + 1))
    for events in seen["live"]:  # everything a reader was given is in the promoted store, unchanged
        assert by_id(events).items() <= replays[0].items()
