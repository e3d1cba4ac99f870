"""One SSE connection's queue (SPEC D-4): bounded by count (``maxQueued``) and by
``sse_queue_max_bytes``, a ``slow_client_warning`` at 75 %, eviction at 100 %; and the half-full
signal the bus paces delivery and the pipe readers by."""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Sequence

from hopline.budget import HOP_DAEMON_SSE
from hopline.daemon.bus.bus_event import BusEvent, synthetic
from hopline.vocabulary import CLIENT_EVICTED, SLOW_CLIENT_WARNING

log = logging.getLogger("hopline.daemon.bus")  # the bus's one logger name, whichever module logs

WARN_FRACTION = 0.75  # SPEC D-4: warn at 75 % of a subscriber's queue, evict at 100 %


class Subscriber:
    """One SSE connection's queue; the bus fills it, the connection drains it."""

    def __init__(self, session_id: str, max_events: int, max_bytes: int) -> None:
        self.session_id = session_id
        self.max_events = max_events
        self.max_bytes = max_bytes
        self._queue: collections.deque[BusEvent] = collections.deque()
        self._control: collections.deque[BusEvent] = collections.deque()  # synthetic, outside the bounds
        self.queued_bytes = 0
        self.warned = False
        self.evicted = False
        self.closed = False
        self._waiter: asyncio.Future[None] | None = None
        self.evicted_signal = asyncio.Event()
        self.after = 0  # events up to this id come from the replay, not the queue
        self._below_half: asyncio.Future[None] | None = None  # a pipe reader waiting for it

    def start_after(self, after: int) -> None:
        """Take only events with an id above ``after`` (those up to it are replayed); drop the
        ones queued before the id was known."""
        self.after = after
        if any(e.id is not None and e.id <= after for e in self._queue):
            self._queue = collections.deque(e for e in self._queue if e.id is None or e.id > after)
            self.queued_bytes = sum(e.size for e in self._queue)

    @property
    def queued(self) -> int:
        return len(self._queue)

    def offer(self, event: BusEvent) -> None:
        if self._take(event):
            self._wake()

    def offer_run(self, events: Sequence[tuple[str, BusEvent]], start: int, stop: int) -> tuple[int, bool]:
        """:meth:`offer` each event of ``events[start:stop]`` ((session, event) pairs) in turn, up
        to the first after which the queue is half full while its stream is woken (the bus lets
        the stream run before offering more). Return the index after the last event offered, and
        whether it stopped there for that reason."""
        for index in range(start, stop):
            if self._take(events[index][1]):
                self._wake()
                if self.half_full_and_woken:
                    return index + 1, True
            elif self.evicted or self.closed:
                return stop, False  # it takes nothing more
        return stop, False

    def _take(self, event: BusEvent) -> bool:
        """Queue ``event`` (True), or pass over it (False: an id the replay serves, the queue gone),
        or evict the subscriber (False) when it does not fit."""
        if self.evicted or self.closed or (event.id is not None and event.id <= self.after):
            return False
        # The head of the queue is the event in delivery: it does not count toward the byte bound,
        # so one large event never evicts a subscriber that keeps up (an empty queue accepts any
        # event). A subscriber holds at most max_bytes plus one event (<= sse_max_event_bytes).
        queue = self._queue
        if queue and (len(queue) + 1 > self.max_events
                      or self.queued_bytes - queue[0].size + event.size > self.max_bytes):
            self._evict(event)
            return False
        queue.append(event)
        self.queued_bytes += event.size
        if not self.warned:
            waiting = self.queued_bytes - queue[0].size
            if len(queue) >= WARN_FRACTION * self.max_events or waiting >= WARN_FRACTION * self.max_bytes:
                self.warned = True
                self._control.append(synthetic(SLOW_CLIENT_WARNING, {
                    "queuedEvents": len(queue), "maxQueuedEvents": self.max_events,
                    "queuedBytes": waiting, "maxQueuedBytes": self.max_bytes,
                    "lastQueuedEventId": event.id}))
        return True

    def _evict(self, event: BusEvent) -> None:
        dropped = len(self._queue)
        first_dropped = self._queue[0].id if self._queue else event.id
        self._queue.clear()
        self.queued_bytes = 0
        self.evicted = True
        self.evicted_signal.set()
        self._check_below_half()
        self._control.append(synthetic(CLIENT_EVICTED, {
            "reason": "subscriber queue full", "hop": HOP_DAEMON_SSE,
            "maxQueuedEvents": self.max_events, "maxQueuedBytes": self.max_bytes,
            "droppedEvents": dropped + 1, "resumeAfterEventId": (first_dropped or 1) - 1,
            "message": "reconnect with Last-Event-ID to resume"}))
        self._wake()
        log.warning("sse subscriber evicted", extra={"maxQueuedEvents": self.max_events,
                                                      "maxQueuedBytes": self.max_bytes})

    @property
    def half_full(self) -> bool:
        """Half of either bound reached (the head, in delivery, not counted toward the bytes)."""
        if not self._queue or self.evicted or self.closed:
            return False
        waiting = self.queued_bytes - self._queue[0].size
        return len(self._queue) * 2 >= self.max_events or waiting * 2 >= self.max_bytes

    @property
    def half_full_and_woken(self) -> bool:
        """Half full while its stream has been woken and not yet run."""
        waiter = self._waiter
        return waiter is not None and waiter.done() and self.half_full

    def below_half(self) -> asyncio.Future[None]:
        """A future resolved once the queue is below half of both bounds (or gone)."""
        if self._below_half is None or self._below_half.done():
            self._below_half = asyncio.get_running_loop().create_future()
            if not self.half_full:
                self._below_half.set_result(None)
        return self._below_half

    def _check_below_half(self) -> None:
        below = self._below_half
        if below is not None and not below.done() and not self.half_full:
            below.set_result(None)

    def close(self) -> None:
        self.closed = True
        self._check_below_half()
        self._wake()

    def pop_nowait(self) -> BusEvent | None:
        """The next event: control events (warning, eviction) first, in their order."""
        if self._control:
            return self._control.popleft()
        if self._queue:
            event = self._queue.popleft()
            self.queued_bytes -= event.size
            if not self._queue:
                self.warned = False
            if self._below_half is not None:
                self._check_below_half()
            return event
        return None

    def drain(self) -> list[BusEvent]:
        """Every event :meth:`pop_nowait` would give now, in its order, taken at once."""
        out = list(self._control)
        self._control.clear()
        if self._queue:
            out += self._queue
            self._queue.clear()
            self.queued_bytes = 0
            self.warned = False
            if self._below_half is not None:
                self._check_below_half()
        return out

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def next(self, timeout: float) -> BusEvent | None:
        """The next event, or None after ``timeout`` seconds without one (or when closed).

        A bare future rather than ``wait_for(BusEvent.wait())``: the waiting stream resumes one loop
        iteration after an offer, so it keeps up with a relay that yields once per frame."""
        event = self.pop_nowait()
        if event is not None or self.closed:
            return event
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(timeout, self._wake)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None
        return self.pop_nowait()

