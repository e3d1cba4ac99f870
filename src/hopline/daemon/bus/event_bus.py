"""The bus itself (SPEC D-3..D-5, X): publishing, delivery to the ring and the subscribers, replay,
and another daemon's events read from the journal. The package's docstring tells the whole."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import orjson

from hopline.budget import CEILINGS_BY_KEY, Budget
from hopline.daemon.bus.bus_event import LOST_PAST_COMMIT_POINT, BusEvent, exact_bytes, missing_ids, synthetic
from hopline.daemon.bus.commits import CommitQueue
from hopline.daemon.bus.ring import Ring
from hopline.daemon.bus.subscriber import Subscriber
from hopline.errors import StoreError
from hopline.store import bounded
from hopline.store.idempotency import KeyRecord
from hopline.store.integrity import CorruptCount, corrupt_json
from hopline.store.journal import EventJournal, JournalRow
from hopline.vocabulary import DATA_CORRUPT, FRAME_DROPPED

log = logging.getLogger("hopline.daemon.bus")

_LOST = ("by the store (a crash cut them, `hopline store check` names the gap; or a failover to a "
         "replica that lacked them)")

class JournalReadFailed(StoreError):
    """Reading the journal failed (not a client's disconnect): the stream says so and ends."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"reading the journal failed ({type(cause).__name__})")
        self.exception = type(cause).__name__


class ReplayPages:
    """:meth:`EventBus.replay`'s pages, read one at a time as they are iterated. A class, not an
    async generator: the bus is compiled with mypyc (src/hopline/compiled.py), which has none.

    The gaps the journal knows of in the replayed range (ids it lost: a torn WAL, a failover) are
    each said once, in their place (before the first event past them, or at the end): a reader
    resuming inside one learns which ids it will never get (:meth:`EventBus.missing`)."""

    def __init__(self, bus: EventBus, session_id: str, after: int, upto: int) -> None:
        self.bus = bus
        self.session_id = session_id
        self.cursor = after
        self.upto = upto
        self.first = True
        self.gaps: list[tuple[int, int]] = []  # (first, last) still to say, clipped to the range

    def __aiter__(self) -> ReplayPages:
        return self

    async def __anext__(self) -> list[BusEvent]:
        bus, session_id, after, upto = self.bus, self.session_id, self.cursor, self.upto
        if after >= upto:
            return self._last_gaps()
        try:
            if self.first:
                self.first = False
                self.gaps = [(max(first, after + 1), min(last, upto))
                             for first, last in await bus.journal.gaps(session_id, after, upto)]
                ring = bus._ring(session_id)
                if bus.replay_from_ring and ring.covers(after, upto):
                    self.cursor = upto
                    return self._with_gaps(ring.between(after, upto))
            rows = await bus.journal.read_page(session_id, after, upto=upto,
                                               max_bytes=bus.budget.sse_queue_max_bytes)
        except Exception as exc:
            raise JournalReadFailed(exc) from exc
        if not rows:
            self.cursor = upto
            return self._last_gaps()
        self.cursor = rows[-1].seq
        return self._with_gaps([bus.event_of(session_id, r) for r in rows])

    def _with_gaps(self, events: list[BusEvent]) -> list[BusEvent]:
        """``events`` (in id order) with each gap that lies before one of them said in its place."""
        gaps = self.gaps
        if not gaps:
            return events
        out: list[BusEvent] = []
        for event in events:
            while gaps and event.id is not None and gaps[0][0] < event.id:
                first, last = gaps.pop(0)
                out.append(self.bus.missing(self.session_id, first, last))
            out.append(event)
        return out

    def _last_gaps(self) -> list[BusEvent]:
        """The gaps past every replayed event, said as the last page; then the replay ends."""
        if not self.gaps:
            raise StopAsyncIteration
        gaps, self.gaps = self.gaps, []
        return [self.bus.missing(self.session_id, first, last) for first, last in gaps]


class EventBus:
    def __init__(self, budget: Budget, journal: EventJournal) -> None:
        self.budget = budget
        self.journal = journal
        # Several daemons: a replay comes from the store, never a ring, so every daemon shows the
        # same history (a ring may hold what a store that failed over lost, until written back).
        self.replay_from_ring = True
        self.missing_told = 0  # ids said missing to a reader (a store's gap), for /daemon/status
        self._rings: dict[str, Ring] = {}
        self._subscribers: dict[str, set[Subscriber]] = {}
        self.evictions = 0
        self.oversize_dropped = 0
        self.journal_failed = 0  # events whose commit failed (each one said to its session)
        # Called with the session of each event whose commit failed (the manager ends its turn, T-1).
        self.on_journal_failed: Callable[[str], None] = lambda _session_id: None
        self.corrupt = CorruptCount()  # damaged events met on reads (T-3), for /daemon/status
        self._batch: list[tuple[str, BusEvent]] | None = None  # (session id, event), in publication order
        self._queue = CommitQueue(journal, self._deliver, self._deliver_from, self._journal_failed)
        # Several daemons (SPEC X): the last id delivered here per session, and the catch-ups that
        # read another daemon's committed events for this daemon's subscribers. ``owns`` tells the
        # sessions this daemon writes itself (their events are delivered after their commit).
        self.owns: Callable[[str], bool] = lambda _session_id: False
        self._delivered: dict[str, int] = {}
        self._remote_last: dict[str, int] = {}
        self._catch_ups: dict[str, asyncio.Task[None]] = {}
        self._listening: set[asyncio.Task[None]] = set()  # catch_up_all's tasks, referenced until done
        self.remote_events = 0

    @property
    def queued_events(self) -> int:
        """Events handed to the journal, not yet committed."""
        return self._queue.queued_events

    @property
    def queued_bytes(self) -> int:
        return self._queue.queued_bytes

    def _ring(self, session_id: str) -> Ring:
        ring = self._rings.get(session_id)
        if ring is None:
            ring = self._rings[session_id] = Ring(self.budget.ring_max_events, self.budget.ring_max_bytes)
        return ring

    def _drop_ring(self, session_id: str) -> None:
        ring = self._rings.pop(session_id, None)
        if ring is not None:
            ring.close()

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Stage the events published inside (synchronous code only: no await in the block) and
        hand them to the journal in one commit at its end; they are delivered, in order, when it
        resolves. The events published before an exception in the block are still committed and
        delivered. A nested batch joins the outer one."""
        if self._batch is not None:
            yield
            return
        pending: list[tuple[str, BusEvent]] = []
        self._batch = pending
        try:
            yield
        finally:
            self._batch = None
            self._queue.hand_over(pending)

    def publish(self, session_id: str, event_type: str, data: dict[str, Any]) -> BusEvent | None:
        """Stage the event (it gets its id now), commit, then ring and subscribers, in that order
        (the commit deferred to the end of a :meth:`batch`). An event over ``sse_max_event_bytes``
        is not journaled: a synthetic ``frame_dropped`` naming its size and the limit goes out
        instead, and None is returned."""
        return self.publish_encoded(session_id, event_type, exact_bytes(orjson.dumps(data)))

    def publish_encoded(self, session_id: str, event_type: str, payload: bytes,
                        key: KeyRecord | None = None) -> BusEvent | None:
        """:meth:`publish` for data already encoded: ``payload`` is the JSON of the event's data,
        journaled and sent as given; ``key`` (outside a batch) goes in the event's transaction."""
        limit = self.budget.sse_max_event_bytes
        event = BusEvent(self.journal.next_id(session_id), event_type, payload)  # sized with its id
        if event.size > limit:
            self.oversize_dropped += 1
            exceeded = CEILINGS_BY_KEY["sse_max_event_bytes"].exceeded(limit, event.size)
            self.publish_synthetic(session_id, FRAME_DROPPED, {
                "direction": "sse", "bytes": len(payload), **exceeded.fields(),
                "reason": "sse_max_event_bytes", "eventType": event_type})
            log.warning("event over the sse event limit dropped",
                        extra={"eventType": event_type, "bytes": len(payload), "limit": limit})
            return None
        if self.journal.stage(session_id, event_type, payload) != event.id:  # next_id's contract
            raise RuntimeError("the journal staged an event under another id than next_id gave")
        if self._batch is not None:
            self._batch.append((session_id, event))
        else:
            self._queue.hand_over([(session_id, event)], key)
        return event

    async def publish_committed(self, session_id: str, event_type: str, data: dict[str, Any],
                                key: KeyRecord | None = None) -> BusEvent:
        """:meth:`publish` outside any batch, returning once the event is durable; raises the
        commit's error when it is not (T-1: the caller answers 2xx, or acts, only after this).
        ``key``: the request's idempotency key, durable with the event."""
        if self._batch is not None:
            raise RuntimeError("publish_committed inside a batch")
        event = self.publish_encoded(session_id, event_type, exact_bytes(orjson.dumps(data)), key)
        if event is None:
            raise RuntimeError("a control event over the SSE event limit")
        commit = self._queue.last()
        if commit is not None and commit.committed is not None and commit.events[-1][1] is event:
            commit.answered = len(commit.events) == 1
            # the requester is answered within the deadline (SPEC T-11); the commit goes on
            await bounded.awaited_within(commit.committed, self.budget.store_request_deadline_seconds)
        return event

    def publish_synthetic(self, session_id: str, event_type: str, data: dict[str, Any]) -> None:
        event = synthetic(event_type, data)
        if self._batch is not None:
            self._batch.append((session_id, event))  # in its place among the batched events
        else:
            self._queue.hand_over([(session_id, event)])

    # --- the journal's queue (its commits in bus/commits.py) ---------------------------------------

    def _journal_failed(self, session_id: str, event: BusEvent, error: BaseException, answered: bool) -> None:
        if answered:  # the requester was answered 507/503; nothing was accepted, nothing is lost
            log.warning("journal commit failed: the request was refused",
                        extra={"eventType": event.type, "exception": type(error).__name__})
            return
        self.journal_failed += 1
        log.error("journal commit failed: event not delivered",
                  extra={"eventType": event.type, "bytes": len(event.data),
                         "exception": type(error).__name__})
        if event.id is not None:
            self._deliver(session_id, missing_ids(event.id, event.id, reason="journal_write_failed",
                                                  bytes=len(event.data), eventType=event.type))
        self.on_journal_failed(session_id)

    def backpressure(self, session_id: str | None = None) -> asyncio.Future[None] | None:
        """None while the journal's queue is within both bounds (at most ``journal_queue_max_events``
        events and ``journal_queue_max_bytes`` bytes handed over and not committed); past either,
        a future resolved once a commit was delivered: a pipe reader awaits it before its next
        read, so a child that outruns the disk is held back instead of the daemon's memory growing.

        With ``session_id``, the bounds are that session's fair share (SPEC T-6): the queue's bounds
        divided by the sessions that compete (events queued, or a client streaming), and while
        others compete at most ``journal_queue_share_max_events`` events. A flooding session is
        held at its share, and another is never held while within its own (the queue then passes
        its bounds by at most one pipe read per session): the other's events wait in the journal's
        writer behind a share of the flood, not the whole queue, so a smaller share shortens the
        other's round trip (``bench/fair_share.py``)."""
        max_events, max_bytes = self.budget.journal_queue_max_events, self.budget.journal_queue_max_bytes
        if session_id is None:
            held = self.queued_events > max_events or self.queued_bytes > max_bytes
        else:
            queued_by = self._queue.queued_by
            share = queued_by.get(session_id)
            competing = {sid for sid, subscribers in self._subscribers.items() if subscribers}
            active = len(competing.union(queued_by)) or 1
            share_events = max_events // active
            if active > 1:
                share_events = min(share_events, self.budget.journal_queue_share_max_events)
            held = share is not None and (share[0] > share_events or share[1] > max_bytes // active)
        if not held:
            return None
        return self._queue.room()

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
        await self._queue.flushed()

    # --- delivery -------------------------------------------------------------------------------

    def _deliver(self, session_id: str, event: BusEvent) -> bool:
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

    def _deliver_from(self, events: list[tuple[str, BusEvent]], start: int) -> tuple[int, bool]:
        """:meth:`_deliver` for ``events[start:]`` (a commit's): each session's run of consecutive
        events is offered in one call when it has one subscriber (the common case: the per-event
        calls were a tenth of the daemon's CPU at 1 KiB frames), else event by event. Return the
        index of the next event to deliver and whether a half-full subscriber is about to run
        (delivery pauses there, as :meth:`_deliver` says)."""
        end = len(events)
        index = start
        while index < end:
            session_id = events[index][0]
            stop = index + 1
            while stop < end and events[stop][0] == session_id:
                stop += 1
            subscribers = self._subscribers.get(session_id)
            if session_id in self._catch_ups or (subscribers is not None and len(subscribers) > 1):
                for at in range(index, stop):
                    if self._deliver(session_id, events[at][1]):
                        return at + 1, True
                index = stop
                continue
            pause = False
            if subscribers:
                subscriber = next(iter(subscribers))
                offered, pause = subscriber.offer_run(events, index, stop)
                if subscriber.evicted:
                    self._drop(subscriber)
                stop = offered
            self._ring_run(session_id, events, index, stop)
            index = stop
            if pause:
                return index, True
        return index, False

    def _ring_run(self, session_id: str, events: list[tuple[str, BusEvent]], start: int, stop: int) -> None:
        """Ring ``events[start:stop]``, one session's, and move its last delivered id."""
        journaled = [event for _, event in itertools.islice(events, start, stop) if event.id is not None]
        if journaled:
            self._ring(session_id).extend(journaled)
            last = journaled[-1].id
            if last is not None and last > self._delivered.get(session_id, 0):
                self._delivered[session_id] = last

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

    def replay(self, session_id: str, after: int, upto: int) -> ReplayPages:
        """Pages of the events ``after < id <= upto``: from the ring when it holds them all, else
        from the journal in pages of about ``sse_queue_max_bytes`` (an async iterator)."""
        return ReplayPages(self, session_id, after, upto)

    def missing(self, session_id: str, first: int, last: int, cause: str = _LOST) -> BusEvent:
        """The ids ``first..last`` the store does not hold, said to a reader (counted, logged by count)."""
        self.missing_told += last - first + 1
        log.warning("event ids missing from the store told to a reader", extra={"events": last - first + 1})
        return missing_ids(first, last, reason=LOST_PAST_COMMIT_POINT,
                           message=f"events {first} to {last} were lost {cause}; they are not served")

    def event_of(self, session_id: str, row: JournalRow) -> BusEvent:
        """The event a journal row is, or the ``data_corrupt`` that says it is damaged (T-3): a
        damaged event is never served as if it were whole."""
        if row.corrupt is None:
            return BusEvent(row.seq, row.type, row.data)
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
            self._drop_ring(session_id)
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
                    delivered = self._delivered.get(session_id, 0)
                    if row.seq > delivered:
                        if row.seq > delivered + 1:  # ids the store does not hold: said in their place
                            self._deliver(session_id, self.missing(session_id, delivered + 1, row.seq - 1))
                        self.remote_events += 1
                        if row.corrupt is not None:  # said in its place; the next good one goes on
                            self._delivered[session_id] = row.seq
                        if self._deliver(session_id, self.event_of(session_id, row)):
                            await asyncio.sleep(0)  # a stream about to drain runs first
                        # Paced as the owner's pipe reader is (T-6): a subscriber past half
                        # its queue is waited for (bounded), so a page never evicts one that reads.
                        if (behind := self.catch_up(session_id)) is not None:
                            await behind
        except Exception as exc:  # the next notification tries again; a reconnecting client resumes
            log.warning("reading another daemon's events failed", extra={"error": type(exc).__name__})
        finally:
            self._catch_ups.pop(session_id, None)

    def known(self) -> dict[str, int]:  # a failover's (T-10): the last id delivered here per session
        return dict(self._delivered)

    def delivered(self, session_id: str) -> int:  # the session's last id delivered here (0: none)
        return self._delivered.get(session_id, 0)

    def held(self, session_id: str, after: int) -> list[BusEvent]:
        """The events of the session's ring past ``after``, in id order."""
        ring = self._rings.get(session_id)
        return ring.between(after, 2**63 - 1) if ring is not None else []

    def tell_lost(self, session_id: str, first: int, last: int) -> None:
        """Ids ``first..last`` no daemon held when the store lost them: said to this daemon's readers."""
        self._deliver(session_id, self.missing(session_id, first, last, "when the store failed over (no "
                                               "daemon still held them to write back)"))

    def close_session(self, session_id: str) -> None:
        for subscriber in list(self._subscribers.pop(session_id, ())):
            subscriber.close()
        self._drop_ring(session_id)
        self._delivered.pop(session_id, None)
        self._remote_last.pop(session_id, None)

    def close_all(self) -> None:
        for session_id in list(self._subscribers):
            for subscriber in list(self._subscribers.pop(session_id, ())):
                subscriber.close()
