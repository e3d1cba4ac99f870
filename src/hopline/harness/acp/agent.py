"""`hopline agent`: the harness's tool loop served as an ACP agent over stdio (SPEC H-10, D-6).

Wire names (relayed by the daemon):

- ``session/new`` ``_meta``: ``hopline.profile`` (default ``qa_automation``),
  ``hopline.permissionMode`` (``"auto"`` auto-approves; env ``HOPLINE_PERMISSION_MODE=auto`` too),
  ``hopline.scripted`` (a dict handed to the scripted model as request ``params["scripted"]``, each
  hint bounded by the budget), ``hopline.review`` (``{base, head}``, two commit ids: a gate session's
  change under review, for ``git_diff``; its ``run_command`` runs tests and linters only),
  ``hopline.credentials`` (see below).
- ``session/new`` and ``session/load`` ``_meta["hopline.credentials"]``: per-session secrets from the
  daemon, ``{"gatewayToken"?: str, "sidecarWriteToken"?: str}``. The gateway token is this session's
  llm-turn credential (D-11), the write token opens its sidecar store (S-3); both are kept in memory
  only: never in the session store, a log, or a tool's environment.
- ``session/prompt`` answers ``{stopReason, _meta: {"hopline.turn": {iterations, compactions,
  maxBodyBytes, ceilingBytes, stopReason, repairs, summarizerFailures}}}``; a failed turn answers a
  JSON-RPC error (code ``-32603``) whose ``data`` is ``{origin, message, status?, hop?, setting?, limit?,
  observed?, unit?, retryable?}`` (:meth:`hopline.errors.TurnFailure.fields`;
  ``retryable``: a transient failure the loop already retried).
- Progress: notification ``_hopline/progress`` with ``{sessionId, progress}`` before every llm-turn
  and ``{sessionId, compaction}`` per compaction.
- ``session/load`` ``_meta["hopline.session.loadReplayMode"] = "bulk"`` answers
  ``_meta["hopline.session.loadReplay"] = {v: 1, updates, partial?, hasMore?, nextCursor?}``;
  otherwise the history is replayed as ``session/update`` notifications before the answer.
- Request ``_hopline/session/loadUpdates`` ``{sessionId, cursor?}`` answers ``{updates, startTime,
  lastUpdated, nextCursor?, partial?, hasMore?}``.

Each prompt's text is echoed first as a ``user_message_chunk`` update, so the persisted log (and
every replay) holds the whole conversation, user side included. The agent's text goes out as the
model streams it, one ``agent_message_chunk`` per delta; the ``plan`` update follows the loop (one
entry per tool iteration, statuses that advance) and is sent when it changes.

Tool updates carry ``_meta["hopline.tool"] = {name, provenance: "builtin"}``. With the daemon's
sidecar store (``HOPLINE_SIDECAR_DIR``) and a session's write token (``session/new`` or
``session/load`` ``_meta["hopline.credentials"]["sidecarWriteToken"]``, kept in memory only; SPEC
S-3) any update over the sidecar threshold is projected into the store (S-4) and carries its
previews and ``_meta["hopline.sidecar"]`` entries instead, on the wire and in the persisted log
alike (:mod:`hopline.harness.acp.sidecars`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from acp import PROTOCOL_VERSION, RequestError
from acp.agent.router import build_agent_router
from acp.connection import Connection
from acp.schema import (
    AgentCapabilities,
    Implementation,
    InitializeResponse,
    NewSessionResponse,
)

from hopline.budget import PERMISSION_MODE_ENV, Budget
from hopline.errors import InputRefused
from hopline.harness.acp.content import PROMPT_CAPABILITIES, echo_blocks, prompt_content
from hopline.harness.acp.messages import (
    ALLOW_ONCE,
    permission_request_of,
    stop_reason_of,
    tool_call_update_of,
    tool_result_update_of,
    tool_status_update_of,
    turn_error_of,
)
from hopline.harness.acp.requests import (
    SessionCredentials,
    credentials_of,
    cursor_of,
    review_of,
    workspace_of,
)
from hopline.harness.acp.sidecars import needs_offload, offload_update, writer_for
from hopline.harness.context import repair
from hopline.harness.failures import failure_brief
from hopline.harness.loop_events import (
    AgentText,
    Compacted,
    IterationProgress,
    LoopEvent,
    PlanUpdated,
    ToolCallFinished,
    ToolCallStarted,
)
from hopline.harness.model import Model
from hopline.harness.sessions import AgentSessionRecord, Page, SessionStore, page_updates
from hopline.sidecars.store import SidecarStore
from hopline.sidecars.writer import SidecarWriter
from hopline.vocabulary import (
    LOAD_UPDATES_METHOD,
    META_LOAD_REPLAY,
    META_LOAD_REPLAY_MODE,
    META_PERMISSION_MODE,
    META_PROFILE,
    META_SCRIPTED,
    META_TAKES_CREDENTIALS,
    META_TURN,
    PROGRESS_METHOD,
)
from hopline.vocabulary import REVIEW_META as META_REVIEW

log = logging.getLogger("hopline.agent")

DEFAULT_PROFILE = "qa_automation"

PERMISSION_TOOLS = frozenset({"run_command", "write_file"})


ModelFactory = Callable[[str, SessionCredentials], Model]  # session id, its credentials -> model
LoopFactory = Callable[..., Any]
# A session's model hints (``_meta.hopline.scripted``) and the field they came in: checked by the
# model that reads them, or refused with InputRefused.
HintCheck = Callable[[Any, str], object]



@dataclasses.dataclass
class LiveSession:
    record: AgentSessionRecord
    auto_approve: bool
    scripted: dict[str, Any] | None
    credentials: SessionCredentials = dataclasses.field(default_factory=SessionCredentials)
    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    task: asyncio.Task[Any] | None = None
    tool_loop: Any = None
    cancelled: bool = False
    open_calls: dict[str, str] = dataclasses.field(default_factory=dict)
    sidecar_writer: SidecarWriter | None = None  # from the request's credentials, in memory only


class HoplineAgent:
    """The ACP agent. ``attach()`` binds it to the SDK connection it talks through."""

    def __init__(
        self,
        budget: Budget,
        store: SessionStore,
        model_factory: ModelFactory,
        loop_factory: LoopFactory,
        *,
        environ: dict[str, str] | None = None,
        sidecar_store: SidecarStore | None = None,
        check_hints: HintCheck | None = None,
    ) -> None:
        self.budget = budget
        self.store = store
        self._model_factory = model_factory
        self._loop_factory = loop_factory
        self._env = dict(os.environ if environ is None else environ)
        self._sessions: dict[str, LiveSession] = {}
        self._conn: Connection | None = None
        self.sidecar_store = sidecar_store
        self._check_hints = check_hints

    def attach(self, conn: Connection) -> None:
        self._conn = conn

    def close(self) -> None:
        """Every session's tools closed (blocking): a gate session's base checkout removed from git's
        worktrees, the kept tool outputs deleted. The agent calls it as it stops."""
        for live in list(self._sessions.values()):
            closing = getattr(live.tool_loop, "close", None)
            if closing is not None:
                with contextlib.suppress(Exception):
                    closing()

    @property
    def conn(self) -> Connection:
        if self._conn is None:
            raise RuntimeError("agent not attached to a connection")
        return self._conn

    # --- ACP: initialize, session/new -------------------------------------------------------

    async def initialize(self, protocol_version: int, client_capabilities: Any = None,
                         client_info: Any = None, **kwargs: Any) -> InitializeResponse:
        from hopline import __version__

        return InitializeResponse(
            protocol_version=PROTOCOL_VERSION,
            agent_capabilities=AgentCapabilities(load_session=True,
                                                 prompt_capabilities=PROMPT_CAPABILITIES),
            agent_info=Implementation(name="hopline", title="hopline agent", version=__version__),
            # hopline's own agent: the daemon sends this one its per-session credentials (T-8)
            field_meta={META_TAKES_CREDENTIALS: True},
        )

    async def authenticate(self, method_id: str, **kwargs: Any) -> None:
        return None

    async def new_session(self, cwd: str, additional_directories: list[str] | None = None,
                          mcp_servers: list[Any] | None = None, **meta: Any) -> NewSessionResponse:
        workspace = workspace_of(cwd)
        profile_name = meta.get(META_PROFILE) or DEFAULT_PROFILE
        if not isinstance(profile_name, str):
            raise RequestError.invalid_params({"field": f"_meta.{META_PROFILE}", "reason": "not a string"})
        self._check_profile(profile_name)
        mode = meta.get(META_PERMISSION_MODE) or self._env.get(PERMISSION_MODE_ENV, "")
        scripted = meta.get(META_SCRIPTED)
        if scripted is not None and self._check_hints is not None:
            try:
                self._check_hints(scripted, f"_meta.{META_SCRIPTED}")
            except InputRefused as refused:
                raise RequestError.invalid_params({"reason": refused.message, **refused.fields}) from None
        credentials = credentials_of(meta)
        options = {"permissionMode": "auto" if mode == "auto" else "ask", "scripted": scripted}
        review = meta.get(META_REVIEW)
        if review is not None:
            options["review"] = review_of(review)
        record = self.store.create(profile_name, str(workspace), options)
        live = self._sessions[record.id] = self._live(record)
        self._take_credentials(live, credentials)
        log.info("session created", extra={"profile": profile_name, "autoApprove": mode == "auto"})
        return NewSessionResponse(session_id=record.id)

    def _live(self, record: AgentSessionRecord) -> LiveSession:
        return LiveSession(record, record.options.get("permissionMode") == "auto",
                           record.options.get("scripted"))

    def _take_credentials(self, live: LiveSession, credentials: SessionCredentials | None) -> None:
        """A request's credentials become the session's (a load brings new ones): its sidecar writer,
        and its gateway token for the next turn's model."""
        if credentials is None or credentials == live.credentials:
            return
        live.credentials = credentials
        live.sidecar_writer = writer_for(self.sidecar_store, credentials.sidecar_write_token)
        if not live.lock.locked():  # the next turn's model uses the new credential
            live.tool_loop = None

    def _check_profile(self, name: str) -> None:
        from hopline.harness.profiles import get_profile

        try:
            get_profile(name, self.budget)
        except (KeyError, ValueError):
            raise RequestError.invalid_params(
                {"field": f"_meta.{META_PROFILE}", "reason": "unknown profile", "profile": name}) from None

    def _session(self, session_id: str) -> LiveSession:
        live = self._sessions.get(session_id)
        if live is not None:
            return live
        try:
            record = self.store.get(session_id)
        except KeyError:
            raise RequestError.invalid_params(
                {"sessionId": session_id, "reason": "unknown session"}) from None
        live = self._live(record)
        self._sessions[session_id] = live
        return live

    # --- updates ------------------------------------------------------------------------------

    async def _send_update(self, session_id: str, update: dict[str, Any]) -> None:
        """Project the update (S-4), persist it (its exact JSON), then send it as a session/update."""
        live = self._sessions.get(session_id)
        if live is not None:
            update = await self._offload(live, update)
        self.store.append_update(session_id, update)
        await self.conn.send_notification("session/update", {"sessionId": session_id, "update": update})

    async def _offload(self, live: LiveSession, update: dict[str, Any]) -> dict[str, Any]:
        """A large update to the sidecar store (S-3), off the event loop; inline without a writer."""
        writer = live.sidecar_writer
        if writer is None or not needs_offload(update, self.budget):
            return update
        return await asyncio.to_thread(offload_update, update, writer, self.budget)

    async def _progress(self, session_id: str, key: str, value: dict[str, Any]) -> None:
        await self.conn.send_notification(PROGRESS_METHOD, {"sessionId": session_id, key: value})

    # --- ACP: session/prompt, session/cancel ---------------------------------------------------

    async def prompt(self, session_id: str, prompt: list[Any], **meta: Any) -> dict[str, Any]:
        live = self._session(session_id)
        if live.lock.locked():
            raise RequestError.invalid_request({"reason": "a prompt is already running in this session"})
        async with live.lock:
            live.cancelled = False
            live.open_calls = {}
            content = await asyncio.to_thread(prompt_content, prompt, live.record.cwd, self.budget)
            text = content.text
            for block in echo_blocks(prompt):  # the user's side of the log, each block as sent
                await self._send_update(session_id, {"sessionUpdate": "user_message_chunk", "content": block})
            for said in content.said():
                await self._send_update(session_id, {"sessionUpdate": "agent_message_chunk",
                                                     "content": {"type": "text", "text": said}})
            if live.tool_loop is None:  # one loop per session: it keeps the cut outputs for read-more
                live.tool_loop = self._build_loop(live)
            conversation = live.record.conversation
            live.task = asyncio.ensure_future(live.tool_loop.run(conversation, text))
            result: Any = None
            try:
                result = await live.task
            except asyncio.CancelledError:
                if not live.cancelled:
                    raise
            finally:
                live.task = None
                returned = getattr(result, "conversation", None)
                if isinstance(returned, list):
                    conversation = returned
                # A loop stopped between a tool call and its answer leaves an orphan call: repair it
                # (counted) before the conversation is kept, so the next turn starts valid.
                conversation, report = repair(conversation)
                if report.total:
                    log.info("conversation repaired after the turn", extra=report.to_json())
                live.record.conversation = conversation
                self.store.save_conversation(session_id, conversation)
            await self._close_open_calls(live)
            if result is None:  # cancelled before the loop could answer
                return self._prompt_answer("cancelled", None)
            failure = getattr(result, "failure", None)
            if result.stop_reason == "failed" and failure is not None:
                log.warning("turn failed", extra={"origin": failure.origin})
                raise turn_error_of(failure)
            stop = "cancelled" if live.cancelled else stop_reason_of(result.stop_reason)
            log.info("turn finished", extra={"stopReason": stop, "iterations": result.iterations})
            return self._prompt_answer(stop, result)

    async def _close_open_calls(self, live: LiveSession) -> None:
        """Tool calls started but never finished (a cancelled turn) end as failed, not dangling."""
        for call_id, name in list(live.open_calls.items()):
            update = tool_status_update_of(call_id, name, "failed", "cancelled")
            await self._send_update(live.record.id, update)
        live.open_calls = {}

    def _prompt_answer(self, stop: str, result: Any) -> dict[str, Any]:
        repairs = getattr(result, "repairs", None)
        summarizer_failures = getattr(result, "summarizer_failures", None) or []
        turn = {
            "iterations": getattr(result, "iterations", 0),
            "compactions": len(getattr(result, "compactions", None) or []),
            "maxBodyBytes": getattr(result, "max_body_bytes", 0),
            "ceilingBytes": self.budget.transport_max_body_bytes,
            "stopReason": stop,
            "repairs": repairs.to_json() if repairs is not None else {},
            # A degraded turn says so: each compaction whose model summary failed (extractive used).
            "summarizerFailures": [failure_brief(f) for f in summarizer_failures],
        }
        return {"stopReason": stop, "_meta": {META_TURN: turn}}

    def _build_loop(self, live: LiveSession) -> Any:
        session_id = live.record.id

        async def sink(event: LoopEvent) -> None:
            if isinstance(event, AgentText):
                await self._send_update(session_id, {"sessionUpdate": "agent_message_chunk",
                                                     "content": {"type": "text", "text": event.text}})
            elif isinstance(event, PlanUpdated):
                await self._send_update(session_id, {"sessionUpdate": "plan", "entries": event.entries})
            elif isinstance(event, ToolCallStarted):
                live.open_calls[event.call_id] = event.name
                asks = event.name in PERMISSION_TOOLS and not live.auto_approve
                await self._send_update(session_id,
                                        tool_call_update_of(event, "pending" if asks else "in_progress"))
            elif isinstance(event, ToolCallFinished):
                name = live.open_calls.get(event.call_id)
                await self._send_update(session_id, tool_result_update_of(event, name))
                # Popped once sent: a turn cancelled during the offload still closes this call.
                live.open_calls.pop(event.call_id, None)
            elif isinstance(event, IterationProgress):
                await self._progress(session_id, "progress", event.to_json())
            elif isinstance(event, Compacted):
                await self._progress(session_id, "compaction", event.record.to_json())

        async def permit(event: ToolCallStarted) -> bool:
            if live.auto_approve or event.name not in PERMISSION_TOOLS:
                return True
            allowed = await self._ask_permission(session_id, event)
            if allowed:
                await self._send_update(session_id,
                                        tool_status_update_of(event.call_id, event.name, "in_progress"))
            return allowed

        return self._loop_factory(live, self._model_factory(session_id, live.credentials), sink, permit)

    async def _ask_permission(self, session_id: str, event: ToolCallStarted) -> bool:
        answer = await self.conn.send_request("session/request_permission",
                                              permission_request_of(session_id, event))
        outcome = (answer or {}).get("outcome") or {}
        allowed = outcome.get("outcome") == "selected" and outcome.get("optionId") == ALLOW_ONCE
        log.info("permission answered", extra={"tool": event.name, "allowed": allowed})
        return bool(allowed)

    async def cancel(self, session_id: str, **meta: Any) -> None:
        live = self._sessions.get(session_id)
        if live is None or live.task is None:
            return
        live.cancelled = True
        # The loop runs inside this task: it catches the cancellation, repairs the conversation and
        # answers "cancelled" (a cancel landing before the loop started is caught in prompt()).
        live.task.cancel()

    # --- ACP: session/load and the loadUpdates extension ----------------------------------------

    async def load_session(self, cwd: str, session_id: str, mcp_servers: list[Any] | None = None,
                           additional_directories: list[str] | None = None, **meta: Any) -> dict[str, Any]:
        live = self._session(session_id)
        self._take_credentials(live, credentials_of(meta))
        workspace = Path(cwd)
        if workspace.is_dir() and str(workspace.resolve()) != live.record.cwd:
            live.record.cwd = str(workspace.resolve())
        if meta.get(META_LOAD_REPLAY_MODE) == "bulk":
            envelope = self._bulk_page(session_id, 0)
            log.info("session loaded", extra={"mode": "bulk", "updates": len(envelope["updates"])})
            return {"_meta": {META_LOAD_REPLAY: envelope}}
        sent = 0
        start = 0
        chunk = self.budget.bulk_replay_max_updates
        while True:
            bodies = self.store.read_updates(session_id, start, chunk)
            for body in bodies:
                await self.conn.send_notification(
                    "session/update", {"sessionId": session_id, "update": orjson.loads(body)})
            sent += len(bodies)
            start += len(bodies)
            if len(bodies) < chunk:
                break
        log.info("session loaded", extra={"mode": "stream", "updates": sent})
        return {}

    def _page(self, session_id: str, start: int, envelope_bytes: int) -> tuple[Page, list[bytes]]:
        total = self.store.update_count(session_id)
        limit = self.budget.bulk_replay_max_updates
        candidates = self.store.read_updates(session_id, start, limit)
        page = page_updates(candidates, start, max_updates=limit,
                            max_bytes=(self.budget.bulk_replay_max_bytes
                                       - self.budget.bulk_page_envelope_bytes),
                            envelope_bytes=envelope_bytes, total=total)
        return page, candidates[: page.count]

    def _bulk_page(self, session_id: str, start: int) -> dict[str, Any]:
        overhead = len(orjson.dumps({"v": 1, "updates": [], "partial": True, "hasMore": True,
                                     "nextCursor": str(2**63)}))
        page, bodies = self._page(session_id, start, overhead)
        envelope: dict[str, Any] = {"v": 1, "updates": [orjson.loads(b) for b in bodies]}
        if page.has_more:
            envelope.update(partial=True, hasMore=True, nextCursor=str(page.next_start))
        return envelope

    async def ext_method(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        if method != LOAD_UPDATES_METHOD.removeprefix("_"):  # the SDK strips the "_"
            raise RequestError.method_not_found(f"_{method}")
        session_id = params.get("sessionId")
        if not isinstance(session_id, str):
            raise RequestError.invalid_params({"field": "sessionId", "reason": "required string"})
        live = self._session(session_id)
        start = cursor_of(params.get("cursor"))
        overhead = len(orjson.dumps({"updates": [], "startTime": live.record.created_at,
                                     "lastUpdated": "x" * 40, "nextCursor": str(2**63),
                                     "partial": True, "hasMore": True}))
        page, bodies = self._page(session_id, start, overhead)
        record = self.store.get(session_id)
        answer: dict[str, Any] = {"updates": [orjson.loads(b) for b in bodies],
                                  "startTime": record.created_at, "lastUpdated": record.updated_at}
        if page.has_more:
            answer.update(nextCursor=str(page.next_start), partial=True, hasMore=True)
        return answer

    async def ext_notification(self, method: str, params: dict[str, Any]) -> None:
        return None



def build_connection(agent: HoplineAgent, transport: Any) -> Connection:
    """The SDK's agent router on our transport; the agent sends through the same connection."""
    conn = Connection(build_agent_router(agent), transport, listening=False)  # type: ignore[arg-type]
    agent.attach(conn)
    return conn


async def serve(agent: HoplineAgent, transport: Any) -> None:
    conn = build_connection(agent, transport)
    try:
        await conn.main_loop()
    finally:
        with contextlib.suppress(Exception):
            await asyncio.shield(conn.close())
