"""The event bus (SPEC D-3..D-5): journal, per-session ring, per-subscriber bounded queues.

One bus over any :class:`~hopline.store.journal.EventJournal`. ``publish`` stages the event in the
journal (which gives it its id) and hands it to the journal's writer; once its commit resolves, the
bus appends it to the session's ring (bounded by ``ring_max_events`` and ``ring_max_bytes``) and
offers it to every subscriber. A subscriber's queue is bounded by count (``maxQueued``, the only
client knob) and by ``sse_queue_max_bytes`` (not client-settable); an empty queue always accepts one
event, so a single large event is still delivered (more generally the event at the head of the
queue, the one in delivery, does not count toward the byte bound). At 75 % of either bound the
subscriber gets a ``slow_client_warning``; an event that would pass 100 % evicts it: its queue is
dropped (memory is freed at once) and it gets ``client_evicted``, after which its stream ends and
the client reconnects with ``Last-Event-ID``. Nothing is lost: every event with an id is in the
journal.

A session's pipe reader also waits (:meth:`EventBus.catch_up`, at most ``sse_catch_up_seconds``
before each read) while one of the session's subscribers is past half its queue: a reader a little
slower than the agent is waited for, not evicted by the next burst; one that does not read is
evicted as its queue fills. Delivery of one commit pauses for a turn of the loop when a subscriber
whose stream is about to run is half full.

Synthetic events (no id, not journaled) go to the live subscribers only.

Inside :meth:`EventBus.batch` (a synchronous stretch, e.g. every frame of one pipe read) the events
are staged and handed to the writer together at its end (one commit). Commits are delivered in
the order they were made, each batch's events in publication order, synthetic ones in their place
(a synthetic event waits behind the commits before it). D-5 holds: nothing reaches the ring or a
subscriber before its commit. Publishing does not wait for the commit: the writer's queue (the
events handed to it and not yet committed) is bounded by ``journal_queue_max_events`` and
``journal_queue_max_bytes``, and :meth:`EventBus.backpressure` tells a pipe reader to stop
reading its child while the queue is past either bound. A commit that fails delivers none of its
events: each session hears of them in a synthetic ``frame_dropped`` (reason
``journal_write_failed``, sizes only), counted and logged.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import orjson

from hopline.budget import CEILINGS_BY_KEY, HOP_DAEMON_SSE, HOP_JOURNAL, Budget
from hopline.errors import HoplineError
from hopline.store.integrity import CorruptCount, corrupt_json
from hopline.store.journal import EventJournal, JournalRow
from hopline.vocabulary import CLIENT_EVICTED, DATA_CORRUPT, FRAME_DROPPED, SLOW_CLIENT_WARNING

log = logging.getLogger("hopline.daemon.bus")

WARN_FRACTION = 0.75  # SPEC D-4: warn at 75 % of a subscriber's queue, evict at 100 %


class JournalReadFailed(HoplineError):
    """Reading the journal failed (not a client's disconnect): the stream says so and ends."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"reading the journal failed ({type(cause).__name__})")
        self.exception = type(cause).__name__


class Event:
    """One SSE event; ``id`` is None for synthetic events. ``wire`` is the exact SSE bytes and
    ``size`` their length, computed once (the bounds read it several times per event). Treated
    as immutable: one event object is shared by the ring and every subscriber."""

    __slots__ = ("data", "id", "size", "type")

    def __init__(self, id: int | None, type: str, data: bytes) -> None:
        self.id = id
        self.type = type
        self.data = data  # the JSON of the event's data
        self.size = wire_size(id, type, len(data))

    def __repr__(self) -> str:
        return f"Event(id={self.id!r}, type={self.type!r}, {len(self.data)} bytes)"

    @property
    def wire(self) -> bytes:
        return b"".join(self.wire_parts())

    def wire_parts(self) -> tuple[bytes, bytes, bytes]:
        """The SSE bytes in three parts, ``data`` among them as is: several events are joined
        into one socket write without building each event's bytes first."""
        lines = _type_lines(self.type)
        return lines if self.id is None else b"id: %d\n%s" % (self.id, lines), self.data, b"\n\n"

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "type": self.type, "data": orjson.loads(self.data)}


