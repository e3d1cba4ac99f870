"""Daemon sessions: one ACP child per session, relayed onto the event bus (SPEC D-1, D-2, D-6).

Each session owns its child process (simple and isolated: a crash fails that session's pending
prompts and nothing else). Prompts are serialized per session (ACP agents run one turn at a time);
every update a child sends is attributed to the prompt in flight (``promptId`` null between turns
and before the ``session/new`` answer, whose early updates are kept).

A child's exit fails its session's pending prompts with a ``turn_error`` whose ``origin`` is
``"agent"`` and ``reason`` is ``"agent_exited"`` with the exit code: neither the model nor our
request code failed, the agent process did, and the H-8 origins do not describe that.
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

from hopline.budget import CEILINGS_BY_KEY, HOP_PIPE, HOP_REPLAY, Budget, KiB
from hopline.daemon.bus import EventBus
from hopline.daemon.child import (
    JSONRPC_METHOD_NOT_FOUND,
    AcpChild,
    AgentExited,
    AgentRpcError,
    PipeInstruments,
    child_environment,
)
from hopline.daemon.journal import Journal
from hopline.daemon.projection import InboundProjector, oversize_replacement
from hopline.gateway.auth import SessionTokens
from hopline.sidecars.store import SidecarStore
from hopline.sidecars.writer import ENV_SIDECAR_DIR, ENV_SIDECAR_WRITE_TOKEN
from hopline.wire.ndjson import FrameError, FrameTooLarge

log = logging.getLogger("hopline.daemon.sessions")

# Agent error data echoed to a client is cut here: an error must never carry a payload-sized blob.
ERROR_DATA_ECHO_MAX_BYTES = 4 * KiB
PROTOCOL_VERSION = 1
META_LOAD_REPLAY_MODE = "hopline.session.loadReplayMode"
LOAD_REPLAY_KEYS = ("hopline.session.loadReplay", "qwen.session.loadReplay")
LOAD_UPDATES_METHOD = "_hopline/session/loadUpdates"
PROGRESS_METHODS = frozenset({"_hopline/progress", "hopline/progress"})
PERMISSION_METHOD = "session/request_permission"
OFFLOADED_KINDS = frozenset({"tool_call", "tool_call_update"})  # the updates sidecars apply to (S-1)
# Per-session secrets travel in session/new and session/load params, never in a child's env (D-11).
META_CREDENTIALS = "hopline.credentials"
LIVE_STATES = frozenset({"starting", "ready", "loading"})  # a session with an agent child


class SessionError(Exception):
    """A route-level failure: HTTP status and a JSON error body naming what failed."""

    def __init__(self, status: int, kind: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.body = {"error": {"type": kind, "message": message, **extra}}


@dataclasses.dataclass
class PendingPermission:
    child_request_id: Any
    options: list[dict[str, Any]]
    child: AcpChild


@dataclasses.dataclass
class LoadState:
    suppress: bool  # the journal already holds the history: replayed updates are counted, not published
    streamed: int = 0
    streamed_bytes: int = 0
    frame_error: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    frame_error_size: int = 0


class DaemonSession:
    def __init__(self, session_id: str, options: dict[str, Any], agent_session_id: str | None) -> None:
        self.id = session_id
        self.options = options
        self.agent_session_id = agent_session_id
        self.child: AcpChild | None = None
        self.state = "detached"  # starting | ready | loading | detached
        self.exit_code: int | None = None
        self.turn_lock = asyncio.Lock()
        self.load_lock = asyncio.Lock()
        self.current_prompt: str | None = None
        self.prompts: dict[str, asyncio.Task[None]] = {}
        self.permissions: dict[str, PendingPermission] = {}
        self.loading: LoadState | None = None
        self.frames_dropped = 0

    @property
    def cwd(self) -> str:
        return str(self.options.get("cwd") or "")


class _ChildEvents:
    """The child's callbacks, bound to one session and one child (a replaced child is ignored)."""

    def __init__(self, manager: SessionManager, session: DaemonSession) -> None:
        self.manager = manager
        self.session = session
        self.child: AcpChild | None = None

    def _current(self) -> bool:
        return self.child is not None and self.session.child is self.child

    def on_notification(self, message: dict[str, Any], size: int) -> Awaitable[None] | None:
        if self._current():
            return self.manager._on_notification(self.session, message, size)
        return None

    def on_request(self, message: dict[str, Any]) -> None:
        if self.child is not None:
            self.manager._on_request(self.session, self.child, message)

    def on_frame_error(self, error: FrameError | None, size: int, reason: str) -> None:
        self.manager._on_frame_error(self.session, error, size, reason)

    def on_exit(self, returncode: int | None) -> None:
        if self._current():
            self.manager._on_exit(self.session, returncode)

    def batch(self) -> contextlib.AbstractContextManager[None]:
        return self.manager.bus.batch()


