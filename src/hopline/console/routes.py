"""The console's two ASGI pieces: its static files under ``/ui/`` and ``GET /daemon/frames``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter
from starlette.exceptions import HTTPException
from starlette.responses import RedirectResponse
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hopline.budget import CEILINGS_BY_KEY, HOP_DAEMON_API, Budget
from hopline.http.body_limit import send_json
from hopline.observe.pipe import PipeObservability
from hopline.observe.pipe_histogram import HISTOGRAM_NAME, HISTOGRAM_UNIT

CONSOLE_PREFIX = "/ui"
STATIC_DIR = Path(__file__).parent / "static"

# No inline script or style, nothing from another origin; the API is same-origin (connect-src).
CONTENT_SECURITY_POLICY = "; ".join((
    "default-src 'none'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self' data:",
    "connect-src 'self'",
    "base-uri 'none'",
    "form-action 'none'",
    "frame-ancestors 'none'",
))
_STATIC_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cache-control", b"no-cache"),  # revalidate (ETag): a daemon upgrade shows its new console
)

# The ceilings drawn as lines on the frame histogram, in the order of the legend.
FRAME_LINE_KEYS: tuple[str, ...] = (
    "pipe_max_frame_bytes", "sidecar_threshold_bytes", "large_frame_threshold_bytes",
)


class ConsoleDispatcher:
    """``/ui/...`` -> the console's static files (``/ui`` redirects to ``/ui/``), else ``app``.

    It sits outside the bearer-token check: the files are the same for everyone and carry no data;
    every call the page makes goes through ``app`` with the token in its ``Authorization`` header."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.files = StaticFiles(directory=STATIC_DIR, html=True)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "") if scope["type"] == "http" else ""
        root: str = scope.get("root_path", "")
        if path == root + CONSOLE_PREFIX:
            await RedirectResponse(root + CONSOLE_PREFIX + "/", status_code=308)(scope, receive, send)
            return
        if not path.startswith(root + CONSOLE_PREFIX + "/"):
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *_STATIC_HEADERS]}
            await send(message)

        child_scope = dict(scope, root_path=root + CONSOLE_PREFIX, app_root_path=root)
        try:
            await self.files(child_scope, receive, send_with_headers)
        except HTTPException as exc:  # raised before any byte is sent: no such file, or not GET/HEAD
            kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "console_error")
            body = {"error": {"type": kind, "hop": HOP_DAEMON_API, "message": f"console: {exc.detail}"}}
            headers = [(k.lower().encode(), v.encode()) for k, v in (exc.headers or {}).items()]
            await send_json(send, exc.status_code, body, extra_headers=headers)


def frames_json(budget: Budget, instruments: PipeObservability) -> dict[str, Any]:
    """The pipe frame histogram per direction, the ceilings drawn on it, and the large-frame records."""
    large = instruments.large_frames.snapshot()
    return {
        "histogram": {"name": HISTOGRAM_NAME, "unit": HISTOGRAM_UNIT,
                      "boundaries": [int(b) for b in instruments.metrics.boundaries],
                      "directions": instruments.metrics.snapshot()},
        "lines": [{"key": key, "name": CEILINGS_BY_KEY[key].name, "bytes": int(budget.value(key)),
                   "description": CEILINGS_BY_KEY[key].description} for key in FRAME_LINE_KEYS],
        "largeFrames": {**large, "recent": instruments.large_frames.recent()},
    }


def frames_router(budget: Budget, instruments: PipeObservability) -> APIRouter:
    router = APIRouter()

    @router.get("/daemon/frames", responses={401: {}})
    async def frames() -> dict[str, Any]:
        """The frame-size histogram (``hopline.daemon.pipe.message_bytes``) per direction: one count
        per bucket, ``(previous bound, bound]`` for each boundary and then the overflow bucket; the
        pipe ceilings drawn on it; the recent large-frame records (newest first) and their counters."""
        return frames_json(budget, instruments)

    return router
