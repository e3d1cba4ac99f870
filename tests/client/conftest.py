"""A tiny real SSE + sidecar server on 127.0.0.1 (Starlette under uvicorn, in a thread) for the SDK tests.

Routes mimic the daemon's event and sidecar contract; the stream's shape is chosen per session id so
each test exercises one behaviour: exact bytes and line endings, a clean end after N events, a
connection killed mid-event, an event of a chosen size.
"""

from __future__ import annotations

import hashlib
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

TOKEN = "test-token"
TOTAL_EVENTS = 12
SIDECAR_BODY = (b"line of tool output\n" * 5000)
SIDECAR_SHA = hashlib.sha256(SIDECAR_BODY).hexdigest()


@dataclass
class ServerLog:
    last_event_ids: list[str | None] = field(default_factory=list)
    connections: int = 0


def _event(i: int) -> bytes:
    # Multi-line data, each event with its own id; JSON spread over two data lines.
    return (f"id: {i}\nevent: session_update\ndata: {{\"promptId\": \"p1\", \"n\": {i},\n"
            f"data: \"text\": \"line a\\nline b\"}}\n\n").encode()


def build_app(log: ServerLog) -> Starlette:
    async def events(request: Request) -> Response:
        if request.headers.get("authorization") != f"Bearer {TOKEN}":
            return JSONResponse({"hop": "daemon.api", "message": "unauthorized"}, status_code=401)
        sid = request.path_params["sid"]
        last = request.headers.get("last-event-id")
        log.connections += 1
        log.last_event_ids.append(last)
        start = int(last) + 1 if last else 1

        async def clean_end() -> AsyncIterator[bytes]:
            # Ends the response after 5 events per connection (a proxy timing out a stream).
            # It re-sends the last event it already sent, as a ring replay may: the client dedupes.
            first = max(1, start - 1)
            for i in range(first, min(first + 5, TOTAL_EVENTS + 1)):
                yield _event(i)

        async def killed() -> AsyncIterator[bytes]:
            # Sends 4 events and half of the 5th, then the connection dies (chunked body incomplete).
            for i in range(start, min(start + 4, TOTAL_EVENTS + 1)):
                yield _event(i)
            if start + 4 <= TOTAL_EVENTS:
                yield _event(start + 4)[:20]
                raise RuntimeError("connection killed by the test server")
            while True:  # all sent: stay open like a live stream, with a heartbeat
                yield b": heartbeat\n\n"
                import asyncio
                await asyncio.sleep(0.05)

        async def shapes() -> AsyncIterator[bytes]:
            yield b": comment before anything\n\n"
            yield b"id: 1\r\nevent: a\r\ndata: crlf\r\n\r\n"
            yield b"id: 2\revent: b\rdata: cr\r"
            yield b"\rid: 3\nevent: c\n"  # the "\r" before is the blank line ending event 2
            yield b"data: one\ndata:two\n: a comment inside an event\ndata\n\n"
            yield b"id: 4\r"  # "\r" at the end of one chunk, "\n" at the start of the next
            yield b"\nevent: d\r\ndata: split\r"
            yield b"\n\r\n"
            yield b"retry: 10\nunknown: field\ndata: {\"no\": \"id\"}\nevent: replay_complete\n\n"

        async def sized() -> AsyncIterator[bytes]:
            # The session id carries the shape: sized-<data bytes>-<chunk bytes>.
            _, size_text, chunk_text = sid.split("-")
            size, chunk = int(size_text), int(chunk_text)
            yield b"id: 1\nevent: big\n"
            data = b"data: " + b"x" * size + b"\n\n"
            for offset in range(0, len(data), chunk):
                yield data[offset:offset + chunk]
            yield b"id: 2\nevent: small\ndata: {}\n\n"

        async def resync() -> AsyncIterator[bytes]:
            # The journal is behind the client's Last-Event-ID (as after a lost journal): the
            # daemon says so and goes on from its own latest id.
            yield (b'event: state_resync_required\ndata: {"lastEventId": %d, "latestEventId": 3}\n\n'
                   % (start - 1))
            for i in range(4, 7):
                yield _event(i)

        async def empty() -> AsyncIterator[bytes]:
            # A stream that ends at once, every time: the client's reconnects are bounded.
            yield b": nothing here\n\n"

        generators = {"empty": empty, "resync": resync, "clean": clean_end, "killed": killed,
                      "shapes": shapes, "sized": sized}
        return StreamingResponse(generators[sid.split("-")[0]](), media_type="text/event-stream")

    async def sidecar(request: Request) -> Response:
        if request.headers.get("authorization") != f"Bearer {TOKEN}":
            return JSONResponse({"message": "unauthorized"}, status_code=401)
        scid = request.path_params["scid"]
        body = SIDECAR_BODY
        if scid == "tampered":
            body = SIDECAR_BODY[:-1] + b"!"
        elif scid == "longer":
            body = SIDECAR_BODY + b"extra"
        elif scid == "missing":
            return JSONResponse({"hop": "daemon.sidecars", "message": "no such sidecar"}, status_code=404)

        async def stream() -> AsyncIterator[bytes]:
            for offset in range(0, len(body), 16384):
                yield body[offset:offset + 16384]

        return StreamingResponse(stream(), media_type="application/octet-stream")

    return Starlette(routes=[
        Route("/session/{sid}/events", events),
        Route("/session/{sid}/sidecars/{scid}", sidecar),
    ])


@dataclass
class RunningServer:
    url: str
    log: ServerLog


@pytest.fixture(scope="module")
def sse_server() -> Iterator[RunningServer]:
    log = ServerLog()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(build_app(log), log_level="error", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("test SSE server did not start")
        time.sleep(0.02)
    try:
        yield RunningServer(f"http://127.0.0.1:{port}", log)
    finally:
        server.should_exit = True
        server.force_exit = True
        thread.join(timeout=10)
        sock.close()


