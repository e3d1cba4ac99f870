"""Idempotent writes (SPEC T-12): ``POST /session``, ``/session/{id}/prompt``, ``/cancel`` and
``/permission/{requestId}`` take an ``Idempotency-Key`` header.

A keyed write is looked up first: a live key with the same request (its fingerprint: the route, its
ids and its body) answers what the first write answered (``Idempotent-Replayed: true``) and runs
nothing; with another request, 422 naming the header. Otherwise the write runs, and its key is
stored in the same transaction as what it creates (the session row, the open prompt, the cancel's or
the permission answer's event), so a write is either done with its key or not done at all. A write
that is refused stores nothing: its retry runs it.

Two requests with one key at once (a client retrying while its first request still runs) take
turns on this daemon: the second waits for the first, then finds its key. On several daemons a
session's writes all run on its owner (forwarded with their key), and two creates with one key on
two daemons are decided by the store: the second finds the key taken, and answers the first's.

Bounded: a key's length (``idempotency_key_max_chars``), the keys stored (``idempotency_max_keys``:
the expired ones are purged first, then a keyed write answers 503), and how long one is kept
(``idempotency_ttl_seconds``; a background task purges the expired ones).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
from fastapi.responses import Response

from hopline.budget import CEILINGS_BY_KEY, HOP_DAEMON_API, Budget, HoplineError
from hopline.daemon.errors import SessionError
from hopline.errors import KeyRecordDamaged, KeyTaken
from hopline.store.idempotency import FoundKey, KeyRecord
from hopline.store.journal import EventJournal
from hopline.vocabulary import IDEMPOTENCY_HEADER, REPLAYED_HEADER

log = logging.getLogger("hopline.daemon.sessions")

PURGE_EVERY_SECONDS = 3600.0  # at most; a shorter TTL purges every half of it
_PRINTABLE = frozenset(range(0x21, 0x7F))  # a key's characters: printable ASCII, no space


@dataclasses.dataclass(frozen=True, slots=True)
class KeyClaim:
    """A keyed write under way: :meth:`record` makes the row stored with what it creates."""

    key: str
    fingerprint: bytes
    ttl_seconds: float

    def record(self, session_id: str, status: int, answer: dict[str, Any]) -> KeyRecord:
        now = time.time()
        return KeyRecord(self.key, self.fingerprint, session_id, status, orjson.dumps(answer), now,
                         now + self.ttl_seconds)


def record_of(claim: KeyClaim | None, session_id: str, status: int,
              answer: dict[str, Any]) -> KeyRecord | None:
    """The row a keyed write stores with what it creates (None: the write has no key)."""
    return claim.record(session_id, status, answer) if claim is not None else None


class Replayed(HoplineError):
    """Not an error: the first answer to this key, given again (the app sends ``response``): the one
    stored here, or the session owner's, when ``on_replay`` forwarded the retry to it."""

    def __init__(self, record: KeyRecord, response: Response | None = None) -> None:
        super().__init__("answered from the idempotency key")
        self.record = record
        self.response = response or Response(record.answer, status_code=record.status,
                                             media_type="application/json", headers={REPLAYED_HEADER: "true"})


def request_shape(route: str, ids: tuple[str, ...], body: Any) -> bytes:
    """What a key's fingerprint is made of: the route, its ids, and the body as parsed (so a retry
    that serializes the same fields in another order or spacing is the same request)."""
    fields = body.model_dump() if body is not None else None
    return b"\0".join([route.encode(), *(i.encode() for i in ids),
                       orjson.dumps(fields, option=orjson.OPT_SORT_KEYS)])


