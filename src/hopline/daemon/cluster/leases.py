"""The cluster's SQL (SPEC X): this daemon's row in ``daemons`` and the sessions' rows in ``leases``.

A lease is taken by one compare-and-set transaction (:meth:`Leases.try_adopt`: it locks the lease
row ``SKIP LOCKED`` and takes it only when expired, or one's own), so of two daemons racing for a
session exactly one wins. The request path's statements and the heartbeat's run on two connections
of their own (:class:`~hopline.store.bounded.BoundedConnection`), so a slow adoption never delays a
renewal (a missed renewal would lose this daemon's sessions) and neither waits behind the journal.
"""

from __future__ import annotations

import dataclasses
import secrets
from typing import Any

from hopline.budget import CEILINGS_BY_KEY, Budget
from hopline.errors import StoreBusy
from hopline.store.bounded import BoundedConnection, tcp_options


def new_daemon_id() -> str:
    return "d_" + secrets.token_hex(6)


@dataclasses.dataclass(frozen=True)
class Owner:
    """A session's lease as the store holds it."""

    daemon_id: str
    url: str
    live: bool  # the lease has not expired
    expires_in: float  # seconds (negative: expired that long ago)


class Leases:
    def __init__(self, dsn: str, budget: Budget, *, daemon_id: str, advertise_url: str) -> None:
        self.budget = budget
        self.daemon_id = daemon_id
        self.advertise_url = advertise_url
        self.lease_seconds = budget.owner_lease_seconds
        lock, statement = budget.store_lock_timeout_seconds, budget.store_statement_timeout_seconds
        tcp = tcp_options(budget)
        # A request's lease statements answer within the request deadline; the heartbeat's within
        # the lease's margin (a renewal that would come too late to count is given up, its
        # connection closed: no server-side timeout fires when packets are dropped).
        self._leases = BoundedConnection(
            dsn, name=f"hopline {daemon_id} leases", lock_timeout=lock, statement_timeout=statement,
            deadline=budget.store_request_deadline_seconds, tcp=tcp,
            deadline_setting=CEILINGS_BY_KEY["store_request_deadline_seconds"].name)
        self.renewal_deadline = budget.owner_lease_seconds * budget.owner_lease_margin
        self._beat = BoundedConnection(
            dsn, name=f"hopline {daemon_id} heartbeat", lock_timeout=lock, statement_timeout=statement,
            deadline=self.renewal_deadline, tcp=tcp,
            deadline_setting=CEILINGS_BY_KEY["owner_lease_margin"].name)
        # The fencing token (the lease's epoch) this daemon took each session's lease with: a prompt
        # opens only while the store still holds the lease at that epoch (PgJournal.open_prompt).
        self.epochs: dict[str, int] = {}

    async def close(self) -> None:
        await self._beat.close()
        await self._leases.close()

    async def fetch(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        """One statement on the lease connection (bounded: :class:`BoundedConnection`)."""
        return await self._leases.fetch(sql, params)

    # --- this daemon's row, on the heartbeat's connection -----------------------------------------

    async def register(self) -> None:
        await self._beat.fetch(
            "INSERT INTO daemons (id, advertise_url) VALUES (%s, %s)", (self.daemon_id, self.advertise_url))

    async def beat(self) -> tuple[str, str | None]:
        """This daemon is alive (its heartbeat; its row made again if a store that failed over lost
        it). Returns the server it reached: its start time and, where this role may read it, its
        system identifier (a failover or a restart changes them)."""
        rows = await self._beat.fetch(
            "INSERT INTO daemons (id, advertise_url) VALUES (%s, %s) ON CONFLICT (id) DO UPDATE "
            "SET heartbeat_at = now(), stopped = FALSE RETURNING pg_postmaster_start_time()::text, "
            "CASE WHEN has_function_privilege('pg_control_system()', 'EXECUTE') "
            "THEN (SELECT system_identifier::text FROM pg_control_system()) END",
            (self.daemon_id, self.advertise_url))
        return (str(rows[0][0]), rows[0][1]) if rows else ("", None)

    async def renew(self) -> set[str]:
        """This daemon's leases run one more lease period: the sessions whose lease it still holds."""
        rows = await self._beat.fetch(
            "UPDATE leases SET expires_at = now() + make_interval(secs => %s) WHERE owner = %s "
            "RETURNING session_id", (self.lease_seconds, self.daemon_id))
        return {row[0] for row in rows}

    async def give_up_all(self) -> None:
        """This daemon's leases expire at once (another daemon adopts its sessions on their next
        write) and the daemon is marked stopped."""
        await self._beat.fetch("UPDATE leases SET expires_at = now() WHERE owner = %s", (self.daemon_id,))
        await self._beat.fetch("UPDATE daemons SET stopped = TRUE WHERE id = %s", (self.daemon_id,))

    # --- the sessions' leases, on the request path's connection -----------------------------------

    async def claim_new(self, session_id: str) -> None:
        """The lease of a session this daemon just created."""
        await self.fetch("INSERT INTO leases (session_id, owner, epoch, expires_at) "
                         "VALUES (%s, %s, 1, now() + make_interval(secs => %s))",
                         (session_id, self.daemon_id, self.lease_seconds))
        self.epochs[session_id] = 1

    async def release(self, session_id: str) -> None:
        """Give up this daemon's lease of a stream it has finished writing (a gate run's)."""
        await self.fetch("DELETE FROM leases WHERE session_id = %s AND owner = %s",
                         (session_id, self.daemon_id))
        self.epochs.pop(session_id, None)

    async def still_holds(self, session_id: str) -> bool:
        """The store still holds this session's lease for this daemon, live, at the epoch taken
        (checked again just before a prompt is written to the child)."""
        epoch = self.epochs.get(session_id)
        if epoch is None:
            return False
        rows = await self.fetch("SELECT 1 FROM leases WHERE session_id = %s AND owner = %s AND epoch = %s "
                                "AND expires_at > now()", (session_id, self.daemon_id, epoch))
        return bool(rows)

    async def renew_own(self, session_id: str) -> bool:
        """This daemon's own lease renewed if it expired with nobody taking it (same owner, same
        epoch: an adoption would have changed both): a store outage longer than the lease does
        not make a daemon fence its own sessions. False when another daemon took it meanwhile."""
        epoch = self.epochs.get(session_id)
        if epoch is None:
            return False
        rows = await self.fetch("UPDATE leases SET expires_at = now() + make_interval(secs => %s) "
                                "WHERE session_id = %s AND owner = %s AND epoch = %s RETURNING 1",
                                (self.lease_seconds, session_id, self.daemon_id, epoch))
        return bool(rows)

    async def try_adopt(self, session_id: str) -> bool:
        """Take the session's lease when it is free, expired or already ours: True for the one
        daemon that gets it (a compare-and-set under the row's lock). A lease row another
        transaction holds (an old owner's commit, perhaps frozen in it) is skipped, not waited on:
        :class:`StoreBusy`, to retry once that transaction ends."""

        async def work(conn: Any) -> bool:
            async with conn.transaction():
                cursor = await conn.execute(
                    "SELECT expires_at <= now() OR owner = %s FROM leases WHERE session_id = %s "
                    "FOR UPDATE SKIP LOCKED", (self.daemon_id, session_id))
                row = await cursor.fetchone()
                if row is None:
                    cursor = await conn.execute(
                        "INSERT INTO leases (session_id, owner, epoch, expires_at) "
                        "VALUES (%s, %s, 1, now() + make_interval(secs => %s)) "
                        "ON CONFLICT (session_id) DO NOTHING RETURNING epoch",
                        (session_id, self.daemon_id, self.lease_seconds))
                    inserted = await cursor.fetchone()
                    if inserted is not None:
                        self.epochs[session_id] = int(inserted[0])
                        return True
                    raise StoreBusy("the session's lease is held by another daemon's transaction (its "
                                    "owner may be frozen inside a commit)",
                                    self.budget.store_idle_transaction_seconds)
                if not row[0]:
                    return False  # live, another daemon's
                cursor = await conn.execute(
                    "UPDATE leases SET owner = %s, epoch = epoch + 1, "
                    "expires_at = now() + make_interval(secs => %s) WHERE session_id = %s RETURNING epoch",
                    (self.daemon_id, self.lease_seconds, session_id))
                taken = await cursor.fetchone()
                self.epochs[session_id] = int(taken[0])
                return True

        return await self._leases.run(work)

    async def owner_of(self, session_id: str) -> Owner | None:
        rows = await self.fetch(
            "SELECT l.owner, COALESCE(d.advertise_url, ''), l.expires_at > now(), "
            "EXTRACT(EPOCH FROM l.expires_at - now()) FROM leases l LEFT JOIN daemons d ON d.id = l.owner "
            "WHERE l.session_id = %s", (session_id,))
        if not rows:
            return None
        owner, url, live, expires_in = rows[0]
        return Owner(str(owner), str(url), bool(live), float(expires_in))

    async def daemons(self) -> list[dict[str, Any]]:
        """Every registered daemon (live: not stopped, heartbeat within a lease) with its live
        leases' count and sessions."""
        rows = await self.fetch(
            "SELECT d.id, d.advertise_url, d.stopped, EXTRACT(EPOCH FROM now() - d.heartbeat_at), "
            "COUNT(l.session_id) FILTER (WHERE l.expires_at > now()), "
            "COALESCE(array_agg(l.session_id ORDER BY l.session_id) "
            "FILTER (WHERE l.expires_at > now()), '{}') "
            "FROM daemons d LEFT JOIN leases l ON l.owner = d.id GROUP BY d.id ORDER BY d.started_at", ())
        return [{"id": d[0], "advertiseUrl": d[1], "self": d[0] == self.daemon_id,
                 "live": not d[2] and float(d[3]) < self.lease_seconds,
                 "heartbeatAgeSeconds": round(float(d[3]), 3), "leases": int(d[4]),
                 "sessions": list(d[5])} for d in rows]

    async def expired_count(self) -> int:
        expired = await self.fetch("SELECT COUNT(*) FROM leases WHERE expires_at <= now()", ())
        return int(expired[0][0]) if expired else 0
