"""``Subscriber.offer_run`` (a commit's run of one session's events, issue #30) is ``offer`` event by
event: the same queue, warning, eviction and bytes, and it stops exactly where the bus's per-event
delivery paused (the queue half full while its stream is woken). Hypothesis draws the runs."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from hopline.daemon.bus import BusEvent, Subscriber

# (id or None for a synthetic event, data bytes)
events_strategy = st.lists(st.tuples(st.one_of(st.none(), st.integers(1, 60)), st.integers(0, 300)),
                           max_size=40)


def _subscriber(loop: asyncio.AbstractEventLoop, max_events: int, max_bytes: int, after: int,
                prefill: int, waiting: bool) -> Subscriber:
    subscriber = Subscriber("s1", max_events, max_bytes)
    subscriber.after = after
    for n in range(prefill):
        subscriber.offer(BusEvent(100 + n, "e", b"p" * 10))
    if waiting:  # its stream waits for the next event (SseStream's next())
        subscriber._waiter = loop.create_future()
    return subscriber


def _state(subscriber: Subscriber) -> tuple[object, ...]:
    return ([(e.id, e.type, e.data) for e in subscriber._queue],
            [(e.type, e.data) for e in subscriber._control],
            subscriber.queued_bytes, subscriber.warned, subscriber.evicted,
            subscriber._waiter is not None and subscriber._waiter.done())


@settings(max_examples=300, deadline=None)
@given(drawn=events_strategy, max_events=st.integers(1, 12), max_bytes=st.integers(50, 2000),
       after=st.integers(0, 20), prefill=st.integers(0, 3), waiting=st.booleans(), closed=st.booleans())
def test_offer_run_is_offer_event_by_event_and_stops_where_delivery_paused(
        drawn: list[tuple[int | None, int]], max_events: int, max_bytes: int, after: int, prefill: int,
        waiting: bool, closed: bool) -> None:
    loop = asyncio.new_event_loop()
    try:
        events = [("s1", BusEvent(event_id, "e", b"d" * size)) for event_id, size in drawn]
        one_by_one = _subscriber(loop, max_events, max_bytes, after, prefill, waiting)
        at_once = _subscriber(loop, max_events, max_bytes, after, prefill, waiting)
        if closed:
            one_by_one.closed = at_once.closed = True
        # the reference: EventBus._deliver per event, pausing after the first that leaves the
        # queue half full while its stream is woken (nothing more once it is evicted)
        stop, paused = len(events), False
        for index, (_, event) in enumerate(events):
            one_by_one.offer(event)
            if one_by_one.evicted:
                break
            if one_by_one.half_full_and_woken:
                stop, paused = index + 1, True
                break
        offered, stopped = at_once.offer_run(events, 0, len(events))
        assert _state(at_once) == _state(one_by_one)
        assert stopped == paused
        if paused:
            assert offered == stop
        else:
            assert offered == len(events)  # evicted or closed: the rest is the ring's alone
    finally:
        loop.close()
