"""The daemon's ASGI app (SPEC D-1, D-3, D-7) with the gateway embedded under ``/internal``.

Outermost: a dispatcher sends ``/internal/...`` to the gateway app (its own bearer token and its own
body limit, ``API_JSON_BODY_LIMIT``) and everything else to the daemon routes behind the daemon's
bearer token (``/health`` open) and the daemon's body limit (``HOPLINE_DAEMON_JSON_BODY_LIMIT``,
enforced while reading). No query parameter, header or body field changes a byte ceiling: bodies
forbid unknown fields, and the only client knob is ``maxQueued`` in [16, 2048] (B-5); the scripted
model's hints are bounded by their budget ceilings.

Client input is checked before use (D-10): JSON bodies are parsed by
:func:`hopline.wire.input.loads_bounded` (400 for invalid UTF-8, lone surrogates, nesting past
``HOPLINE_JSON_MAX_DEPTH``), cursors and ``Last-Event-ID`` by ``parse_decimal_id``, and every error,
FastAPI's own included, has hopline's shape naming the hop. Load is bounded: pending prompts per
session (429), live sessions (503), SSE subscribers per session (429), body-read time (408).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import urllib.parse
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Header, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.types import Receive, Scope, Send

from hopline.budget import (
    CEILINGS_BY_KEY,
    HOP_CLUSTER,
    HOP_DAEMON_API,
    HOP_DAEMON_SSE,
    HOP_JOURNAL,
    MAX_QUEUED_RANGE,
    SETTINGS_BY_KEY,
    Budget,
    Settings,
    check_coherence,
    limits_json,
    require_coherent,
)
from hopline.daemon.bus import Event, EventBus, JournalReadFailed, Subscriber, synthetic
from hopline.daemon.cluster import (
    FORWARDED_SCOPE_KEY,
    Cluster,
    ClusterAuth,
    cluster_metrics,
    new_daemon_id,
    with_daemon_label,
)
from hopline.daemon.embedded_gateway import InternalDispatcher, embedded_gateway, running
from hopline.daemon.errors import SessionError
from hopline.daemon.gates import GateRegistry, gate_router
from hopline.daemon.pg_journal import PgJournal
from hopline.daemon.projection import InboundProjector, oversize_replacement
from hopline.daemon.session import DaemonSession
from hopline.daemon.sessions import SessionManager
from hopline.daemon.sqlite_journal import SqliteJournal
from hopline.daemon.transcript import transcript_page
from hopline.gateway.auth import BearerTokenMiddleware, SessionTokens
from hopline.gateway.body_limit import BodyLimit
from hopline.gateway.errors import bounded_json_route, install_error_handlers
from hopline.harness.scripted import scripted_hints
from hopline.observe.pipe import PipeObservability
from hopline.sidecars import SidecarStore, sidecar_projector
from hopline.sidecars.store import open_sidecar_store
from hopline.store.check import check_recent_events, require_usable
from hopline.store.locations import SIDECARS_DIR, StoreSettingError, sidecar_location, store_location
from hopline.store.postgres import migrate
from hopline.vocabulary import (
    CLIENT_EVICTED,
    DATA_CORRUPT,
    GATEWAY_URL_ENV,
    REPLAY_COMPLETE,
    SERVER_TOKEN_ENV,
    STATE_RESYNC_REQUIRED,
    STREAM_ERROR,
)
from hopline.wire.input import parse_decimal_id

log = logging.getLogger("hopline.daemon")

# I/O granularity, not a limit: the queued events joined into one socket write. 64 KiB is one write
# per 64 events of 1 KiB; larger writes cost a client that re-scans its buffer per event (a naive
# SSE reader) quadratic time, and the slow-subscriber test's reader fell behind at 256 KiB.
SSE_WRITE_BYTES = 64 * 1024



# --- request bodies -------------------------------------------------------------------------------

class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateSessionBody(_Body):
    cwd: Annotated[str, Field(min_length=1, max_length=4096)] | None = None
    profile: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")] | None = None
    permissionMode: Literal["auto", "ask"] | None = None
    scripted: dict[str, Any] | None = None


class PromptBody(_Body):
    text: Annotated[str, Field(min_length=1)]


class PermissionBody(_Body):
    optionId: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    outcome: Literal["reject"] | None = None

    @model_validator(mode="after")
    def _one_answer(self) -> PermissionBody:
        if (self.optionId is None) == (self.outcome is None):
            raise ValueError("give exactly one of optionId or outcome: 'reject'")
        return self


class SessionCreated(BaseModel):
    sessionId: str


class PromptAccepted(BaseModel):
    promptId: str


# --- the SSE stream -------------------------------------------------------------------------------

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

    async def _emit(self, send: Send, events: Sequence[Event]) -> None:
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
            if self.resync is not None:
                await self._emit(send, [synthetic(STATE_RESYNC_REQUIRED, self.resync)])
            replayed = corrupt = 0
            async for page in self.bus.replay(self.session_id, self.after, self.upto):
                await self._emit(send, page)
                damaged = sum(1 for event in page if event.type == DATA_CORRUPT)
                replayed += len(page) - damaged
                corrupt += damaged
            await self._emit(send, [synthetic(REPLAY_COMPLETE, {
                "replayed": replayed, "lastEventId": self.upto, "corrupt": corrupt})])
            while True:
                live = await self.subscriber.next(self.heartbeat)
                if live is None:
                    if self.subscriber.closed:
                        return
                    await send({"type": "http.response.body", "body": b": heartbeat\n\n", "more_body": True})
                    continue
                # Everything already queued goes out in one write (the queue's byte bound bounds it).
                batch = [live]
                while batch[-1].type != CLIENT_EVICTED:
                    queued = self.subscriber.pop_nowait()
                    if queued is None:
                        break
                    batch.append(queued)
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


async def open_event_stream(bus: EventBus, budget: Budget, key: str, *, max_queued: int | None,
                            last_event_id: str | None) -> SseStream:
    """The SSE stream of one journaled stream (a session's, a gate run's): the subscriber limit
    (429), ``Last-Event-ID`` parsed (400), and a resync when it is ahead of the journal."""
    after = (parse_decimal_id(last_event_id, "Last-Event-ID")
             if last_event_id is not None and last_event_id.strip() else None)
    subscribers, limit = bus.subscriber_count(key), budget.max_subscribers_per_session
    if subscribers >= limit:
        setting = CEILINGS_BY_KEY["max_subscribers_per_session"].name
        raise SessionError(429, "too_many_subscribers",
                           f"this would be event stream {subscribers + 1} of this session, over the "
                           f"limit of {limit} ({setting})", hop=HOP_DAEMON_SSE, limit=limit,
                           observed=subscribers + 1, setting=setting)
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


# --- the app --------------------------------------------------------------------------------------

def _error(exc: SessionError) -> JSONResponse:
    exc.body["error"].setdefault("hop", HOP_DAEMON_API)
    return JSONResponse(exc.body, status_code=exc.status)


def create_daemon_app(
    budget: Budget,
    *,
    data_dir: Path,
    agent_cmd: Sequence[str],
    server_token: str,
    internal_token: str,
    gateway_url: str | None = None,
    provider: Any = None,
    projector: InboundProjector | None = None,
    embed_gateway: bool = True,
    sidecars: bool = True,
    allow_incoherent: bool = False,
    agent_env: Sequence[str] = (),
    gateway_tokens: SessionTokens | None = None,
    instruments: PipeObservability | None = None,
    settings: Settings | None = None,
    listen_url: str = "",
) -> InternalDispatcher:
    """The whole `hopline serve` app. ``gateway_url`` is what children get as HOPLINE_GATEWAY_URL
    (the URL this app is served at); ``provider`` defaults to :func:`provider_from_env`.

    With ``sidecars`` (the default) large tool output goes to the sidecar store under
    ``data_dir/sidecars`` (S-1) before the journal, the ring and SSE, and the oversize replacement
    still guards the SSE event limit behind it; ``projector`` replaces that whole chain.

    Children get an allow-listed environment (:func:`hopline.daemon.child.child_environment`) plus
    the variables named in ``agent_env``; with the gateway embedded, each session's agent gets its
    own gateway token in ``session/new`` (D-11), never ``internal_token``; ``gateway_tokens`` replaces
    the registry of those tokens. ``instruments`` replaces the pipe's instruments (the benchmarks'
    A/B switches, :class:`~hopline.observe.pipe.PipeObservability`).

    ``settings`` name where the state lives (SPEC X): the default is the embedded SQLite journal and
    the sidecar files under ``data_dir``; a PostgreSQL store makes this daemon one of several
    (:mod:`hopline.daemon.cluster`), reached by the others at ``HOPLINE_ADVERTISE_URL`` (default:
    ``listen_url``)."""
    if not allow_incoherent:  # only `hopline demo --naive` serves an incoherent chain, on purpose
        require_coherent(budget)
    if not server_token:
        raise ValueError("the server token must not be empty")
    settings = settings if settings is not None else Settings()
    location = store_location(settings.store_url, data_dir)
    cluster: Cluster | None = None
    fenced: list[Callable[[tuple[str, ...]], None]] = []  # the manager's, once it exists
    journal: SqliteJournal | PgJournal
    if location.shared:
        if not settings.cluster_token:
            raise StoreSettingError(f"{SETTINGS_BY_KEY['cluster_token'].env} must be set with a "
                                    "postgresql store (the same on every daemon)")
        advertise = settings.advertise_url or listen_url
        if urllib.parse.urlsplit(advertise).hostname in (None, "0.0.0.0", "::"):
            raise StoreSettingError(f"{SETTINGS_BY_KEY['advertise_url'].env} must name where the other "
                                    "daemons reach this one (it listens on every address)")
        migrate(location.dsn)  # idempotent, under an advisory lock: every daemon runs it
        check_recent_events(location.dsn)  # a bounded check (T-3): reachable, recent rows whole
        daemon_id = new_daemon_id()

        def on_fenced(session_ids: tuple[str, ...]) -> None:
            for stop in fenced:
                stop(session_ids)

        journal = PgJournal(location.dsn, budget, owner=daemon_id, on_fenced=on_fenced)
        cluster = Cluster(location.dsn, budget, daemon_id=daemon_id, advertise_url=advertise,
                          token=settings.cluster_token)
    else:
        assert location.path is not None
        require_usable(location.path, data_dir)  # quick_check, segments agree (T-3): else one line
        journal = SqliteJournal(data_dir, path=location.path)
    bus = EventBus(budget, journal)
    instruments = instruments if instruments is not None else PipeObservability(budget)
    child_env: dict[str, str] = {}
    if gateway_url:
        child_env[GATEWAY_URL_ENV] = gateway_url
    session_tokens = None
    if embed_gateway:
        session_tokens = gateway_tokens if gateway_tokens is not None else SessionTokens()
    store: SidecarStore | None = None
    if sidecars:
        store = open_sidecar_store(location, sidecar_location(settings.sidecar_url, data_dir, os.environ),
                                   budget, index_dir=data_dir / SIDECARS_DIR)
        if projector is None:
            projector = sidecar_projector(store, budget, then=oversize_replacement(budget))
    manager = SessionManager(budget, journal=journal, bus=bus, instruments=instruments, agent_cmd=agent_cmd,
                             data_dir=data_dir, child_env=child_env, projector=projector, sidecars=store,
                             agent_env=agent_env, gateway_tokens=session_tokens, cluster=cluster)
    fenced.append(manager.fenced)
    bus.owns = manager.owned.__contains__
    gates = GateRegistry(budget, manager, bus, journal, data_dir)

    gateway: FastAPI | None = None
    if session_tokens is not None:
        gateway = embedded_gateway(budget, internal_token=internal_token, provider=provider,
                                   session_tokens=session_tokens)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with running(gateway):
            reaper: asyncio.Task[None] | None = None
            if store is not None:
                await asyncio.to_thread(store.collect_orphans)
                await asyncio.to_thread(store.reap_expired)
                reaper = asyncio.create_task(store.run_reaper(budget.sidecar_reap_interval_seconds))
            if isinstance(journal, PgJournal):
                await journal.open()
            await manager.start()  # ends the prompts a crash cut (D-8), warms the pool (D-9)
            if cluster is not None:
                await cluster.start(on_commit=bus.on_remote_commit, held=manager.held, on_lost=manager.lose,
                                    on_listen=bus.catch_up_all)
            try:
                yield
            finally:
                if cluster is not None:
                    await cluster.stop()  # its leases expire now: the others adopt at the next write
                if reaper is not None:
                    reaper.cancel()
                    with contextlib.suppress(BaseException):
                        await reaper
                await gates.shutdown()  # cancelled runs remove their checkouts and sessions
                bus.close_all()
                await manager.shutdown()
                instruments.shutdown()
                await journal.close()
                if store is not None:
                    store.close()

    app = FastAPI(title="hopline daemon", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.router.route_class = bounded_json_route(budget.json_max_depth)
    install_error_handlers(app, HOP_DAEMON_API)
    app.state.budget = budget
    app.state.manager = manager
    app.state.bus = bus
    app.state.journal = journal
    app.state.instruments = instruments
    app.state.gateway = gateway

    @app.exception_handler(SessionError)
    async def _session_error(_: Request, exc: SessionError) -> JSONResponse:
        return _error(exc)

    async def session_of(session_id: str) -> DaemonSession:
        if len(session_id) > budget.path_id_max_chars:  # opaque tokens: refused before any lookup
            raise SessionError(404, "unknown_session", "no such session")
        return await manager.get(session_id)

    async def at_owner(request: Request, session: DaemonSession, *,
                       spawn: bool = True) -> Response | None:
        """Several daemons: None when this daemon owns the session (adopting it if its owner died),
        else the owner's answer to the forwarded request. A forwarded request is never forwarded
        again: if the lease moved meanwhile, the sender hears 409 and retries."""
        if cluster is None:
            return None
        for _ in range(3):  # an owner that falls silent while we forward is adopted, then served here
            owner = await manager.ensure_owner(session, spawn=spawn)
            if owner is None:
                return None
            if request.scope.get(FORWARDED_SCOPE_KEY):
                raise SessionError(409, "owner_changed", "the session's owner changed while this write was "
                                   "forwarded; retry it", hop=HOP_CLUSTER)
            answer = await cluster.forward(owner, request)
            if answer is not None:
                return answer
        raise SessionError(503, "owner_changing", "the session's owner keeps changing; retry",
                           hop=HOP_CLUSTER)

    errors: dict[int | str, dict[str, Any]] = {400: {}, 401: {}, 404: {}, 408: {}, 409: {}, 413: {}, 422: {}}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok"}

    @app.post("/session", response_model=SessionCreated, responses={**errors, 502: {}, 503: {}, 504: {}})
    async def create_session(body: CreateSessionBody) -> Any:
        cwd = body.cwd if body.cwd is not None else str(Path.cwd())
        if not Path(cwd).is_absolute() or not Path(cwd).is_dir():
            raise SessionError(422, "invalid_cwd", "cwd must be an absolute path to an existing directory")
        if body.scripted is not None:
            scripted_hints(body.scripted, budget, unknown=True)
        session = await manager.create(cwd=cwd, profile=body.profile, permission_mode=body.permissionMode,
                                       scripted=body.scripted)
        return {"sessionId": session.id}

    @app.post("/session/{session_id}/prompt", status_code=202, response_model=PromptAccepted,
              responses={**errors, 429: {}})
    async def prompt(session_id: str, body: PromptBody, request: Request) -> Any:
        session = await session_of(session_id)
        gates.check_prompt(session.id)  # a dev session awaiting a gate takes no prompt (409, RN-412)
        forwarded = await at_owner(request, session)
        if forwarded is not None:
            return forwarded
        return {"promptId": await manager.prompt(session, body.text)}

    @app.post("/session/{session_id}/cancel", responses=errors)
    async def cancel(session_id: str, request: Request) -> Any:
        session = await session_of(session_id)
        forwarded = await at_owner(request, session)
        if forwarded is not None:
            return forwarded
        running = await manager.cancel(session)
        return {"cancelled": running}

    @app.get("/session/{session_id}/events", responses={**errors, 429: {}})
    async def events(
        session_id: str,
        maxQueued: Annotated[int | None, Query(ge=MAX_QUEUED_RANGE[0], le=MAX_QUEUED_RANGE[1])] = None,
        last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
    ) -> Any:
        session = await session_of(session_id)
        return await open_event_stream(bus, budget, session.id, max_queued=maxQueued,
                                       last_event_id=last_event_id)

    @app.post("/session/{session_id}/load", responses={**errors, 502: {}, 503: {}, 504: {}})
    async def load(session_id: str, request: Request) -> Any:
        session = await session_of(session_id)
        forwarded = await at_owner(request, session)
        if forwarded is not None:
            return forwarded
        return await manager.load(session)

    @app.get("/session/{session_id}/transcript", responses=errors)
    async def transcript(session_id: str,
                         cursor: Annotated[str | None, Query(max_length=20)] = None) -> Response:
        session = await session_of(session_id)
        after = parse_decimal_id(cursor, "cursor") if cursor else 0
        page = await transcript_page(journal, session.id, after,
                                     page_max_bytes=budget.transcript_page_max_bytes,
                                     envelope_bytes=budget.transcript_page_envelope_bytes)
        return Response(page, media_type="application/json")

    @app.post("/session/{session_id}/permission/{request_id}", responses=errors)
    async def permission(session_id: str, request_id: str, body: PermissionBody, request: Request) -> Any:
        session = await session_of(session_id)
        forwarded = await at_owner(request, session)
        if forwarded is not None:
            return forwarded
        outcome = await manager.answer_permission(session, request_id[:budget.path_id_max_chars],
                                                  option_id=body.optionId, reject=body.outcome == "reject")
        return {"requestId": request_id, "outcome": outcome}

    @app.delete("/session/{session_id}", responses=errors)
    async def delete_session(session_id: str, request: Request) -> Any:
        session = await session_of(session_id)
        forwarded = await at_owner(request, session, spawn=False)  # no agent needed to delete
        if forwarded is not None:
            return forwarded
        await manager.delete(session)
        return {"deleted": True}

    if store is not None:
        from hopline.sidecars.routes import sidecar_router

        async def sidecar_session(session_id: str) -> None:
            await session_of(session_id)  # 404 for a session this daemon does not know (D-7)

        app.include_router(sidecar_router(store, authorize=sidecar_session))

    @app.get("/daemon/status", responses=errors)
    async def status() -> dict[str, Any]:
        sessions = await manager.status()
        dev_states = gates.dev_states()
        for row in sessions:  # a dev session attached to a gate run shows its dev state
            if row["sessionId"] in dev_states:
                row["devState"] = dev_states[row["sessionId"]]
        return {
            "sessions": sessions,
            "gates": gates.status(),
            # uvloop under `hopline serve` (uvicorn[standard]), asyncio's own loop elsewhere
            "eventLoop": type(asyncio.get_running_loop()).__module__.split(".")[0],
            "journal": {"queuedEvents": bus.queued_events, "queuedBytes": bus.queued_bytes,
                        "failedEvents": bus.journal_failed, **bus.corrupt.status()},
            **instruments.status(),
            "sse": {"evictions": bus.evictions, "oversizeDropped": bus.oversize_dropped},
            "delivery": manager.delivery_status(),
            "warmChildren": manager.pool.status() if manager.pool is not None else None,
            "sidecars": store.stats() if store is not None else None,
            "budget": limits_json(budget, check_coherence(budget), settings),
            "cluster": await cluster.status() if cluster is not None else None,
        }

    @app.get("/metrics", responses=errors)
    async def metrics() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        body = instruments.metrics.render()
        if gateway is not None:
            body += gateway.state.metrics.render()
        if cluster is not None:  # every series above is this daemon's own: labelled with its id
            text = with_daemon_label(body.decode(), cluster.daemon_id)
            text += cluster_metrics(await cluster.status())
            body = text.encode()
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    from hopline.console import ConsoleDispatcher, frames_router

    app.include_router(frames_router(budget, instruments))
    app.include_router(gate_router(gates))

    guarded = BodyLimit(app, limit=budget.daemon_json_body_limit, ceiling="daemon_json_body_limit",
                        read_timeout=budget.body_read_timeout_seconds)
    authed: Any = BearerTokenMiddleware(guarded, token=server_token, hop=HOP_DAEMON_API,
                                        open_paths=("/health",), token_env=SERVER_TOKEN_ENV)
    if cluster is not None:  # another daemon's forwarded write: the cluster credential
        authed = ClusterAuth(authed, guarded, token=settings.cluster_token)
    # The console's static files (/ui/) need no token: the page asks for it, then sends it as a header.
    return InternalDispatcher(ConsoleDispatcher(authed), gateway, app)
