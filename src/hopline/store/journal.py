"""The session journal (SPEC D-5): every session event is stored before it is published.

:class:`EventJournal` is the interface the daemon needs of its store (sessions, open prompts,
events); the bus and the session manager speak only to it. ``store.sqlite_journal`` implements it
on one SQLite file (a writer thread with group commit, reads on their own connection),
``store.pg_journal`` on a PostgreSQL store shared by several daemons.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol

import orjson

from hopline.store.idempotency import FoundKey, KeyRecord


@dataclasses.dataclass(frozen=True)
class SessionRecord:
    id: str
    agent_session_id: str | None
    options: dict[str, Any]
    created: float


@dataclasses.dataclass(frozen=True, slots=True)
class JournalRow:
    seq: int
    type: str
    data: bytes  # the event's JSON, exactly as published (empty when ``corrupt``)
    # Why the stored bytes are not the event's (``hopline.store.integrity`` reasons), or None: a
    # damaged row is returned in its place, never raised, so a reader goes on with the next one.
    corrupt: str | None = None


class EventJournal(Protocol):
    """What the daemon needs of its store. Every method that touches storage is ``async`` (or
    returns an awaitable): an implementation never blocks the event loop on I/O.

    **Order.** Writes (sessions, prompts, event commits) are applied in the order they are called:
    each is queued behind every write called before it, whatever the method. A read sees every
    write whose awaitable has resolved (and may see later ones).

    **Event ids** are per session, increasing from 1, and allocated by the journal alone, at
    :meth:`stage`, synchronously, in call order. :meth:`next_id` tells the id the next staged event
    of a session gets, without allocating it (the bus sizes an event's SSE form with it before
    staging). Both work on an *open* session only: one this journal created
    (:meth:`create_session`) or returned from :meth:`get_session` (which loads the session's last
    id), and not deleted since; on any other they raise ``LookupError``.

    **Commit.** :meth:`commit` hands every event staged so far, of every session, to the writer
    and returns a future resolved once they are durable (group commit: an implementation may join
    several commits in one transaction; a transaction is all or nothing). Futures resolve in call
    order. A failed transaction writes none of its events, and every commit in it gets the
    exception; its ids are given out again to the next staged events of a session when nothing was
    staged after them, else they stay a gap (ids never go back: always increasing, not always
    consecutive).

    **Idempotency keys** (:mod:`hopline.store.idempotency`): a keyed write hands its
    :class:`KeyRecord` to the write that stores what it creates (:meth:`create_session`,
    :meth:`open_prompt`, :meth:`commit`), and both are durable in one transaction; a key is gone
    with its session, or once expired and purged.

    **Close.** :meth:`close` commits what is staged, waits for every queued write, then releases
    the storage; nothing may be called after it.

    An implementation subclasses this protocol (it inherits :meth:`append_many`) and is checked
    against it by mypy.
    """

    # --- sessions -------------------------------------------------------------------------------

    async def create_session(self, session_id: str, options: dict[str, Any],
                             key: KeyRecord | None = None) -> None:
        """Store a new session (no agent session id yet); it is open, its last id is 0.
        Raises when the id exists; with ``key``, :class:`~hopline.store.idempotency.KeyTaken` (and
        nothing stored) when the key is live already."""
        ...

    async def get_session(self, session_id: str) -> SessionRecord | None:
        """The stored session, or None. A returned session is open (its last id loaded)."""
        ...

    async def set_agent_session_id(self, session_id: str, agent_session_id: str) -> None:
        """Record the agent's id for the session (what a later ``session/load`` asks for)."""
        ...

    async def delete_session(self, session_id: str) -> None:
        """Remove the session, its events, its prompts and its keys in one transaction; what was staged
        for it and not committed is dropped. The session is no longer open."""
        ...

    async def list_sessions(self) -> list[SessionRecord]:
        """Every stored session, oldest first."""
        ...

    # --- prompts: accepted and not yet ended (a restart ends them, D-8) -------------------------

    async def open_prompt(self, session_id: str, prompt_id: str, key: KeyRecord | None = None) -> None:
        """Record an accepted prompt, after the session's events committed so far, until
        :meth:`close_prompt`. Durable when the call returns (the daemon answers 202 after it). With
        ``key``, as :meth:`create_session`."""
        ...

    async def close_prompt(self, session_id: str, prompt_id: str) -> None:
        """The prompt's turn ended (its end event was committed before, by the write order)."""
        ...

    async def unended_prompts(self, session_id: str | None = None) -> list[tuple[str, str]]:
        """(session id, prompt id) of every open prompt with no turn end (``TURN_END_TYPES`` with
        its ``promptId``) journaled after it, by session then age; ``session_id`` limits it to one
        session (an adoption's). Open prompts that did end are closed on the way."""
        ...

    # --- events ---------------------------------------------------------------------------------

    def next_id(self, session_id: str) -> int:
        """The id the session's next staged event gets; allocates nothing, touches no storage."""
        ...

    def forget_allocations(self, session_id: str) -> None:
        """Drop what this daemon staged or allocated for the session and has not committed (an
        adoption: the store's last id is the truth, :meth:`get_session` reads it again)."""
        ...

    def ensure_above(self, session_id: str, floor: int) -> None:
        """The session's next id is above ``floor``, an id this daemon knows was given (its readers
        got it): a shared store that failed over may have lost it, and it is never given again. A
        journal only one daemon writes has nothing to do."""
        return None

    def stage(self, session_id: str, event_type: str, data: bytes) -> int:
        """Allocate the session's next id to ``(event_type, data)`` and hold the event for the next
        :meth:`commit`; touches no storage. ``data`` is the event's JSON, stored as given."""
        ...

    def commit(self, key: KeyRecord | None = None) -> asyncio.Future[None]:
        """Hand every staged event to the writer; the future resolves once all of them are durable
        (with nothing staged: once every earlier commit has resolved), or fails with the error of
        their transaction. Call it on the event loop; the future belongs to that loop. ``key`` is
        stored in the same transaction (not when that key is live already: the events are)."""
        ...

    async def append_many(self, session_id: str, events: Sequence[tuple[str, bytes]]) -> list[int]:
        """Stage ``(type, data)`` events of one session and commit; return their ids, in order,
        once they are durable (with whatever else was staged before)."""
        seqs = [self.stage(session_id, event_type, data) for event_type, data in events]
        await self.commit()
        return seqs

    async def read_page(self, session_id: str, after: int, *, upto: int | None = None,
                        max_bytes: int) -> list[JournalRow]:
        """Committed events with ``after < id <= upto`` (``upto`` None: the last committed), in id
        order, until their ``data`` bytes pass ``max_bytes``. At least one row when one exists, so
        a single event larger than ``max_bytes`` still makes progress. Every row's bytes are checked
        against their checksum; a row that fails (or whose bytes cannot be read) comes back with
        ``corrupt`` set and no data."""
        ...

    async def last_id(self, session_id: str) -> int:
        """The id of the session's last committed event (0 for none or an unknown session)."""
        ...

    async def count(self, session_id: str, event_type: str) -> int:
        """How many committed events of the session have this type."""
        ...

    async def gaps(self, session_id: str, after: int, upto: int) -> list[tuple[int, int]]:
        """The known gaps that reach into ``after < id <= upto``, as (first id, last id), in id
        order: ids a client may have been given whose events the store lost (SPEC T-10; a gap is
        reported, never hidden). Ids continue past them; :meth:`last_id` counts them."""
        ...

    # --- idempotency keys -----------------------------------------------------------------------

    async def find_key(self, key: str, now: float) -> FoundKey:
        """The live (unexpired at ``now``) row of ``key``, and how many keys are stored; raises
        :class:`~hopline.store.idempotency.KeyRecordDamaged` when the row fails its checksum."""
        ...

    async def purge_keys(self, now: float) -> int:
        """Delete the keys expired at ``now``; how many."""
        ...

    async def open(self) -> EventJournal:
        """Connect what needs connecting before the first call (a no-op for SQLite, which opens in
        its constructor); returns the journal."""
        ...

    async def close(self) -> None:
        ...


