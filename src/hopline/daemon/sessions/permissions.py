"""The agent's requests to the daemon, bounded (SPEC D-2, D-10, T-4), and the client's
answers to its permission requests.

The daemon serves one kind, ``session/request_permission``: it stays pending until a client
answers it. Pending requests of a session have a count ceiling (``HOPLINE_MAX_PENDING_PERMISSIONS``)
and a byte ceiling (``HOPLINE_MAX_PENDING_PERMISSION_BYTES``, the JSON they hold once projected).
Past either, the child gets a JSON-RPC error naming the setting, and the refusal is counted
(``droppedFrames`` and ``lostByReason`` in ``/daemon/status``, ``refusedRequests`` on the session)
and said on the session's stream (``frame_dropped``). A request whose frame is over the sidecar
threshold has its ``toolCall`` passed through the same projection as a large update (sidecar and
preview, or a stub saying what was dropped), so its event always fits an SSE event: a request is
never pending where no client can see it.

Every other method is answered ``-32601`` at once. Each answer is written by the pipe reader
itself, which waits for it before reading on (within the write deadline): a child that floods
requests is held back by its own pipe, and no task is left behind per request.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson

from hopline.budget import CEILINGS_BY_KEY, HOP_PIPE, Budget
from hopline.daemon.bus import EventBus
from hopline.daemon.child import JSONRPC_METHOD_NOT_FOUND, AcpChild
from hopline.daemon.errors import SessionError
from hopline.daemon.projection import InboundProjector, losses
from hopline.daemon.sessions.keys import KeyClaim, record_of
from hopline.daemon.sessions.state import DaemonSession, PendingPermission
from hopline.daemon.storage_faults import commit_first
from hopline.vocabulary import (
    PERMISSION_METHOD,
    PERMISSION_REQUEST,
    PERMISSION_RESOLVED,
    RESOLVED_BY_CANCEL,
    RESOLVED_BY_CLIENT,
)
from hopline.wire.ndjson import Frame

# JSON-RPC's implementation-defined server error range: the request was refused by a ceiling.
JSONRPC_LIMIT_EXCEEDED = -32000
REFUSED_COUNT = "max_pending_permissions"
REFUSED_BYTES = "max_pending_permission_bytes"
REFUSED_EVENT = "sse_max_event_bytes"
# The update kind a permission's toolCall is projected as (its fields are a tool call update's).
_TOOL_CALL_KIND = "tool_call_update"

# (session, size, reason, **details): the relay's drop_frame
DropFrame = Callable[..., None]
# (session, prompt id, lost bytes, reasons, kind): the relay's loss count
CountLost = Callable[[DaemonSession | None, str | None, int, list[str], str], None]


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


class AgentRequests:
    """The agent-initiated requests of every session of one daemon. ``project`` is the relay's
    projection (the one large updates pass); ``drop_frame`` and ``count_lost`` its counts."""

    def __init__(self, budget: Budget, *, bus: EventBus, sessions: Mapping[str, DaemonSession],
                 project: InboundProjector, drop_frame: DropFrame, count_lost: CountLost) -> None:
        self.budget = budget
        self.bus = bus
        self.sessions = sessions
        self.project = project
        self.drop_frame = drop_frame
        self.count_lost = count_lost

    def on_request(self, session: DaemonSession | None, child: AcpChild,
                   frame: Frame) -> Awaitable[None] | None:
        message = frame.message
        method = message.get("method")
        if method != PERMISSION_METHOD or session is None or session.child is not child:
            error = {"code": JSONRPC_METHOD_NOT_FOUND,
                     "message": f"method not found: the hopline daemon does not serve {str(method)[:64]}"}
            return child.respond(message["id"], error=error)
        pending = len(session.permissions)
        if pending >= self.budget.max_pending_permissions:
            return self._refuse(session, child, frame, REFUSED_COUNT, self.budget.max_pending_permissions,
                                pending + 1)
        params = _dict(message.get("params"))
        if frame.size > self.budget.sidecar_threshold_bytes:
            return self._project_and_admit(session, child, frame, params)
        return self._admit(session, child, frame, params.get("toolCall"), frame.size)

    async def _project_and_admit(self, session: DaemonSession, child: AcpChild, frame: Frame,
                                 params: dict[str, Any]) -> None:
        tool_call = params.get("toolCall")
        if isinstance(tool_call, dict):
            # the same projection as a large update: sidecar and preview, or a stub naming the loss
            update = {**tool_call, "sessionUpdate": _TOOL_CALL_KIND}
            projected = await asyncio.to_thread(self.project, session.id, update)
            lost, reasons = losses(projected)
            if lost:
                self.count_lost(session, session.current_prompt, lost, reasons, "permission")
            tool_call = {k: v for k, v in projected.items() if k != "sessionUpdate"}
        if session.id not in self.sessions or session.child is not child:
            return  # deleted or replaced meanwhile: nothing to answer to
        held = len(orjson.dumps({"toolCall": tool_call, "options": params.get("options")}))
        pending = self._admit(session, child, frame, tool_call, held)
        if pending is not None:
            await pending

    def _admit(self, session: DaemonSession, child: AcpChild, frame: Frame, tool_call: Any,
               held: int) -> Awaitable[None] | None:
        message = frame.message
        params = _dict(message.get("params"))
        limit = self.budget.max_pending_permission_bytes
        if session.permission_bytes + held > limit:
            return self._refuse(session, child, frame, REFUSED_BYTES, limit, session.permission_bytes + held)
        options = params.get("options")
        options = options if isinstance(options, list) else []
        request_id = "perm_" + secrets.token_hex(8)
        event = self.bus.publish(session.id, PERMISSION_REQUEST, {
            "requestId": request_id, "promptId": session.current_prompt, "toolCall": tool_call,
            "options": options})
        if event is None:  # still over the SSE event limit (its options): no client could answer it
            return self._refuse(session, child, frame, REFUSED_EVENT, self.budget.sse_max_event_bytes, held)
        session.permissions[request_id] = PendingPermission(message["id"], options, child, held,
                                                        session.current_prompt)
        session.permission_bytes += held
        return None

    def _refuse(self, session: DaemonSession, child: AcpChild, frame: Frame, reason: str, limit: int,
                observed: int) -> Awaitable[None]:
        """The one limit shape (hop, setting, limit, observed, unit) as the JSON-RPC error's data."""
        exceeded = CEILINGS_BY_KEY[reason].exceeded(limit, observed, hop=HOP_PIPE)
        session.refused_requests += 1
        self.drop_frame(session, frame.size, reason, **exceeded.limit_fields())
        error = {"code": JSONRPC_LIMIT_EXCEEDED,
                 "message": f"{HOP_PIPE}: request refused, {observed} over the limit of {limit} "
                            f"({exceeded.setting})",
                 "data": exceeded.fields()}
        return child.respond(frame.message["id"], error=error)


