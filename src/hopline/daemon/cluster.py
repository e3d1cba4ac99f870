"""Several daemons on one PostgreSQL store (SPEC X): who owns a session, and how the others reach it.

* **Daemons.** Each daemon has a random id per process (a restarted daemon is a new daemon: it owns
  nothing) and a row in ``daemons`` with the URL the others reach it at (``HOPLINE_ADVERTISE_URL``)
  and its last heartbeat.
* **Leases.** A session's agent child lives on one daemon, which holds the session's lease
  (``HOPLINE_OWNER_LEASE_SECONDS``, store time, renewed every third of it by the heartbeat). A
  lease is taken by one compare-and-set transaction (:meth:`Cluster.try_adopt`: it locks the
  lease row ``SKIP LOCKED`` and takes it only when expired, or one's own), so of two daemons racing
  for a session exactly one wins. The heartbeat tells which leases this daemon still holds: a daemon
  that finds a lease taken (it was paused or partitioned away) stops its children for those sessions.
* **No cascades.** The lease operations and the heartbeat each run on their own connection
  (:class:`~hopline.store.bounded.BoundedConnection`: ``lock_timeout``, ``statement_timeout`` and a
  deadline of its own on every answer), never behind the journal's. A lease row a commit holds
  (the old owner's fencing read, perhaps frozen mid-transaction) is never waited on: the adoption
  answers :class:`~hopline.store.bounded.StoreBusy` (503 and ``Retry-After``) until PostgreSQL ends
  that idle transaction (``HOPLINE_STORE_IDLE_TRANSACTION_SECONDS``). So a frozen daemon stalls
  only its own sessions: the others keep their heartbeat, their leases and their status.
* **Writes go to the owner**: forwarded over HTTP to its URL with the cluster credential
  (``HOPLINE_CLUSTER_TOKEN``) and the header ``x-hopline-forwarded-by``; the owner's answer is the
  client's answer, status and body.
* **Readers everywhere**: one ``LISTEN hopline_events`` connection per daemon; each notification
  (``"<session id> <last id>"``, never a payload) wakes this daemon's readers of that session, who
  read the rows from the journal.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from hopline.budget import CEILINGS_BY_KEY, HOP_CLUSTER, SETTINGS_BY_KEY, Budget
from hopline.gateway.auth import bearer_token
from hopline.gateway.body_limit import send_json
from hopline.gateway.errors import error_body, error_response
from hopline.store.bounded import BoundedConnection, StoreBusy, session_options
from hopline.store.postgres import EVENTS_CHANNEL, aconnect
from hopline.vocabulary import FORWARDED_BY_HEADER

log = logging.getLogger("hopline.daemon.cluster")

FORWARDED_SCOPE_KEY = "hopline.forwarded"  # set on a request the cluster credential let in


def new_daemon_id() -> str:
    return "d_" + secrets.token_hex(6)


@dataclasses.dataclass(frozen=True)
class Owner:
    """A session's lease as the store holds it."""

    daemon_id: str
    url: str
    live: bool  # the lease has not expired
    expires_in: float  # seconds (negative: expired that long ago)


