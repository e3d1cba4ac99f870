"""The agent children of a daemon's sessions (SPEC D-2, D-9, D-11): spawning, the warm pool, the
handshake (``initialize``, ``session/new``), per-session credentials, and binding the agent's
session id to ours (one place for a create, a load's fallback and an adoption).

Children come from the warm pool when it has one ready (:mod:`hopline.daemon.pool`); per-session
credentials travel in ``session/new`` / ``session/load`` ``_meta["hopline.credentials"]``, never in a
child's environment.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hopline import __version__
from hopline.budget import DATA_DIR_ENV, SIDECAR_DIR_ENV, Budget
from hopline.daemon.child import AcpChild, child_environment
from hopline.daemon.credentials import takes_credentials
from hopline.daemon.errors import SessionError, agent_timeout
from hopline.daemon.pool import WarmPool
from hopline.daemon.sessions.relay import ChildEvents, Relay
from hopline.daemon.sessions.state import DaemonSession
from hopline.http.auth import SessionTokens
from hopline.observe.pipe import PipeObservability
from hopline.sidecars.store import SidecarStore
from hopline.store.journal import EventJournal
from hopline.vocabulary import (
    CREDENTIAL_GATEWAY_TOKEN,
    CREDENTIAL_SIDECAR_WRITE_TOKEN,
    META_CREDENTIALS,
    META_PERMISSION_MODE,
    META_PROFILE,
    META_SCRIPTED,
)

PROTOCOL_VERSION = 1


class AgentChildren:
    def __init__(self, budget: Budget, *, relay: Relay, journal: EventJournal,
                 instruments: PipeObservability, agent_cmd: Sequence[str], data_dir: Path,
                 child_env: Mapping[str, str] | None, sidecars: SidecarStore | None,
                 agent_env: Sequence[str], gateway_tokens: SessionTokens | None) -> None:
        self.budget = budget
        self.relay = relay
        self.journal = journal
        self.instruments = instruments
        self.agent_cmd = list(agent_cmd)
        self.data_dir = data_dir
        self.extra_env = dict(child_env or {})
        self.sidecars = sidecars
        self.agent_env = tuple(agent_env)
        self.gateway_tokens = gateway_tokens
        self.handshake_timeout = budget.agent_handshake_timeout_seconds
        # One warm pool per agent command (D-9); this daemon runs one command.
        self.pools: dict[tuple[str, ...], WarmPool] = {}
        if budget.warm_children > 0:
            self.pools[tuple(self.agent_cmd)] = WarmPool(budget.warm_children, lambda: self._start(None))

    @property
    def pool(self) -> WarmPool | None:
        return self.pools.get(tuple(self.agent_cmd))

    def _child_env(self) -> dict[str, str]:
        """Nothing per session: a warm child is started before its session exists."""
        extra = {**self.budget.to_env(), **self.extra_env}
        extra.setdefault(DATA_DIR_ENV, str(self.data_dir / "agent"))
        if self.sidecars is not None and self.sidecars.local:
            # S-3: an agent on this machine may write its large outputs straight to the store;
            # the write token for one session comes with that session's request (credentials).
            # A shared store (PostgreSQL index, S3 bodies) is not opened by children: they send
            # their updates inline and the daemon projects them (no store credential in a child).
            extra[SIDECAR_DIR_ENV] = str(self.sidecars.root)
        return child_environment(os.environ, extra, self.agent_env)

    def credentials_meta(self, session: DaemonSession, child: AcpChild) -> dict[str, Any]:
        """The ``_meta`` entry of a session/new or session/load that carries credentials: none for a
        child that did not claim them in its initialize answer (:mod:`hopline.daemon.credentials`, T-8)."""
        if not takes_credentials(child.initialized):
            return {}
        return {META_CREDENTIALS: self.credentials(session)}

    def credentials(self, session: DaemonSession) -> dict[str, str]:
        """``_meta["hopline.credentials"]`` of a session/new or session/load: this session's only,
        minted for the child about to get them (the write token and the gateway token are scoped to
        the session and revoked with it, D-11)."""
        credentials: dict[str, str] = {}
        if self.sidecars is not None and self.sidecars.local:
            credentials[CREDENTIAL_SIDECAR_WRITE_TOKEN] = self.sidecars.mint_write_token(session.id)
        if self.gateway_tokens is not None:
            credentials[CREDENTIAL_GATEWAY_TOKEN] = self.gateway_tokens.mint(session.id,
                                                                             session.agent_session_id)
        return credentials

    async def handshake(self, awaitable: Any, what: str) -> Any:
        try:
            return await asyncio.wait_for(awaitable, self.handshake_timeout)
        except TimeoutError:
            raise agent_timeout(what, self.handshake_timeout) from None

    async def spawn(self, session: DaemonSession) -> tuple[AcpChild, dict[str, Any]]:
        """A child for ``session``: a warm one from the pool when one is ready, else a new one."""
        pool = self.pool
        taken = await pool.take_waiting(self.handshake_timeout) if pool is not None else None
        if taken is None:
            return await self._start(session)
        child, init = taken
        events = child.handler
        assert isinstance(events, ChildEvents)
        events.session = session
        self._attach(session, child)
        return child, init

    @staticmethod
    def _attach(session: DaemonSession, child: AcpChild) -> None:
        """``child`` is the session's now: what the daemon knew of the one before goes."""
        session.child = child
        session.child_failure = None
        session.agent_init = child.initialized

    async def _start(self, session: DaemonSession | None) -> tuple[AcpChild, dict[str, Any]]:
        """Start and initialize a child, for ``session`` or (None) for the warm pool."""
        events = ChildEvents(self.relay, session, self._warm_exited)
        child = AcpChild(self.agent_cmd, env=self._child_env(), budget=self.budget,
                         instruments=self.instruments, handler=events)
        events.child = child
        try:
            await child.start()
        except OSError as exc:
            raise SessionError(502, "agent_spawn_failed",
                               f"the agent command could not be started ({type(exc).__name__})") from None
        if session is not None:
            self._attach(session, child)
        try:
            init, _ = await self.handshake(child.request("initialize", {
                "protocolVersion": PROTOCOL_VERSION,
                "clientCapabilities": {"fs": {"readTextFile": False, "writeTextFile": False},
                                       "terminal": False},
                "clientInfo": {"name": "hopline-daemon", "version": __version__},
            }), "initialize")
        except BaseException:
            await self.discard_child(session, child)
            raise
        child.initialized = init if isinstance(init, dict) else {}
        if session is not None and session.child is child:
            session.agent_init = child.initialized
        return child, child.initialized

    async def discard_child(self, session: DaemonSession | None, child: AcpChild) -> None:
        if session is not None and session.child is child:
            session.child = None
        await child.stop()

    def _warm_exited(self, child: AcpChild) -> None:
        for pool in self.pools.values():
            pool.exited(child)

    async def new_agent_session(self, session: DaemonSession, child: AcpChild) -> str:
        """``session/new`` on ``child`` with the session's options and credentials: the agent's
        session id (a create's, or an adoption's by an agent that cannot load)."""
        options = session.options
        meta: dict[str, Any] = self.credentials_meta(session, child)
        for key, meta_key in (("profile", META_PROFILE), ("permissionMode", META_PERMISSION_MODE),
                              ("scripted", META_SCRIPTED)):
            if options.get(key) is not None:
                meta[meta_key] = options[key]
        meta.update(options.get("extraMeta") or {})
        params: dict[str, Any] = {"cwd": session.cwd or str(self.data_dir), "mcpServers": [], "_meta": meta}
        result, _ = await self.handshake(child.request("session/new", params), "session/new")
        agent_session_id = result.get("sessionId") if isinstance(result, dict) else None
        if not isinstance(agent_session_id, str):
            raise SessionError(502, "agent_protocol_error",
                               "the agent answered session/new without a sessionId")
        return agent_session_id

    async def bind(self, session: DaemonSession, agent_session_id: str) -> None:
        """The agent's session id is the session's: its gateway token names it, the journal keeps it."""
        session.agent_session_id = agent_session_id
        if self.gateway_tokens is not None:
            self.gateway_tokens.bind(session.id, agent_session_id)
        await self.journal.set_agent_session_id(session.id, agent_session_id)
