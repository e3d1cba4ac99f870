"""Fixtures for the gateway: a real uvicorn server per test on 127.0.0.1, and a test provider."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from hopline.budget import Budget
from hopline.gateway.app import create_gateway_app
from hopline.harness.model import LlmTurnRequest, LlmTurnResponse, Usage
from hopline.http.body_limit import BodyLimitStats

from ._server import ServerThread, serve

TOKEN = "test-token-0123456789"


class CountingProvider:
    """Answers with what it received (message count and bytes of content), so tests can see it arrived."""

    name = "counting"

    def __init__(self) -> None:
        self.requests: list[LlmTurnRequest] = []

    async def complete(self, request: LlmTurnRequest) -> LlmTurnResponse:
        self.requests.append(request)
        size = sum(len(str(m.get("content") or "")) for m in request.messages)
        return LlmTurnResponse({"role": "assistant", "content": f"{len(request.messages)} messages, {size}"},
                               Usage(size // 4, 3), self.name)

    async def aclose(self) -> None:
        return None


class Gateway:
    def __init__(self, server: ServerThread, stats: BodyLimitStats, provider: Any, budget: Budget) -> None:
        self.server = server
        self.stats = stats
        self.provider = provider
        self.budget = budget
        self.url = server.url
        self.turn_url = f"{server.url}/internal/sessions/s-1/llm-turn"
        self.auth = {"authorization": f"Bearer {TOKEN}"}


GatewayFactory = Callable[..., Gateway]


@pytest.fixture
def gateway_factory() -> Iterator[GatewayFactory]:
    """Start gateways (one per call) with a given budget and provider; all are stopped after the test."""
    started: list[ServerThread] = []

    def start(budget: Budget | None = None, provider: Any | None = None) -> Gateway:
        budget = budget or Budget.defaults()
        provider = provider or CountingProvider()
        stats = BodyLimitStats()
        app = create_gateway_app(budget, token=TOKEN, provider=provider, body_stats=stats)
        server = ServerThread(app).start()
        started.append(server)
        return Gateway(server, stats, provider, budget)

    yield start
    for server in started:
        server.stop()


__all__ = ["TOKEN", "CountingProvider", "Gateway", "GatewayFactory", "serve"]
