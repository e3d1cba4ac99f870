"""A streamed body's large chunks go out in one vectored write, not joined first (``vectored_cycle``
in ``http/server.py``, issue 30): the bytes on the wire are exactly uvicorn's chunked framing,
each ASGI body one HTTP chunk, at the threshold and one byte under it. A real uvicorn server with
hopline's httptools protocol on 127.0.0.1 in a thread (tests/gateway/_server.py); a raw socket
reads the response."""

from __future__ import annotations

import gc
import socket
import time
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from gateway._server import serve
from hopline.budget import HOP_DAEMON_SSE, Budget
from hopline.http.server import VECTORED_BODY_MIN_BYTES, guarded_protocol

T = VECTORED_BODY_MIN_BYTES
# The app's bodies, in order (the last ends the response): around the threshold, large ones, an
# empty one in the middle (uvicorn sends nothing for it).
SIZES = [1, T - 1, T, T + 1, 0, 1 << 20, 3 << 20, 5]
recorded_writes: list[tuple[str, int]] = []  # (how, bytes) of every body write the server made
started_cycles: list[weakref.ref[Any]] = []  # uvicorn's request cycles, as the server started them


def body(index: int, size: int) -> bytes:
    return bytes([65 + index]) * size


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    for index, size in enumerate(SIZES):
        await send({"type": "http.response.body", "body": body(index, size),
                    "more_body": index < len(SIZES) - 1})


class RecordingTransport:
    """The server's transport, its writes recorded after the response head."""

    def __init__(self, transport: Any) -> None:
        self._transport = transport
        self.head_sent = False

    def write(self, data: bytes) -> None:
        if self.head_sent:
            recorded_writes.append(("write", len(data)))
        self.head_sent = True
        self._transport.write(data)

    def writelines(self, parts: Any) -> None:
        parts = list(parts)
        recorded_writes.append(("writelines", sum(map(len, parts))))
        self._transport.writelines(parts)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


@pytest.fixture
def server() -> Iterator[tuple[str, int]]:
    guarded = guarded_protocol(Budget.defaults(), HOP_DAEMON_SSE)
    if guarded is None:
        pytest.skip("httptools is not installed: uvicorn's h11 protocol joins as it always did")

    class Recording(guarded):  # type: ignore[misc, valid-type]
        def connection_made(self, transport: Any) -> None:
            super().connection_made(RecordingTransport(transport))

        def _start_asgi_task(self, cycle: Any, app: Any) -> None:
            started_cycles.append(weakref.ref(cycle))
            super()._start_asgi_task(cycle, app)

    with serve(app, http=Recording, log_config=None) as running:
        yield ("127.0.0.1", running.port)


def read_response(address: tuple[str, int]) -> bytes:
    with socket.create_connection(address, timeout=20) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        answer = bytearray()
        while chunk := sock.recv(1 << 20):
            answer += chunk
    return bytes(answer)


def test_each_body_is_one_chunk_and_large_ones_are_written_without_a_join(server: tuple[str, int]) -> None:
    recorded_writes.clear()
    answer = read_response(server)
    head, _, wire = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head
    expected = b"".join(b"%x\r\n%s\r\n" % (size, body(i, size)) for i, size in enumerate(SIZES) if size)
    assert wire == expected + b"0\r\n\r\n"  # byte for byte: every body one chunk, then the end
    framed = [size + len(b"%x\r\n\r\n" % size) for size in SIZES]
    assert recorded_writes == [
        ("write", framed[0]), ("write", framed[1]),  # under the threshold: joined, as uvicorn does
        ("writelines", framed[2]), ("writelines", framed[3]),  # at it and one byte over: vectored
        ("write", 0),  # the empty body: uvicorn's own (it writes no chunk for it)
        ("writelines", framed[5]), ("writelines", framed[6]),
        ("write", framed[7] + len(b"0\r\n\r\n")),  # the last body: uvicorn's own, with the end
    ]


def test_a_request_cycle_is_freed_without_the_collector(server: tuple[str, int]) -> None:
    """The changed send leaves no reference cycle: once its connection is gone, a request's cycle
    (and the request body it holds) is freed by reference counting, the collector off. (A send
    bound to the cycle in its own attributes kept it: this test failed with one.)"""
    started_cycles.clear()
    gc.collect()
    gc.disable()
    try:
        assert read_response(server).endswith(b"0\r\n\r\n")
        deadline = time.monotonic() + 10  # the server drops the connection after the client saw EOF
        while started_cycles[0]() is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(started_cycles) == 1 and started_cycles[0]() is None
    finally:
        gc.enable()
