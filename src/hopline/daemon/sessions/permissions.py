"""The agent's permission requests (``session/request_permission``) and the client's answers."""

from __future__ import annotations

import secrets
from typing import Any

from hopline.daemon.bus import EventBus
from hopline.daemon.child import AcpChild
from hopline.daemon.errors import SessionError
from hopline.daemon.sessions.state import DaemonSession, PendingPermission
from hopline.daemon.storage_faults import commit_first
from hopline.vocabulary import PERMISSION_ANSWERED, PERMISSION_REQUEST


def request_permission(bus: EventBus, session: DaemonSession, child: AcpChild, message: dict[str, Any],
                       params: dict[str, Any]) -> None:
    """Hold the child's request under a new id and tell the session's stream."""
    request_id = "perm_" + secrets.token_hex(8)
    options = params.get("options")
    options = options if isinstance(options, list) else []
    session.permissions[request_id] = PendingPermission(message["id"], options, child)
    bus.publish(session.id, PERMISSION_REQUEST, {
        "requestId": request_id, "promptId": session.current_prompt,
        "toolCall": params.get("toolCall"), "options": options})


async def cancel_permissions(session: DaemonSession) -> None:
    """A cancel: every pending request is answered ``cancelled``."""
    for request_id in list(session.permissions):
        pending = session.permissions.pop(request_id)
        await pending.child.respond(pending.child_request_id, result={"outcome": {"outcome": "cancelled"}})


async def answer_permission(bus: EventBus, session: DaemonSession, request_id: str, *, option_id: str | None,
                            reject: bool) -> dict[str, Any]:
    """The client's answer, committed to the journal before the agent hears it (T-1)."""
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
    await commit_first(bus, session.id, PERMISSION_ANSWERED, {"requestId": request_id, "outcome": outcome},
                       "the permission answer")
    if session.permissions.pop(request_id, None) is None:  # answered by another request meanwhile
        raise SessionError(404, "unknown_permission_request", "no pending permission request with this id")
    await pending.child.respond(pending.child_request_id, result={"outcome": outcome})
    return outcome
