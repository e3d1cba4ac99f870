"""The last resort of both apps (SPEC T-5): an exception no route handled reaches the client as
hopline's JSON error with an ``incidentId``, and the log has the same id with the traceback's frames
(``hopline.logs.exception_fields``). A 500 is always a bug to fix; this makes it one that can be found.

Two layers, because Starlette's ``ServerErrorMiddleware`` answers a route's exception with the
handler registered for ``Exception`` and then re-raises it to the server (which would log it again as
"Exception in ASGI application"): :func:`answer_incident` is that handler, and :class:`LastResort`,
outermost, swallows what it already answered and answers what was raised outside FastAPI (the
middlewares around it).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hopline.http.errors import error_response

log = logging.getLogger("hopline.incident")
_INCIDENT_ATTR = "_hopline_incident_id"


def incident_response(hop: str, incident_id: str) -> Response:
    return error_response(500, hop, "internal_error",
                          "hopline failed to answer this request: a bug; its log names this incidentId",
                          incidentId=incident_id)


def record_incident(exc: BaseException, hop: str) -> str:
    """Log ``exc`` once under a fresh incident id (frames only, never locals), and mark it answered."""
    incident_id = secrets.token_hex(8)
    log.error("unhandled exception", exc_info=exc, extra={"incidentId": incident_id, "hop": hop})
    with contextlib.suppress(AttributeError):  # an exception type with __slots__: logged twice at worst
        setattr(exc, _INCIDENT_ATTR, incident_id)
    return incident_id


def answer_incident_for(hop: str) -> Any:
    """The handler for ``Exception`` that Starlette's server-error middleware calls."""

    async def answer_incident(_: Request, exc: Exception) -> Response:
        return incident_response(hop, record_incident(exc, hop))

    return answer_incident


class LastResort:
    """Outermost ASGI layer: nothing raised inside reaches the server unanswered or unlogged."""

    def __init__(self, app: ASGIApp, hop: str) -> None:
        self.app = app
        self.hop = hop

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # the lifespan's failures are the server's to report
            await self.app(scope, receive, send)
            return
        started = False

        async def send_tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, send_tracked)
        except Exception as exc:
            if getattr(exc, _INCIDENT_ATTR, None) is not None:
                return  # answered and logged by the app's own handler
            incident_id = record_incident(exc, self.hop)
            if not started:
                await incident_response(self.hop, incident_id)(scope, receive, send)
