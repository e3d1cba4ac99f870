"""EventBus and journal on a real SQLite file: bounds at the limit and one over, journal first."""

from __future__ import annotations

from pathlib import Path

import orjson

from hopline.budget import Budget
from hopline.daemon.bus import EventBus, Subscriber, wire_size
from hopline.daemon.journal import Journal


def _bus(tmp_path: Path, **changes: int) -> EventBus:
    budget = Budget.defaults().replace(**changes) if changes else Budget.defaults()
    journal = Journal(tmp_path)
    journal.create_session("s1", {})
    return EventBus(budget, journal)


def _drain(sub: Subscriber) -> list[str]:
    types = []
    while (event := sub.pop_nowait()) is not None:
        types.append(event.type)
    return types


def test_event_is_journaled_with_its_id_before_subscribers_see_it(tmp_path: Path) -> None:
    bus = _bus(tmp_path)
    sub, upto = bus.subscribe("s1", 16)
    assert upto == 0
    seen_in_journal: list[int] = []
    original_offer = sub.offer

    def offer(event):  # type: ignore[no-untyped-def]
        seen_in_journal.append(bus.journal.last_id("s1"))
        rows = bus.journal.read_page("s1", 0, max_bytes=1 << 20)
        assert rows[-1].seq == event.id and rows[-1].data == event.data
        original_offer(event)

    sub.offer = offer  # type: ignore[method-assign]
    for i in range(3):
        bus.publish("s1", "session_update", {"n": i})
    assert seen_in_journal == [1, 2, 3]
    # a second journal on the same file (a restarted daemon) reads the same events
    again = Journal(tmp_path)
    assert [orjson.loads(r.data)["n"] for r in again.read_page("s1", 0, max_bytes=1 << 20)] == [0, 1, 2]
    assert again.last_id("s1") == 3


def test_count_bound_warns_at_75_percent_and_evicts_one_past_the_limit(tmp_path: Path) -> None:
    bus = _bus(tmp_path)
    sub, _ = bus.subscribe("s1", 16)
    for i in range(11):
        bus.publish("s1", "e", {"i": i})
    assert not sub.warned  # 11 < 12 = 75 % of 16
    bus.publish("s1", "e", {"i": 11})
    assert sub.warned and not sub.evicted
    for i in range(12, 16):
        bus.publish("s1", "e", {"i": i})
    assert sub.queued == 16 and not sub.evicted  # exactly at the limit: kept
    bus.publish("s1", "e", {"i": 16})  # one over: evicted
    assert sub.evicted and sub.queued == 0
    types = _drain(sub)
    assert types == ["slow_client_warning", "client_evicted"]
    assert bus.subscriber_count("s1") == 0
    # the journal still has everything: a reconnect replays it
    pages = list(bus.replay("s1", 0, 17))
    assert [e.id for page in pages for e in page] == list(range(1, 18))


def test_byte_bound_and_empty_queue_accepts_one_large_event(tmp_path: Path) -> None:
    bus = _bus(tmp_path, sse_queue_max_bytes=4096)
    sub, _ = bus.subscribe("s1", 2048)
    big = "z" * 10_000
    bus.publish("s1", "e", {"head": 1})
    # behind the head, the byte bound is exact: an event that brings the waiting bytes to the
    # limit is kept, one byte more evicts
    event_overhead = wire_size(3, "e", len(b'{"p":""}'))
    at_limit = "p" * (4096 - event_overhead)
    bus.publish("s1", "e", {"p": at_limit})
    assert not sub.evicted and sub.warned
    bus.publish("s1", "e", {"p": ""})
    assert sub.evicted
    sub, _ = bus.subscribe("s1", 2048)  # larger than the whole queue byte budget
    bus.publish("s1", "e", {"big": big})
    assert not sub.evicted and sub.queued == 1
    assert _drain(sub)[-1] == "e"
    bus.publish("s1", "e", {"big": big})  # in delivery at the head: does not count
    bus.publish("s1", "e", {"small": 1})
    assert not sub.evicted
    bus.publish("s1", "e", {"big": big})  # waiting behind the head: over the byte bound, evicts
    assert sub.evicted


def test_ring_bounds_and_replay_beyond_the_ring_reads_the_journal(tmp_path: Path) -> None:
    bus = _bus(tmp_path, ring_max_events=5)
    for i in range(12):
        bus.publish("s1", "e", {"i": i})
    ring = bus._ring("s1")
    assert [e.id for e in ring.events] == [8, 9, 10, 11, 12]
    assert ring.covers(7) and not ring.covers(6)
    from_ring = [e.id for page in bus.replay("s1", 9, 12) for e in page]
    from_journal = [e.id for page in bus.replay("s1", 2, 12) for e in page]
    assert from_ring == [10, 11, 12]
    assert from_journal == list(range(3, 13))


def test_oversize_event_is_never_emitted(tmp_path: Path) -> None:
    bus = _bus(tmp_path, sse_max_event_bytes=2048, client_sse_max_event_bytes=2048,
               sidecar_threshold_bytes=1024)
    sub, _ = bus.subscribe("s1", 16)
    assert bus.publish("s1", "turn_error", {"message": "m" * 4096}) is None
    event = sub.pop_nowait()
    assert event is not None and event.type == "frame_dropped" and event.id is None
    data = orjson.loads(event.data)
    assert data["limitBytes"] == 2048 and data["bytes"] > 4096 and data["reason"] == "sse_max_event_bytes"
    assert bus.journal.last_id("s1") == 0


def test_sse_event_limit_is_exact_on_the_wire(tmp_path: Path) -> None:
    limit = 2048
    bus = _bus(tmp_path, sse_max_event_bytes=limit, client_sse_max_event_bytes=limit,
               sidecar_threshold_bytes=1024)
    sub, _ = bus.subscribe("s1", 16)
    fill = limit - wire_size(1, "e", len(b'{"f":""}'))
    event = bus.publish("s1", "e", {"f": "f" * fill})
    assert event is not None and len(event.wire) == limit == event.size
    assert bus.publish("s1", "e", {"f": "f" * (fill + 1)}) is None  # one byte over: not emitted
    assert [e.type for e in iter(sub.pop_nowait, None)] == ["e", "frame_dropped"]
