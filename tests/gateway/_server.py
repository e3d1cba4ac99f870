"""A real uvicorn server on 127.0.0.1 in a background thread, started and stopped by the test."""

from __future__ import annotations

import asyncio
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


class PromptServer(uvicorn.Server):
    """uvicorn's server, stopping as soon as it is asked: its main loop waits for the stop instead
    of ticking every 0.1 s, and its shutdown polls the connections and tasks it waits for every
    10 ms instead of every 0.1 s (after a fixed 0.1 s). Serving is uvicorn's own, untouched."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None

    async def main_loop(self) -> None:
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 1) % 864000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), 0.1)
            should_exit = await self.on_tick(counter)

    def request_exit(self) -> None:
        self.should_exit = True
        if self._loop is not None and self._wake is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._wake.set)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()
        deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
        while (self.server_state.connections or self.server_state.tasks) and not self.force_exit:
            if time.monotonic() > deadline:
                for task in self.server_state.tasks:
                    task.cancel()
                break
            await asyncio.sleep(0.01)
        for server in self.servers:
            await server.wait_closed()
        if not self.force_exit:
            await self.lifespan.shutdown()


class ServerThread:
    """Runs ``app`` with uvicorn on a socket bound to 127.0.0.1:0 (a free port), or on ``sock`` (bound by
    the caller, for an app that must know its own URL before it is built)."""

    def __init__(self, app: Any, *, sock: socket.socket | None = None, **config: Any) -> None:
        self.sock = sock if sock is not None else bound_socket()
        self.port: int = self.sock.getsockname()[1]
        options: dict[str, Any] = {"log_level": "warning", "access_log": False, "lifespan": "on"}
        options.update(config)
        self.server = PromptServer(uvicorn.Config(app, **options))
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
        self.server.request_exit()
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
