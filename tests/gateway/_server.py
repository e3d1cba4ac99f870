"""A real uvicorn server on 127.0.0.1 in a background thread, started and stopped by the test."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn

START_TIMEOUT_SECONDS = 10.0
STOP_TIMEOUT_SECONDS = 10.0


def bound_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


class ServerThread:
    """Runs ``app`` with uvicorn on a socket bound to 127.0.0.1:0 (a free port), or on ``sock`` (bound by
    the caller, for an app that must know its own URL before it is built)."""

    def __init__(self, app: Any, *, sock: socket.socket | None = None, **config: Any) -> None:
        self.sock = sock if sock is not None else bound_socket()
        self.port: int = self.sock.getsockname()[1]
        options: dict[str, Any] = {"log_level": "warning", "access_log": False, "lifespan": "on"}
        options.update(config)
        self.server = uvicorn.Server(uvicorn.Config(app, **options))
        self.thread = threading.Thread(target=self._run, name=f"uvicorn-{self.port}", daemon=True)
        self.error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        try:
            self.server.run(sockets=[self.sock])
        except BaseException as exc:  # surfaced by start()
            self.error = exc

    def start(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while not self.server.started:
            if self.error is not None or not self.thread.is_alive():
                raise RuntimeError(f"uvicorn did not start: {self.error!r}")
            if time.monotonic() > deadline:
                raise TimeoutError("uvicorn did not start in time")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(STOP_TIMEOUT_SECONDS)
        if self.thread.is_alive():
            self.server.force_exit = True
            self.thread.join(STOP_TIMEOUT_SECONDS)
        with contextlib.suppress(OSError):
            self.sock.close()


@contextlib.contextmanager
def serve(app: Any, *, sock: socket.socket | None = None, **config: Any) -> Iterator[ServerThread]:
    server = ServerThread(app, sock=sock, **config).start()
    try:
        yield server
    finally:
        server.stop()
