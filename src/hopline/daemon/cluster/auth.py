"""Another daemon's forwarded write (SPEC X) is let in by the cluster credential alone."""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from hopline.budget import HOP_CLUSTER, SETTINGS_BY_KEY
from hopline.http.auth import bearer_token
from hopline.http.body_limit import send_json
from hopline.http.errors import error_body
from hopline.vocabulary import FORWARDED_BY_HEADER

FORWARDED_SCOPE_KEY = "hopline.forwarded"  # set on a request the cluster credential let in


class ClusterAuth:
    """A request carrying ``x-hopline-forwarded-by`` is another daemon's forwarded write: it passes
    only with the cluster credential (constant-time), straight to ``forwarded`` (marked in its
    scope, so it is served here and never forwarded again); every other request goes to ``app``
    (the client-facing auth)."""

    def __init__(self, app: ASGIApp, forwarded: ASGIApp, *, token: str) -> None:
        self.app = app
        self.forwarded = forwarded
        self._token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and any(name == FORWARDED_BY_HEADER.encode()
                                           for name, _ in scope.get("headers", ())):
            given = bearer_token(scope)
            if given is None or not hmac.compare_digest(given, self._token):
                setting = SETTINGS_BY_KEY["cluster_token"].env
                await send_json(send, 401, error_body(
                    HOP_CLUSTER, "unauthorized",
                    f"a forwarded write needs the cluster credential ({setting})"))
                return
            await self.forwarded({**scope, FORWARDED_SCOPE_KEY: True}, receive, send)
            return
        await self.app(scope, receive, send)
