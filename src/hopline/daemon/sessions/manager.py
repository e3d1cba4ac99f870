"""The daemon's sessions as the routes see them (SPEC D-1, D-2, D-6): lookup, create, delete,
startup, shutdown, status; prompts, permissions and loads delegated to their modules.

Each session owns its child process (simple and isolated: a crash fails that session's pending
prompts and nothing else). A child's exit fails its session's pending prompts with a ``turn_error``
whose ``origin`` is ``"agent"`` and ``reason`` is ``"agent_exited"`` with the exit code: neither the
model nor our request code failed, the agent process did, and the H-8 origins do not describe that.
Accepted prompts are journaled until their turn ends, so a daemon that died mid-turn ends them with
``turn_error`` / ``daemon_restarted`` when it starts again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hopline.budget import CEILINGS_BY_KEY, HOP_DAEMON_API, Budget
from hopline.daemon.bus import EventBus
from hopline.daemon.child import AcpChild
from hopline.daemon.cluster import Owner
from hopline.daemon.errors import SessionError, agent_failure
from hopline.daemon.pool import WarmPool
from hopline.daemon.projection import InboundProjector, oversize_replacement
from hopline.daemon.sessions.agents import AgentChildren
from hopline.daemon.sessions.keys import IdempotentWrites, KeyClaim, record_of
from hopline.daemon.sessions.load import SessionLoader
from hopline.daemon.sessions.ownership import Ownership
from hopline.daemon.sessions.permissions import answer_permission
from hopline.daemon.sessions.prompts import Prompts, end_open_prompts
from hopline.daemon.sessions.relay import Relay
from hopline.daemon.sessions.state import LIVE_STATES, DaemonSession, SessionState
from hopline.daemon.sessions.tasks import BackgroundTasks
from hopline.daemon.storage_faults import is_storage_fault, refusal
from hopline.http.auth import SessionTokens
from hopline.observe.pipe import PipeObservability
from hopline.sidecars.store import SidecarStore
from hopline.store.bounded import store_errors
from hopline.store.journal import EventJournal, SessionRecord
from hopline.vocabulary import (
    AGENT_RESTARTED,
    REASON_OWNER_LOST,
    SESSION_ADOPTED,
    SESSION_REAPED,
    STREAM_KIND,
)

log = logging.getLogger("hopline.daemon.sessions")

REASON_DAEMON_RESTARTED = "daemon_restarted"
REASON_STEPPED_DOWN = "owner_stepped_down"


class SessionManager:
    def __init__(self, budget: Budget, *, journal: EventJournal, bus: EventBus,
                 instruments: PipeObservability, agent_cmd: Sequence[str], data_dir: Path,
                 child_env: Mapping[str, str] | None = None,
                 projector: InboundProjector | None = None,
                 sidecars: SidecarStore | None = None, agent_env: Sequence[str] = (),
                 gateway_tokens: SessionTokens | None = None, ownership: Ownership | None = None) -> None:
        self.budget = budget
        self.journal = journal
        self.bus = bus
        self.sidecars = sidecars
        self.gateway_tokens = gateway_tokens
        self.ownership = ownership if ownership is not None else Ownership(None)
        self.cluster = self.ownership.cluster
        self.sessions: dict[str, DaemonSession] = {}
        self.tasks = BackgroundTasks()
        self.relay = Relay(budget, bus=bus, instruments=instruments,
                           projector=projector if projector is not None else oversize_replacement(budget),
                           sessions=self.sessions, tasks=self.tasks, gateway_tokens=gateway_tokens)
        self.agents = AgentChildren(budget, relay=self.relay, journal=journal, instruments=instruments,
                                    agent_cmd=agent_cmd, data_dir=data_dir, child_env=child_env,
                                    sidecars=sidecars, agent_env=agent_env, gateway_tokens=gateway_tokens)
        self.prompts = Prompts(budget, journal, bus, self.tasks, self.ownership, sidecars)
        self.keys = IdempotentWrites(budget, journal)
        self.prompts.retire = self._retire_child
        self.prompts.restore = self._restart_agent
        bus.on_journal_failed = self._journal_failed
        self.loader = SessionLoader(budget, journal=journal, bus=bus, agents=self.agents, relay=self.relay,
                                    check_capacity=self.check_live_capacity)
        self.ownership.on_lost(lambda session_ids: self.tasks.spawn(self.lose(set(session_ids))))

    async def start(self) -> None:
        """At daemon startup: end the prompts a previous run left running, then warm the pool. With
        several daemons another daemon may be running them: an adoption ends a dead owner's."""
        if self.cluster is None:
            await end_open_prompts(
                self.journal, self.bus, await self.journal.unended_prompts(), reason=REASON_DAEMON_RESTARTED,
                message="the daemon restarted while this prompt was running; its turn ended there "
                        "(POST /session/{id}/load restores the session)")
        for pool in self.agents.pools.values():
            pool.fill()

    @property
    def pool(self) -> WarmPool | None:
        return self.agents.pool

    # --- lookup -----------------------------------------------------------------------------------

    async def get(self, session_id: str) -> DaemonSession:
        """The session a client names (its request counts as activity: the idle reaper waits)."""
        session = self.sessions.get(session_id)
        if session is not None:
            session.last_active = time.monotonic()
        if session is not None and (self.cluster is None or self.ownership.owns(session_id)):
            return session
        # Several daemons: a session another daemon owns may have been deleted there; ask the store.
        record = await self.journal.get_session(session_id)
        if record is None or STREAM_KIND in record.options:  # a gate run's stream is no session
            self.sessions.pop(session_id, None)
            raise SessionError(404, "unknown_session", "no such session")
        if session is not None:
            return session
        return self.sessions.setdefault(session_id, DaemonSession(record.id, record.options,
                                                                  record.agent_session_id))

    def find(self, session_id: str) -> DaemonSession | None:
        """The session if this daemon holds it in memory (no store read)."""
        return self.sessions.get(session_id)

    def live_ids(self) -> list[str]:
        """The sessions live here: an agent running them, or a client reading their stream (their
        sidecars never expire, :mod:`hopline.sidecars.expiry`)."""
        return [session_id for session_id, session in list(self.sessions.items())
                if session.state in LIVE_STATES or self.bus.subscriber_count(session_id)]

    def check_live_capacity(self) -> None:
        limit = self.budget.max_live_sessions
        live = sum(1 for s in self.sessions.values() if s.state in LIVE_STATES)
        if live >= limit:
            setting = CEILINGS_BY_KEY["max_live_sessions"].name
            message = (f"this daemon runs {live} sessions with an agent, the limit of {limit} ({setting}); "
                       "delete one or retry later")
            raise SessionError.over_limit(503, "too_many_sessions", "max_live_sessions", limit, live + 1,
                                          message, hop=HOP_DAEMON_API)

    # --- create / delete ------------------------------------------------------------------------

    async def create(self, *, cwd: str, profile: str | None, permission_mode: str | None,
                     scripted: dict[str, Any] | None, extra_meta: Mapping[str, Any] | None = None,
                     key: KeyClaim | None = None) -> DaemonSession:
        """A new session with its own child; ``extra_meta`` adds ``session/new`` ``_meta`` keys (the
        gate run's ``hopline.review``); ``key``: the request's idempotency key, stored with the
        session's row (and gone with it when the create fails)."""
        self.check_live_capacity()
        session_id = secrets.token_hex(16)
        options = {"cwd": cwd, "profile": profile, "permissionMode": permission_mode, "scripted": scripted,
                   "extraMeta": dict(extra_meta) if extra_meta else None}  # kept for a load or an adoption
        record = record_of(key, session_id, 200, {"sessionId": session_id})
        try:
            await self.journal.create_session(session_id, options, record)
        except Exception as exc:
            if not is_storage_fault(exc):
                raise
            raise refusal(exc, "the session") from None
        session = DaemonSession(session_id, options, None, state=SessionState.STARTING)
        session.early = []
        self.sessions[session_id] = session
        try:
            await self.ownership.claim_new(session_id)  # this daemon owns what it creates
            child, _ = await self.agents.spawn(session)
            agent_session_id = await self.agents.new_agent_session(session, child)
            await self.agents.bind(session, agent_session_id)  # journaled: a refusal fails the create
        except BaseException as exc:
            await self._forget(session)
            failure = agent_failure(exc, "session/new", self.budget)
            if failure is None and isinstance(exc, Exception) and is_storage_fault(exc):
                failure = refusal(exc, "the session")
            if failure is None:
                raise
            raise failure from None
        self.relay.release_early(session)
        session.move(SessionState.READY)
        # Read your writes: what the agent sent during the handshake (its commands, a greeting) is
        # journaled before the id is returned, so a client that subscribes next gets it in its replay.
        await self.bus.flushed()
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
        try:
            await self.journal.delete_session(session.id)  # with its lease, on a shared store
        except Exception as exc:  # a full or failing store: the row stays (a later delete removes it)
            if not is_storage_fault(exc):
                raise
            log.error("a session's rows could not be deleted", extra={"exception": type(exc).__name__})
        self.ownership.forget(session.id)
        if self.sidecars is not None:
            await asyncio.to_thread(self.sidecars.delete_session, session.id)
        self.sessions.pop(session.id, None)

    async def delete(self, session: DaemonSession) -> None:
        for task in list(session.prompts.values()):
            task.cancel()
        await self._forget(session)
        log.info("session deleted")

    async def reap(self, session: DaemonSession, idle_seconds: float) -> bool:
        """Stop an idle session's agent (:mod:`hopline.daemon.idle_sessions`) and let the session go
        from memory; its journal stays (events, transcript, sidecars), and a load gives it a new agent.
        False when it is busy again by now."""
        child = session.child
        if child is None or session.state is not SessionState.READY or session.prompts or session.permissions:
            return False
        idle = CEILINGS_BY_KEY["session_idle_seconds"].exceeded(self.budget.session_idle_seconds,
                                                                 round(idle_seconds, 3))
        self.bus.publish(session.id, SESSION_REAPED, {
            "reason": "idle", **idle.fields(),
            "message": f"no prompt, subscriber, permission request or client request for "
                       f"{idle_seconds:.0f} s ({idle.setting}): the agent was stopped; the session's events "
                       "stay readable, and POST /session/{id}/load gives it a new agent"})
        await self.bus.flushed()
        if session.child is not child or session.prompts:  # a prompt came while the event was stored
            return False
        if self.gateway_tokens is not None:
            self.gateway_tokens.revoke(session.id)
        await self.agents.discard_child(session, child)
        session.move(SessionState.DETACHED)
        self.bus.close_session(session.id)
        await self.ownership.release(session.id)  # several daemons: whoever gets a write next adopts it
        self.sessions.pop(session.id, None)
        log.info("idle session reaped", extra={"idleSeconds": round(idle_seconds, 3)})
        return True

    # --- prompts, permissions, load -----------------------------------------------------------------

    async def prompt(self, session: DaemonSession, blocks: list[dict[str, Any]],
                     key: KeyClaim | None = None) -> str:
        return await self.prompts.prompt(session, blocks, key)

    async def cancel(self, session: DaemonSession, key: KeyClaim | None = None) -> bool:
        return await self.prompts.cancel(session, key)

    async def answer_permission(self, session: DaemonSession, request_id: str, *, option_id: str | None,
                                reject: bool, key: KeyClaim | None = None) -> dict[str, Any]:
        return await answer_permission(self.bus, session, request_id, option_id=option_id, reject=reject,
                                       key=key)

    def _journal_failed(self, session_id: str) -> None:
        """The bus could not store an event of the session: its turn in flight is cut (T-1)."""
        session = self.sessions.get(session_id)
        cancel = self.prompts.journal_failed(session) if session is not None else None
        if cancel is not None:
            self.tasks.spawn(cancel)

    def _retire_child(self, session: DaemonSession, child: AcpChild) -> None:
        """A child that ignored a cancel: let go at once (a prompt queued meanwhile waits for a new
        one), stopped in the background; the next prompt's turn starts a new one."""
        if session.child is not child:
            return
        self.relay.detach(session, None)
        session.restart_on_prompt = "cancel_ignored"
        self.tasks.spawn(child.stop())
        log.warning("agent ignored a cancel past its grace: stopped",
                    extra={"graceSeconds": self.budget.cancel_grace_seconds})

    async def _restart_agent(self, session: DaemonSession) -> None:
        """A new child for the session, its memory restored with session/load where the agent
        supports it (else session/new); said on the session's stream."""
        reason = session.restart_on_prompt
        loaded = await self.loader.load(session, new_if_unloadable=True)
        restored = loaded.get("source") != "new"
        why = ("the agent that ignored the cancel" if reason == "cancel_ignored" else
               "the agent stopped when this daemon could not renew its lease")
        self.bus.publish(session.id, AGENT_RESTARTED, {
            "reason": reason, "restoredWith": "session/load" if restored else "session/new",
            "agentMemoryRestored": restored,
            "message": (f"{why} was replaced; the new one restored the session with session/load" if restored
                        else f"{why} was replaced; it cannot load sessions, so the new one started a new "
                             "session without its memory (the journal still holds the history)")})

    async def load(self, session: DaemonSession) -> dict[str, Any]:
        await self.ensure_owner(session)  # (forwarded before this when another daemon owns it)
        return await self.loader.load(session)

    # --- several daemons (SPEC X): ownership, adoption, a lease lost ---------------------------------

    async def ensure_owner(self, session: DaemonSession, *, spawn: bool = True) -> Owner | None:
        """Before a write: None when this daemon owns the session (adopting it first when its owner's
        lease expired), else the live owner to forward it to. With ``spawn`` an adoption restores the
        agent (``session/load``, or ``session/new``)."""
        async def adopt(adopted: DaemonSession, previous: Owner | None) -> None:
            await self._adopt(adopted, previous, spawn=spawn)
        return await self.ownership.ensure_owner(session, adopt)

    async def _adopt(self, session: DaemonSession, previous: Owner | None, *, spawn: bool) -> None:
        journal = self.journal
        journal.forget_allocations(session.id)  # from an earlier ownership, if any
        await journal.get_session(session.id)  # the last id, read after the compare-and-set
        # never below an id this daemon's readers were given (a store that failed over may lack it)
        journal.ensure_above(session.id, self.bus.delivered(session.id))
        ended = await end_open_prompts(
            journal, self.bus, await journal.unended_prompts(session.id), reason=REASON_OWNER_LOST,
            message="the daemon running this prompt stopped answering (its lease expired) and "
                    "another daemon adopted the session; this turn ended there")
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
        return {sid for sid in self.ownership.owned()
                if sid in self.sessions and self.sessions[sid].state in LIVE_STATES}

    async def lose(self, session_ids: set[str] | tuple[str, ...]) -> None:
        """Another daemon holds these sessions' leases now: stop their children here. Nothing more
        is journaled from here (the journal fences it); their readers reconnect, to any daemon."""
        for session_id in list(session_ids):
            self.ownership.forget(session_id)
            if self.cluster is not None:
                self.cluster.epochs.pop(session_id, None)
            session = self.sessions.get(session_id)
            if session is None:
                continue
            for task in list(session.prompts.values()):
                task.cancel()
            session.clear_permissions()
            child = session.child
            if child is not None:
                await self.agents.discard_child(session, child)
            if session.state in (SessionState.READY, SessionState.LOADING):
                session.move(SessionState.DETACHED)
            self.bus.close_session(session_id)
            log.warning("agent child stopped: its session's lease was taken")

    def step_down(self) -> None:
        """The lease may pass to another daemon soon (SPEC T-11): every owned session's agent is
        frozen at once, then killed; their turns stop here unended and unpublished (nothing more is
        published as their owner): whoever holds the lease next ends them. Synchronous: called from
        the lease's timer, it freezes before anything else runs."""
        stepped = [self.sessions[sid] for sid in self.ownership.step_down(set(self.sessions))]
        children = [(session, session.child) for session in stepped if session.child is not None]
        for _, child in children:
            child.freeze()
        for session in stepped:
            for task in list(session.prompts.values()):
                task.cancel()
            session.clear_permissions()  # answered by nobody: the agent is gone
            session.child = None
            if self.gateway_tokens is not None:
                self.gateway_tokens.revoke(session.id)
            if session.state in (SessionState.READY, SessionState.LOADING):
                session.move(SessionState.DETACHED)
            session.restart_on_prompt = REASON_STEPPED_DOWN  # its next prompt starts a new agent
        for _, child in children:
            self.tasks.spawn(child.kill())
        log.error("stepped down: agents frozen and stopped", extra={"sessions": len(stepped),
                                                                     "agents": len(children)})

    def store_lost(self, session_id: str, events: int) -> None:
        """A failover's store lost ``events`` of the session that no daemon held (SPEC T-10; told
        to its readers already): counted, and each prompt in flight here ends degraded."""
        session = self.sessions.get(session_id)
        if session is not None:
            session.lost_events += events
            session.turn_degraded.update(session.turn_lost)  # turn_lost: the prompts in flight

    async def resume(self, renewed: set[str]) -> set[str]:
        """A renewal succeeded after a step-down: the sessions still held are this daemon's again,
        the turns the step-down cut end now (``owner_stepped_down``); the others were adopted
        (returned, their leases lost)."""
        kept, lost = self.ownership.resume(renewed)
        for session_id in sorted(kept):
            await end_open_prompts(
                self.journal, self.bus, await self.journal.unended_prompts(session_id),
                reason=REASON_STEPPED_DOWN,
                message="the daemon running this prompt could not renew its lease in time and stopped its "
                        "agent (so no two agents act on one session); the next prompt starts a new one")
        return lost  # the heartbeat stops what is left of them (lose)

    # --- shutdown / status ----------------------------------------------------------------------

    async def shutdown(self) -> None:
        await asyncio.gather(*(pool.close() for pool in self.agents.pools.values()), return_exceptions=True)
        sessions = list(self.sessions.values())
        children = [s.child for s in sessions if s.child is not None]
        for session in sessions:
            for task in list(session.prompts.values()):
                task.cancel()
        await asyncio.gather(*(c.stop() for c in children), return_exceptions=True)
        self.tasks.cancel_all()

    def delivery_status(self) -> dict[str, Any]:
        return self.relay.delivery_status()

    def summary(self, session_id: str, record: SessionRecord | None = None) -> dict[str, Any]:
        """A session as ``GET /session`` lists it: what it is doing here, and (from its record) when
        it was made, for which workspace and profile. Not in memory: ``detached`` (no agent here)."""
        session = self.sessions.get(session_id)
        row: dict[str, Any] = {
            "sessionId": session_id,
            "state": session.state if session is not None else SessionState.DETACHED,
            "activity": session.activity if session is not None else "idle",
            "pendingPrompts": session.pending_prompts if session is not None else 0,
            "pendingPermissions": len(session.permissions) if session is not None else 0,
            "subscribers": self.bus.subscriber_count(session_id),
        }
        options = record.options if record is not None else session.options if session is not None else {}
        row.update({"created": record.created if record is not None else None, "cwd": options.get("cwd"),
                    "profile": options.get("profile"), "permissionMode": options.get("permissionMode")})
        return row

    async def listing(self, limit: int) -> tuple[list[dict[str, Any]], int]:
        """The newest ``limit`` sessions of the store (a gate run's stream is none), and how many
        there are."""
        records = [r for r in await self.journal.list_sessions() if STREAM_KIND not in r.options]
        newest = sorted(records, key=lambda r: r.created, reverse=True)[:limit]
        return [self.summary(r.id, r) for r in newest], len(records)

    async def status(self) -> list[dict[str, Any]]:
        out = []
        store_away = False  # the store failed once: the status answers without it (lastEventId None)
        # A snapshot: the awaits below let other tasks create and delete sessions (T-5).
        for session in list(self.sessions.values()):
            child = session.child
            last_id: int | None = None
            if not store_away:
                try:
                    last_id = await self.journal.last_id(session.id)
                except store_errors():
                    store_away = True
            out.append({
                "sessionId": session.id, "state": session.state, "activity": session.activity,
                "childPid": child.pid if child is not None else None,
                "exitCode": session.exit_code,
                "pendingPrompts": session.pending_prompts,
                "pendingPermissions": len(session.permissions),
                "pendingPermissionBytes": session.permission_bytes,
                "refusedRequests": session.refused_requests,
                "agentNotReading": session.not_reading,
                "subscribers": self.bus.subscriber_count(session.id),
                "lastEventId": last_id,
                "framesDropped": session.frames_dropped,
                **({"owned": self.ownership.owns(session.id)} if self.cluster is not None else {}),
                "lostBytes": session.lost_bytes,
                "lostEvents": session.lost_events,
                "stderr": dataclasses.asdict(child.stderr) if child is not None else None,
            })
        return out
