"""The internal bearer token (SPEC G-3), checked from headers before any body byte is read."""

from __future__ import annotations

import hmac
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from hopline.gateway.body_limit import send_json

TOKEN_ENV = "HOPLINE_INTERNAL_TOKEN"


def route_path(scope: Scope) -> str:
    """The path inside this app: the mount prefix (``root_path``) removed when mounted."""
    path: str = scope.get("path", "")
    root: str = scope.get("root_path", "")
    if root and path.startswith(root):
        return path[len(root):] or "/"
    return path


def bearer_token(scope: Scope) -> bytes | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            if scheme.lower() == b"bearer" and token:
                return token.strip()
            return None
    return None


class BearerTokenMiddleware:
    """401 JSON unless ``Authorization: Bearer <token>`` matches (constant-time); open paths pass."""

    def __init__(
        self, app: ASGIApp, *, token: str, hop: str, open_paths: Iterable[str] = ("/health",)
    ) -> None:
        if not token:
            raise ValueError("the internal token must not be empty")
        self.app = app
        self._token = token.encode()
        self.hop = hop
        self.open_paths = frozenset(open_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or route_path(scope) in self.open_paths:
            await self.app(scope, receive, send)
            return
        given = bearer_token(scope)
        # compare_digest on equal-length-independent inputs: the time does not depend on the token.
        if given is None or not hmac.compare_digest(given, self._token):
            reason = "missing" if given is None else "wrong"
            await send_json(
                send,
                401,
                {"error": {"type": "unauthorized", "hop": self.hop,
                           "message": f"{reason} bearer token (Authorization: Bearer <{TOKEN_ENV}>)"}},
                extra_headers=[(b"www-authenticate", b"Bearer")],
            )
            return
        await self.app(scope, receive, send)