def prompt_id_of(data: bytes) -> object:
    """The ``promptId`` of a turn-end event's data (None when it has none or is not an object):
    both journals find a prompt's end by it."""
    try:
        decoded = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return decoded.get("promptId") if isinstance(decoded, dict) else None


StagedRow = tuple[str, int, str, bytes]  # (session id, id, type, data)


class StagedIds:
    """The id rule of both journals (:meth:`EventJournal.next_id`, :meth:`EventJournal.stage`): a
    session's next id is one past the last one allocated to it, staged or committed; staging
    allocates it. Each journal says where a session's last allocated id comes from."""

    _allocated: dict[str, int]  # session -> the last id staged (until its commit settles)
    _staged: list[StagedRow]  # in stage order, handed to the writer by the next commit

    def _last_allocated(self, session_id: str) -> int:
        """The session's last allocated id; LookupError when it is not open in this journal."""
        raise NotImplementedError

    def next_id(self, session_id: str) -> int:
        return self._last_allocated(session_id) + 1

    def forget_allocations(self, session_id: str) -> None:
        self._staged = [row for row in self._staged if row[0] != session_id]
        self._allocated.pop(session_id, None)

    def stage(self, session_id: str, event_type: str, data: bytes) -> int:
        seq = self.next_id(session_id)
        self._allocated[session_id] = seq
        self._staged.append((session_id, seq, event_type, data))
        return seq
