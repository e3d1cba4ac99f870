"""The journal's queue (SPEC D-5, T-6): the commits handed to the journal's writer, delivered in
commit order once each resolves, never before; its size in events and bytes, each session's share
of it, and the future a held pipe reader waits on for room.

Delivery itself (ring, subscribers) and a failed commit's ``frame_dropped`` are the bus's: the
queue calls ``deliver`` and ``failed`` with each event of a resolved commit."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
from collections.abc import Callable

from hopline.daemon.bus.bus_event import BusEvent
from hopline.store.idempotency import KeyRecord
from hopline.store.journal import EventJournal

Deliver = Callable[[str, BusEvent], bool]  # (session, event) -> a half-full subscriber is about to run
# (a commit's events, the first to deliver) -> (the next one, a half-full subscriber is about to run)
DeliverFrom = Callable[[list[tuple[str, BusEvent]], int], tuple[int, bool]]
Failed = Callable[[str, BusEvent, BaseException, bool], None]  # (session, event, error, answered)


@dataclasses.dataclass(eq=False)
class Commit:
    """Events handed to the journal together, delivered together once ``committed`` resolves
    (None: synthetic events only, delivered when the commits before them are)."""

    events: list[tuple[str, BusEvent]]
    committed: asyncio.Future[None] | None
    delivered: asyncio.Future[None] | None = None  # made on demand by CommitQueue.flushed
    next_index: int = 0  # the first event not yet delivered (a commit may take several turns)
    # A write-ahead request's own event (publish_committed): refused, it is answered to the
    # requester (507/503) and was never accepted, so it is neither a loss nor a turn's fault.
    answered: bool = False
    # The sessions of its events, made once: the fair-share scan looks at it per commit per delivery.
    sessions: frozenset[str] = frozenset()
    # Each session's journaled events in it: [events, bytes], added to and taken from the queue's.
    shares: dict[str, list[int]] = dataclasses.field(default_factory=dict)

    @property
    def journaled(self) -> int:
        """Its events with an id."""
        return sum(share[0] for share in self.shares.values())

    @property
    def nbytes(self) -> int:
        """Their data bytes."""
        return sum(share[1] for share in self.shares.values())


AROUND_SCAN = 64  # commits looked at behind a held one (each is one pipe read or one publish)


def ready(commit: Commit) -> bool:
    return commit.committed is None or commit.committed.done()


class CommitQueue:
    """The commits handed to the journal and not yet delivered, in commit order."""

    def __init__(self, journal: EventJournal, deliver: Deliver, deliver_from: DeliverFrom,
                 failed: Failed) -> None:
        self.journal = journal
        self._deliver = deliver
        self._deliver_from = deliver_from
        self._failed = failed
        self._commits: collections.deque[Commit] = collections.deque()  # in commit order
        self.queued_events = 0  # handed to the journal, not yet committed
        self.queued_bytes = 0
        self._room: asyncio.Future[None] | None = None
        # The queue's share of each session with events in it: [events, bytes] (SPEC T-6, fair shares)
        self.queued_by: dict[str, list[int]] = {}
        self._delivering = False  # a deliver_next is running or scheduled

    def last(self) -> Commit | None:
        """The commit handed over last (the one a publish just made, if it made one)."""
        return self._commits[-1] if self._commits else None

    def room(self) -> asyncio.Future[None]:
        """A future resolved once a commit was delivered (a held pipe reader awaits it)."""
        if self._room is None or self._room.done():
            self._room = asyncio.get_running_loop().create_future()
        return self._room

    def hand_over(self, events: list[tuple[str, BusEvent]], key: KeyRecord | None = None) -> None:
        """``key``: an idempotency key stored in the same transaction as these events."""
        if not events:
            return
        shares: dict[str, list[int]] = {}
        for session_id, event in events:
            if event.id is not None:
                share = shares.get(session_id)
                if share is None:
                    share = shares[session_id] = [0, 0]
                share[0] += 1
                share[1] += len(event.data)
        if not shares and not self._commits:
            for session_id, event in events:  # nothing before them: out at once
                self._deliver(session_id, event)
            return
        commit = Commit(events, self.journal.commit(key) if shares else None,
                        sessions=frozenset([session_id for session_id, _ in events]), shares=shares)
        queued_by = self.queued_by
        for session_id, (count, nbytes) in shares.items():
            share = queued_by.get(session_id)
            if share is None:
                queued_by[session_id] = [count, nbytes]
            else:
                share[0] += count
                share[1] += nbytes
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
        if commits and ready(commits[0]):
            commit = commits[0]
            error = None
            if commit.committed is not None and not commit.committed.cancelled():
                error = commit.committed.exception()
            events = commit.events
            while commit.next_index < len(events):
                if error is None:
                    commit.next_index, pause = self._deliver_from(events, commit.next_index)
                else:
                    session_id, event = events[commit.next_index]
                    commit.next_index += 1
                    if event.id is not None:
                        self._failed(session_id, event, error, commit.answered)
                        continue
                    pause = self._deliver(session_id, event)
                if pause and commit.next_index < len(events):
                    asyncio.get_running_loop().call_soon(self._deliver_next)
                    self._deliver_around(commit)
                    return
            commits.popleft()
            self._retire(commit)
            if self.queued_by.keys() - commit.sessions:
                # another session has journaled events queued: give it its turn beside this one
                # (alone, as a relay of one session is, the scan would find nothing to deliver)
                self._deliver_around(commit)
            room = self._room
            if room is not None and not room.done():
                room.set_result(None)  # each held reader checks its own share again
            if commits and ready(commits[0]):
                asyncio.get_running_loop().call_soon(self._deliver_next)
                return
        self._delivering = False

    def _deliver_around(self, head: Commit) -> None:
        """Beside the head commit (delivered this loop iteration, or waiting for a subscriber to
        drain), each other session's first ready commit among the next ones is delivered too (SPEC
        T-6, fair shares): a transaction that settles a flood's commits and another session's
        delivers one commit per session per iteration, so one session's flood neither holds back
        another's events nor does a slow stream. A session's own events keep their order: a commit
        is passed over while any commit before it that is not yet out holds one of its sessions.
        The scan is bounded (``AROUND_SCAN`` commits)."""
        blocked = set(head.sessions)
        start = 1 if self._commits and self._commits[0] is head else 0
        for commit in list(itertools.islice(self._commits, start, start + AROUND_SCAN)):
            sessions = commit.sessions
            if not ready(commit) or commit.next_index or sessions & blocked:
                blocked |= sessions
                continue
            blocked |= sessions  # one commit per session per iteration
            error = None
            if commit.committed is not None and not commit.committed.cancelled():
                error = commit.committed.exception()
            for session_id, event in commit.events:
                if error is not None and event.id is not None:
                    self._failed(session_id, event, error, commit.answered)
                else:
                    self._deliver(session_id, event)
            commit.next_index = len(commit.events)
            self._commits.remove(commit)
            self._retire(commit)

    def _retire(self, commit: Commit) -> None:
        """A delivered commit, out of the queue: its events and bytes leave the queue's counts and
        its sessions' shares, and a ``flushed`` waiting on it returns."""
        self.queued_events -= commit.journaled
        self.queued_bytes -= commit.nbytes
        queued_by = self.queued_by
        for session_id, (count, nbytes) in commit.shares.items():
            if (share := queued_by.get(session_id)) is not None:
                share[0] -= count
                share[1] -= nbytes
                if share[0] <= 0:
                    del queued_by[session_id]
        if commit.delivered is not None and not commit.delivered.done():
            commit.delivered.set_result(None)

    async def flushed(self) -> None:
        """Return once everything published before the call is committed and delivered."""
        if not self._commits:
            return
        last = self._commits[-1]
        if last.delivered is None:
            last.delivered = asyncio.get_running_loop().create_future()
        await asyncio.shield(last.delivered)
