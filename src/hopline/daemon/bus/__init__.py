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
whose stream is about to run is half full. A commit's run of one session's events goes to a session
with one subscriber in one call (:meth:`Subscriber.offer_run`, the same rules event by event), and
the SSE stream takes its whole queue at once (:meth:`Subscriber.drain`).

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
``journal_write_failed``, sizes only), counted and logged. Every ``frame_dropped`` that names event
ids a reader will not get is built by one function, :func:`~.events.missing_ids`: a failed commit's,
and a gap's (reason ``lost_past_commit_point``: ids the store lost, by a crash past its commit point
or a failover to a replica that lacked them, SPEC T-10), said in its place among the replayed or
caught-up events, or to every reader when a failover's loss is found.

The modules: :mod:`.bus_event` (one event's bytes), :mod:`.subscriber` (a connection's bounded queue,
warning, eviction, the half-full signal), :mod:`.commits` (the journal's queue, delivered in commit
order), :mod:`.event_bus` (publishing, delivery, replay, another daemon's events). The names other
modules use are re-exported here; the modules of this package import each other, never this one
(no import circle).
"""

from hopline.daemon.bus.bus_event import LOST_PAST_COMMIT_POINT, BusEvent, missing_ids, synthetic, wire_size
from hopline.daemon.bus.event_bus import EventBus, JournalReadFailed
from hopline.daemon.bus.subscriber import Subscriber

__all__ = ["LOST_PAST_COMMIT_POINT", "BusEvent", "EventBus", "JournalReadFailed", "Subscriber", "missing_ids",
           "synthetic", "wire_size"]
