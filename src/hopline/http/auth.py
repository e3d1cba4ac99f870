"""Bearer tokens (SPEC G-3, D-7, D-11), checked from headers before any body byte is read.

Two kinds: the app's own token (``HOPLINE_INTERNAL_TOKEN`` for the gateway, ``HOPLINE_SERVER_TOKEN``
for the daemon), good for every route; and per-session gateway tokens (:class:`SessionTokens`),
which the daemon mints for each session's agent: each opens the llm-turn route of that one session
and nothing else, and stops working when the daemon revokes it (session deleted, new child).
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import secrets
from collections.abc import Callable, Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from hopline.budget import INTERNAL_TOKEN_ENV
from hopline.http.body_limit import send_json


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


@dataclasses.dataclass
class _Grant:
    owner: str  # the daemon's session id: what revokes it
    route_session: str | None  # the llm-turn route's session id (the agent's), once known


class SessionTokens:
    """Per-session gateway credentials, minted by the daemon and kept in its memory only.

    Only SHA-256 digests are kept, looked up by digest (the lookup time does not depend on how
    much of a guess matches). A token is bound to its route's session id once the agent named it
    (the answer to ``session/new``); before that it opens nothing. One token per owner: minting
    again revokes the previous one.
    """

    def __init__(self) -> None:
        self._grants: dict[bytes, _Grant] = {}
        self._by_owner: dict[str, bytes] = {}

    @staticmethod
    def _digest(token: bytes) -> bytes:
        return hashlib.sha256(token).digest()

    def mint(self, owner: str, route_session: str | None = None) -> str:
        self.revoke(owner)
        token = secrets.token_urlsafe(32)
        digest = self._digest(token.encode())
        self._grants[digest] = _Grant(owner, route_session)
        self._by_owner[owner] = digest
        return token

    def bind(self, owner: str, route_session: str) -> None:
        digest = self._by_owner.get(owner)
        if digest is not None:
            self._grants[digest].route_session = route_session

    def revoke(self, owner: str) -> None:
        digest = self._by_owner.pop(owner, None)
        if digest is not None:
            self._grants.pop(digest, None)

    def known(self, token: bytes) -> bool:
        return self._digest(token) in self._grants

    def allows(self, token: bytes, route_session: str | None) -> bool:
        grant = self._grants.get(self._digest(token))
        return (grant is not None and route_session is not None and grant.route_session is not None
                and hmac.compare_digest(grant.route_session.encode(), route_session.encode()))

    @property
    def active(self) -> int:
        """How many tokens are in force."""
        return len(self._grants)


class BearerTokenMiddleware:
    """401 JSON unless ``Authorization: Bearer <token>`` matches (constant-time); open paths pass.

    With ``session_tokens``, a session token also passes on the path whose session id
    (``session_of_path``) it was minted for; on any other path it gets a 403.
    """

    def __init__(
        self, app: ASGIApp, *, token: str, hop: str, open_paths: Iterable[str] = ("/health",),
        token_env: str = INTERNAL_TOKEN_ENV, session_tokens: SessionTokens | None = None,
        session_of_path: Callable[[str], str | None] | None = None,
    ) -> None:
        if not token:
            raise ValueError("the internal token must not be empty")
        self.app = app
        self._token = token.encode()
        self.hop = hop
        self.open_paths = frozenset(open_paths)
        self.token_env = token_env
        self.session_tokens = session_tokens
        self.session_of_path = session_of_path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or route_path(scope) in self.open_paths:
            await self.app(scope, receive, send)
            return
        given = bearer_token(scope)
        # compare_digest on equal-length-independent inputs: the time does not depend on the token.
        if given is not None and hmac.compare_digest(given, self._token):
            await self.app(scope, receive, send)
            return
        tokens = self.session_tokens
        if given is not None and tokens is not None and tokens.known(given):
            path = route_path(scope)
            route_session = self.session_of_path(path) if self.session_of_path is not None else None
            if tokens.allows(given, route_session):
                await self.app(scope, receive, send)
                return
            await send_json(send, 403, {"error": {
                "type": "forbidden", "hop": self.hop,
                "message": "this session token is good only for its own session's llm-turn route"}})
            return
        reason = "missing" if given is None else "wrong"
        await send_json(
            send,
            401,
            {"error": {"type": "unauthorized", "hop": self.hop,
                       "message": f"{reason} bearer token (Authorization: Bearer <{self.token_env}>)"}},
            extra_headers=[(b"www-authenticate", b"Bearer")],
        )