class SessionManager:
    def __init__(self, budget: Budget, *, journal: Journal, bus: EventBus, instruments: PipeInstruments,
                 agent_cmd: Sequence[str], data_dir: Path, child_env: Mapping[str, str] | None = None,
                 projector: InboundProjector | None = None,
                 sidecars: SidecarStore | None = None, agent_env: Sequence[str] = (),
                 gateway_tokens: SessionTokens | None = None) -> None:
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
        self.sessions: dict[str, DaemonSession] = {}
        self._background: set[asyncio.Task[Any]] = set()

    # --- lookup -----------------------------------------------------------------------------------

    def get(self, session_id: str) -> DaemonSession:
        session = self.sessions.get(session_id)
        if session is not None:
            return session
        record = self.journal.get_session(session_id)
        if record is None:
            raise SessionError(404, "unknown_session", "no such session")
        session = DaemonSession(record.id, record.options, record.agent_session_id)
        self.sessions[session_id] = session
        return session

    # --- the child ------------------------------------------------------------------------------

    def _child_env(self, session: DaemonSession) -> dict[str, str]:
        extra = {**self.budget.to_env(), **self.extra_env}
        extra.setdefault("HOPLINE_DATA_DIR", str(self.data_dir / "agent"))
        if self.sidecars is not None:
            # S-3: an agent on this machine may write its large outputs straight to the store,
            # for this session only (the token is scoped to it and revoked with it).
            extra[ENV_SIDECAR_DIR] = str(self.sidecars.root)
            extra[ENV_SIDECAR_WRITE_TOKEN] = self.sidecars.mint_write_token(session.id)
        return child_environment(os.environ, extra, self.agent_env)

    def _credentials(self, session: DaemonSession) -> dict[str, Any]:
        """``_meta`` with this session's gateway token, minted for the child about to get it."""
        if self.gateway_tokens is None:
            return {}
        token = self.gateway_tokens.mint(session.id, session.agent_session_id)
        return {META_CREDENTIALS: {"gatewayToken": token}}

    def _check_live_capacity(self) -> None:
        limit = self.budget.max_live_sessions
        live = sum(1 for s in self.sessions.values() if s.state in LIVE_STATES)
        if live >= limit:
            setting = CEILINGS_BY_KEY["max_live_sessions"].name
            raise SessionError(503, "too_many_sessions",
                               f"this daemon runs {live} sessions with an agent, the limit of {limit} "
                               f"({setting}); delete one or retry later", limit=limit, observed=live + 1,
                               setting=setting)

    async def _handshake(self, awaitable: Any, what: str) -> Any:
        try:
            return await asyncio.wait_for(awaitable, self.handshake_timeout)
        except TimeoutError:
            raise SessionError(504, "agent_timeout",
                               f"the agent did not answer {what} within {self.handshake_timeout} s") from None

    async def _spawn(self, session: DaemonSession) -> tuple[AcpChild, dict[str, Any]]:
        events = _ChildEvents(self, session)
        child = AcpChild(self.agent_cmd, env=self._child_env(session), budget=self.budget,
                         instruments=self.instruments, handler=events)
        events.child = child
        try:
            await child.start()
        except OSError as exc:
            raise SessionError(502, "agent_spawn_failed",
                               f"the agent command could not be started ({type(exc).__name__})") from None
        session.child = child
        try:
            init, _ = await self._handshake(child.request("initialize", {
                "protocolVersion": PROTOCOL_VERSION,
                "clientCapabilities": {"fs": {"readTextFile": False, "writeTextFile": False},
                                       "terminal": False},
                "clientInfo": {"name": "hopline-daemon", "version": "0.1.0"},
            }), "initialize")
        except BaseException:
            await self._discard_child(session, child)
            raise
        return child, init if isinstance(init, dict) else {}

    async def _discard_child(self, session: DaemonSession, child: AcpChild) -> None:
        if session.child is child:
            session.child = None
        await child.stop()

    # --- create ---------------------------------------------------------------------------------

    async def create(self, *, cwd: str, profile: str | None, permission_mode: str | None,
                     scripted: dict[str, Any] | None) -> DaemonSession:
        self._check_live_capacity()
        session_id = secrets.token_hex(16)
        options = {"cwd": cwd, "profile": profile, "permissionMode": permission_mode, "scripted": scripted}
        self.journal.create_session(session_id, options)
        session = DaemonSession(session_id, options, None)
        session.state = "starting"
        self.sessions[session_id] = session
        try:
            child, _ = await self._spawn(session)
            meta: dict[str, Any] = self._credentials(session)
            if profile is not None:
                meta["hopline.profile"] = profile
            if permission_mode is not None:
                meta["hopline.permissionMode"] = permission_mode
            if scripted is not None:
                meta["hopline.scripted"] = scripted
            params: dict[str, Any] = {"cwd": cwd, "mcpServers": []}
            if meta:
                params["_meta"] = meta
            result, _ = await self._handshake(child.request("session/new", params), "session/new")
            agent_session_id = result.get("sessionId") if isinstance(result, dict) else None
            if not isinstance(agent_session_id, str):
                raise SessionError(502, "agent_protocol_error",
                                   "the agent answered session/new without a sessionId")
        except BaseException as exc:
            await self._forget(session)
            if isinstance(exc, AgentRpcError):
                raise SessionError(422, "agent_refused", f"the agent refused session/new: {exc.message}",
                                   code=exc.code, data=_small(exc.data)) from None
            if isinstance(exc, AgentExited):
                raise SessionError(502, "agent_exited",
                                   f"the agent exited during session setup with code {exc.returncode}",
                                   reason="agent_exited", exitCode=exc.returncode) from None
            raise
        session.agent_session_id = agent_session_id
        if self.gateway_tokens is not None:
            self.gateway_tokens.bind(session_id, agent_session_id)
        self.journal.set_agent_session_id(session_id, agent_session_id)
        session.state = "ready"
        log.info("session created", extra={"agentPid": child.pid})
        return session

    async def _forget(self, session: DaemonSession) -> None:
        if self.gateway_tokens is not None:
            self.gateway_tokens.revoke(session.id)
        child = session.child
        session.child = None
        if child is not None:
            await child.stop()
        self.bus.close_session(session.id)
        self.journal.delete_session(session.id)
        if self.sidecars is not None:
            await asyncio.to_thread(self.sidecars.delete_session, session.id)
        self.sessions.pop(session.id, None)

    # --- prompts ----------------------------------------------------------------------------------

    def _require_ready(self, session: DaemonSession) -> AcpChild:
        child = session.child
        if child is None or not child.alive or session.state != "ready":
            state = "loading" if session.state == "loading" else "detached"
            message = ("the session is being loaded" if state == "loading" else
                       f"the session has no running agent (last exit code {session.exit_code}); "
                       "POST /session/{id}/load restores it")
            raise SessionError(409, "session_not_ready", message, state=state)
        return child

    def prompt(self, session: DaemonSession, text: str) -> str:
        self._require_ready(session)
        pending, limit = len(session.prompts), self.budget.max_pending_prompts
        if pending >= limit:
            setting = CEILINGS_BY_KEY["max_pending_prompts"].name
            raise SessionError(429, "too_many_pending_prompts",
                               f"this would be prompt {pending + 1} running or queued in this session, over "
                               f"the limit of {limit} ({setting}); wait for a turn to end", limit=limit,
                               observed=pending + 1, setting=setting)
        prompt_id = "p_" + secrets.token_hex(8)
        task = asyncio.create_task(self._run_prompt(session, prompt_id, text))
        session.prompts[prompt_id] = task
        task.add_done_callback(lambda _t: session.prompts.pop(prompt_id, None))
        return prompt_id

    async def _run_prompt(self, session: DaemonSession, prompt_id: str, text: str) -> None:
        async with session.turn_lock:
            child = session.child
            if child is None or not child.alive or session.agent_session_id is None:
                self._publish_exit_error(session, prompt_id, session.exit_code)
                return
            session.current_prompt = prompt_id
            try:
                result, _ = await child.request("session/prompt", {
                    "sessionId": session.agent_session_id, "prompt": [{"type": "text", "text": text}]})
                result = _dict(result)
                turn = _dict(result.get("_meta")).get("hopline.turn")
                turn = turn if isinstance(turn, dict) else None
                self.bus.publish(session.id, "turn_complete", {
                    "promptId": prompt_id, "stopReason": result.get("stopReason"), "turn": turn})
            except AgentRpcError as exc:
                data = _dict(exc.data)
                payload: dict[str, Any] = {
                    "promptId": prompt_id,
                    "origin": data.get("origin") if isinstance(data.get("origin"), str) else "agent",
                    "message": data.get("message") if isinstance(data.get("message"), str) else exc.message,
                    "code": exc.code,
                }
                for key in ("hop", "limitBytes", "observedBytes"):
                    if key in data:
                        payload[key] = data[key]
                self.bus.publish(session.id, "turn_error", payload)
            except AgentExited as exc:
                self._publish_exit_error(session, prompt_id, exc.returncode)
            finally:
                session.current_prompt = None

    def _publish_exit_error(self, session: DaemonSession, prompt_id: str, code: int | None) -> None:
        self.bus.publish(session.id, "turn_error", {
            "promptId": prompt_id, "origin": "agent", "reason": "agent_exited", "exitCode": code,
            "message": f"the agent process exited (code {code}) before the turn finished"})

    async def cancel(self, session: DaemonSession) -> bool:
        child = self._require_ready(session)
        running = session.current_prompt is not None
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
        session.permissions.pop(request_id, None)
        await pending.child.respond(pending.child_request_id, result={"outcome": outcome})
        return outcome

    # --- the child's traffic ------------------------------------------------------------------------

    def _on_notification(self, session: DaemonSession, message: dict[str, Any],
                         size: int) -> Awaitable[None] | None:
        method = message.get("method")
        params = _dict(message.get("params"))
        if method == "session/update":
            update = params.get("update")
            if not isinstance(update, dict):
                return None
            loading = session.loading
            if loading is not None:
                loading.streamed += 1
                if loading.suppress:
                    return None
            prompt_id = session.current_prompt
            if size > self.budget.sidecar_threshold_bytes and update.get("sessionUpdate") in OFFLOADED_KINDS:
                # A large tool update may be written to the sidecar store (files, fsync): off the loop.
                return self._project_and_publish(session, prompt_id, update)
            self.bus.publish(session.id, "session_update",
                             {"promptId": prompt_id, "update": self.projector(session.id, update)})
        elif method in PROGRESS_METHODS:
            for key in ("progress", "compaction"):
                value = params.get(key)
                if isinstance(value, dict):
                    self.bus.publish(session.id, key, {"promptId": session.current_prompt, key: value})
        return None

    async def _project_and_publish(self, session: DaemonSession, prompt_id: str | None,
                                   update: dict[str, Any]) -> None:
        projected = await asyncio.to_thread(self.projector, session.id, update)
        if session.id in self.sessions:  # not deleted meanwhile
            self.bus.publish(session.id, "session_update", {"promptId": prompt_id, "update": projected})

    def _on_request(self, session: DaemonSession, child: AcpChild, message: dict[str, Any]) -> None:
        method = message.get("method")
        params = _dict(message.get("params"))
        if method == PERMISSION_METHOD and session.child is child:
            request_id = "perm_" + secrets.token_hex(8)
            options = _list(params.get("options"))
            session.permissions[request_id] = PendingPermission(message["id"], options, child)
            self.bus.publish(session.id, "permission_request", {
                "requestId": request_id, "promptId": session.current_prompt,
                "toolCall": params.get("toolCall"), "options": options})
            return
        error = {"code": JSONRPC_METHOD_NOT_FOUND,
                 "message": f"method not found: the hopline daemon does not serve {str(method)[:64]}"}
        self._spawn_task(child.respond(message["id"], error=error))

    def _on_frame_error(self, session: DaemonSession, error: FrameError | None, size: int,
                        reason: str) -> None:
        session.frames_dropped += 1
        limit = error.limit if isinstance(error, FrameTooLarge) else None
        reason_name = {"FrameTooLarge": "frame_too_large", "IncompleteFrame": "incomplete_frame",
                       "InvalidFrame": getattr(error, "reason", "invalid")}.get(reason, reason)
        data: dict[str, Any] = {"direction": "inbound", "bytes": size, "limitBytes": limit,
                                "reason": reason_name, "hop": HOP_PIPE, "promptId": session.current_prompt}
        if limit is not None:
            data["setting"] = CEILINGS_BY_KEY["pipe_max_frame_bytes"].name
        log.warning("pipe frame dropped", extra={"direction": "inbound", "bytes": size, "reason": reason_name,
                                                 "limitBytes": limit})
        self.bus.publish_synthetic(session.id, "frame_dropped", data)
        if session.loading is not None and limit is not None:
            session.loading.frame_error_size = size
            session.loading.frame_error.set()

    def _on_exit(self, session: DaemonSession, returncode: int | None) -> None:
        session.child = None
        if self.gateway_tokens is not None:  # the child's credential dies with it; a load mints anew
            self.gateway_tokens.revoke(session.id)
        session.exit_code = returncode
        if session.state in ("ready", "loading"):
            session.state = "detached"
        session.permissions.clear()
        log.info("agent exited", extra={"exitCode": returncode})

    def _spawn_task(self, awaitable: Any) -> None:
        task = asyncio.ensure_future(awaitable)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # --- load (D-6) -------------------------------------------------------------------------------

    async def load(self, session: DaemonSession) -> dict[str, Any]:
        async with session.load_lock:
            child = session.child
            if child is not None and child.alive and session.state == "ready":
                return {"sessionId": session.id, "source": "journal", "replayedUpdates": 0,
                        "lastEventId": self.journal.last_id(session.id)}
            if session.agent_session_id is None:
                raise SessionError(409, "session_not_loadable", "the session never got an agent session id")
            self._check_live_capacity()
            session.state = "loading"
            try:
                return await self._load_from_child(session)
            except BaseException:
                session.state = "detached"
                session.loading = None
                if session.child is not None:
                    await self._discard_child(session, session.child)
                raise

    async def _load_from_child(self, session: DaemonSession) -> dict[str, Any]:
        child, init = await self._spawn(session)
        caps = _dict(init.get("agentCapabilities"))
        if not caps.get("loadSession"):
            raise SessionError(409, "agent_cannot_load", "the agent does not support session/load")
        loading = LoadState(suppress=self.journal.count(session.id, "session_update") > 0)
        session.loading = loading
        params: dict[str, Any] = {"sessionId": session.agent_session_id,
                                  "cwd": session.cwd or str(self.data_dir), "mcpServers": [],
                                  "_meta": {META_LOAD_REPLAY_MODE: "bulk", **self._credentials(session)}}
        result, size = await self._load_request(child, loading, "session/load", params)
        updates: list[Any] = []
        replay = _replay_of(result)
        pages = 0
        while replay is not None:
            page_updates = _list(replay.get("updates"))
            self._check_bulk(len(page_updates), size)
            updates.extend(page_updates)
            pages += 1
            cursor = replay.get("nextCursor")
            if not replay.get("hasMore") or cursor is None:
                break
            result, size = await self._load_request(child, loading, LOAD_UPDATES_METHOD,
                                                    {"sessionId": session.agent_session_id, "cursor": cursor})
            replay = result if isinstance(result, dict) else None
        self._check_bulk(loading.streamed, 0)
        published = 0
        if not loading.suppress:
            for update in updates:
                if isinstance(update, dict):
                    self.bus.publish(session.id, "session_update",
                                     {"promptId": None, "update": self.projector(session.id, update)})
                    published += 1
        session.loading = None
        session.state = "ready"
        log.info("session loaded", extra={"updates": len(updates) + loading.streamed, "pages": pages,
                                          "published": published})
        return {"sessionId": session.id, "source": "child",
                "replayedUpdates": len(updates) + loading.streamed,
                "publishedUpdates": published + (0 if loading.suppress else loading.streamed),
                "lastEventId": self.journal.last_id(session.id)}

    async def _load_request(self, child: AcpChild, loading: LoadState, method: str,
                            params: dict[str, Any]) -> tuple[Any, int]:
        request = asyncio.ensure_future(child.request(method, params))
        dropped = asyncio.ensure_future(loading.frame_error.wait())
        try:
            done, _ = await asyncio.wait({request, dropped}, timeout=self.handshake_timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            dropped.cancel()
        if request in done:
            try:
                return request.result()
            except AgentRpcError as exc:
                raise SessionError(422, "agent_refused", f"the agent refused {method}: {exc.message}",
                                   code=exc.code, data=_small(exc.data)) from None
            except AgentExited as exc:
                raise SessionError(502, "agent_exited",
                                   f"the agent exited during {method} with code {exc.returncode}",
                                   reason="agent_exited", exitCode=exc.returncode) from None
        request.cancel()
        if dropped in done:
            limit = self.budget.pipe_max_frame_bytes
            raise SessionError(
                422, "bulk_replay_too_large",
                f"bulk replay response of {loading.frame_error_size} bytes exceeds the pipe max frame of "
                f"{limit} bytes ({CEILINGS_BY_KEY['pipe_max_frame_bytes'].name})",
                hop=HOP_PIPE, limitBytes=limit, observedBytes=loading.frame_error_size)
        raise SessionError(504, "agent_timeout", f"the agent did not answer {method} within "
                           f"{self.handshake_timeout} s")

    def _check_bulk(self, count: int, size: int) -> None:
        max_updates = self.budget.bulk_replay_max_updates
        max_bytes = self.budget.bulk_replay_max_bytes
        if count > max_updates:
            raise SessionError(
                422, "bulk_replay_too_large",
                f"bulk replay of {count} updates exceeds the limit of {max_updates} updates "
                f"({CEILINGS_BY_KEY['bulk_replay_max_updates'].name})",
                hop=HOP_REPLAY, limit=max_updates, observed=count)
        if size > max_bytes:
            raise SessionError(
                422, "bulk_replay_too_large",
                f"bulk replay of {size} bytes exceeds the limit of {max_bytes} bytes "
                f"({CEILINGS_BY_KEY['bulk_replay_max_bytes'].name})",
                hop=HOP_REPLAY, limitBytes=max_bytes, observedBytes=size)

    # --- delete / shutdown ----------------------------------------------------------------------

    async def delete(self, session: DaemonSession) -> None:
        for task in list(session.prompts.values()):
            task.cancel()
        await self._forget(session)
        log.info("session deleted")

    async def shutdown(self) -> None:
        children = [s.child for s in self.sessions.values() if s.child is not None]
        for session in self.sessions.values():
            for task in list(session.prompts.values()):
                task.cancel()
        await asyncio.gather(*(c.stop() for c in children), return_exceptions=True)
        for task in list(self._background):
            task.cancel()

    def status(self) -> list[dict[str, Any]]:
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
                "lastEventId": self.journal.last_id(session.id),
                "framesDropped": session.frames_dropped,
                "stderr": dataclasses.asdict(child.stderr) if child is not None else None,
            })
        return out


def _replay_of(result: Any) -> dict[str, Any] | None:
    if not isinstance(result, dict):
        return None
    meta = result.get("_meta")
    if not isinstance(meta, dict):
        return None
    for key in LOAD_REPLAY_KEYS:
        value = meta.get(key)
        if isinstance(value, dict):
            return value
    return None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _small(value: Any) -> Any:
    """Agent error data echoed to the client, cut at ERROR_DATA_ECHO_MAX_BYTES."""
    if value is None:
        return None
    raw = orjson.dumps(value, default=str)
    return value if len(raw) <= ERROR_DATA_ECHO_MAX_BYTES else {"omittedBytes": len(raw)}
