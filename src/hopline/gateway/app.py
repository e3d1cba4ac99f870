"""The gateway's ASGI app (SPEC G-1..G-3): ``POST /internal/sessions/{sessionId}/llm-turn``.

With ``Accept: application/x-ndjson`` the answer streams (:mod:`hopline.gateway.streaming`).

Layers, outermost first: metrics (status counter, body-bytes histogram) -> bearer token (401 before
any body byte is read; ``/health`` is open) -> body limit (413 JSON, enforced while reading) -> routes.

Standalone, the routes are ``/internal/sessions/{sessionId}/llm-turn``, ``/health`` and ``/metrics``.
To mount it inside another app (the daemon) keep the public path the same by moving the prefix to
the mount::

    daemon.mount("/internal", create_gateway_app(budget, token=..., provider=..., route_prefix=""))

The mounted app keeps its own middleware, so its body limit and token apply only under ``/internal``
(and its health/metrics become ``/internal/health`` and ``/internal/metrics``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import asynccontextmanager
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry
from pydantic import ValidationError

from hopline import __version__
from hopline.budget import HOP_GATEWAY, Budget
from hopline.errors import TurnFailure
from hopline.gateway.providers import Provider
from hopline.gateway.request_metrics import GatewayMetrics, MetricsMiddleware
from hopline.gateway.schema import LlmTurnBody, field_errors
from hopline.gateway.streaming import accepts_ndjson, stream_llm_turn, turn_failure_response
from hopline.harness.model import LlmTurnRequest
from hopline.http.auth import BearerTokenMiddleware, SessionTokens
from hopline.http.body_limit import BodyLimit, BodyLimitStats
from hopline.http.errors import error_response
from hopline.http.handlers import install_error_handlers
from hopline.http.incidents import LastResort
from hopline.scripted.hints import check_model_params
from hopline.wire.input import loads_bounded

log = logging.getLogger("hopline.gateway")

LLM_TURN_PATH = "/sessions/{sessionId}/llm-turn"


def llm_turn_session(route_prefix: str) -> Callable[[str], str | None]:
    """The session id of an llm-turn route path (inside this app), or None for any other path."""
    head, tail = (route_prefix + LLM_TURN_PATH).split("{sessionId}")

    def session_of(path: str) -> str | None:
        if path.startswith(head) and path.endswith(tail) and len(path) > len(head) + len(tail):
            session_id = path[len(head):len(path) - len(tail)]
            return None if "/" in session_id else session_id
        return None

    return session_of


def _error(status: int, kind: str, message: str, **extra: Any) -> JSONResponse:
    return error_response(status, HOP_GATEWAY, kind, message, **extra)


def _is_json(content_type: str | None) -> bool:
    if not content_type:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def _body_schema() -> tuple[dict[str, Any], dict[str, Any]]:
    """The body's JSON schema for OpenAPI, and its nested models (for ``components.schemas``)."""
    schema = LlmTurnBody.model_json_schema(ref_template="#/components/schemas/{model}")
    nested = schema.pop("$defs", {})
    return schema, nested


def _add_schema_components(app: FastAPI, nested: dict[str, Any]) -> None:
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        spec = generate()
        spec.setdefault("components", {}).setdefault("schemas", {}).update(nested)
        return spec

    app.openapi = openapi  # type: ignore[method-assign]


def create_gateway_app(
    budget: Budget,
    *,
    token: str,
    provider: Provider,
    metrics_registry: CollectorRegistry | None = None,
    route_prefix: str = "/internal",
    body_stats: BodyLimitStats | None = None,
    session_tokens: SessionTokens | None = None,
) -> FastAPI:
    """The gateway app. ``body_stats`` (optional) receives what the body limit read, for tests.

    ``session_tokens`` (the daemon's, D-11): besides ``token``, each of them opens the llm-turn
    route of the one session it was minted for."""
    limit = budget.api_json_body_limit
    metrics = GatewayMetrics(limit, metrics_registry)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> Any:
        try:
            yield
        finally:
            await provider.aclose()

    app = FastAPI(title="hopline gateway", version=__version__, lifespan=lifespan)
    app.state.budget = budget
    app.state.metrics = metrics
    app.state.body_stats = body_stats if body_stats is not None else BodyLimitStats()
    install_error_handlers(app, HOP_GATEWAY)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "provider": provider.name, "bodyLimitBytes": limit}

    @app.get("/metrics")
    async def metrics_endpoint() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    _add_llm_turn_route(app, budget, provider, route_prefix)
    _add_middleware(app, budget, token=token, session_tokens=session_tokens, route_prefix=route_prefix,
                    metrics=metrics)
    return app


def _add_llm_turn_route(app: FastAPI, budget: Budget, provider: Provider, route_prefix: str) -> None:
    """The llm-turn route: a JSON body checked (shape, depth, the scripted model's params), then the
    provider's answer, whole or streamed (G-5)."""
    body_schema, nested = _body_schema()
    _add_schema_components(app, nested)

    @app.post(
        route_prefix + LLM_TURN_PATH,
        openapi_extra={"requestBody": {"required": True,
                                       "content": {"application/json": {"schema": body_schema}}}},
        responses={400: {}, 401: {}, 413: {}, 415: {}, 502: {}, 504: {}},
    )
    async def llm_turn(sessionId: str, request: Request) -> Response:
        if not _is_json(request.headers.get("content-type")):
            return _error(415, "unsupported_media_type", "the llm-turn body must be application/json")
        raw = await request.body()
        data = loads_bounded(raw, budget.json_max_depth)  # InputRefused -> 400 (install_error_handlers)
        try:
            LlmTurnBody.model_validate(data)
        except ValidationError as exc:
            errors = field_errors(exc)
            return _error(400, "invalid_request", f"{errors[0]['field']}: {errors[0]['message']}",
                          field=errors[0]["field"], errors=errors)
        check_model_params(data.get("params"), budget)
        # The validated shape is checked; the provider gets the original dicts, byte for byte.
        turn = LlmTurnRequest(
            messages=data["messages"],
            tools=data.get("tools") or [],
            model=data.get("model"),
            params=data.get("params") or {},
            purpose=data.get("purpose", "turn"),
        )
        del raw, data
        if accepts_ndjson(request.headers.get("accept")):  # the streaming form (G-5)
            return stream_llm_turn(provider, turn)
        try:
            answer = await provider.complete(turn)
        except TurnFailure as failure:
            return turn_failure_response(failure)
        return Response(orjson.dumps(answer.to_json()), media_type="application/json")


def _add_middleware(app: FastAPI, budget: Budget, *, token: str, session_tokens: SessionTokens | None,
                    route_prefix: str, metrics: GatewayMetrics) -> None:
    """The layers around the routes, added innermost first: the body limit, the bearer token,
    metrics, the last resort (outermost)."""
    limit = budget.api_json_body_limit
    # A body our own engine may build (up to its ceiling, even when misconfigured over this limit)
    # gets a readable 413 rather than a reset; anything larger has its connection closed.
    discard_up_to = max(2 * limit, budget.transport_max_body_bytes)
    app.add_middleware(BodyLimit, limit=limit, ceiling="api_json_body_limit", stats=app.state.body_stats,
                       discard_up_to=discard_up_to, read_timeout=budget.body_read_timeout_seconds)
    app.add_middleware(BearerTokenMiddleware, token=token, hop=HOP_GATEWAY, session_tokens=session_tokens,
                       session_of_path=llm_turn_session(route_prefix))
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    app.add_middleware(LastResort, hop=HOP_GATEWAY)  # outermost: added last