class Cluster:
    def __init__(self, dsn: str, budget: Budget, *, daemon_id: str, advertise_url: str, token: str) -> None:
        if not token:
            raise ValueError("the cluster token must not be empty")
        self._dsn = dsn
        self.budget = budget
        self.daemon_id = daemon_id
        self.advertise_url = advertise_url.rstrip("/")
        self._token = token
        self.lease_seconds = budget.owner_lease_seconds
        timeouts = {"lock_timeout": budget.store_lock_timeout_seconds,
                    "statement_timeout": budget.store_statement_timeout_seconds}
        # The request path's lease statements and the heartbeat: two connections, so a slow
        # adoption never delays a renewal (a missed renewal would lose this daemon's sessions).
        self._leases = BoundedConnection(dsn, name=f"hopline {daemon_id} leases", **timeouts)
        self._beat = BoundedConnection(dsn, name=f"hopline {daemon_id} heartbeat", **timeouts)
        self._tasks: list[asyncio.Task[None]] = []
        self._http: httpx.AsyncClient | None = None
        self.forwarded = 0
        self.adopted = 0
        self.leases_lost = 0
        self.stale_refused = 0  # writes refused because the lease they came under was gone
        # The fencing token (the lease's epoch) this daemon took each session's lease with: a prompt
        # opens only while the store still holds the lease at that epoch (PgJournal.open_prompt).
        self.epochs: dict[str, int] = {}

    # --- lifecycle --------------------------------------------------------------------------------

    async def start(self, *, on_commit: Callable[[str, int], None], held: Callable[[], set[str]],
                    on_lost: Callable[[set[str]], Awaitable[None]], on_listen: Callable[[], None]) -> None:
        """Register this daemon, then heartbeat (``held``: the sessions this daemon runs a child
        for; ``on_lost`` gets those whose lease it no longer holds) and listen (``on_commit`` per
        notification; ``on_listen`` once listening, again after a reconnect: catch up)."""
        await self._beat.fetch(
            "INSERT INTO daemons (id, advertise_url) VALUES (%s, %s)", (self.daemon_id, self.advertise_url))
        self._http = httpx.AsyncClient(timeout=self.budget.cluster_forward_timeout_seconds)
        self._tasks = [asyncio.create_task(self._heartbeat(held, on_lost)),
                       asyncio.create_task(self._listen(on_commit, on_listen))]

    async def stop(self) -> None:
        """Stop heartbeating; the leases this daemon holds expire at once (another daemon adopts
        its sessions on their next write) and the daemon is marked stopped."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
        with contextlib.suppress(Exception):
            await self._beat.fetch("UPDATE leases SET expires_at = now() WHERE owner = %s", (self.daemon_id,))
            await self._beat.fetch("UPDATE daemons SET stopped = TRUE WHERE id = %s", (self.daemon_id,))
        await self.close_connections()
        if self._http is not None:
            await self._http.aclose()

    async def close_connections(self) -> None:
        await self._beat.close()
        await self._leases.close()

    async def fetch(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        """One statement on the lease connection (bounded: :class:`BoundedConnection`)."""
        return await self._leases.fetch(sql, params)

    _fetch = fetch

    async def _heartbeat(self, held: Callable[[], set[str]],
                         on_lost: Callable[[set[str]], Awaitable[None]]) -> None:
        period = self.lease_seconds / 3
        while True:
            try:
                await self._beat.fetch(
                    "UPDATE daemons SET heartbeat_at = now(), stopped = FALSE WHERE id = %s",
                    (self.daemon_id,))
                running = held()  # read before the renewal: a lease taken after it is not "lost"
                rows = await self._beat.fetch(
                    "UPDATE leases SET expires_at = now() + make_interval(secs => %s) WHERE owner = %s "
                    "RETURNING session_id", (self.lease_seconds, self.daemon_id))
                lost = running - {row[0] for row in rows}
                if lost:
                    self.leases_lost += len(lost)
                    log.warning("leases taken by another daemon; their children stop",
                                extra={"sessions": len(lost)})
                    await on_lost(lost)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the store is away: try again; the journal fences meanwhile
                log.warning("cluster heartbeat failed", extra={"error": type(exc).__name__})
            await asyncio.sleep(period)

    async def _listen(self, on_commit: Callable[[str, int], None], on_listen: Callable[[], None]) -> None:
        while True:
            try:
                name = f"hopline {self.daemon_id} listen"
                conn = await aconnect(self._dsn, options=session_options(name=name))
                try:
                    await conn.execute(f"LISTEN {EVENTS_CHANNEL}")
                    on_listen()
                    async for notify in conn.notifies():
                        session_id, _, last = notify.payload.partition(" ")
                        if last.isdigit():
                            on_commit(session_id, int(last))
                finally:
                    with contextlib.suppress(Exception):
                        await conn.close()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("cluster listener lost its connection", extra={"error": type(exc).__name__})
                await asyncio.sleep(min(1.0, self.lease_seconds / 3))

    # --- leases -----------------------------------------------------------------------------------

    async def claim_new(self, session_id: str) -> None:
        """The lease of a session this daemon just created."""
        await self._fetch("INSERT INTO leases (session_id, owner, epoch, expires_at) "
                          "VALUES (%s, %s, 1, now() + make_interval(secs => %s))",
                          (session_id, self.daemon_id, self.lease_seconds))
        self.epochs[session_id] = 1

    async def release(self, session_id: str) -> None:
        """Give up this daemon's lease of a stream it has finished writing (a gate run's)."""
        await self._fetch("DELETE FROM leases WHERE session_id = %s AND owner = %s",
                          (session_id, self.daemon_id))
        self.epochs.pop(session_id, None)

    async def still_holds(self, session_id: str) -> bool:
        """The store still holds this session's lease for this daemon, live, at the epoch taken
        (checked again just before a prompt is written to the child)."""
        epoch = self.epochs.get(session_id)
        if epoch is None:
            return False
        rows = await self._fetch("SELECT 1 FROM leases WHERE session_id = %s AND owner = %s AND epoch = %s "
                                 "AND expires_at > now()", (session_id, self.daemon_id, epoch))
        return bool(rows)

    async def renew_own(self, session_id: str) -> bool:
        """This daemon's own lease renewed if it expired with nobody taking it (same owner, same
        epoch: an adoption would have changed both): a store outage longer than the lease does
        not make a daemon fence its own sessions. False when another daemon took it meanwhile."""
        epoch = self.epochs.get(session_id)
        if epoch is None:
            return False
        rows = await self._fetch("UPDATE leases SET expires_at = now() + make_interval(secs => %s) "
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
        rows = await self._fetch(
            "SELECT l.owner, COALESCE(d.advertise_url, ''), l.expires_at > now(), "
            "EXTRACT(EPOCH FROM l.expires_at - now()) FROM leases l LEFT JOIN daemons d ON d.id = l.owner "
            "WHERE l.session_id = %s", (session_id,))
        if not rows:
            return None
        owner, url, live, expires_in = rows[0]
        return Owner(str(owner), str(url), bool(live), float(expires_in))

    async def status(self) -> dict[str, Any]:
        """The daemons (live: heartbeat within a lease), their leases and sessions, for
        ``/daemon/status``."""
        daemons = await self._fetch(
            "SELECT d.id, d.advertise_url, d.stopped, EXTRACT(EPOCH FROM now() - d.heartbeat_at), "
            "COUNT(l.session_id) FILTER (WHERE l.expires_at > now()), "
            "COALESCE(array_agg(l.session_id ORDER BY l.session_id) "
            "FILTER (WHERE l.expires_at > now()), '{}') "
            "FROM daemons d LEFT JOIN leases l ON l.owner = d.id GROUP BY d.id ORDER BY d.started_at", ())
        expired = await self._fetch("SELECT COUNT(*) FROM leases WHERE expires_at <= now()", ())
        return {
            "daemon": self.daemon_id, "advertiseUrl": self.advertise_url, "leaseSeconds": self.lease_seconds,
            "forwardedWrites": self.forwarded, "adoptedSessions": self.adopted,
            "leasesLost": self.leases_lost, "staleWritesRefused": self.stale_refused,
            "expiredLeases": int(expired[0][0]) if expired else 0,
            "daemons": [{"id": d[0], "advertiseUrl": d[1], "self": d[0] == self.daemon_id,
                         "live": not d[2] and float(d[3]) < self.lease_seconds,
                         "heartbeatAgeSeconds": round(float(d[3]), 3), "leases": int(d[4]),
                         "sessions": list(d[5])} for d in daemons],
        }

    # --- forwarding -------------------------------------------------------------------------------

    async def forward(self, owner: Owner, request: Request) -> Response | None:
        """The client's write, sent to the owner as it came (method, path, query, body); the owner's
        answer, status and JSON body, is the client's. None when the owner's lease expired while it
        did not answer (paused, partitioned): the caller adopts the session instead (the owner's
        late writes, if any, are fenced by the journal)."""
        assert self._http is not None
        url = owner.url + request.url.path + (f"?{request.url.query}" if request.url.query else "")
        headers = {"authorization": f"Bearer {self._token}", FORWARDED_BY_HEADER: self.daemon_id,
                   "content-type": request.headers.get("content-type", "application/json")}
        body = await request.body()
        self.forwarded += 1
        sent = asyncio.ensure_future(self._http.request(request.method, url, content=body, headers=headers))
        try:
            while True:  # a live owner renews its lease while it works; a silent one lets it expire
                wait = max(owner.expires_in, 0) + self.lease_seconds / 3
                done, _ = await asyncio.wait({sent}, timeout=wait)
                if done:
                    break
                current = await self.owner_of(request.path_params.get("session_id", ""))
                if current is None or not current.live or current.daemon_id != owner.daemon_id:
                    sent.cancel()
                    return None
                owner = current
            answer = sent.result()
        except httpx.TimeoutException:
            timeout = self.budget.cluster_forward_timeout_seconds
            setting = CEILINGS_BY_KEY["cluster_forward_timeout_seconds"].name
            return _cluster_error(504, "owner_timeout", f"the daemon that owns this session did not answer "
                                  f"within {timeout} s ({setting})")
        except httpx.HTTPError:
            retry = max(1, int(owner.expires_in) + 1)
            return _cluster_error(503, "owner_unreachable",
                                  "the daemon that owns this session cannot be reached; once its lease "
                                  f"expires (in about {retry} s) any daemon adopts the session: retry then",
                                  headers={"retry-after": str(retry)})
        finally:
            if not sent.done():
                sent.cancel()
        kept = {name: answer.headers[name] for name in ("retry-after",) if name in answer.headers}
        return Response(answer.content, status_code=answer.status_code,
                        media_type=answer.headers.get("content-type"), headers=kept)


def _cluster_error(status: int, kind: str, message: str,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return error_response(status, HOP_CLUSTER, kind, message, headers=headers)


class ClusterAuth:
    """A request carrying ``x-hopline-forwarded-by`` is another daemon's forwarded write: it passes
    only with the cluster credential (constant-time), straight to ``forwarded`` (marked in its
    scope, so it is served here and never forwarded again); every other request goes to ``app``
    (the client-facing auth)."""

    def __init__(self, app: ASGIApp, forwarded: ASGIApp, *, token: str) -> None:
        self.app = app
        self.forwarded = forwarded
        self._token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and any(name == FORWARDED_BY_HEADER.encode()
                                           for name, _ in scope.get("headers", ())):
            given = bearer_token(scope)
            if given is None or not hmac.compare_digest(given, self._token):
                setting = SETTINGS_BY_KEY["cluster_token"].env
                await send_json(send, 401, error_body(
                    HOP_CLUSTER, "unauthorized",
                    f"a forwarded write needs the cluster credential ({setting})"))
                return
            await self.forwarded({**scope, FORWARDED_SCOPE_KEY: True}, receive, send)
            return
        await self.app(scope, receive, send)


def with_daemon_label(exposition: str, daemon_id: str) -> str:
    """A Prometheus text exposition with ``daemon="<id>"`` on every sample: its series are this
    daemon's own (its pipe, its gateway); comment lines are kept as they are."""
    label = f'daemon="{daemon_id}"'
    out: list[str] = []
    for line in exposition.splitlines():
        if not line or line.startswith("#"):
            out.append(line)
        elif "{" in line.split(" ", 1)[0]:
            name, _, rest = line.partition("{")
            out.append(f"{name}{{{label},{rest}" if not rest.startswith("}") else f"{name}{{{label}{rest}")
        else:
            name, _, rest = line.partition(" ")
            out.append(f"{name}{{{label}}} {rest}")
    return "\n".join(out) + "\n"


def cluster_metrics(status: dict[str, Any]) -> str:
    """What the store says of the whole cluster, the same on every daemon: no ``daemon`` label on
    the totals; the per-daemon lease counts name the daemon they count."""
    daemons = status.get("daemons") or []
    lines = ["# HELP hopline_cluster_daemons Daemons registered in the store, by liveness.",
             "# TYPE hopline_cluster_daemons gauge",
             f'hopline_cluster_daemons{{state="live"}} {sum(1 for d in daemons if d["live"])}',
             f'hopline_cluster_daemons{{state="gone"}} {sum(1 for d in daemons if not d["live"])}',
             "# HELP hopline_cluster_expired_leases Session leases expired and not yet adopted.",
             "# TYPE hopline_cluster_expired_leases gauge",
             f"hopline_cluster_expired_leases {status.get('expiredLeases', 0)}",
             "# HELP hopline_cluster_leases Live session leases held by each daemon.",
             "# TYPE hopline_cluster_leases gauge"]
    lines += [f'hopline_cluster_leases{{daemon="{d["id"]}"}} {d["leases"]}' for d in daemons if d["live"]]
    return "\n".join(lines) + "\n"
