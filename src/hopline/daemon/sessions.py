"""Daemon sessions: one ACP child per session, relayed onto the event bus (SPEC D-1, D-2, D-6).

Each session owns its child process (simple and isolated: a crash fails that session's pending
prompts and nothing else). Prompts are serialized per session (ACP agents run one turn at a time);
every update a child sends is attributed to the prompt in flight (``promptId`` null between turns
and before the ``session/new`` answer, whose early updates are kept).

A child's exit fails its session's pending prompts with a ``turn_error`` whose ``origin`` is
``"agent"`` and ``reason`` is ``"agent_exited"`` with the exit code: neither the model nor our
request code failed, the agent process did, and the H-8 origins do not describe that.

Children come from the warm pool when it has one ready (D-9, :mod:`.pool`); per-session credentials
travel in ``session/new`` / ``session/load`` ``_meta["hopline.credentials"]``, never in a child's
environment. Only the session's own updates are relayed (D-8): a ``session/update`` for another
``sessionId``, or without an ``update`` object, is dropped and counted (``frame_dropped``); updates
sent before ``session/new`` answers are held until its ``sessionId`` is known. Every update of any
kind passes the projection (S-4); what it could not deliver is counted per turn and ends the turn's
``turn_complete`` as ``lostBytes`` / ``degraded``. Accepted prompts are journaled until their turn
ends, so a daemon that died mid-turn ends them with ``turn_error`` / ``daemon_restarted`` when it
starts again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import secrets
from collections.abc import Awaitable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from hopline.budget import CEILINGS_BY_KEY, HOP_PIPE, Budget
from hopline.daemon.bus import EventBus
from hopline.daemon.child import (
    JSONRPC_METHOD_NOT_FOUND,
    AcpChild,
    AgentExited,
    AgentRpcError,
    child_environment,
)
from hopline.daemon.cluster import Cluster, Owner
from hopline.daemon.errors import SessionError, agent_failure, agent_timeout
from hopline.daemon.journal import EventJournal
from hopline.daemon.load import SessionLoader
from hopline.daemon.pg_journal import PgJournal
from hopline.daemon.pool import WarmPool
from hopline.daemon.projection import InboundProjector, losses, oversize_replacement
from hopline.daemon.session import LIVE_STATES, DaemonSession, PendingPermission, SessionState
from hopline.daemon.storage_faults import is_storage_fault, refusal
from hopline.daemon.turn_end import end_turn_durably
from hopline.gateway.auth import SessionTokens
from hopline.observe.pipe import PipeObservability
from hopline.sidecars.store import SidecarStore
from hopline.vocabulary import (
    CANCEL_REQUESTED,
    CREDENTIAL_GATEWAY_TOKEN,
    CREDENTIAL_SIDECAR_WRITE_TOKEN,
    FRAME_DROPPED,
    META_CREDENTIALS,
    META_PERMISSION_MODE,
    META_PROFILE,
    META_SCRIPTED,
    PERMISSION_ANSWERED,
    PERMISSION_METHOD,
    PERMISSION_REQUEST,
    PROGRESS_METHOD,
    REASON_OWNER_LOST,
    SESSION_ADOPTED,
    SESSION_UPDATE,
    SIDECAR_DIR_ENV,
    STREAM_KIND,
    TURN_COMPLETE,
    TURN_ERROR,
)
from hopline.wire.ndjson import Frame, FrameError, FrameTooLarge
from hopline.wire.passthrough import PASSTHROUGH_MIN_FRAME_BYTES, text_chunk_update_bytes

log = logging.getLogger("hopline.daemon.sessions")

PROTOCOL_VERSION = 1
# Older agents sent the progress notification without the extension prefix.
PROGRESS_METHODS = frozenset({PROGRESS_METHOD, PROGRESS_METHOD.removeprefix("_")})
# frame_dropped reasons of frames that decoded but are not relayed (D-8)
DROP_FOREIGN_SESSION = "foreign_session"
DROP_INVALID_UPDATE = "invalid_update"
DROP_HELD_FULL = "held_updates_full"  # more updates before session/new answered than the ring holds
REASON_DAEMON_RESTARTED = "daemon_restarted"
# Update kinds named in the degradation log line; any other kind is logged as "other" (it is the
# agent's free text).
_LOGGED_KINDS = frozenset({"agent_message_chunk", "agent_thought_chunk", "user_message_chunk", "tool_call",
                           "tool_call_update", "plan", "available_commands_update", "current_mode_update"})


class _ChildEvents:
    """The child's callbacks, bound to one child and to the session that took it (none while the
    child is warm in the pool; a replaced child is ignored)."""

    def __init__(self, manager: SessionManager, session: DaemonSession | None) -> None:
        self.manager = manager
        self.session = session
        self.child: AcpChild | None = None

    def _current(self) -> DaemonSession | None:
        session = self.session
        if self.child is None or session is None or session.child is not self.child:
            return None
        return session

    def on_notification(self, frame: Frame) -> Awaitable[None] | None:
        session = self._current()
        if session is not None:
            return self.manager._on_notification(session, frame)
        if self.session is None:  # a warm child has no session: nothing it sends is anyone's
            self.manager._drop_frame(None, frame.size, DROP_FOREIGN_SESSION)
        return None

    def on_request(self, message: dict[str, Any]) -> None:
        if self.child is not None:
            self.manager._on_request(self._current(), self.child, message)

    def on_frame_error(self, error: FrameError | None, size: int, reason: str) -> None:
        self.manager._on_frame_error(self.session, error, size, reason)

    def on_exit(self, returncode: int | None) -> None:
        session = self._current()
        if session is not None:
            self.manager._on_exit(session, returncode)
        elif self.session is None and self.child is not None:
            self.manager._warm_exited(self.child)

    def batch(self) -> contextlib.AbstractContextManager[None]:
        return self.manager.bus.batch()

    def backpressure(self) -> Awaitable[Any] | None:
        held = self.manager.bus.backpressure()
        if held is not None or self.session is None:
            return held
        return self.manager.bus.catch_up(self.session.id)


class SessionManager:
    def __init__(self, budget: Budget, *, journal: EventJournal, bus: EventBus,
                 instruments: PipeObservability, agent_cmd: Sequence[str], data_dir: Path,
                 child_env: Mapping[str, str] | None = None,
                 projector: InboundProjector | None = None,
                 sidecars: SidecarStore | None = None, agent_env: Sequence[str] = (),
                 gateway_tokens: SessionTokens | None = None, cluster: Cluster | None = None) -> None:
        self.budget = budget
        self.journal = journal
        self.bus = bus
        self.instruments = instruments
        self.agent_cmd = list(agent_cmd)
        self.data_dir = data_dir
        self.extra_env = dict(child_env or {})
        self.projector = projector if projector is not None else oversize_replacement(budget)
        self.handshake_timeout = budget.agent_handshake_timeout_seconds
        self.sidecars = sidecars
        self.agent_env = tuple(agent_env)
        self.gateway_tokens = gateway_tokens
        self.cluster = cluster
        self.owned: set[str] = set()  # sessions whose lease this daemon holds (several daemons)
        self.sessions: dict[str, DaemonSession] = {}
        self.loader = SessionLoader(self)
        bus.on_journal_failed = self._journal_failed
        self._background: set[asyncio.Task[Any]] = set()
        # One warm pool per agent command (D-9); this daemon runs one command.
        self.pools: dict[tuple[str, ...], WarmPool] = {}
        if budget.warm_children > 0:
            self.pools[tuple(self.agent_cmd)] = WarmPool(budget.warm_children,
                                                         lambda: self._start_child(None))
        # What could not be delivered (D-8), for /daemon/status.
        self.lost_updates = 0
        self.lost_bytes = 0
        self.lost_by_reason: dict[str, int] = {}
        self.dropped_by_reason: dict[str, int] = {}
        self.passed_through = 0  # session updates relayed as the agent's own bytes (not re-encoded)

    async def start(self) -> None:
        """At daemon startup: end the prompts a previous run left running, then warm the pool. With
        several daemons another daemon may be running them: an adoption ends a dead owner's."""
        unended = [] if self.cluster is not None else await self.journal.unended_prompts()
        for session_id, prompt_id in unended:
            if await self.journal.get_session(session_id) is None:  # opens it for its event
                continue
            self.bus.publish(session_id, TURN_ERROR, {
                "promptId": prompt_id, "origin": "daemon", "reason": REASON_DAEMON_RESTARTED,
                "message": "the daemon restarted while this prompt was running; its turn ended there "
                           "(POST /session/{id}/load restores the session)"})
            await self.journal.close_prompt(session_id, prompt_id)
            log.warning("prompt ended by a daemon restart")
        for pool in self.pools.values():
            pool.fill()

    @property
    def pool(self) -> WarmPool | None:
        return self.pools.get(tuple(self.agent_cmd))

    # --- lookup -----------------------------------------------------------------------------------

    async def get(self, session_id: str) -> DaemonSession:
        session = self.sessions.get(session_id)
        if session is not None and (self.cluster is None or session_id in self.owned):
            return session
        # Several daemons: a session another daemon owns may have been deleted there; ask the store.
        record = await self.journal.get_session(session_id)
        if record is None or STREAM_KIND in record.options:  # a gate run's stream is no session
            self.sessions.pop(session_id, None)
            raise SessionError(404, "unknown_session", "no such session")
        if session is not None:
            return session
        session = self.sessions.setdefault(session_id, DaemonSession(record.id, record.options,
                                                                     record.agent_session_id))
        return session

    # --- the child ------------------------------------------------------------------------------

    def _child_env(self) -> dict[str, str]:
        """Nothing per session: a warm child is started before its session exists."""
        extra = {**self.budget.to_env(), **self.extra_env}
        extra.setdefault("HOPLINE_DATA_DIR", str(self.data_dir / "agent"))
        if self.sidecars is not None and self.sidecars.local:
            # S-3: an agent on this machine may write its large outputs straight to the store;
            # the write token for one session comes with that session's request (_credentials).
            # A shared store (PostgreSQL index, S3 bodies) is not opened by children: they send
            # their updates inline and the daemon projects them (no store credential in a child).
            extra[SIDECAR_DIR_ENV] = str(self.sidecars.root)
        return child_environment(os.environ, extra, self.agent_env)

    def check_live_capacity(self) -> None:
        limit = self.budget.max_live_sessions
        live = sum(1 for s in self.sessions.values() if s.state in LIVE_STATES)
        if live >= limit:
            setting = CEILINGS_BY_KEY["max_live_sessions"].name
            raise SessionError(503, "too_many_sessions",
                               f"this daemon runs {live} sessions with an agent, the limit of {limit} "
                               f"({setting}); delete one or retry later", limit=limit, observed=live + 1,
                               setting=setting)

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

    async def _handshake(self, awaitable: Any, what: str) -> Any:
        try:
            return await asyncio.wait_for(awaitable, self.handshake_timeout)
        except TimeoutError:
            raise agent_timeout(what, self.handshake_timeout) from None

    async def spawn(self, session: DaemonSession) -> tuple[AcpChild, dict[str, Any]]:
        """A child for ``session``: a warm one from the pool when one is ready, else a new one."""
        pool = self.pool
        taken = pool.take() if pool is not None else None
        if taken is None:
            return await self._start_child(session)
        child, init = taken
        events = child.handler
        assert isinstance(events, _ChildEvents)
        events.session = session
        session.child = child
        return child, init

    async def _start_child(self, session: DaemonSession | None) -> tuple[AcpChild, dict[str, Any]]:
        """Start and initialize a child, for ``session`` or (None) for the warm pool."""
        events = _ChildEvents(self, session)
        child = AcpChild(self.agent_cmd, env=self._child_env(), budget=self.budget,
                         instruments=self.instruments, handler=events)
        events.child = child
        try:
            await child.start()
        except OSError as exc:
            raise SessionError(502, "agent_spawn_failed",
                               f"the agent command could not be started ({type(exc).__name__})") from None
        if session is not None:
            session.child = child
        try:
            init, _ = await self._handshake(child.request("initialize", {
                "protocolVersion": PROTOCOL_VERSION,
                "clientCapabilities": {"fs": {"readTextFile": False, "writeTextFile": False},
                                       "terminal": False},
                "clientInfo": {"name": "hopline-daemon", "version": "0.1.0"},
            }), "initialize")
        except BaseException:
            await self.discard_child(session, child)
            raise
        return child, init if isinstance(init, dict) else {}

    async def discard_child(self, session: DaemonSession | None, child: AcpChild) -> None:
        if session is not None and session.child is child:
            session.child = None
        await child.stop()

    def _warm_exited(self, child: AcpChild) -> None:
        for pool in self.pools.values():
            pool.exited(child)

    # --- create ---------------------------------------------------------------------------------

    async def create(self, *, cwd: str, profile: str | None, permission_mode: str | None,
                     scripted: dict[str, Any] | None,
                     extra_meta: Mapping[str, Any] | None = None) -> DaemonSession:
        """A new session with its own child; ``extra_meta`` adds ``session/new`` ``_meta`` keys (the
        gate run's ``hopline.review``)."""
        self.check_live_capacity()
        session_id = secrets.token_hex(16)
        options = {"cwd": cwd, "profile": profile, "permissionMode": permission_mode, "scripted": scripted,
                   "extraMeta": dict(extra_meta) if extra_meta else None}  # kept for a load or an adoption
        try:
            await self.journal.create_session(session_id, options)
        except Exception as exc:
            if not is_storage_fault(exc):
                raise
            raise refusal(exc, "the session") from None
        session = DaemonSession(session_id, options, None, state=SessionState.STARTING)
        session.early = []
        self.sessions[session_id] = session
        try:
            if self.cluster is not None:  # this daemon owns what it creates
                await self.cluster.claim_new(session_id)
                self.owned.add(session_id)
            child, _ = await self.spawn(session)
            agent_session_id = await self.new_agent_session(session, child)
            await self.journal.set_agent_session_id(session_id, agent_session_id)
        except BaseException as exc:
            await self._forget(session)
            failure = agent_failure(exc, "session/new", self.budget)
            if failure is None and isinstance(exc, Exception) and is_storage_fault(exc):
                failure = refusal(exc, "the session")
            if failure is None:
                raise
            raise failure from None
        session.agent_session_id = agent_session_id
        if self.gateway_tokens is not None:
            self.gateway_tokens.bind(session_id, agent_session_id)
        self._release_early(session)
        session.move(SessionState.READY)
        # Read your writes: what the agent sent during the handshake (its commands, a greeting) is
        # journaled before the id is returned, so a client that subscribes next gets it in its replay.
        await self.bus.flushed()
        log.info("session created", extra={"agentPid": child.pid})
        return session

    async def new_agent_session(self, session: DaemonSession, child: AcpChild) -> str:
        """``session/new`` on ``child`` with the session's options and credentials: the agent's
        session id (a create's, or an adoption's by an agent that cannot load)."""
        options = session.options
        meta: dict[str, Any] = {META_CREDENTIALS: self.credentials(session)}
        for key, meta_key in (("profile", META_PROFILE), ("permissionMode", META_PERMISSION_MODE),
                              ("scripted", META_SCRIPTED)):
            if options.get(key) is not None:
                meta[meta_key] = options[key]
        meta.update(options.get("extraMeta") or {})
        params: dict[str, Any] = {"cwd": session.cwd or str(self.data_dir), "mcpServers": [], "_meta": meta}
        result, _ = await self._handshake(child.request("session/new", params), "session/new")
        agent_session_id = result.get("sessionId") if isinstance(result, dict) else None
        if not isinstance(agent_session_id, str):
            raise SessionError(502, "agent_protocol_error",
                               "the agent answered session/new without a sessionId")
        return agent_session_id

    async def _forget(self, session: DaemonSession) -> None:
        if self.gateway_tokens is not None:
            self.gateway_tokens.revoke(session.id)
        child = session.child
        session.child = None
        if child is not None:
            await child.stop()
        self.bus.close_session(session.id)
        try:
            await self.journal.delete_session(session.id)  # with its lease, on a shared store
        except Exception as exc:  # a full or failing store: the row stays (a later delete removes it)
            if not is_storage_fault(exc):
                raise
            log.error("a session's rows could not be deleted", extra={"exception": type(exc).__name__})
        self.owned.discard(session.id)
        if self.sidecars is not None:
            await asyncio.to_thread(self.sidecars.delete_session, session.id)
        self.sessions.pop(session.id, None)

    # --- prompts ----------------------------------------------------------------------------------

    def _require_ready(self, session: DaemonSession) -> AcpChild:
        child = session.child
        if child is None or not child.alive or session.state is not SessionState.READY:
            state = "loading" if session.state is SessionState.LOADING else "detached"
            message = ("the session is being loaded" if state == "loading" else
                       f"the session has no running agent (last exit code {session.exit_code}); "
                       "POST /session/{id}/load restores it")
            raise SessionError(409, "session_not_ready", message, state=state)
        return child

    async def prompt(self, session: DaemonSession, text: str) -> str:
        self._require_ready(session)
        pending, limit = len(session.prompts), self.budget.max_pending_prompts
        if pending >= limit:
            setting = CEILINGS_BY_KEY["max_pending_prompts"].name
            raise SessionError(429, "too_many_pending_prompts",
                               f"this would be prompt {pending + 1} running or queued in this session, over "
                               f"the limit of {limit} ({setting}); wait for a turn to end", limit=limit,
                               observed=pending + 1, setting=setting)
        prompt_id = "p_" + secrets.token_hex(8)
        # Registered at once (it counts toward the limit while the prompt is stored); the task
        # waits for open_prompt's commit before it sends anything (write-ahead, T-1): a prompt the
        # journal refused never reaches the agent, and a 202 means the prompt is durable.
        accepted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(self._run_prompt(session, prompt_id, text, accepted))
        session.prompts[prompt_id] = task
        task.add_done_callback(lambda _t: session.prompts.pop(prompt_id, None))
        try:
            await self.journal.open_prompt(session.id, prompt_id)  # before the 202: a restart ends it (D-8)
        except BaseException as exc:
            task.cancel()
            if isinstance(exc, Exception) and is_storage_fault(exc):
                log.error("prompt refused: the journal could not store it",
                          extra={"exception": type(exc).__name__})
                raise refusal(exc, "the prompt") from None
            raise
        accepted.set_result(None)
        return prompt_id

    async def _end_turn(self, session: DaemonSession, prompt_id: str, event_type: str,
                        data: dict[str, Any]) -> None:
        """Publish the turn's end with the D-8 fields (the bytes it could not deliver); the prompt is
        then no longer open (a turn cut before this point is ended by the next daemon start). A turn
        whose events the journal refused ends with ``turn_error`` (origin daemon, reason storage),
        stored once the store takes it again (:func:`end_turn_durably`)."""
        lost = session.turn_lost.pop(prompt_id, 0)
        await end_turn_durably(self.bus, self.journal, session, prompt_id,
                               (event_type, {**data, "lostBytes": lost, "degraded": lost > 0}))

    def _journal_failed(self, session_id: str) -> None:
        """An event of the session was not stored: the prompt in flight is cut (its agent is told
        to stop: what it does next could not be recorded) and will end with a storage turn_error."""
        session = self.sessions.get(session_id)
        if session is None or session.current_prompt is None:
            return
        prompt_id = session.current_prompt
        first = prompt_id not in session.storage_faults
        session.storage_faults[prompt_id] = session.storage_faults.get(prompt_id, 0) + 1
        child = session.child
        if first and child is not None and session.agent_session_id is not None:
            log.error("a turn's events could not be stored: the agent's turn is cancelled")
            cancel = child.notify("session/cancel", {"sessionId": session.agent_session_id})
            self._spawn_task(_quietly(cancel))

    async def _run_prompt(self, session: DaemonSession, prompt_id: str, text: str,
                          accepted: asyncio.Future[None]) -> None:
        await accepted  # open_prompt committed (else this task is cancelled: nothing was sent)
        async with session.turn_lock:
            child = session.child
            if child is None or not child.alive or session.agent_session_id is None:
                await self._publish_exit_error(session, prompt_id, session.exit_code)
                return
            session.current_prompt = prompt_id
            session.turn_lost[prompt_id] = 0
            try:
                result, _ = await child.request("session/prompt", {
                    "sessionId": session.agent_session_id, "prompt": [{"type": "text", "text": text}]})
                result = _dict(result)
                turn = _dict(result.get("_meta")).get("hopline.turn")
                turn = turn if isinstance(turn, dict) else None
                await self._end_turn(session, prompt_id, TURN_COMPLETE, {
                    "promptId": prompt_id, "stopReason": result.get("stopReason"), "turn": turn})
            except AgentRpcError as exc:
                data = _dict(exc.data)
                payload: dict[str, Any] = {
                    "promptId": prompt_id,
                    "origin": data.get("origin") if isinstance(data.get("origin"), str) else "agent",
                    "message": data.get("message") if isinstance(data.get("message"), str) else exc.message,
                    "code": exc.code,
                }
                for key in ("status", "hop", "limitBytes", "observedBytes"):
                    if key in data:
                        payload[key] = data[key]
                await self._end_turn(session, prompt_id, TURN_ERROR, payload)
            except AgentExited as exc:
                await self._publish_exit_error(session, prompt_id, exc.returncode)
            finally:
                session.current_prompt = None

    async def _publish_exit_error(self, session: DaemonSession, prompt_id: str, code: int | None) -> None:
        await self._end_turn(session, prompt_id, TURN_ERROR, {
            "promptId": prompt_id, "origin": "agent", "reason": "agent_exited", "exitCode": code,
            "message": f"the agent process exited (code {code}) before the turn finished"})

    async def cancel(self, session: DaemonSession) -> bool:
        child = self._require_ready(session)
        running = session.current_prompt is not None
        await self._journal_first(session, CANCEL_REQUESTED, {"promptId": session.current_prompt},
                                  "the cancel")
        for request_id in list(session.permissions):
            pending = session.permissions.pop(request_id)
            await pending.child.respond(pending.child_request_id,
                                        result={"outcome": {"outcome": "cancelled"}})
        if session.agent_session_id is not None:
            with contextlib.suppress(AgentExited):
                await child.notify("session/cancel", {"sessionId": session.agent_session_id})
        return running

    async def answer_permission(self, session: DaemonSession, request_id: str, *,
                                option_id: str | None, reject: bool) -> dict[str, Any]:
        pending = session.permissions.get(request_id)
        if pending is None:
            raise SessionError(404, "unknown_permission_request",
                               "no pending permission request with this id")
        ids = [o.get("optionId") for o in pending.options if isinstance(o, dict)]
        if reject:
            rejects = [o.get("optionId") for o in pending.options
                       if isinstance(o, dict) and o.get("kind") in ("reject_once", "reject_always")]
            chosen = rejects[0] if rejects else None
            outcome: dict[str, Any] = ({"outcome": "selected", "optionId": chosen} if isinstance(chosen, str)
                                       else {"outcome": "cancelled"})
        else:
            if option_id not in ids:
                raise SessionError(422, "unknown_option", "optionId is not one of the request's options",
                                   options=[i for i in ids if isinstance(i, str)])
            outcome = {"outcome": "selected", "optionId": option_id}
        await self._journal_first(session, PERMISSION_ANSWERED, {"requestId": request_id, "outcome": outcome},
                                  "the permission answer")
        if session.permissions.pop(request_id, None) is None:  # answered by another request meanwhile
            raise SessionError(404, "unknown_permission_request",
                               "no pending permission request with this id")
        await pending.child.respond(pending.child_request_id, result={"outcome": outcome})
        return outcome

    async def _journal_first(self, session: DaemonSession, event_type: str, data: dict[str, Any],
                             what: str) -> None:
        """Write-ahead (T-1): the request's row is committed before the agent hears of it, else
        the client gets 507/503 and the agent nothing."""
        try:
            await self.bus.publish_committed(session.id, event_type, data)
        except Exception as exc:
            if not is_storage_fault(exc):
                raise
            raise refusal(exc, what) from None

    # --- the child's traffic ------------------------------------------------------------------------

    def _on_notification(self, session: DaemonSession, frame: Frame) -> Awaitable[None] | None:
        message, size = frame.message, frame.size
        method = message.get("method")
        params = _dict(message.get("params"))
        if method == "session/update":
            update = params.get("update")
            if not isinstance(update, dict):
                self._drop_frame(session, size, DROP_INVALID_UPDATE)
                return None
            sender = params.get("sessionId")
            if session.agent_session_id is not None and sender != session.agent_session_id:
                self._drop_frame(session, size, DROP_FOREIGN_SESSION)
                return None
            loading = session.loading
            if loading is not None:
                loading.streamed += 1
                if loading.suppress:
                    return None
            prompt_id = session.current_prompt
            if size > self.budget.sidecar_threshold_bytes:
                # A large update may be written to the sidecar store (files, fsync): off the loop.
                return self._project_and_deliver(session, prompt_id, sender, frame)
            # Its frame is under the threshold, so is its JSON: nothing to project (and under the
            # threshold it is under the SSE event limit, a coherence rule).
            self._deliver_update(session, prompt_id, sender, update, raw_update=_passthrough(frame))
        elif method in PROGRESS_METHODS:
            for key in ("progress", "compaction"):
                value = params.get(key)
                if isinstance(value, dict):
                    self.bus.publish(session.id, key, {"promptId": session.current_prompt, key: value})
        return None

    async def _project_and_deliver(self, session: DaemonSession, prompt_id: str | None, sender: Any,
                                   frame: Frame) -> None:
        update = frame.message["params"]["update"]
        projected = await asyncio.to_thread(self.projector, session.id, update)
        if session.id in self.sessions:  # not deleted meanwhile
            raw = _passthrough(frame) if projected is update else None
            self._deliver_update(session, prompt_id, sender, projected, raw_update=raw)

    def _deliver_update(self, session: DaemonSession, prompt_id: str | None, sender: Any,
                        update: dict[str, Any], *, raw_update: memoryview | None = None) -> None:
        """Publish a projected update, or hold it while session/new has not answered. A load's
        replayed updates are not counted again: their losses were counted when they were live.
        ``raw_update``: the update's bytes as the agent wrote them, when nothing changed it."""
        early = session.early
        if session.agent_session_id is None and early is not None:
            size = len(orjson.dumps(update))
            if (len(early) >= self.budget.ring_max_events
                    or session.early_bytes + size > self.budget.ring_max_bytes):
                self._drop_frame(session, size, DROP_HELD_FULL)
                return
            early.append((sender, update))
            session.early_bytes += size
            return
        self.publish_update(session, prompt_id, update, count=session.loading is None, raw_update=raw_update)

    def _release_early(self, session: DaemonSession) -> None:
        """session/new answered: publish the held updates that are this session's, drop the rest."""
        early, session.early, session.early_bytes = session.early or [], None, 0
        for sender, update in early:
            if sender == session.agent_session_id:
                self.publish_update(session, None, update)
            else:
                self._drop_frame(session, len(orjson.dumps(update)), DROP_FOREIGN_SESSION)

    def publish_update(self, session: DaemonSession, prompt_id: str | None, update: dict[str, Any], *,
                        count: bool = True, raw_update: memoryview | None = None) -> None:
        """One ``session_update`` event; what the update says it lost is on the event (``lostBytes``)
        and, with ``count``, in the turn's and the daemon's counters. With ``raw_update`` (the
        update's own bytes, :func:`~hopline.wire.passthrough.text_chunk_update_bytes`) the event's
        data is the envelope with those bytes spliced in: the same JSON, not encoded again."""
        lost, reasons = losses(update)
        if raw_update is not None and not lost:
            payload = b"".join((b'{"promptId":', orjson.dumps(prompt_id), b',"update":', raw_update, b"}"))
            event = self.bus.publish_encoded(session.id, SESSION_UPDATE, payload)
            self.passed_through += event is not None
        else:
            data: dict[str, Any] = {"promptId": prompt_id, "update": update}
            if lost:
                data["lostBytes"] = lost
            event = self.bus.publish(session.id, SESSION_UPDATE, data)
        if event is None:  # over the SSE event limit: the bus sent frame_dropped instead
            lost, reasons = len(orjson.dumps(update)), ["sse_max_event_bytes"]
        if lost and count:
            kind = update.get("sessionUpdate")
            self._count_lost(session, prompt_id, lost, reasons, kind if kind in _LOGGED_KINDS else "other")

    def _count_lost(self, session: DaemonSession | None, prompt_id: str | None, lost: int,
                    reasons: list[str], kind: str) -> None:
        self.lost_updates += 1
        self.lost_bytes += lost
        for reason in reasons:
            self.lost_by_reason[reason] = self.lost_by_reason.get(reason, 0) + 1
        if session is not None:
            session.lost_bytes += lost
            if prompt_id is not None and prompt_id in session.turn_lost:
                session.turn_lost[prompt_id] += lost
        log.warning("payload not delivered whole",
                    extra={"lostBytes": lost, "reasons": reasons, "kind": kind})

    def _drop_frame(self, session: DaemonSession | None, size: int, reason: str, *, decoded: bool = True,
                    **details: Any) -> None:
        """A frame that is not relayed (D-8): counted, said on the session's stream (``frame_dropped``),
        logged by size. ``decoded`` frames were already measured as read frames; the others were
        measured by the child's reader."""
        if decoded:
            self.instruments.record_dropped("inbound", size, observed=True)
        self.dropped_by_reason[reason] = self.dropped_by_reason.get(reason, 0) + 1
        log.warning("pipe frame dropped", extra={"direction": "inbound", "bytes": size, "reason": reason,
                                                 **details})
        if session is None:  # a warm child's: no session to tell
            return
        session.frames_dropped += 1
        self.bus.publish_synthetic(session.id, FRAME_DROPPED, {
            "direction": "inbound", "bytes": size, **details, "reason": reason, "hop": HOP_PIPE,
            "promptId": session.current_prompt})
        if reason != DROP_FOREIGN_SESSION:  # another session's bytes are not this session's loss
            self._count_lost(session, session.current_prompt, size, [reason], "other")

    def _on_request(self, session: DaemonSession | None, child: AcpChild, message: dict[str, Any]) -> None:
        method = message.get("method")
        params = _dict(message.get("params"))
        if method == PERMISSION_METHOD and session is not None and session.child is child:
            request_id = "perm_" + secrets.token_hex(8)
            options = _list(params.get("options"))
            session.permissions[request_id] = PendingPermission(message["id"], options, child)
            self.bus.publish(session.id, PERMISSION_REQUEST, {
                "requestId": request_id, "promptId": session.current_prompt,
                "toolCall": params.get("toolCall"), "options": options})
            return
        error = {"code": JSONRPC_METHOD_NOT_FOUND,
                 "message": f"method not found: the hopline daemon does not serve {str(method)[:64]}"}
        self._spawn_task(child.respond(message["id"], error=error))

    def _on_frame_error(self, session: DaemonSession | None, error: FrameError | None, size: int,
                        reason: str) -> None:
        limit = error.limit if isinstance(error, FrameTooLarge) else None
        details: dict[str, Any] = {"limitBytes": limit}
        if limit is not None:
            details["setting"] = CEILINGS_BY_KEY["pipe_max_frame_bytes"].name
        self._drop_frame(session, size, reason, decoded=False, **details)
        if session is not None and session.loading is not None and limit is not None:
            session.loading.frame_error_size = size
            session.loading.frame_error.set()

    def _on_exit(self, session: DaemonSession, returncode: int | None) -> None:
        session.child = None
        if self.gateway_tokens is not None:  # the child's credential dies with it; a load mints anew
            self.gateway_tokens.revoke(session.id)
        session.exit_code = returncode
        if session.state in (SessionState.READY, SessionState.LOADING):
            session.move(SessionState.DETACHED)
        session.permissions.clear()
        log.info("agent exited", extra={"exitCode": returncode})

    def _spawn_task(self, awaitable: Any) -> None:
        task = asyncio.ensure_future(awaitable)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # --- several daemons (SPEC X): ownership, adoption, a lease lost ---------------------------------

    async def ensure_owner(self, session: DaemonSession, *, spawn: bool = True) -> Owner | None:
        """Before a write: None when this daemon owns the session (adopting it first when its owner's
        lease expired: one daemon wins the compare-and-set), else the live owner to forward it to.
        With ``spawn`` an adoption restores the agent (``session/load``, or ``session/new``)."""
        cluster = self.cluster
        if cluster is None or session.id in self.owned:
            return None
        async with session.adopt_lock:
            if session.id in self.owned:
                return None
            owner = await cluster.owner_of(session.id)
            if owner is not None and owner.live and owner.daemon_id != cluster.daemon_id:
                return owner
            if not await cluster.try_adopt(session.id):
                return await cluster.owner_of(session.id)  # another daemon won the race: forward
            self.owned.add(session.id)
            cluster.adopted += 1
            log.warning("session adopted", extra={"previousOwnerLive": bool(owner and owner.live)})
            # A failed restore keeps the lease (nothing else could run the session meanwhile): the
            # next write, or POST /load, tries the restore again.
            await self._adopt(session, owner, spawn=spawn)
        return None

    async def _adopt(self, session: DaemonSession, previous: Owner | None, *, spawn: bool) -> None:
        journal = self.journal
        assert isinstance(journal, PgJournal)  # several daemons: the PostgreSQL store
        journal.forget_allocations(session.id)  # from an earlier ownership, if any
        await journal.get_session(session.id)  # the last id, read after the compare-and-set
        ended = 0
        for session_id, prompt_id in await journal.unended_prompts(session.id):
            self.bus.publish(session_id, TURN_ERROR, {
                "promptId": prompt_id, "origin": "daemon", "reason": REASON_OWNER_LOST,
                "message": "the daemon running this prompt stopped answering (its lease expired) and "
                           "another daemon adopted the session; this turn ended there"})
            await journal.close_prompt(session_id, prompt_id)  # after the end event, in write order
            ended += 1
        if not spawn:
            return
        loaded = await self.loader.load(session, new_if_unloadable=True)
        restored = loaded.get("source") != "new"
        self.bus.publish(session.id, SESSION_ADOPTED, {
            "daemon": self.cluster.daemon_id if self.cluster is not None else None,
            "previousOwner": previous.daemon_id if previous is not None else None,
            "endedPrompts": ended, "restoredWith": "session/load" if restored else "session/new",
            "agentMemoryRestored": restored,
            "message": ("the agent's session was restored with session/load" if restored else
                        "the agent cannot load sessions: it started a new one, so its own memory of "
                        "this session was not restored (the journal still holds the history)")})

    def held(self) -> set[str]:
        """The sessions this daemon runs (or is starting) a child for under its lease."""
        return {sid for sid in self.owned if sid in self.sessions and self.sessions[sid].state in LIVE_STATES}

    async def lose(self, session_ids: set[str] | tuple[str, ...]) -> None:
        """Another daemon holds these sessions' leases now: stop their children here. Nothing more
        is journaled from here (the journal fences it); their readers reconnect, to any daemon."""
        for session_id in session_ids:
            self.owned.discard(session_id)
            session = self.sessions.get(session_id)
            if session is None:
                continue
            for task in list(session.prompts.values()):
                task.cancel()
            session.permissions.clear()
            child = session.child
            if child is not None:
                await self.discard_child(session, child)
            if session.state in (SessionState.READY, SessionState.LOADING):
                session.move(SessionState.DETACHED)
            self.bus.close_session(session_id)
            log.warning("agent child stopped: its session's lease was taken")

    def fenced(self, session_ids: tuple[str, ...]) -> None:
        """The journal refused events of these sessions (their lease is gone): stop them."""
        self._spawn_task(self.lose(set(session_ids)))

    # --- load (D-6): hopline.daemon.load ---------------------------------------------------------

    async def load(self, session: DaemonSession) -> dict[str, Any]:
        await self.ensure_owner(session)  # (forwarded before this when another daemon owns it)
        return await self.loader.load(session)

    # --- delete / shutdown ----------------------------------------------------------------------

    async def delete(self, session: DaemonSession) -> None:
        for task in list(session.prompts.values()):
            task.cancel()
        await self._forget(session)
        log.info("session deleted")

    async def shutdown(self) -> None:
        await asyncio.gather(*(pool.close() for pool in self.pools.values()), return_exceptions=True)
        children = [s.child for s in self.sessions.values() if s.child is not None]
        for session in self.sessions.values():
            for task in list(session.prompts.values()):
                task.cancel()
        await asyncio.gather(*(c.stop() for c in children), return_exceptions=True)
        for task in list(self._background):
            task.cancel()

    def delivery_status(self) -> dict[str, Any]:
        """What could not be delivered whole (D-8) and what was dropped, daemon-wide."""
        return {"degradedUpdates": self.lost_updates, "lostBytes": self.lost_bytes,
                "lostByReason": dict(self.lost_by_reason), "droppedFrames": dict(self.dropped_by_reason),
                "passedThroughUpdates": self.passed_through}

    async def status(self) -> list[dict[str, Any]]:
        out = []
        for session in self.sessions.values():
            child = session.child
            out.append({
                "sessionId": session.id, "state": session.state,
                "childPid": child.pid if child is not None else None,
                "exitCode": session.exit_code,
                "pendingPrompts": len(session.prompts),
                "pendingPermissions": len(session.permissions),
                "subscribers": self.bus.subscriber_count(session.id),
                "lastEventId": await self.journal.last_id(session.id),
                "framesDropped": session.frames_dropped,
                **({"owned": session.id in self.owned} if self.cluster is not None else {}),
                "lostBytes": session.lost_bytes,
                "stderr": dataclasses.asdict(child.stderr) if child is not None else None,
            })
        return out


def _passthrough(frame: Frame) -> memoryview | None:
    """The update's own bytes when passing them through pays (see the threshold's measurements)."""
    if frame.size < PASSTHROUGH_MIN_FRAME_BYTES:
        return None
    return text_chunk_update_bytes(frame.raw, frame.message)


async def _quietly(awaitable: Awaitable[Any]) -> None:
    with contextlib.suppress(AgentExited, OSError):
        await awaitable


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
