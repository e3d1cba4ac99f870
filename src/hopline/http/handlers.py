"""Both apps' exception handlers: FastAPI's own errors (request validation 422, unknown route 404,
method 405) and every refused input in hopline's error shape (:mod:`hopline.http.errors`), and
the last resort for anything else (:mod:`hopline.http.incidents`)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from hopline.errors import InputRefused
from hopline.http.errors import (
    STATUS_KINDS,
    RefusedBody,
    RequestError,
    error_response,
    request_error_response,
)
from hopline.http.incidents import answer_incident_for


def install_error_handlers(app: FastAPI, hop: str) -> None:
    """FastAPI's own errors in hopline's shape, naming ``hop``."""

    async def refused(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestError)
        return request_error_response(exc, hop)

    async def http_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        kind = STATUS_KINDS.get(exc.status_code, "http_error")
        return error_response(exc.status_code, hop, kind, str(exc.detail), headers=exc.headers)

    for error in (RequestValidationError, RefusedBody, InputRefused):
        app.add_exception_handler(error, refused)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, answer_incident_for(hop))
