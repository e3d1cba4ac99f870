"""The replay ring (daemon/bus/ring.py): a session's last events in mappings of its own, bounded by
count and SSE bytes (at the limit and one over), the newest always kept, events read back whole
(id, type, bytes), a large event kept as it is, and every mapping handed back once its events are
evicted or the ring is closed."""

from __future__ import annotations

import orjson
import pytest

from hopline.daemon.bus import BusEvent
from hopline.daemon.bus.ring import BY_REFERENCE_BYTES, CHUNK_BYTES, Ring


def event(event_id: int, size: int = 10, event_type: str = "session_update") -> BusEvent:
    return BusEvent(event_id, event_type, orjson.dumps({"n": event_id, "pad": "x" * size}))


def test_events_come_back_whole_in_order_and_the_bounds_hold_at_the_limit() -> None:
    originals = [event(i, size=i % 300, event_type=("turn_complete", "session_update", "é")[i % 3])
                 for i in range(1, 101)]
    ring = Ring(max_events=100, max_bytes=1 << 30)
    ring.extend(originals)
    assert ring.count == 100 and ring.bytes == sum(e.size for e in originals)  # at the count limit: all kept
    back = [(e.id, e.type, e.data, e.size) for e in ring.events]
    assert back == [(e.id, e.type, e.data, e.size) for e in originals]
    ring.append(event(101))  # one over the count: the oldest goes
    assert ring.first_id == 2 and ring.last_id == 101 and ring.count == 100
    assert ring.covers(1, 101) and not ring.covers(0, 101) and not ring.covers(1, 102)
    assert [e.id for e in ring.between(50, 53)] == [51, 52, 53]


def test_the_byte_bound_at_the_limit_and_one_over_and_the_newest_is_always_kept() -> None:
    events = [event(1, 100), event(2, 100), event(3, 100)]
    total = sum(e.size for e in events)
    at_limit, one_over = Ring(max_events=10, max_bytes=total), Ring(max_events=10, max_bytes=total - 1)
    for ring in (at_limit, one_over):
        ring.extend(events)
    assert [e.id for e in at_limit.events] == [1, 2, 3] and at_limit.bytes == total
    assert [e.id for e in one_over.events] == [2, 3] and one_over.bytes == total - events[0].size
    huge = event(4, 10 * total)
    one_over.append(huge)  # larger than the whole bound: kept alone
    assert [e.id for e in one_over.events] == [4] and one_over.count == 1


def test_a_large_event_is_kept_as_it_is_and_mappings_go_with_their_events() -> None:
    ring = Ring(max_events=100_000, max_bytes=1 << 40)
    large = event(1, BY_REFERENCE_BYTES)
    ring.append(large)
    assert ring.events[0] is large  # not copied
    small = [event(i, 1000) for i in range(2, 2 + 3 * CHUNK_BYTES // 1000)]  # about three mappings
    ring.extend(small)
    chunks = list(ring._chunks)
    assert len(chunks) >= 4 and all(c.map is not None for c in chunks[1:])
    ring.max_events = len(small) // 2
    ring.append(event(10**6, 1000))
    assert chunks[0].map is None and chunks[1].map is None  # evicted whole: handed back
    assert ring.first_id == len(small) // 2 + 3 and ring.count == len(small) // 2
    kept = ring.events
    assert [e.id for e in kept] == [*range(ring.first_id, 2 + len(small)), 10**6]
    ring.close()
    assert all(c.map is None for c in chunks) and ring.events == [] and ring.first_id is None


@pytest.mark.parametrize("size", [0, CHUNK_BYTES - 200, BY_REFERENCE_BYTES - 100])
def test_events_at_a_mappings_edge_read_back_whole(size: int) -> None:
    ring = Ring(max_events=1000, max_bytes=1 << 40)
    originals = [event(i, size) for i in range(1, 6)]
    ring.extend(originals)
    assert [e.data for e in ring.events] == [e.data for e in originals]
