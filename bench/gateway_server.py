"""The gateway app under uvicorn, alone in its process so its memory can be measured.

    python bench/gateway_server.py PORT TOKEN

The budget comes from the environment (``API_JSON_BODY_LIMIT``...). The provider is never reached
by the benchmark (every body is refused before it), so a stand-in that fails is enough.
"""

from __future__ import annotations

import sys

import uvicorn

from hopline.budget import HOP_GATEWAY, Budget
from hopline.errors import TurnFailure
from hopline.gateway.app import create_gateway_app
from hopline.harness.model import LlmTurnRequest, LlmTurnResponse
from hopline.http.server import uvicorn_config


class UnreachableProvider:
    name = "bench-unreachable"

    async def complete(self, request: LlmTurnRequest) -> LlmTurnResponse:
        raise TurnFailure("model", "the benchmark provider answers nothing")

    async def aclose(self) -> None:
        return None


def main() -> None:
    port, token = int(sys.argv[1]), sys.argv[2]
    budget = Budget.from_env()
    app = create_gateway_app(budget, token=token, provider=UnreachableProvider())
    # the config `hopline gateway` runs (its protocol with the head deadline and connection ceiling)
    uvicorn.Server(uvicorn_config(app, budget, HOP_GATEWAY, host="127.0.0.1", port=port,
                                  log_level="warning")).run()


if __name__ == "__main__":
    main()
