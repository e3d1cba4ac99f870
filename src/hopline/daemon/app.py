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
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from hopline import __version__
from hopline.budget import (
    GATEWAY_URL_ENV,
    HOP_DAEMON_API,
    SERVER_TOKEN_ENV,
    SETTINGS_BY_KEY,
    Budget,
    Settings,
    require_coherent,
)
from hopline.daemon.adoption import run_sweeps
from hopline.daemon.bus import EventBus
from hopline.daemon.cluster import Cluster, ClusterAuth, new_daemon_id
from hopline.daemon.cluster.failover import Failover
from hopline.daemon.embedded_gateway import InternalDispatcher, embedded_gateway, running
from hopline.daemon.errors import SessionError
from hopline.daemon.gates import GateRegistry, gate_router
from hopline.daemon.idle_sessions import IdleSessions
from hopline.daemon.parts import DaemonParts
from hopline.daemon.projection import InboundProjector, oversize_replacement
from hopline.daemon.routes.sessions import session_router
from hopline.daemon.routes.status import status_router
from hopline.daemon.sessions.keys import Replayed
from hopline.daemon.sessions.manager import SessionManager
from hopline.daemon.sessions.ownership import Ownership
from hopline.daemon.storage_faults import install_object_store_error_handler, install_store_error_handlers
from hopline.errors import StoreSettingError
from hopline.http.auth import BearerTokenMiddleware, SessionTokens
from hopline.http.body_limit import BodyLimit
from hopline.http.errors import bounded_json_route
from hopline.http.handlers import install_error_handlers
from hopline.http.incidents import LastResort
from hopline.observe.pipe import PipeObservability
from hopline.sidecars import SidecarStore, sidecar_projector
from hopline.sidecars.expiry import Reaper
from hopline.sidecars.store import open_sidecar_store
from hopline.store.check import check_recent_events, require_usable
from hopline.store.journal import EventJournal
from hopline.store.locations import (
    SIDECARS_DIR,
    SYNC_FULL,
    sidecar_location,
    store_location,
    store_sync,
)
from hopline.store.pg_journal import PgJournal
from hopline.store.postgres import migrate, prove_token
from hopline.store.sqlite_journal import SqliteJournal

log = logging.getLogger("hopline.daemon")


def _error(exc: SessionError) -> JSONResponse:
    exc.body["error"].setdefault("hop", HOP_DAEMON_API)
    retry = exc.body["error"].get("retryAfterSeconds")  # a 503 says when to retry, as a header too
    headers = {"retry-after": str(retry)} if isinstance(retry, int) else None
    return JSONResponse(exc.body, status_code=exc.status, headers=headers)


def open_journal(budget: Budget, settings: Settings, data_dir: Path,
                 listen_url: str) -> tuple[EventJournal, Cluster | None, Ownership]:
    """The journal the settings name (SPEC X): SQLite under ``data_dir``, or PostgreSQL shared by
    several daemons (its cluster settings checked, its schema migrated, this daemon's id minted)."""
    location = store_location(settings.store_url, data_dir)
    if not location.shared:
        assert location.path is not None
        require_usable(location.path, data_dir)  # quick_check, segments agree (T-3): else one line
        sqlite = SqliteJournal(data_dir, path=location.path, sync=store_sync(settings.store_sync))
        return sqlite, None, Ownership(None)
    if not settings.cluster_token:
        raise StoreSettingError(f"{SETTINGS_BY_KEY['cluster_token'].env} must be set with a "
                                "postgresql store (the same on every daemon)")
    advertise = settings.advertise_url or listen_url
    if urllib.parse.urlsplit(advertise).hostname in (None, "0.0.0.0", "::"):
        raise StoreSettingError(f"{SETTINGS_BY_KEY['advertise_url'].env} must name where the other "
                                "daemons reach this one (it listens on every address)")
    migrate(location.dsn)  # idempotent, under an advisory lock: every daemon runs it
    prove_token(location.dsn, settings.cluster_token)  # before it joins: a wrong one stops it here
    check_recent_events(location.dsn)  # a bounded check (T-3): reachable, recent rows whole
    daemon_id = new_daemon_id()
    cluster = Cluster(location.dsn, budget, daemon_id=daemon_id, advertise_url=advertise,
                      token=settings.cluster_token)
    ownership = Ownership(cluster)
    journal = PgJournal(location.dsn, budget, owner=daemon_id, on_fenced=ownership.fenced)
    journal.epochs = cluster.epochs  # the fencing token open_prompt checks (exactly-once starts)
    return journal, cluster, ownership


def _open_sidecars(budget: Budget, settings: Settings, data_dir: Path) -> SidecarStore:
    """The sidecar store the settings name (SPEC S-1, X), synced as ``HOPLINE_STORE_SYNC`` says."""
    return open_sidecar_store(store_location(settings.store_url, data_dir),
                              sidecar_location(settings.sidecar_url, data_dir, os.environ),
                              budget, index_dir=data_dir / SIDECARS_DIR,
                              durable=store_sync(settings.store_sync) == SYNC_FULL)