def _resolution(request_id: str, pending: PendingPermission, outcome: dict[str, Any],
                by: str) -> dict[str, Any]:
    return {"requestId": request_id, "promptId": pending.prompt_id, "outcome": outcome, "resolvedBy": by}


def permission_resolved(bus: EventBus, session: DaemonSession, request_id: str, pending: PendingPermission,
                        outcome: dict[str, Any], by: str) -> None:
    """``permission_resolved`` (T-8): every subscriber, and every replay, sees the request answered,
    with the outcome and who answered it (client, cancel, or the agent's exit)."""
    bus.publish(session.id, PERMISSION_RESOLVED, _resolution(request_id, pending, outcome, by))


def resolve_all(bus: EventBus, session: DaemonSession, by: str) -> None:
    """Every open request of the session resolved ``cancelled`` for every reader (a cancel, an exit);
    the caller takes them out."""
    for request_id, pending in list(session.permissions.items()):
        permission_resolved(bus, session, request_id, pending, {"outcome": "cancelled"}, by)


def cancel_all(bus: EventBus, session: DaemonSession) -> list[PendingPermission]:
    """A cancel: every pending request resolved for the readers and taken out, to be answered."""
    resolve_all(bus, session, RESOLVED_BY_CANCEL)
    return release_all(session)


def release(session: DaemonSession, request_id: str) -> PendingPermission | None:
    """Take a pending request out (answered or cancelled), giving its bytes back."""
    pending = session.permissions.pop(request_id, None)
    if pending is not None:
        session.permission_bytes = max(0, session.permission_bytes - pending.bytes)
    return pending


def release_all(session: DaemonSession) -> list[PendingPermission]:
    """A cancel: every pending request taken out, to be answered ``cancelled``."""
    return [p for p in (release(session, r) for r in list(session.permissions)) if p is not None]


async def answer_cancelled(pending: list[PendingPermission]) -> None:
    for permission in pending:
        await permission.child.respond(permission.child_request_id,
                                       result={"outcome": {"outcome": "cancelled"}})


async def answer_permission(bus: EventBus, session: DaemonSession, request_id: str, *, option_id: str | None,
                            reject: bool, key: KeyClaim | None = None) -> dict[str, Any]:
    """The client's answer: taken out (a second answer finds nothing), its ``permission_resolved``
    committed to the journal before the agent hears it (T-1), with the request's idempotency
    ``key``; a refused commit puts it back."""
    pending = session.permissions.get(request_id)
    if pending is None:
        raise SessionError(404, "unknown_permission_request", "no pending permission request with this id")
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
    release(session, request_id)
    record = record_of(key, session.id, 200, {"requestId": request_id, "outcome": outcome})
    try:
        await commit_first(bus, session.id, PERMISSION_RESOLVED,
                           _resolution(request_id, pending, outcome, RESOLVED_BY_CLIENT),
                           "the permission answer", record)
    except BaseException:
        session.permissions[request_id] = pending  # not answered: still open, for a retry
        session.permission_bytes += pending.bytes
        raise
    await pending.child.respond(pending.child_request_id, result={"outcome": outcome})
    return outcome
