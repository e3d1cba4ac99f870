"""The SSE stream of one journaled stream, a session's or a gate run's (SPEC D-3, D-4): replay up
to the subscribe instant, ``replay_complete``, then live events from the subscriber's bounded queue."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

import orjson
from fastapi.responses import Response
from starlette.types import Receive, Scope, Send

from hopline.budget import CEILINGS_BY_KEY, HOP_DAEMON_SSE, HOP_JOURNAL, Budget
from hopline.daemon.bus import (
    LOST_PAST_COMMIT_POINT,
    BusEvent,
    EventBus,
    JournalReadFailed,
    Subscriber,
    missing_ids,
    synthetic,
)
from hopline.daemon.errors import SessionError
from hopline.vocabulary import (
    CLIENT_EVICTED,
    DATA_CORRUPT,
    FRAME_DROPPED,
    REPLAY_COMPLETE,
    STATE_RESYNC_REQUIRED,
    STREAM_ERROR,
)
from hopline.wire.input import parse_decimal_id

log = logging.getLogger("hopline.daemon")

# I/O granularity, not a limit: the queued events joined into one socket write. 64 KiB is one write
# per 64 events of 1 KiB; larger writes cost a client that re-scans its buffer per event (a naive
# SSE reader) quadratic time, and the slow-subscriber test's reader fell behind at 256 KiB.
SSE_WRITE_BYTES = 64 * 1024


class SseStream(Response):
    """An SSE response: replay (ring or journal) up to the subscribe instant, ``replay_complete``,
    then live events from the subscriber's bounded queue, with heartbeat comments. The events
    queued when the stream wakes go out in socket writes of up to ``SSE_WRITE_BYTES`` (the data of
    an event larger than that is one write of its own, its head and end lines joined to the writes
    around it). The stream ends
    when the subscriber is evicted (after ``client_evicted``), closed, or the client disconnects."""

    def __init__(self, bus: EventBus, session_id: str, subscriber: Subscriber, *, after: int, upto: int,
                 resync: dict[str, Any] | None, heartbeat: float, write_max_bytes: int) -> None:
        self.bus = bus
        self.session_id = session_id
        self.subscriber = subscriber
        self.after = after
        self.upto = upto
        self.resync = resync
        self.heartbeat = heartbeat
        self.write_max_bytes = write_max_bytes
        self.background = None
        self.status_code = 200

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-store"),
            (b"x-accel-buffering", b"no")]})
        sender = asyncio.ensure_future(self._pump(send))
        disconnect = asyncio.ensure_future(self._wait_disconnect(receive))
        stalled = asyncio.ensure_future(self._evicted_and_stalled())
        tasks = (sender, disconnect, stalled)
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.bus.unsubscribe(self.subscriber)
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(BaseException):
                    await task
        if sender.done() and not sender.cancelled() and sender.exception() is None:
            with contextlib.suppress(Exception):
                await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _evicted_and_stalled(self) -> None:
        """Done when the subscriber was evicted and its stream still has not delivered
        ``client_evicted`` one heartbeat later: the client is not reading, so the connection is
        dropped (the stream is cut, uvicorn closes it) and nothing of it stays in memory."""
        await self.subscriber.evicted_signal.wait()
        await asyncio.sleep(self.heartbeat)

    @staticmethod
    async def _wait_disconnect(receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return

    async def _emit(self, send: Send, events: Sequence[BusEvent]) -> None:
        """Write ``events`` in as few socket writes as the bound allows: consecutive events are
        joined while a write holds at most ``write_max_bytes``; the data of an event larger than
        that is a write of its own (the very bytes object, never copied here)."""
        parts: list[bytes] = []
        size = 0
        for event in events:
            head, data, tail = event.wire_parts()
            if event.size > self.write_max_bytes:
                # A large event's data goes out as it is, not copied into a joined write first (the
                # server frames it: one copy; the join was a second one, 1 MiB per MiB relayed).
                if parts and size + len(head) > self.write_max_bytes:
                    await send({"type": "http.response.body", "body": b"".join(parts), "more_body": True})
                    parts = []
                parts.append(head)
                await send({"type": "http.response.body", "body": b"".join(parts), "more_body": True})
                await send({"type": "http.response.body", "body": data, "more_body": True})
                parts = [tail]
                size = len(tail)
                continue
            if parts and size + event.size > self.write_max_bytes:
                await send({"type": "http.response.body", "body": b"".join(parts), "more_body": True})
                parts = []
                size = 0
            parts += (head, data, tail)
            size += event.size
        if parts:
            await send({"type": "http.response.body", "body": b"".join(parts), "more_body": True})

    async def _pump(self, send: Send) -> None:
        try:
            replayed = corrupt = missing = 0
            if self.resync is not None:  # ids the client has seen that the store does not hold: a gap too
                # (the client's claim: said to it, not counted nor logged as a loss of the store's)
                first, last = self.resync["latestEventId"] + 1, self.resync["lastEventId"]
                await self._emit(send, [synthetic(STATE_RESYNC_REQUIRED, self.resync), missing_ids(
                    first, last, reason=LOST_PAST_COMMIT_POINT, message=f"events {first} to {last} are past "
                    "the store's last event (a store that failed over lost them, or they never were)")])
            async for page in self.bus.replay(self.session_id, self.after, self.upto):
                await self._emit(send, page)
                for event in page:  # an event with its id, a damaged one said, or a gap said
                    if event.id is not None:
                        replayed += 1
                    elif event.type == DATA_CORRUPT:
                        corrupt += 1
                    else:
                        missing += _missing_count(event)
            await self._emit(send, [synthetic(REPLAY_COMPLETE, {
                "replayed": replayed, "lastEventId": self.upto, "corrupt": corrupt, "missing": missing})])
            while True:
                live = await self.subscriber.next(self.heartbeat)
                if live is None:
                    if self.subscriber.closed:
                        return
                    await send({"type": "http.response.body", "body": b": heartbeat\n\n", "more_body": True})
                    continue
                # Everything already queued goes out in one write (the queue's byte bound bounds it);
                # nothing follows an eviction's client_evicted (its queue is gone).
                batch = [live] if live.type == CLIENT_EVICTED else [live, *self.subscriber.drain()]
                await self._emit(send, batch)
                if batch[-1].type == CLIENT_EVICTED:
                    return
        except JournalReadFailed as exc:  # the store's fault, not the client's: said, not swallowed
            log.error("sse replay: reading the journal failed", extra={"exception": exc.exception})
            with contextlib.suppress(Exception):
                await self._emit(send, [synthetic(STREAM_ERROR, {
                    "reason": "journal_read_failed", "hop": HOP_JOURNAL, "exception": exc.exception,
                    "message": "reading this session's journal failed; reconnect with Last-Event-ID"})])
        except OSError:  # the client went away mid-write
            return
        except Exception as exc:
            log.warning("sse stream failed", extra={"exception": type(exc).__name__})
            with contextlib.suppress(Exception):
                await self._emit(send, [synthetic(STREAM_ERROR, {"message": "the event stream failed; "
                                                                   "reconnect with Last-Event-ID"})])


def _missing_count(event: BusEvent) -> int:
    """How many ids a replay's ``frame_dropped`` said missing (its ``missingIds`` range)."""
    span = orjson.loads(event.data).get("missingIds") if event.type == FRAME_DROPPED else None
    return int(span["last"]) - int(span["first"]) + 1 if isinstance(span, dict) else 0