def _lifespan(parts: DaemonParts) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    store, journal, manager, cluster = parts.store, parts.journal, parts.manager, parts.cluster
    bus, expiry = parts.bus, parts.reaper

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with running(parts.gateway):
            reaper: asyncio.Task[None] | None = None
            if store is not None and expiry is not None:
                await asyncio.to_thread(store.collect_orphans)
                await asyncio.to_thread(store.reap_expired)  # no session is live yet
                reaper = asyncio.create_task(expiry.run())
            await journal.open()
            await manager.start()  # ends the prompts a crash cut (D-8), warms the pool (D-9)
            purger = asyncio.create_task(manager.keys.run_purger())  # expired idempotency keys
            if cluster is not None:
                assert isinstance(journal, PgJournal)
                # settled: every daemon's heartbeat (each third of the lease) saw the new server twice
                settle = 2 * cluster.lease_seconds / 3
                failover = cluster.failover = Failover(bus, journal, settle_seconds=settle,
                                                       last_committed=journal.last_committed,
                                                       on_lost=manager.store_lost)
                journal.on_reconnect = failover.start  # a reconnect may have reached another server
                await cluster.start(on_commit=bus.on_remote_commit, held=manager.held, on_lost=manager.lose,
                                    on_listen=bus.catch_up_all, step_down=manager.step_down,
                                    on_resume=manager.resume, on_server=failover.seen)
                sweeps = asyncio.create_task(run_sweeps(manager, cluster, bus))  # adopt on expiry
            idle = IdleSessions(manager, bus, held=lambda sid: parts.gates.dev_gate(sid) is not None)
            try:
                async with idle.running():
                    yield
            finally:
                if cluster is not None:
                    sweeps.cancel()
                    with contextlib.suppress(BaseException):
                        await sweeps
                    await failover.stop()
                    await cluster.stop()  # its leases expire now: the others adopt them
                for task in (reaper, purger):
                    if task is not None:
                        task.cancel()
                        with contextlib.suppress(BaseException):
                            await task
                await parts.gates.shutdown()  # cancelled runs remove their checkouts and sessions
                bus.close_all()
                await manager.shutdown()
                await journal.close()
                if store is not None:
                    store.close()

    return lifespan


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
    journal, cluster, ownership = open_journal(budget, settings, data_dir, listen_url)
    bus = EventBus(budget, journal)
    bus.owns = ownership.owns
    bus.replay_from_ring = cluster is None  # several daemons: every replay from the store (SPEC T-10)
    instruments = instruments if instruments is not None else PipeObservability(budget)
    child_env = {GATEWAY_URL_ENV: gateway_url} if gateway_url else {}
    session_tokens = None
    if embed_gateway:
        session_tokens = gateway_tokens if gateway_tokens is not None else SessionTokens()
    store = _open_sidecars(budget, settings, data_dir) if sidecars else None
    if store is not None and projector is None:
        projector = sidecar_projector(store, budget, then=oversize_replacement(budget))
    manager = SessionManager(budget, journal=journal, bus=bus, instruments=instruments, agent_cmd=agent_cmd,
                             data_dir=data_dir, child_env=child_env, projector=projector, sidecars=store,
                             agent_env=agent_env, gateway_tokens=session_tokens, ownership=ownership)
    gateway: FastAPI | None = None
    if session_tokens is not None:
        gateway = embedded_gateway(budget, internal_token=internal_token, provider=provider,
                                   session_tokens=session_tokens)
    reaper = Reaper(store, budget.sidecar_reap_interval_seconds, live=manager.live_ids) if store else None
    parts = DaemonParts(budget=budget, settings=settings, journal=journal, bus=bus, manager=manager,
                        gates=GateRegistry(budget, manager, bus, journal, data_dir), instruments=instruments,
                        store=store, reaper=reaper, cluster=cluster, gateway=gateway)
    app = _routes(parts)
    guarded = BodyLimit(app, limit=budget.daemon_json_body_limit, ceiling="daemon_json_body_limit",
                        read_timeout=budget.body_read_timeout_seconds)
    authed: Any = BearerTokenMiddleware(guarded, token=server_token, hop=HOP_DAEMON_API,
                                        open_paths=("/health",), token_env=SERVER_TOKEN_ENV)
    if cluster is not None:  # another daemon's forwarded write: the cluster credential
        authed = ClusterAuth(authed, guarded, token=settings.cluster_token)
    from hopline.console import ConsoleDispatcher

    # The console's static files (/ui/) need no token: the page asks for it, then sends it as a header.
    # Outermost but for the /internal dispatch (the gateway app has its own last resort).
    return InternalDispatcher(LastResort(ConsoleDispatcher(authed), HOP_DAEMON_API), gateway, app)


def _routes(parts: DaemonParts) -> FastAPI:
    """The FastAPI app: its error handlers and every router, mounted in this order."""
    budget = parts.budget
    app = FastAPI(title="hopline daemon", version=__version__, lifespan=_lifespan(parts), docs_url=None,
                  redoc_url=None)
    route_class = bounded_json_route(budget.json_max_depth)
    app.router.route_class = route_class
    install_error_handlers(app, HOP_DAEMON_API)
    install_object_store_error_handler(app)
    if parts.cluster is not None:
        install_store_error_handlers(app)
    app.state.budget = budget
    app.state.manager = parts.manager
    app.state.bus = parts.bus
    app.state.journal = parts.journal
    app.state.instruments = parts.instruments
    app.state.gateway = parts.gateway

    @app.exception_handler(SessionError)
    async def _session_error(_: Request, exc: SessionError) -> JSONResponse:
        return _error(exc)

    @app.exception_handler(Replayed)
    async def _replayed(_: Request, exc: Replayed) -> Response:
        return exc.response

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok"}

    from hopline.console import frames_router

    app.include_router(session_router(parts, route_class))
    app.include_router(status_router(parts, route_class))
    app.include_router(frames_router(budget, parts.instruments))
    app.include_router(gate_router(parts.gates))
    return app
