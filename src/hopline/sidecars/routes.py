"""``GET /session/{session_id}/sidecars/{sidecar_id}`` (SPEC D-1, D-7, S-2).

Only the owning session reads a sidecar: another session's id, an unknown id and a malformed id
all answer 404 (never 403, so ids cannot be probed), and a malformed id is refused before the
store touches its database or filesystem. Bodies stream from disk with their media type,
``Content-Length`` and ``ETag: "<sha256>"``; one ``Range: bytes=`` range is honoured (206, or 416
when unsatisfiable) and ``If-None-Match`` answers 304.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from hopline.budget import CEILINGS_BY_KEY, HOP_SIDECARS
from hopline.errors import InputError
from hopline.sidecars.entry import SidecarEntry, is_valid_sidecar_id
from hopline.sidecars.store import SidecarStore

SIDECAR_ROUTE = "/session/{session_id}/sidecars/{sidecar_id}"
_RANGE_RE = re.compile(r"\A\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*\Z")
_RANGE_HEADER_MAX_CHARS = int(CEILINGS_BY_KEY["range_header_max_chars"].default)


class RangeNotSatisfiable(InputError):
    pass


def parse_range(header: str | None, size: int,
                max_chars: int = _RANGE_HEADER_MAX_CHARS) -> tuple[int, int] | None:
    """``(start, stop)`` (stop exclusive) for one ``bytes=`` range, or ``None`` to serve it whole.

    Syntactically invalid or multi-range headers are ignored (RFC 9110 §14.2 allows that);
    a valid but unsatisfiable range raises :class:`RangeNotSatisfiable`. A header longer than
    ``max_chars`` (the budget's ``range_header_max_chars``) is ignored, never parsed.
    """
    if header is None or len(header) > max_chars:
        return None
    match = _RANGE_RE.match(header)
    if match is None:
        return None
    first, last = match.group(1), match.group(2)
    if first == "" and last == "":
        return None
    if first == "":  # suffix: the last N bytes
        length = int(last)
        if length == 0 or size == 0:
            raise RangeNotSatisfiable
        return max(size - length, 0), size
    start = int(first)
    if last != "" and int(last) < start:
        return None  # invalid, ignored
    if start >= size:
        raise RangeNotSatisfiable
    stop = size if last == "" else min(int(last) + 1, size)
    return start, stop


def _etag_matches(header: str | None, etag: str) -> bool:
    if header is None:
        return False
    for candidate in header.split(","):
        value = candidate.strip()
        if value.startswith("W/"):
            value = value[2:]
        if value == "*" or value == etag:
            return True
    return False


def _not_found() -> JSONResponse:
    return JSONResponse({"error": {"type": "not_found", "hop": HOP_SIDECARS, "message": "sidecar not found"}},
                        status_code=404)


def _headers(entry: SidecarEntry) -> dict[str, str]:
    return {"ETag": entry.etag, "Accept-Ranges": "bytes", "Cache-Control": "private, no-cache",
            "X-Content-Type-Options": "nosniff"}


def sidecar_router(store: SidecarStore, authorize: Callable[..., Any] | None = None) -> APIRouter:
    """The sidecar route; ``authorize`` is the daemon's token dependency (e.g. ``async def f(request)``)."""
    dependencies = [Depends(authorize)] if authorize is not None else []
    router = APIRouter(dependencies=dependencies)

    @router.get(SIDECAR_ROUTE, name="get_sidecar", responses={
        200: {"description": "The sidecar bytes"}, 206: {"description": "One range of them"},
        304: {"description": "Not modified (If-None-Match)"}, 404: {"description": "No such sidecar here"},
        416: {"description": "Range not satisfiable"}})
    def get_sidecar(session_id: str, sidecar_id: str, request: Request) -> Response:
        # Sync handler: FastAPI runs it in its thread pool, so SQLite and file opens do not block.
        if not is_valid_sidecar_id(sidecar_id):
            return _not_found()
        entry = store.get(session_id, sidecar_id)
        if entry is None:
            return _not_found()
        headers = _headers(entry)
        if _etag_matches(request.headers.get("if-none-match"), entry.etag):
            return Response(status_code=304, headers=headers)
        try:
            byte_range = parse_range(request.headers.get("range"), entry.size,
                                     store.budget.range_header_max_chars)
        except RangeNotSatisfiable:
            error = {"type": "range_not_satisfiable", "hop": HOP_SIDECARS, "bytes": entry.size,
                     "message": f"the range is outside the sidecar's {entry.size} bytes"}
            return JSONResponse({"error": error}, status_code=416,
                                headers={**headers, "Content-Range": f"bytes */{entry.size}"})
        handle = store.open_blob(entry)
        if handle is None:  # reaped between the lookup and the open
            return _not_found()
        start, stop = byte_range if byte_range is not None else (0, entry.size)
        headers["Content-Length"] = str(stop - start)
        status = 200
        if byte_range is not None:
            status = 206
            headers["Content-Range"] = f"bytes {start}-{stop - 1}/{entry.size}"
        return StreamingResponse(store.iter_range(handle, start, stop), status_code=status,
                                 headers=headers, media_type=entry.media_type)

    return router
