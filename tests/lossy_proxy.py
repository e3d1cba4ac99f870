"""A loopback TCP proxy that loses answers on purpose (SPEC T-12's fault): in front of a daemon, it
forwards every request whole, and once armed (:meth:`AnswerDroppingProxy.arm`) for the next
request whose request line matches a pattern, it closes that client's socket at the first byte of
the answer, which it never forwards. The daemon did the write; the client saw its connection closed
before any answer.

It runs on its own event loop in a thread, listens on 127.0.0.1 (a free port) and is stopped by the
test (a context manager)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
from typing import Any

_REQUEST_LINE = re.compile(rb"^(?:GET|POST|PUT|PATCH|DELETE) \S+", re.MULTILINE)


class AnswerDroppingProxy:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.pattern: re.Pattern[bytes] | None = None  # the next request to lose the answer of
        self.port = 0
        self.dropped = 0  # answers lost (the request went through, the answer did not)
        self.requests: list[bytes] = []  # every request line forwarded (method and path), in order
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._server: Any = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self._server = self.loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self.loop.run_forever()
        tasks = asyncio.all_tasks(self.loop)
        for task in tasks:
            task.cancel()
        self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self.loop.close()

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        doomed = [False]  # the request in flight on this connection loses its answer
        up_writer: asyncio.StreamWriter | None = None
        self._writers.add(client_writer)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
            self._writers.add(up_writer)

            async def requests() -> None:
                assert up_writer is not None
                while data := await client_reader.read(65536):
                    self.requests += _REQUEST_LINE.findall(data)
                    if self.pattern is not None and self.pattern.search(data) is not None:
                        self.pattern = None  # one answer lost: the retry goes through
                        doomed[0] = True
                    up_writer.write(data)
                    await up_writer.drain()

            async def answers() -> None:
                while data := await up_reader.read(65536):
                    if doomed[0]:  # the write happened; its answer never reaches the client
                        self.dropped += 1
                        return
                    client_writer.write(data)
                    await client_writer.drain()

            await asyncio.wait([asyncio.ensure_future(requests()), asyncio.ensure_future(answers())],
                               return_when=asyncio.FIRST_COMPLETED)
        except OSError:
            pass
        finally:
            for writer in (client_writer, up_writer):
                if writer is not None:
                    with contextlib.suppress(OSError, RuntimeError):
                        writer.close()
                    self._writers.discard(writer)

    def arm(self, pattern: bytes) -> None:
        """Lose the answer of the next request whose bytes match ``pattern`` (a request line)."""
        self.pattern = re.compile(pattern, re.MULTILINE)  # one assignment: atomic for the proxy's thread

    def __enter__(self) -> AnswerDroppingProxy:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the proxy did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        def stop() -> None:
            self._server.close()
            for writer in list(self._writers):
                writer.close()
            self.loop.stop()

        self.loop.call_soon_threadsafe(stop)
        self._thread.join(10)