@functools.lru_cache(maxsize=64)  # the event types (vocabulary), and a few more
def _type_lines(event_type: str) -> bytes:
    return b"event: " + event_type.encode() + b"\ndata: "


def wire_size(event_id: int | None, event_type: str, data_bytes: int) -> int:
    head = 0 if event_id is None else len(b"id: \n") + len(str(event_id))
    return head + len(_type_lines(event_type)) + len(b"\n\n") + data_bytes


# orjson (3.13) returns a small document in a buffer of at least 8 KiB (measured: 64 events of
# 1 KiB took 8 KiB of RSS each, (1 KiB when copied)): a ring of 8000 small events would hold 64 MiB
# while its byte bound says 8 MiB. Events kept past the call are copied to their exact size.
EXACT_COPY_BELOW_BYTES = 64 * 1024  # where the slack stops mattering (a measure, not a limit)


def exact_bytes(payload: bytes) -> bytes:
    """``payload`` in an allocation of its own size (a copy when it is small)."""
    return memoryview(payload).tobytes() if len(payload) < EXACT_COPY_BELOW_BYTES else payload


def synthetic(event_type: str, data: dict[str, Any]) -> Event:
    return Event(None, event_type, orjson.dumps(data))


class Subscriber:
    """One SSE connection's queue; the bus fills it, the connection drains it."""

    def __init__(self, session_id: str, max_events: int, max_bytes: int) -> None:
        self.session_id = session_id
        self.max_events = max_events
        self.max_bytes = max_bytes
        self._queue: collections.deque[Event] = collections.deque()
        self._control: collections.deque[Event] = collections.deque()  # synthetic, outside the bounds
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

    def offer(self, event: Event) -> None:
        if self.evicted or self.closed or (event.id is not None and event.id <= self.after):
            return
        # The head of the queue is the event in delivery: it does not count toward the byte bound,
        # so one large event never evicts a subscriber that keeps up (an empty queue accepts any
        # event). A subscriber holds at most max_bytes plus one event (<= sse_max_event_bytes).
        queue = self._queue
        if queue and (len(queue) + 1 > self.max_events
                      or self.queued_bytes - queue[0].size + event.size > self.max_bytes):
            self._evict(event)
            return
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
        self._wake()

    def _evict(self, event: Event) -> None:
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

    def pop_nowait(self) -> Event | None:
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

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def next(self, timeout: float) -> Event | None:
        """The next event, or None after ``timeout`` seconds without one (or when closed).

        A bare future rather than ``wait_for(Event.wait())``: the waiting stream resumes one loop
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


class _Ring:
    def __init__(self, max_events: int, max_bytes: int) -> None:
        self.events: collections.deque[Event] = collections.deque()
        self.bytes = 0
        self.max_events = max_events
        self.max_bytes = max_bytes

    def append(self, event: Event) -> None:
        self.events.append(event)
        self.bytes += event.size
        while len(self.events) > 1 and (len(self.events) > self.max_events or self.bytes > self.max_bytes):
            self.bytes -= self.events.popleft().size

    def covers(self, after: int, upto: int) -> bool:
        """True when the ring holds every event ``after < id <= upto`` (an event committed and not
        yet delivered is not in it yet: the journal has it)."""
        if not self.events:
            return False
        first, last = self.events[0].id, self.events[-1].id
        return first is not None and last is not None and first <= after + 1 and last >= upto


@dataclasses.dataclass(eq=False)
class _Commit:
    """Events handed to the journal together, delivered together once ``committed`` resolves
    (None: synthetic events only, delivered when the commits before them are)."""

    events: list[tuple[str, Event]]
    committed: asyncio.Future[None] | None
    journaled: int  # events with an id
    nbytes: int  # their data bytes
    delivered: asyncio.Future[None] | None = None  # made on demand by EventBus.flushed
    next_index: int = 0  # the first event not yet delivered (a commit may take several turns)
    # A write-ahead request's own event (publish_committed): refused, it is answered to the
    # requester (507/503) and was never accepted, so it is neither a loss nor a turn's fault.
    answered: bool = False


_AROUND_SCAN = 64  # commits looked at behind a held one (each is one pipe read or one publish)


def _ready(commit: _Commit) -> bool:
    return commit.committed is None or commit.committed.done()


class EventBus:
    def __init__(self, budget: Budget, journal: EventJournal) -> None:
        self.budget = budget
        self.journal = journal
        self._rings: dict[str, _Ring] = {}
        self._subscribers: dict[str, set[Subscriber]] = {}
        self.evictions = 0
        self.oversize_dropped = 0
        self.journal_failed = 0  # events whose commit failed (each one said to its session)
        # Called with the session of each event whose commit failed (the manager ends its turn, T-1).
        self.on_journal_failed: Callable[[str], None] = lambda _session_id: None
        self.corrupt = CorruptCount()  # damaged events met on reads (T-3), for /daemon/status
        self._batch: list[tuple[str, Event]] | None = None  # (session id, event), in publication order
        self._commits: collections.deque[_Commit] = collections.deque()  # in commit order
        self.queued_events = 0  # handed to the journal, not yet committed
        self.queued_bytes = 0
        self._room: asyncio.Future[None] | None = None
        # The queue's share of each session with events in it: [events, bytes] (SPEC T-6, fair shares)
        self._queued_by: dict[str, list[int]] = {}
        self._delivering = False  # a _deliver_next is running or scheduled
        # Several daemons (SPEC X): the last id delivered here per session, and the catch-ups that
        # read another daemon's committed events for this daemon's subscribers. ``owns`` tells the
        # sessions this daemon writes itself (their events are delivered after their commit).
        self.owns: Callable[[str], bool] = lambda _session_id: False
        self._delivered: dict[str, int] = {}
        self._remote_last: dict[str, int] = {}
        self._catch_ups: dict[str, asyncio.Task[None]] = {}
        self._listening: set[asyncio.Task[None]] = set()  # catch_up_all's tasks, referenced until done
        self.remote_events = 0

    def _ring(self, session_id: str) -> _Ring:
        ring = self._rings.get(session_id)
        if ring is None:
            ring = self._rings[session_id] = _Ring(self.budget.ring_max_events, self.budget.ring_max_bytes)
        return ring

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Stage the events published inside (synchronous code only: no await in the block) and
        hand them to the journal in one commit at its end; they are delivered, in order, when it
        resolves. The events published before an exception in the block are still committed and
        delivered. A nested batch joins the outer one."""
        if self._batch is not None:
            yield
            return
        pending: list[tuple[str, Event]] = []
        self._batch = pending
        try:
            yield
        finally:
            self._batch = None
            self._hand_over(pending)

    def publish(self, session_id: str, event_type: str, data: dict[str, Any]) -> Event | None:
        """Stage the event (it gets its id now), commit, then ring and subscribers, in that order
        (the commit deferred to the end of a :meth:`batch`). An event over ``sse_max_event_bytes``
        is not journaled: a synthetic ``frame_dropped`` naming its size and the limit goes out
        instead, and None is returned."""
        return self.publish_encoded(session_id, event_type, exact_bytes(orjson.dumps(data)))

    def publish_encoded(self, session_id: str, event_type: str, payload: bytes) -> Event | None:
        """:meth:`publish` for data already encoded: ``payload`` is the JSON of the event's data,
        journaled and sent as given."""
        limit = self.budget.sse_max_event_bytes
        event = Event(self.journal.next_id(session_id), event_type, payload)  # sized with its id
        if event.size > limit:
            self.oversize_dropped += 1
            self.publish_synthetic(session_id, FRAME_DROPPED, {
                "direction": "sse", "bytes": len(payload), "limitBytes": limit,
                "reason": "sse_max_event_bytes", "hop": HOP_DAEMON_SSE, "eventType": event_type,
                "setting": CEILINGS_BY_KEY["sse_max_event_bytes"].name})
            log.warning("event over the sse event limit dropped",
                        extra={"eventType": event_type, "bytes": len(payload), "limitBytes": limit})
            return None
        if self.journal.stage(session_id, event_type, payload) != event.id:  # next_id's contract
            raise RuntimeError("the journal staged an event under another id than next_id gave")
        if self._batch is not None:
            self._batch.append((session_id, event))
        else:
            self._hand_over([(session_id, event)])
        return event

    async def publish_committed(self, session_id: str, event_type: str, data: dict[str, Any]) -> Event:
        """:meth:`publish` outside any batch, returning once the event is durable; raises the
        commit's error when it is not (T-1: the caller answers 2xx, or acts, only after this)."""
        if self._batch is not None:
            raise RuntimeError("publish_committed inside a batch")
        event = self.publish(session_id, event_type, data)
        if event is None:
            raise RuntimeError("a control event over the SSE event limit")
        commit = self._commits[-1] if self._commits else None
        if commit is not None and commit.committed is not None and commit.events[-1][1] is event:
            commit.answered = len(commit.events) == 1
            await asyncio.shield(commit.committed)
        return event

    def publish_synthetic(self, session_id: str, event_type: str, data: dict[str, Any]) -> None:
        event = synthetic(event_type, data)
        if self._batch is not None:
            self._batch.append((session_id, event))  # in its place among the batched events
        else:
            self._hand_over([(session_id, event)])

    # --- the journal's queue --------------------------------------------------------------------

    def _hand_over(self, events: list[tuple[str, Event]]) -> None:
        if not events:
            return
        journaled = [event for _, event in events if event.id is not None]
        if not journaled and not self._commits:
            for session_id, event in events:  # nothing before them: out at once
                self._deliver(session_id, event)
            return
        commit = _Commit(events, self.journal.commit() if journaled else None, len(journaled),
                         sum(len(event.data) for event in journaled))
        queued_by = self._queued_by
        for session_id, event in events:
            if event.id is not None:
                share = queued_by.get(session_id)
                if share is None:
                    share = queued_by[session_id] = [0, 0]
                share[0] += 1
                share[1] += len(event.data)
        self._commits.append(commit)
        self.queued_events += commit.journaled
        self.queued_bytes += commit.nbytes
        if commit.committed is not None:
            commit.committed.add_done_callback(self._on_committed)

    def _on_committed(self, _: asyncio.Future[None]) -> None:
        if not self._delivering:
            self._delivering = True
            self._deliver_next()

    def _deliver_next(self) -> None:
        """Deliver the commit at the head of the queue if it is done, then the next one in the next
        loop iteration: a writer transaction that settles many commits at once does not pour them
        all into the subscribers' queues before their streams run (the pacing of one pipe read
        per iteration is kept). Within a commit, delivery also pauses for one iteration when a
        subscriber whose stream is about to run is half full: a subscriber that keeps up is never
        evicted by one burst, one that does not read (its stream stuck in a write) is not waited for."""
        commits = self._commits
        if commits and _ready(commits[0]):
            commit = commits[0]
            error = None
            if commit.committed is not None and not commit.committed.cancelled():
                error = commit.committed.exception()
            events = commit.events
            while commit.next_index < len(events):
                session_id, event = events[commit.next_index]
                commit.next_index += 1
                if error is not None and event.id is not None:
                    self._journal_failed(session_id, event, error, commit.answered)
                elif self._deliver(session_id, event) and commit.next_index < len(events):
                    asyncio.get_running_loop().call_soon(self._deliver_next)
                    self._deliver_around(commit)
                    return
            commits.popleft()
            self.queued_events -= commit.journaled
            self.queued_bytes -= commit.nbytes
            self._unqueue(commit)
            if commit.delivered is not None and not commit.delivered.done():
                commit.delivered.set_result(None)
            room = self._room
            if room is not None and not room.done():
                room.set_result(None)  # each held reader checks its own share again
            if commits and _ready(commits[0]):
                asyncio.get_running_loop().call_soon(self._deliver_next)
                return
        self._delivering = False

    def _deliver_around(self, held: _Commit) -> None:
        """While ``held`` waits for a subscriber to drain, the ready commits behind it of other
        sessions are delivered (SPEC T-6, fair shares): one session's flood to a slow stream does
        not hold back another session's events. A session's own events keep their order: a commit
        is passed over while any commit before it that is still waiting holds one of its sessions.
        The scan is bounded (``_AROUND_SCAN`` commits)."""
        blocked = {session_id for session_id, _ in held.events}
        for commit in list(itertools.islice(self._commits, 1, _AROUND_SCAN)):
            sessions = {session_id for session_id, _ in commit.events}
            if not _ready(commit) or commit.next_index or sessions & blocked:
                blocked |= sessions
                continue
            error = None
            if commit.committed is not None and not commit.committed.cancelled():
                error = commit.committed.exception()
            for session_id, event in commit.events:
                if error is not None and event.id is not None:
                    self._journal_failed(session_id, event, error, commit.answered)
                else:
                    self._deliver(session_id, event)
            commit.next_index = len(commit.events)
            self._commits.remove(commit)
            self.queued_events -= commit.journaled
            self.queued_bytes -= commit.nbytes
            self._unqueue(commit)
            if commit.delivered is not None and not commit.delivered.done():
                commit.delivered.set_result(None)

    def _journal_failed(self, session_id: str, event: Event, error: BaseException, answered: bool) -> None:
        if answered:  # the requester was answered 507/503; nothing was accepted, nothing is lost
            log.warning("journal commit failed: the request was refused",
                        extra={"eventType": event.type, "exception": type(error).__name__})
            return
        self.journal_failed += 1
        log.error("journal commit failed: event not delivered",
                  extra={"eventType": event.type, "bytes": len(event.data),
                         "exception": type(error).__name__})
        self._deliver(session_id, synthetic(FRAME_DROPPED, {
            "direction": "sse", "bytes": len(event.data), "reason": "journal_write_failed",
            "hop": HOP_JOURNAL, "eventType": event.type, "eventId": event.id}))  # the id left as a gap
        self.on_journal_failed(session_id)

    def _unqueue(self, commit: _Commit) -> None:
        queued_by = self._queued_by
        for session_id, event in commit.events:
            if event.id is not None and (share := queued_by.get(session_id)) is not None:
                share[0] -= 1
                share[1] -= len(event.data)
                if share[0] <= 0:
                    del queued_by[session_id]

    def backpressure(self, session_id: str | None = None) -> asyncio.Future[None] | None:
        """None while the journal's queue is within both bounds (at most ``journal_queue_max_events``
        events and ``journal_queue_max_bytes`` bytes handed over and not committed); past either,
        a future resolved once a commit was delivered: a pipe reader awaits it before its next
        read, so a child that outruns the disk is held back instead of the daemon's memory growing.

        With ``session_id``, the bounds are that session's fair share (SPEC T-6): the queue's bounds
        divided by the sessions that compete (events queued, or a client streaming). A flooding
        session is held at its share, and another is never held while within its own (the queue
        then passes its bounds by at most one pipe read per session): the other's events wait in
        the journal's writer behind a share of the flood, not the whole queue."""
        max_events, max_bytes = self.budget.journal_queue_max_events, self.budget.journal_queue_max_bytes
        if session_id is None:
            held = self.queued_events > max_events or self.queued_bytes > max_bytes
        else:
            share = self._queued_by.get(session_id)
            competing = {sid for sid, subscribers in self._subscribers.items() if subscribers}
            active = len(competing.union(self._queued_by)) or 1
            held = share is not None and (share[0] > max_events // active or share[1] > max_bytes // active)
        if not held:
            return None
        if self._room is None or self._room.done():
            self._room = asyncio.get_running_loop().create_future()
        return self._room

    def catch_up(self, session_id: str) -> Awaitable[object] | None:
        """None while every subscriber of the session is below half its queue; else an awaitable
        done when they all are, or after ``sse_catch_up_seconds``: the session's pipe reader awaits
        it before its next read, so a subscriber that reads a little slower than the agent writes
        is waited for instead of evicted, and one that does not read is evicted after a bounded
        delay (its queue fills on the next reads)."""
        behind = [s for s in self._subscribers.get(session_id, ()) if s.half_full]
        if not behind:
            return None
        return asyncio.wait([s.below_half() for s in behind], timeout=self.budget.sse_catch_up_seconds)

    async def flushed(self) -> None:
        """Return once everything published before the call is committed and delivered."""
        if not self._commits:
            return
        last = self._commits[-1]
        if last.delivered is None:
            last.delivered = asyncio.get_running_loop().create_future()
        await asyncio.shield(last.delivered)

    # --- delivery -------------------------------------------------------------------------------

    def _deliver(self, session_id: str, event: Event) -> bool:
        """Ring the event and offer it; True when a subscriber about to drain its queue is half
        full (the caller lets it run before offering more)."""
        event_id = event.id
        if event_id is not None:
            delivered = self._delivered.get(session_id, 0)
            if event_id <= delivered and session_id in self._catch_ups:
                return False  # a catch-up read it from the journal first (a lease moving here)
            self._ring(session_id).append(event)
            if event_id > delivered:
                self._delivered[session_id] = event_id
        subscribers = self._subscribers.get(session_id)
        if not subscribers:
            return False
        pause = False
        for subscriber in tuple(subscribers):  # an eviction drops it from the set
            subscriber.offer(event)
            if subscriber.evicted:
                self._drop(subscriber)
            elif subscriber.half_full_and_woken:
                pause = True
        return pause

    async def subscribe(self, session_id: str, max_queued: int) -> tuple[Subscriber, int]:
        """Register a subscriber; return it and the session's last committed id at that instant.
        Events after that id reach its queue; events up to it are read with :meth:`replay`."""
        subscriber = Subscriber(session_id, max_queued, self.budget.sse_queue_max_bytes)
        self._subscribers.setdefault(session_id, set()).add(subscriber)
        # Registered first, then the id: an event committed meanwhile is in the queue (dropped
        # there when the id covers it), never in neither.
        upto = await self.journal.last_id(session_id)
        subscriber.start_after(upto)
        self._delivered.setdefault(session_id, upto)
        return subscriber, upto

    def unsubscribe(self, subscriber: Subscriber) -> None:
        subscriber.close()
        self._drop(subscriber)

    def _drop(self, subscriber: Subscriber) -> None:
        subs = self._subscribers.get(subscriber.session_id)
        if subs is not None and subscriber in subs:
            subs.discard(subscriber)
            if subscriber.evicted:
                self.evictions += 1

    def subscriber_count(self, session_id: str) -> int:
        return len(self._subscribers.get(session_id, ()))

    async def replay(self, session_id: str, after: int, upto: int) -> AsyncIterator[list[Event]]:
        """Pages of the events ``after < id <= upto``: from the ring when it holds them all, else
        from the journal in pages of about ``sse_queue_max_bytes``."""
        if upto <= after:
            return
        ring = self._ring(session_id)
        if ring.covers(after, upto):
            yield [e for e in list(ring.events) if e.id is not None and after < e.id <= upto]
            return
        cursor = after
        while cursor < upto:
            try:
                rows = await self.journal.read_page(session_id, cursor, upto=upto,
                                                    max_bytes=self.budget.sse_queue_max_bytes)
            except Exception as exc:
                raise JournalReadFailed(exc) from exc
            if not rows:
                return
            yield [self.event_of(session_id, r) for r in rows]
            cursor = rows[-1].seq

    def event_of(self, session_id: str, row: JournalRow) -> Event:
        """The event a journal row is, or the ``data_corrupt`` that says it is damaged (T-3): a
        damaged event is never served as if it were whole."""
        if row.corrupt is None:
            return Event(row.seq, row.type, row.data)
        self.corrupt.seen(session_id, row.seq)
        log.error("damaged journal event not served", extra={"eventType": row.type, "reason": row.corrupt})
        return synthetic(DATA_CORRUPT, corrupt_json(row))

    # --- another daemon's events (SPEC X) -----------------------------------------------------------

    def on_remote_commit(self, session_id: str, last_id: int) -> None:
        """A notification: the session's journal reached ``last_id`` (perhaps on another daemon).
        The events this daemon has not delivered are read from the journal for its subscribers."""
        if self.owns(session_id) or last_id <= self._delivered.get(session_id, 0):
            return  # written here (delivered after its commit), or already read
        if not self._subscribers.get(session_id):
            # Nobody here reads it: no catch-up, and the ring would have a hole, so it goes.
            self._rings.pop(session_id, None)
            self._delivered.pop(session_id, None)
            return
        self._remote_last[session_id] = max(last_id, self._remote_last.get(session_id, 0))
        task = self._catch_ups.get(session_id)
        if task is None or task.done():
            self._catch_ups[session_id] = asyncio.get_running_loop().create_task(self._catch_up(session_id))

    def catch_up_all(self) -> None:
        """After (re)listening: every watched session read up to its journal's last id."""
        async def run() -> None:
            for session_id in [s for s, subs in self._subscribers.items() if subs]:
                self.on_remote_commit(session_id, await self.journal.last_id(session_id))

        task = asyncio.get_running_loop().create_task(run())
        self._listening.add(task)
        task.add_done_callback(self._listening.discard)

    async def _catch_up(self, session_id: str) -> None:
        """Another daemon's events for this daemon's subscribers, read from the journal a page at
        a time and delivered at the pace the slowest reading subscriber takes them."""
        try:
            while self._delivered.get(session_id, 0) < self._remote_last.get(session_id, 0):
                after = self._delivered.get(session_id, 0)
                rows = await self.journal.read_page(session_id, after, upto=self._remote_last[session_id],
                                                    max_bytes=self.budget.sse_queue_max_bytes)
                if not rows:
                    return
                for row in rows:  # a page read for this catch-up (a local list)
                    if row.seq > self._delivered.get(session_id, 0):
                        self.remote_events += 1
                        if row.corrupt is not None:  # said in its place; the next good one goes on
                            self._delivered[session_id] = row.seq
                        if self._deliver(session_id, self.event_of(session_id, row)):
                            await asyncio.sleep(0)  # a stream about to drain runs first
                        # Paced as the owner's pipe reader is (T-6, #27): a subscriber past half
                        # its queue is waited for (bounded), so a page never evicts one that reads.
                        if (behind := self.catch_up(session_id)) is not None:
                            await behind
        except Exception as exc:  # the next notification tries again; a reconnecting client resumes
            log.warning("reading another daemon's events failed", extra={"error": type(exc).__name__})
        finally:
            self._catch_ups.pop(session_id, None)

    def close_session(self, session_id: str) -> None:
        for subscriber in list(self._subscribers.pop(session_id, ())):
            subscriber.close()
        self._rings.pop(session_id, None)
        self._delivered.pop(session_id, None)

    def close_all(self) -> None:
        for session_id in list(self._subscribers):
            for subscriber in list(self._subscribers.pop(session_id, ())):
                subscriber.close()