async def open_event_stream(bus: EventBus, budget: Budget, key: str, *, max_queued: int | None,
                            last_event_id: str | None) -> SseStream:
    """The SSE stream of one journaled stream (a session's, a gate run's): the subscriber limit
    (429), ``Last-Event-ID`` parsed (400), and a resync when it is ahead of the journal."""
    after = (parse_decimal_id(last_event_id, "Last-Event-ID")
             if last_event_id is not None and last_event_id.strip() else None)
    subscribers, limit = bus.subscriber_count(key), budget.max_subscribers_per_session
    if subscribers >= limit:
        setting = CEILINGS_BY_KEY["max_subscribers_per_session"].name
        message = (f"this would be event stream {subscribers + 1} of this session, over the limit of "
                   f"{limit} ({setting})")
        raise SessionError.over_limit(429, "too_many_subscribers", "max_subscribers_per_session", limit,
                                      subscribers + 1, message, hop=HOP_DAEMON_SSE)
    subscriber, upto = await bus.subscribe(key, max_queued or budget.sse_queue_max_events)
    resync = None
    start = after or 0
    if after is not None and after > upto:
        resync = {"lastEventId": after, "latestEventId": upto,
                  "message": "Last-Event-ID is ahead of this session's journal; reload the state"}
        start = upto
    return SseStream(bus, key, subscriber, after=start, upto=upto, resync=resync,
                     heartbeat=budget.sse_heartbeat_seconds,
                     write_max_bytes=min(SSE_WRITE_BYTES, budget.sse_queue_max_bytes))
