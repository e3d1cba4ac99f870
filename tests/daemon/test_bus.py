"""EventBus and journal on a real SQLite file: bounds at the limit and one over, journal first.

The bus delivers once the journal's writer thread has committed: ``publish`` returns at once and
:meth:`EventBus.flushed` waits for the delivery (``_publish`` below does both)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from hopline.budget import Budget
from hopline.daemon.bus import BusEvent, EventBus, Subscriber, wire_size
from hopline.store.sqlite_journal import SqliteJournal

MakeBus = Callable[..., Any]


@pytest.fixture
async def make_bus(tmp_path: Path) -> AsyncIterator[MakeBus]:
    journals: list[SqliteJournal] = []

    async def make(**changes: int) -> EventBus:
        budget = Budget.defaults().replace(**changes) if changes else Budget.defaults()
        journal = SqliteJournal(tmp_path)
        journals.append(journal)
        await journal.create_session("s1", {})
        return EventBus(budget, journal)

    yield make
    for journal in journals:
        await journal.close()


async def _publish(bus: EventBus, session_id: str, event_type: str, data: dict[str, Any]) -> BusEvent | None:
    event = bus.publish(session_id, event_type, data)
    await bus.flushed()
    return event


def _drain(sub: Subscriber) -> list[str]:
    types = []
    while (event := sub.pop_nowait()) is not None:
        types.append(event.type)
    return types


async def _replayed(bus: EventBus, after: int, upto: int) -> list[int | None]:
    return [e.id async for page in bus.replay("s1", after, upto) for e in page]


async def test_event_is_journaled_with_its_id_before_subscribers_see_it(make_bus: MakeBus,
                                                                         tmp_path: Path) -> None:
    bus = await make_bus()
    sub, upto = await bus.subscribe("s1", 16)
    assert upto == 0
    for i in range(3):
        bus.publish("s1", "session_update", {"n": i})
    assert sub.queued == 0  # staged and handed to the writer, not yet committed: not delivered
    await bus.flushed()
    offered = sub.drain()
    assert [e.id for e in offered] == [1, 2, 3]
    # a second journal on the same file (a restarted daemon) reads the same events, as delivered
    again = SqliteJournal(tmp_path)
    rows = await again.read_page("s1", 0, max_bytes=1 << 20)
    assert [(r.seq, r.data) for r in rows] == [(e.id, e.data) for e in offered]
    assert [orjson.loads(r.data)["n"] for r in rows] == [0, 1, 2]
    assert await again.last_id("s1") == 3
    await again.close()


async def test_count_bound_warns_at_75_percent_and_evicts_one_past_the_limit(make_bus: MakeBus) -> None:
    bus = await make_bus()
    sub, _ = await bus.subscribe("s1", 16)
    for i in range(11):
        await _publish(bus, "s1", "e", {"i": i})
    assert not sub.warned  # 11 < 12 = 75 % of 16
    await _publish(bus, "s1", "e", {"i": 11})
    assert sub.warned and not sub.evicted
    for i in range(12, 16):
        await _publish(bus, "s1", "e", {"i": i})
    assert sub.queued == 16 and not sub.evicted  # exactly at the limit: kept
    await _publish(bus, "s1", "e", {"i": 16})  # one over: evicted
    assert sub.evicted and sub.queued == 0
    types = _drain(sub)
    assert types == ["slow_client_warning", "client_evicted"]
    assert bus.subscriber_count("s1") == 0
    # the journal still has everything: a reconnect replays it
    assert await _replayed(bus, 0, 17) == list(range(1, 18))


async def test_byte_bound_and_empty_queue_accepts_one_large_event(make_bus: MakeBus) -> None:
    bus = await make_bus(sse_queue_max_bytes=4096)
    sub, _ = await bus.subscribe("s1", 2048)
    big = "z" * 10_000
    await _publish(bus, "s1", "e", {"head": 1})
    # behind the head, the byte bound is exact: an event that brings the waiting bytes to the
    # limit is kept, one byte more evicts
    event_overhead = wire_size(3, "e", len(b'{"p":""}'))
    at_limit = "p" * (4096 - event_overhead)
    await _publish(bus, "s1", "e", {"p": at_limit})
    assert not sub.evicted and sub.warned
    await _publish(bus, "s1", "e", {"p": ""})
    assert sub.evicted
    sub, _ = await bus.subscribe("s1", 2048)  # larger than the whole queue byte budget
    await _publish(bus, "s1", "e", {"big": big})
    assert not sub.evicted and sub.queued == 1
    assert _drain(sub)[-1] == "e"
    await _publish(bus, "s1", "e", {"big": big})  # in delivery at the head: does not count
    await _publish(bus, "s1", "e", {"small": 1})
    assert not sub.evicted
    await _publish(bus, "s1", "e", {"big": big})  # waiting behind the head: over the byte bound, evicts
    assert sub.evicted


async def test_ring_bounds_and_replay_beyond_the_ring_reads_the_journal(make_bus: MakeBus) -> None:
    bus = await make_bus(ring_max_events=5)
    for i in range(12):
        await _publish(bus, "s1", "e", {"i": i})
    ring = bus._ring("s1")
    assert [e.id for e in ring.events] == [8, 9, 10, 11, 12]
    assert ring.covers(7, 12) and not ring.covers(6, 12)
    assert not ring.covers(9, 13)  # 13 committed and not yet delivered: from the journal
    assert await _replayed(bus, 9, 12) == [10, 11, 12]
    assert await _replayed(bus, 2, 12) == list(range(3, 13))


async def test_oversize_event_is_never_emitted(make_bus: MakeBus) -> None:
    bus = await make_bus(sse_max_event_bytes=2048, client_sse_max_event_bytes=2048,
                         sidecar_threshold_bytes=1024)
    sub, _ = await bus.subscribe("s1", 16)
    assert await _publish(bus, "s1", "turn_error", {"message": "m" * 4096}) is None
    event = sub.pop_nowait()
    assert event is not None and event.type == "frame_dropped" and event.id is None
    data = orjson.loads(event.data)
    assert data["limit"] == 2048 and data["bytes"] > 4096 and data["reason"] == "sse_max_event_bytes"
    assert data["observed"] > 4096 and data["unit"] == "bytes"
    assert data["setting"] == "HOPLINE_SSE_MAX_EVENT_BYTES"
    assert await bus.journal.last_id("s1") == 0


async def test_sse_event_limit_is_exact_on_the_wire(make_bus: MakeBus) -> None:
    limit = 2048
    bus = await make_bus(sse_max_event_bytes=limit, client_sse_max_event_bytes=limit,
                         sidecar_threshold_bytes=1024)
    sub, _ = await bus.subscribe("s1", 16)
    fill = limit - wire_size(1, "e", len(b'{"f":""}'))
    event = await _publish(bus, "s1", "e", {"f": "f" * fill})
    assert event is not None and len(event.wire) == limit == event.size
    assert await _publish(bus, "s1", "e", {"f": "f" * (fill + 1)}) is None  # one byte over: not emitted
    assert [e.type for e in iter(sub.pop_nowait, None)] == ["e", "frame_dropped"]


async def test_a_subscriber_registered_while_a_commit_settles_gets_each_event_once(make_bus: MakeBus) -> None:
    # The subscriber is registered before the last id is read: an event committed meanwhile is
    # queued and then dropped from the queue because the replay covers it.
    bus = await make_bus()
    bus.publish("s1", "e", {"i": 1})
    subscribing = bus.subscribe("s1", 16)
    sub, upto = await subscribing
    await bus.flushed()
    live = [e.id for e in iter(sub.pop_nowait, None)]
    replayed = await _replayed(bus, 0, upto)
    assert sorted(replayed + live) == [1] and len(replayed + live) == 1


async def test_a_small_event_holds_its_own_size_in_memory(make_bus: MakeBus) -> None:
    # orjson returns small documents in 8 KiB buffers; the ring and the queues keep events, so
    # the bus keeps exact copies (a ring's byte bound is then what it holds)
    import tracemalloc

    bus = await make_bus()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        events = [bus.publish("s1", "e", {"text": "x" * 1000}) for _ in range(200)]
        await bus.flushed()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert all(e is not None and len(e.data) == 1011 for e in events)
    assert held < 200 * 2048  # about 1 KiB an event (8 KiB each without the copy)


async def test_the_pipe_reader_waits_for_a_subscriber_past_half_its_queue(make_bus: MakeBus) -> None:
    bus = await make_bus(sse_catch_up_seconds=30.0)
    sub, _ = await bus.subscribe("s1", 16)
    for i in range(7):
        await _publish(bus, "s1", "e", {"i": i})
    assert bus.catch_up("s1") is None  # 7 of 16: under half, read on
    await _publish(bus, "s1", "e", {"i": 7})
    waiting = bus.catch_up("s1")  # 8 of 16: at half, the reader waits
    assert waiting is not None
    task = asyncio.ensure_future(waiting)
    await asyncio.sleep(0)
    assert not task.done()
    sub.pop_nowait()  # 7: below half again
    await asyncio.wait_for(task, 5)
    assert bus.catch_up("s1") is None


async def test_a_subscriber_that_does_not_catch_up_is_waited_for_a_bounded_time(make_bus: MakeBus) -> None:
    bus = await make_bus(sse_catch_up_seconds=0.01)
    sub, _ = await bus.subscribe("s1", 16)
    for i in range(8):
        await _publish(bus, "s1", "e", {"i": i})
    waiting = bus.catch_up("s1")
    assert waiting is not None
    await asyncio.wait_for(waiting, 5)  # done although nothing was read
    assert sub.half_full and not sub.evicted


# --- fair shares (SPEC T-6, issue #26) ------------------------------------------------------------

async def test_a_flooding_session_is_held_at_its_share_of_the_queue_and_another_is_not(
        make_bus: MakeBus) -> None:
    bus = await make_bus(journal_queue_max_events=8)
    await bus.journal.create_session("s2", {})
    await bus.subscribe("s1", 64)
    await bus.subscribe("s2", 64)  # two sessions compete: a share is 8 // 2 = 4 events
    with bus.batch():
        for i in range(5):
            bus.publish("s1", "e", {"i": i})
    held = bus.backpressure("s1")
    assert held is not None  # 5 queued: over its share of 4
    assert bus.backpressure() is None  # while the queue as a whole is within its 8
    with bus.batch():
        for i in range(4):
            bus.publish("s2", "e", {"i": i})
    assert bus.backpressure("s2") is None  # 4: at its share, read on (the queue holds 9 now)
    await bus.flushed()
    assert held.done() and bus.backpressure("s1") is None  # committed and delivered: room again


async def test_while_others_compete_a_share_is_at_most_its_ceiling_exactly(make_bus: MakeBus) -> None:
    bus = await make_bus(journal_queue_max_events=64, journal_queue_share_max_events=3)
    with bus.batch():
        for i in range(5):
            bus.publish("s1", "e", {"i": i})
    assert bus.backpressure("s1") is None  # alone: the whole queue is its share (5 of 64)
    await bus.flushed()
    await bus.journal.create_session("s2", {})
    await bus.subscribe("s2", 64)  # now another competes: the share is min(64 // 2, 3) = 3
    with bus.batch():
        for i in range(3):
            bus.publish("s1", "e", {"i": i})
    assert bus.backpressure("s1") is None  # at the ceiling: read on
    with bus.batch():
        bus.publish("s1", "e", {"i": 3})
    held = bus.backpressure("s1")
    assert held is not None  # one event over
    assert bus.backpressure("s2") is None  # the other is not held
    await bus.flushed()
    assert held.done() and bus.backpressure("s1") is None



# --- another daemon's events (SPEC X, issue #27 item 6) ----------------------------------------------

async def test_a_non_owners_catch_up_is_paced_to_a_subscriber_that_keeps_reading(make_bus: MakeBus) -> None:
    owner = await make_bus()
    reader_bus = EventBus(Budget.defaults(), owner.journal)  # the non-owner (owns() is False)
    sub, _ = await reader_bus.subscribe("s1", 16)  # a queue of 16: one page of 400 would evict it
    total = 400
    with owner.batch():
        for i in range(total):
            owner.publish("s1", "e", {"i": i})
    await owner.flushed()  # committed by "the owner": events the non-owner has not delivered
    received: list[int] = []

    async def read() -> None:  # one event per turn of the loop: slower than a page, but reading
        while len(received) < total and not sub.evicted:
            event = await sub.next(5.0)
            if event is None:
                return
            received.append(orjson.loads(event.data)["i"])

    reader = asyncio.ensure_future(read())
    reader_bus.on_remote_commit("s1", total)
    await asyncio.wait_for(reader, 30)
    assert not sub.evicted and reader_bus.evictions == 0
    assert received == list(range(total))


# --- a commit's runs of one session's events, offered together (issue #30) --------------------------


async def test_one_commits_run_pauses_where_a_woken_subscriber_is_half_full(make_bus: MakeBus) -> None:
    bus = await make_bus()
    sub, _ = await bus.subscribe("s1", 16)
    waiting = asyncio.ensure_future(sub.next(30))  # a stream waiting for its next event
    await asyncio.sleep(0)
    with bus.batch():
        for i in range(12):
            bus.publish("s1", "e", {"i": i})
    commit = bus._queue.last()
    assert commit is not None and commit.committed is not None
    await commit.committed  # resumed right after its first delivery turn (its callback came first)
    # the first delivery turn stops at 8 of 16 (half), woken: the stream runs before the other 4
    assert sub.queued == 8 and not waiting.done()
    assert [e.id for e in bus._ring("s1").events] == list(range(1, 9))
    first = await waiting
    assert first is not None and first.id == 1
    await bus.flushed()
    assert [e.id for e in sub.drain()] == list(range(2, 13))
    assert [e.id for e in bus._ring("s1").events] == list(range(1, 13))


async def test_runs_of_two_sessions_reach_each_subscriber_in_order(make_bus: MakeBus) -> None:
    bus = await make_bus()
    await bus.journal.create_session("s2", {})
    a, _ = await bus.subscribe("s1", 1000)
    b, _ = await bus.subscribe("s1", 1000)  # two subscribers: event by event
    c, _ = await bus.subscribe("s2", 1000)  # one: its runs at once
    with bus.batch():
        for i in range(5):
            bus.publish("s1", "e", {"i": i})
        bus.publish_synthetic("s2", "note", {"n": 0})
        for i in range(3):
            bus.publish("s2", "e", {"i": i})
        bus.publish("s1", "e", {"i": 5})
        bus.publish("s2", "e", {"i": 3})
    await bus.flushed()
    s1 = [(e.type, e.id) for e in a.drain()]
    assert s1 == [(e.type, e.id) for e in b.drain()] == [("e", i) for i in range(1, 7)]
    assert [(e.type, e.id) for e in c.drain()] == [("note", None)] + [("e", i) for i in range(1, 5)]
    assert [e.id for e in bus._ring("s2").events] == [1, 2, 3, 4]  # a synthetic event is not ringed


async def test_a_subscriber_evicted_inside_a_run_takes_nothing_more_and_the_ring_everything(
        make_bus: MakeBus) -> None:
    bus = await make_bus()
    sub, _ = await bus.subscribe("s1", 4)  # nobody reads it: its stream is never woken
    with bus.batch():
        for i in range(10):
            bus.publish("s1", "e", {"i": i})
    await bus.flushed()
    assert sub.evicted and sub.queued == 0 and bus.subscriber_count("s1") == 0
    evicted = sub.drain()
    assert [e.type for e in evicted] == ["slow_client_warning", "client_evicted"]
    assert orjson.loads(evicted[-1].data)["droppedEvents"] == 5  # 4 queued and the 5th, over
    assert [e.id for e in bus._ring("s1").events] == list(range(1, 11))


async def test_drain_gives_what_pop_nowait_would_in_its_order(make_bus: MakeBus) -> None:
    bus = await make_bus()
    one, _ = await bus.subscribe("s1", 8)
    other, _ = await bus.subscribe("s1", 8)
    for i in range(7):  # the 6th passes 75 %: a warning, before the queue in both
        await _publish(bus, "s1", "e", {"i": i})
    popped = []
    while (event := one.pop_nowait()) is not None:
        popped.append((event.type, event.id))
    drained = other.drain()
    assert [(e.type, e.id) for e in drained] == popped
    assert popped[0][0] == "slow_client_warning" and len(popped) == 8
    assert other.queued == 0 and other.queued_bytes == 0 and not other.warned
