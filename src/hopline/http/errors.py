"""hopline's HTTP error shape, for every error the daemon API and the gateway answer (SPEC D-10).

One shape: ``{"error": {"type", "hop", "message", ...}}``, with the limit and the size or count
seen when a ceiling refused the request. :func:`~hopline.http.handlers.install_error_handlers`
puts FastAPI's own errors
(request validation 422, unknown route 404, method 405) in that shape, never echoing the input,
and answers every :class:`~hopline.wire.input.InputRefused` a route raises with a 400;
:func:`bounded_json_route` makes FastAPI parse JSON bodies with :func:`hopline.wire.input.loads_bounded`
(400 for invalid UTF-8, a lone surrogate, or nesting past ``HOPLINE_JSON_MAX_DEPTH``).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

from fastapi import HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute

from hopline.errors import InputError, InputRefused
from hopline.wire.input import loads_bounded

STATUS_KINDS = {404: "not_found", 405: "method_not_allowed", 406: "not_acceptable",
                 415: "unsupported_media_type"}


def error_body(hop: str, kind: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"type": kind, "hop": hop, "message": message, **extra}}


def error_response(status: int, hop: str, kind: str, message: str, *,
                   headers: Mapping[str, str] | None = None, **extra: Any) -> JSONResponse:
    return JSONResponse(error_body(hop, kind, message, **extra), status_code=status, headers=headers)


def refused_response(refused: InputRefused, hop: str, status: int = 400) -> JSONResponse:
    return error_response(status, hop, refused.kind, refused.message, **refused.fields)


def field_errors_of(errors: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """Each validation problem as ``{"field": "body.messages.2.role", "message": ...}`` (no input)."""
    out = []
    for error in errors:
        loc = ".".join(str(part) for part in error.get("loc", ())) or "(body)"
        out.append({"field": loc, "message": str(error.get("msg", "invalid"))})
    return out


class RefusedBody(InputError, HTTPException):
    """:class:`InputRefused` raised while FastAPI parses a body (it re-raises HTTP exceptions only)."""

    def __init__(self, refused: InputRefused) -> None:
        HTTPException.__init__(self, 400, refused.message)  # named: ValueError precedes it in the MRO
        self.refused = refused


RequestError = RequestValidationError | RefusedBody | InputRefused


def request_error_response(exc: RequestError, hop: str) -> JSONResponse:
    """A request hopline does not take (a validation 422, a refused body or input 400), naming ``hop``."""
    if isinstance(exc, RefusedBody):
        return refused_response(exc.refused, hop)
    if isinstance(exc, InputRefused):
        return refused_response(exc, hop)
    errors = field_errors_of(exc.errors())
    return error_response(422, hop, "invalid_request", f"{errors[0]['field']}: {errors[0]['message']}",
                          field=errors[0]["field"], errors=errors)


def bounded_json_route(max_depth: int, hop: str | None = None) -> type[APIRoute]:
    """An ``APIRoute`` class whose JSON bodies are parsed by :func:`loads_bounded` (FastAPI's
    documented extension point for a custom request; set it as ``app.router.route_class``). With
    ``hop``, its routes' request errors (validation 422, a refused body or input 400) name that hop rather
    than the app's (the daemon's ``/gate`` routes are hop ``daemon.gate``)."""

    class BoundedJsonRequest(Request):
        async def json(self) -> Any:
            if not hasattr(self, "_json"):
                try:
                    self._json = loads_bounded(await self.body(), max_depth)
                except InputRefused as refused:
                    raise RefusedBody(refused) from None
            return self._json

    class BoundedJsonRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()

            async def bounded(request: Request) -> Response:
                try:
                    return await handler(BoundedJsonRequest(request.scope, request.receive))
                except (RequestValidationError, RefusedBody, InputRefused) as exc:
                    if hop is None:
                        raise
                    return request_error_response(exc, hop)

            return bounded

    return BoundedJsonRoute
