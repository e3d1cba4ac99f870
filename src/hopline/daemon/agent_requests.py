"""Requests an agent child sends to the daemon, bounded (SPEC D-2, D-10, T-4; issue #26).

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
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

import orjson

from hopline.budget import CEILINGS_BY_KEY, HOP_PIPE
from hopline.daemon.child import JSONRPC_METHOD_NOT_FOUND, AcpChild
from hopline.daemon.projection import losses
from hopline.daemon.session import DaemonSession, PendingPermission
from hopline.vocabulary import PERMISSION_METHOD, PERMISSION_REQUEST
from hopline.wire.ndjson import Frame

if TYPE_CHECKING:
    from hopline.daemon.sessions import SessionManager

# JSON-RPC's implementation-defined server error range: the request was refused by a ceiling.
JSONRPC_LIMIT_EXCEEDED = -32000
REFUSED_COUNT = "max_pending_permissions"
REFUSED_BYTES = "max_pending_permission_bytes"
REFUSED_EVENT = "sse_max_event_bytes"
# The update kind a permission's toolCall is projected as (its fields are a tool call update's).
_TOOL_CALL_KIND = "tool_call_update"


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


class AgentRequests:
    """The agent-initiated requests of every session of one manager."""

    def __init__(self, manager: SessionManager) -> None:
        self.manager = manager
        self.budget = manager.budget

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
        return self._admit(session, child, frame, params.get("toolCall"), [], frame.size)

    async def _project_and_admit(self, session: DaemonSession, child: AcpChild, frame: Frame,
                                 params: dict[str, Any]) -> None:
        tool_call = params.get("toolCall")
        reasons: list[str] = []
        if isinstance(tool_call, dict):
            # the same projection as a large update: sidecar and preview, or a stub naming the loss
            update = {**tool_call, "sessionUpdate": _TOOL_CALL_KIND}
            projected = await asyncio.to_thread(self.manager.projector, session.id, update)
            lost, reasons = losses(projected)
            if lost:
                self.manager._count_lost(session, session.current_prompt, lost, reasons, "permission")
            tool_call = {k: v for k, v in projected.items() if k != "sessionUpdate"}
        if session.id not in self.manager.sessions or session.child is not child:
            return  # deleted or replaced meanwhile: nothing to answer to
        held = len(orjson.dumps({"toolCall": tool_call, "options": params.get("options")}))
        pending = self._admit(session, child, frame, tool_call, reasons, held)
        if pending is not None:
            await pending

    def _admit(self, session: DaemonSession, child: AcpChild, frame: Frame, tool_call: Any,
               reasons: list[str], held: int) -> Awaitable[None] | None:
        message = frame.message
        params = _dict(message.get("params"))
        limit = self.budget.max_pending_permission_bytes
        if session.permission_bytes + held > limit:
            return self._refuse(session, child, frame, REFUSED_BYTES, limit, session.permission_bytes + held)
        options = params.get("options")
        options = options if isinstance(options, list) else []
        request_id = "perm_" + secrets.token_hex(8)
        event = self.manager.bus.publish(session.id, PERMISSION_REQUEST, {
            "requestId": request_id, "promptId": session.current_prompt, "toolCall": tool_call,
            "options": options})
        if event is None:  # still over the SSE event limit (its options): no client could answer it
            return self._refuse(session, child, frame, REFUSED_EVENT, self.budget.sse_max_event_bytes, held)
        session.permissions[request_id] = PendingPermission(message["id"], options, child, held)
        session.permission_bytes += held
        return None

    def _refuse(self, session: DaemonSession, child: AcpChild, frame: Frame, reason: str, limit: int,
                observed: int) -> Awaitable[None]:
        setting = CEILINGS_BY_KEY[reason].name
        session.refused_requests += 1
        self.manager._drop_frame(session, frame.size, reason, limit=limit, observed=observed, setting=setting)
        error = {"code": JSONRPC_LIMIT_EXCEEDED,
                 "message": f"{HOP_PIPE}: request refused, {observed} over the limit of {limit} ({setting})",
                 "data": {"hop": HOP_PIPE, "setting": setting, "limit": limit, "observed": observed}}
        return child.respond(frame.message["id"], error=error)

    @staticmethod
    def release(session: DaemonSession, request_id: str) -> PendingPermission | None:
        """Take a pending request out (answered or cancelled), giving its bytes back."""
        pending = session.permissions.pop(request_id, None)
        if pending is not None:
            session.permission_bytes = max(0, session.permission_bytes - pending.bytes)
        return pending
