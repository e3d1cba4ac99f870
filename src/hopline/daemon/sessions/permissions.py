"""The agent's permission requests (``session/request_permission``) and the client's answers; each
request's end is ``permission_resolved`` for every subscriber and replay (T-8), whoever ended it."""

from __future__ import annotations

import secrets
from typing import Any

from hopline.daemon.bus import EventBus
from hopline.daemon.child import AcpChild
from hopline.daemon.errors import SessionError
from hopline.daemon.sessions.state import DaemonSession, PendingPermission
from hopline.vocabulary import (
    PERMISSION_REQUEST,
    PERMISSION_RESOLVED,
    RESOLVED_BY_CANCEL,
    RESOLVED_BY_CLIENT,
)


def request_permission(bus: EventBus, session: DaemonSession, child: AcpChild, message: dict[str, Any],
                       params: dict[str, Any]) -> None:
    """Hold the child's request under a new id and tell the session's stream."""
    request_id = "perm_" + secrets.token_hex(8)
    options = params.get("options")
    options = options if isinstance(options, list) else []
    session.permissions[request_id] = PendingPermission(message["id"], options, child,
                                                        session.current_prompt)
    bus.publish(session.id, PERMISSION_REQUEST, {
        "requestId": request_id, "promptId": session.current_prompt,
        "toolCall": params.get("toolCall"), "options": options})


def permission_resolved(bus: EventBus, session: DaemonSession, request_id: str, pending: PendingPermission,
                        outcome: dict[str, Any], by: str) -> None:
    """``permission_resolved``: every subscriber, and every replay, sees the request answered,
    with the outcome and who answered it (client, cancel, timeout, or the agent's exit)."""
    bus.publish(session.id, PERMISSION_RESOLVED, {
        "requestId": request_id, "promptId": pending.prompt_id, "outcome": outcome, "resolvedBy": by})


def end_permissions(bus: EventBus, session: DaemonSession, by: str) -> None:
    """The open permission requests of a child that is gone: resolved (cancelled) for every reader."""
    for request_id, pending in list(session.permissions.items()):
        permission_resolved(bus, session, request_id, pending, {"outcome": "cancelled"}, by)
    session.permissions.clear()


async def cancel_permissions(bus: EventBus, session: DaemonSession) -> None:
    """A cancel: every pending request is answered ``cancelled``."""
    for request_id in list(session.permissions):
        pending = session.permissions.pop(request_id)
        outcome = {"outcome": "cancelled"}
        permission_resolved(bus, session, request_id, pending, outcome, RESOLVED_BY_CANCEL)
        await pending.child.respond(pending.child_request_id, result={"outcome": outcome})


async def answer_permission(bus: EventBus, session: DaemonSession, request_id: str, *,
                            option_id: str | None, reject: bool) -> dict[str, Any]:
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
    session.permissions.pop(request_id, None)
    permission_resolved(bus, session, request_id, pending, outcome, RESOLVED_BY_CLIENT)
    await pending.child.respond(pending.child_request_id, result={"outcome": outcome})
    await bus.flushed()  # acknowledged once journaled (T-1)
    return outcome
