"""The browser console (``GET /ui/``): static files shipped in the package, served with a strict
Content-Security-Policy and no token (they hold none), and the JSON routes it reads besides
``/daemon/status``. The page keeps the bearer token in ``sessionStorage`` and sends it as a header
on every call; it is never put in a URL."""

from hopline.console.routes import CONSOLE_PREFIX, CONTENT_SECURITY_POLICY, ConsoleDispatcher, frames_router

__all__ = ["CONSOLE_PREFIX", "CONTENT_SECURITY_POLICY", "ConsoleDispatcher", "frames_router"]