class IdempotentWrites:
    def __init__(self, budget: Budget, journal: EventJournal) -> None:
        self.budget = budget
        self.journal = journal
        # key -> [its lock, the requests holding or awaiting it]: one entry per key in flight only
        self._running: dict[str, list[Any]] = {}
        self.replayed = 0
        self.purged = 0

    @contextlib.asynccontextmanager
    async def claim(self, key: str | None, shape: bytes, *,
                    on_replay: Callable[[KeyRecord], Awaitable[Response | None]] | None = None,
                    ) -> AsyncIterator[KeyClaim | None]:
        """The write runs inside (given the claim its journal write takes; None without a key),
        unless the key answers it: then :class:`Replayed` (``on_replay``'s answer, when it gives one),
        or 422."""
        if key is None:
            yield None
            return
        self._check(key)
        fingerprint = hashlib.sha256(shape).digest()
        entry = self._running.setdefault(key, [asyncio.Lock(), 0])
        entry[1] += 1
        try:
            async with entry[0]:
                await self._answered(key, fingerprint, on_replay, await self._room(key))
                try:
                    yield KeyClaim(key, fingerprint, self.budget.idempotency_ttl_seconds)
                except KeyTaken:  # another daemon stored this key first (two creates at once)
                    await self._answered(key, fingerprint, on_replay, await self._find(key))
                    raise SessionError(409, "idempotency_key_in_use", f"another request with this "
                                       f"{IDEMPOTENCY_HEADER} was being stored; nothing was run: retry",
                                       header=IDEMPOTENCY_HEADER, retryAfterSeconds=1) from None
        finally:
            entry[1] -= 1
            if entry[1] == 0:
                del self._running[key]

    async def _answered(self, key: str, fingerprint: bytes,
                        on_replay: Callable[[KeyRecord], Awaitable[Response | None]] | None,
                        found: FoundKey) -> None:
        """Raise the answer a stored key gives (Replayed, or 422); return when it has none."""
        record = found.record
        if record is None:
            return
        if record.fingerprint != fingerprint:
            ttl = CEILINGS_BY_KEY["idempotency_ttl_seconds"].name
            raise SessionError(422, "idempotency_key_reused",
                               f"this {IDEMPOTENCY_HEADER} was already used with another request (another "
                               f"route, session or body) less than {ttl} ago; a new request needs a new key",
                               header=IDEMPOTENCY_HEADER)
        if on_replay is not None and (answer := await on_replay(record)) is not None:
            raise Replayed(record, answer)  # the session's owner answered the retry (forwarded)
        self.replayed += 1
        log.info("write answered from its idempotency key", extra={"status": record.status})
        raise Replayed(record)

    def _check(self, key: str) -> None:
        limit = self.budget.idempotency_key_max_chars
        if len(key) > limit:
            setting = CEILINGS_BY_KEY["idempotency_key_max_chars"].name
            raise SessionError.over_limit(
                400, "idempotency_key_too_long", "idempotency_key_max_chars", limit, len(key),
                f"the {IDEMPOTENCY_HEADER} header is {len(key)} characters, over the limit of {limit} "
                f"({setting})", hop=HOP_DAEMON_API, header=IDEMPOTENCY_HEADER)
        if not key or not _PRINTABLE.issuperset(key.encode("latin-1")):
            raise SessionError(400, "invalid_idempotency_key",
                               f"the {IDEMPOTENCY_HEADER} header must be 1 to {limit} printable ASCII "
                               "characters without spaces (a UUID, say)", header=IDEMPOTENCY_HEADER)

    async def _find(self, key: str) -> FoundKey:
        try:
            return await self.journal.find_key(key, time.time())
        except KeyRecordDamaged:
            log.error("a stored idempotency key fails its checksum")
            raise SessionError(409, "idempotency_record_damaged",
                               f"the stored answer of this {IDEMPOTENCY_HEADER} is damaged (it fails its "
                               "checksum): the write may have run, so it is not run again; send it with a "
                               "new key only if you know it did not", header=IDEMPOTENCY_HEADER) from None

    async def _room(self, key: str) -> FoundKey:
        """The key's row, once there is room for one more key (expired ones purged when full)."""
        found = await self._find(key)
        limit = self.budget.idempotency_max_keys
        if found.record is not None or found.stored < limit:
            return found
        await self.purge()
        found = await self._find(key)
        if found.record is None and found.stored >= limit:
            setting = CEILINGS_BY_KEY["idempotency_max_keys"].name
            raise SessionError.over_limit(
                503, "idempotency_keys_full", "idempotency_max_keys", limit, found.stored + 1,
                f"the store keeps {found.stored} unexpired idempotency keys, the limit of {limit} "
                f"({setting}); the write was not run: raise {setting} or lower "
                f"{CEILINGS_BY_KEY['idempotency_ttl_seconds'].name}", hop=HOP_DAEMON_API)
        return found

    async def purge(self) -> int:
        deleted = await self.journal.purge_keys(time.time())
        self.purged += deleted
        return deleted

    async def run_purger(self) -> None:
        """Purge the expired keys every half TTL (at most every ``PURGE_EVERY_SECONDS``) until cancelled;
        a store that fails is tried again at the next round."""
        every = min(self.budget.idempotency_ttl_seconds / 2, PURGE_EVERY_SECONDS)
        while True:
            await asyncio.sleep(every)
            try:
                await self.purge()
            except Exception as exc:  # the store is away: the next round, or a full store's write, purges
                log.warning("expired idempotency keys not purged", extra={"exception": type(exc).__name__})
