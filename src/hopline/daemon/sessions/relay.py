"""The child's traffic onto the bus (SPEC D-8, S-4).

Only the session's own updates are relayed: a ``session/update`` for another ``sessionId``, or
without an ``update`` object, is dropped and counted (``frame_dropped``); updates sent before
``session/new`` answers are held until its ``sessionId`` is known. Every update of any kind passes
the projection (S-4); what it could not deliver is counted per turn and ends the turn's
``turn_complete`` as ``lostBytes`` / ``degraded``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson

from hopline.budget import CEILINGS_BY_KEY, HOP_PIPE, HOP_SIDECARS, Budget
from hopline.daemon.bus import EventBus
from hopline.daemon.child import AcpChild, AgentExited
from hopline.daemon.projection import InboundProjector, losses
from hopline.daemon.sessions.permissions import AgentRequests, resolve_all
from hopline.daemon.sessions.state import DaemonSession, SessionState
from hopline.daemon.sessions.tasks import BackgroundTasks
from hopline.http.auth import SessionTokens
from hopline.observe.pipe import PipeObservability
from hopline.vocabulary import (
    FRAME_DROPPED,
    PROGRESS_METHOD,
    RESOLVED_BY_AGENT_EXIT,
    SESSION_UPDATE,
    SIDECAR_DELAYED,
)
from hopline.wire.ndjson import Frame, FrameError, FrameTooLarge
from hopline.wire.passthrough import PASSTHROUGH_MIN_FRAME_BYTES, text_chunk_update_bytes

log = logging.getLogger("hopline.daemon.sessions")

# Older agents sent the progress notification without the extension prefix.
PROGRESS_METHODS = frozenset({PROGRESS_METHOD, PROGRESS_METHOD.removeprefix("_")})
# frame_dropped reasons of frames that decoded but are not relayed (D-8)
DROP_FOREIGN_SESSION = "foreign_session"
DROP_INVALID_UPDATE = "invalid_update"
DROP_HELD_FULL = "held_updates_full"  # more updates before session/new answered than the ring holds
# A notice, not a limit: a sidecar write still running after this long (or a quarter of the object
# store's deadline, when that is shorter) is said to the client (``sidecar_delayed``); a file
# store's writes take milliseconds, an object store's a fraction of a second.
SIDECAR_DELAYED_AFTER_SECONDS = 1.0
# Update kinds named in the degradation log line; any other kind is logged as "other" (it is the
# agent's free text).
_LOGGED_KINDS = frozenset({"agent_message_chunk", "agent_thought_chunk", "user_message_chunk", "tool_call",
                           "tool_call_update", "plan", "available_commands_update", "current_mode_update"})


class Relay:
    """What every child sends, attributed to its session (``promptId``: the prompt in flight), and
    the daemon-wide counts of what could not be delivered."""

    def __init__(self, budget: Budget, *, bus: EventBus, instruments: PipeObservability,
                 projector: InboundProjector, sessions: Mapping[str, DaemonSession],
                 tasks: BackgroundTasks, gateway_tokens: SessionTokens | None) -> None:
        self.budget = budget
        self.bus = bus
        self.instruments = instruments
        self.projector = projector
        self.sessions = sessions  # the manager's, read only: a session deleted meanwhile gets nothing
        self.tasks = tasks
        self.gateway_tokens = gateway_tokens
        self.lost_updates = 0
        self.lost_bytes = 0
        self.lost_by_reason: dict[str, int] = {}
        self.dropped_by_reason: dict[str, int] = {}
        self.passed_through = 0  # session updates relayed as the agent's own bytes (not re-encoded)
        self.delayed_updates = 0  # large updates whose sidecar write took long enough to say so
        self.requests = AgentRequests(budget, bus=bus, sessions=sessions,
                                      project=lambda sid, update: self.projector(sid, update),
                                      drop_frame=self.drop_frame, count_lost=self._count_lost)

    def on_notification(self, session: DaemonSession, frame: Frame) -> Awaitable[None] | None:
        message, size = frame.message, frame.size
        method = message.get("method")
        params = _dict(message.get("params"))
        if method == "session/update":
            update = params.get("update")
            if not isinstance(update, dict):
                self.drop_frame(session, size, DROP_INVALID_UPDATE)
                return None
            sender = params.get("sessionId")
            if session.agent_session_id is not None and sender != session.agent_session_id:
                self.drop_frame(session, size, DROP_FOREIGN_SESSION)
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
            self._deliver_update(session, prompt_id, sender, update, raw_update=passthrough_bytes(frame))
        elif method in PROGRESS_METHODS:
            for key in ("progress", "compaction"):
                value = params.get(key)
                if isinstance(value, dict):
                    self.bus.publish(session.id, key, {"promptId": session.current_prompt, key: value})
        return None

    async def _project_and_deliver(self, session: DaemonSession, prompt_id: str | None, sender: Any,
                                   frame: Frame) -> None:
        update = frame.message["params"]["update"]
        projection = asyncio.ensure_future(asyncio.to_thread(self.projector, session.id, update))
        # Bounded by the store's own deadlines (HOPLINE_OBJECT_STORE_TIMEOUT per request); past a
        # moment of it, the client is told why its stream is quiet instead of seeing a freeze.
        notice_after = min(SIDECAR_DELAYED_AFTER_SECONDS, self.budget.object_store_timeout_seconds / 4)
        done, _ = await asyncio.wait({projection}, timeout=notice_after)
        if not done:
            self._say_delayed(session, prompt_id, frame.size, notice_after)
        projected = await projection
        if session.id in self.sessions:  # not deleted meanwhile
            raw = passthrough_bytes(frame) if projected is update else None
            self._deliver_update(session, prompt_id, sender, projected, raw_update=raw)

    def _say_delayed(self, session: DaemonSession, prompt_id: str | None, size: int, waited: float) -> None:
        timeout = self.budget.object_store_timeout_seconds
        setting = CEILINGS_BY_KEY["object_store_timeout_seconds"].name
        self.delayed_updates += 1
        log.warning("a large update waits for its sidecar write",
                    extra={"bytes": size, "waitedSeconds": waited})
        self.bus.publish_synthetic(session.id, SIDECAR_DELAYED, {
            "promptId": prompt_id, "hop": HOP_SIDECARS, "bytes": size, "waitedSeconds": waited,
            "timeoutSeconds": timeout, "setting": setting,
            "message": f"a large update ({size} bytes) has waited over {waited:g} s for its sidecar write; "
                       "it follows once stored, or degraded (object_store_unavailable) if an object store "
                       f"fails or passes its deadline of {timeout:g} s per request ({setting})"})

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
                self.drop_frame(session, size, DROP_HELD_FULL)
                return
            early.append((sender, update))
            session.early_bytes += size
            return
        self.publish_update(session, prompt_id, update, count=session.loading is None, raw_update=raw_update)

    def release_early(self, session: DaemonSession) -> None:
        """session/new answered: publish the held updates that are this session's, drop the rest."""
        early, session.early, session.early_bytes = session.early or [], None, 0
        for sender, update in early:
            if sender == session.agent_session_id:
                self.publish_update(session, None, update)
            else:
                self.drop_frame(session, len(orjson.dumps(update)), DROP_FOREIGN_SESSION)

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

    def drop_frame(self, session: DaemonSession | None, size: int, reason: str, *, decoded: bool = True,
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

    def on_request(self, session: DaemonSession | None, child: AcpChild,
                   frame: Frame) -> Awaitable[None] | None:
        return self.requests.on_request(session, child, frame)

    def on_frame_error(self, session: DaemonSession | None, error: FrameError | None, size: int,
                       reason: str) -> None:
        limit = error.limit if isinstance(error, FrameTooLarge) else None
        details: dict[str, Any] = {}
        if limit is not None:
            details = CEILINGS_BY_KEY["pipe_max_frame_bytes"].exceeded(limit, size).fields()
        self.drop_frame(session, size, reason, decoded=False, **details)
        if session is not None and session.loading is not None and limit is not None:
            session.loading.frame_error_size = size
            session.loading.frame_error.set()

    def on_exit(self, session: DaemonSession, returncode: int | None) -> None:
        self.detach(session, returncode)
        log.info("agent exited", extra={"exitCode": returncode})

    def detach(self, session: DaemonSession, returncode: int | None) -> None:
        """The session has no child any more (it exited, or the daemon let it go)."""
        session.child = None
        if self.gateway_tokens is not None:  # the child's credential dies with it; a load mints anew
            self.gateway_tokens.revoke(session.id)
        session.exit_code = returncode
        if session.state in (SessionState.READY, SessionState.LOADING):
            session.move(SessionState.DETACHED)
        resolve_all(self.bus, session, RESOLVED_BY_AGENT_EXIT)
        session.clear_permissions()

    def delivery_status(self) -> dict[str, Any]:
        """What could not be delivered whole (D-8) and what was dropped, daemon-wide."""
        return {"degradedUpdates": self.lost_updates, "lostBytes": self.lost_bytes,
                "lostByReason": dict(self.lost_by_reason), "droppedFrames": dict(self.dropped_by_reason),
                "passedThroughUpdates": self.passed_through, "sidecarDelayedUpdates": self.delayed_updates}


class ChildEvents:
    """The child's callbacks, bound to one child and to the session that took it (none while the
    child is warm in the pool; a replaced child is ignored)."""

    def __init__(self, relay: Relay, session: DaemonSession | None,
                 on_warm_exit: Callable[[AcpChild], None]) -> None:
        self.relay = relay
        self.session = session
        self.on_warm_exit = on_warm_exit
        self.child: AcpChild | None = None

    def _current(self) -> DaemonSession | None:
        session = self.session
        if self.child is None or session is None or session.child is not self.child:
            return None
        return session

    def on_notification(self, frame: Frame) -> Awaitable[None] | None:
        session = self._current()
        if session is not None:
            return self.relay.on_notification(session, frame)
        if self.session is None and not extension_without_session(frame.message):
            # a warm child has no session: nothing it sends is anyone's. An extension notification
            # that names no session (an agent's own ``_auth/status_update`` after initialize) is
            # the agent's business with no one: ignored, not a drop.
            self.relay.drop_frame(None, frame.size, DROP_FOREIGN_SESSION)
        return None

    def on_request(self, frame: Frame) -> Awaitable[None] | None:
        if self.child is None:
            return None
        return self.relay.on_request(self._current(), self.child, frame)

    def on_stalled(self, failure: AgentExited) -> None:
        """Its child passed a write deadline or its silence deadline: the prompt in flight fails
        (its request's future), the queued ones end as they start, saying why; the child is stopped."""
        session = self._current()
        if session is not None:
            session.child_failure = failure
        if self.child is not None:
            self.relay.tasks.spawn(self.child.stop())

    def on_frame_error(self, error: FrameError | None, size: int, reason: str) -> None:
        self.relay.on_frame_error(self.session, error, size, reason)

    def on_exit(self, returncode: int | None) -> None:
        session = self._current()
        if session is not None:
            self.relay.on_exit(session, returncode)
        elif self.session is None and self.child is not None:
            self.on_warm_exit(self.child)

    def batch(self) -> contextlib.AbstractContextManager[None]:
        return self.relay.bus.batch()

    def backpressure(self) -> Awaitable[Any] | None:
        held = self.relay.bus.backpressure(self.session.id if self.session is not None else None)
        if held is not None or self.session is None:
            return held
        return self.relay.bus.catch_up(self.session.id)


def extension_without_session(message: dict[str, Any]) -> bool:
    """An extension notification (its method starts with ``_``, ACP's extension prefix) whose params
    name no ``sessionId``."""
    method = message.get("method")
    params = _dict(message.get("params"))
    return isinstance(method, str) and method.startswith("_") and "sessionId" not in params


def passthrough_bytes(frame: Frame) -> memoryview | None:
    """The update's own bytes when passing them through pays (see the threshold's measurements)."""
    if frame.size < PASSTHROUGH_MIN_FRAME_BYTES:
        return None
    return text_chunk_update_bytes(frame.raw, frame.message)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}
