"""The gateway embedded in the daemon (SPEC C-2): built with the daemon's budget, served under
``/internal`` of the daemon's own address, started and stopped inside the daemon's lifespan. The one
door to :mod:`hopline.gateway` (an import-linter contract): ``hopline gateway`` builds the gateway
alone through :func:`standalone_gateway`.

Its agents reach it at the daemon's URL (``HOPLINE_GATEWAY_URL``), each with its own session token
(D-11); the gateway's bearer token and body limit are its own, not the daemon's.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from hopline.budget import Budget
from hopline.http.auth import SessionTokens

INTERNAL_PREFIX = "/internal"


def embedded_gateway(budget: Budget, *, internal_token: str, provider: Any,
                     session_tokens: SessionTokens) -> FastAPI:
    """The gateway app; ``provider`` None means :func:`hopline.gateway.providers.provider_from_env`."""
    from hopline.gateway.app import create_gateway_app
    from hopline.gateway.providers import provider_from_env

    return create_gateway_app(budget, token=internal_token,
                              provider=provider if provider is not None else provider_from_env(budget),
                              route_prefix="", session_tokens=session_tokens)


def gateway_provider(budget: Budget) -> Any:
    """The provider the environment names (:func:`hopline.gateway.providers.provider_from_env`);
    a ``ValueError`` names the setting it cannot use."""
    from hopline.gateway.providers import provider_from_env

    return provider_from_env(budget)


def standalone_gateway(budget: Budget, *, token: str, provider: Any) -> FastAPI:
    """The gateway served alone (``hopline gateway``), at its own address."""
    from hopline.gateway.app import create_gateway_app

    return create_gateway_app(budget, token=token, provider=provider)


@contextlib.asynccontextmanager
async def running(gateway: FastAPI | None) -> AsyncIterator[None]:
    """The gateway's own lifespan (its provider's client), inside the daemon's."""
    if gateway is None:
        yield
        return
    async with gateway.router.lifespan_context(gateway):
        yield


class InternalDispatcher:
    """``/internal/...`` -> the gateway (mounted as starlette's Mount would), else the daemon."""

    def __init__(self, daemon: ASGIApp, gateway: ASGIApp | None, app: FastAPI) -> None:
        self.daemon = daemon
        self.gateway = gateway
        self.app = app  # the daemon's FastAPI app (routes, OpenAPI)
        self.state = app.state  # budget, manager, bus, journal, instruments, gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.gateway is not None and scope["type"] == "http":
            path: str = scope.get("path", "")
            if path == INTERNAL_PREFIX or path.startswith(INTERNAL_PREFIX + "/"):
                root = scope.get("root_path", "")
                child_scope = dict(scope, root_path=root + INTERNAL_PREFIX, app_root_path=root)
                await self.gateway(child_scope, receive, send)
                return
        await self.daemon(scope, receive, send)
