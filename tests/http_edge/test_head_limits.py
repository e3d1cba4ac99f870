"""The request head's ceilings (issue #26, SPEC T-4): bytes and header fields, before any route or
authentication, in both of uvicorn's protocols hopline runs (httptools, and h11 where httptools is
missing). A real uvicorn server on 127.0.0.1 in a thread; raw sockets."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from hopline.budget import HOP_DAEMON_API, Budget
from hopline.http.server import guarded_protocol, h11_guarded_protocol, uvicorn_config

HEAD_MAX = 2048
HEADERS_MAX = 10


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    payload = orjson.dumps({"headers": len(scope["headers"]), "body": len(body)})
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})


@pytest.fixture(params=["httptools", "h11"])
def server(request: pytest.FixtureRequest) -> Iterator[tuple[str, int]]:
    import uvicorn

    budget = Budget.defaults().replace(request_head_max_bytes=HEAD_MAX, request_head_max_headers=HEADERS_MAX)
    protocol = (guarded_protocol(budget, HOP_DAEMON_API) if request.param == "httptools"
                else h11_guarded_protocol(budget, HOP_DAEMON_API))
    assert protocol is not None
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn_config(app, budget, HOP_DAEMON_API, http=protocol, log_config=None)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield sock.getsockname()
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def exchange(address: tuple[str, int], raw: bytes) -> bytes:
    with socket.create_connection(address, timeout=20) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(raw)  # the server may close before all was sent: read what it answered
        answer = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                return answer
            if not chunk:
                return answer
            answer += chunk
            if answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"}"):
                return answer


def head_of(size: int, *, fields: int = 1, tail: bytes = b"") -> bytes:
    """A GET head of exactly ``size`` bytes with ``fields`` header fields (Host among them)."""
    lines = [b"GET / HTTP/1.1", b"Host: 127.0.0.1"] + [b"X-%d: v" % i for i in range(fields - 2)]
    start = b"\r\n".join(lines) + b"\r\n"
    pad_name = b"X-Pad: "
    pad = size - len(start) - len(pad_name) - 2 - 2
    assert pad >= 0
    return start + pad_name + b"p" * pad + b"\r\n\r\n" + tail


def body_of(raw: bytes) -> dict[str, Any]:
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431"), raw[:200]
    assert b"connection: close" in head.lower()
    error: dict[str, Any] = orjson.loads(body)["error"]
    assert error["type"] == "request_header_fields_too_large" and error["hop"] == HOP_DAEMON_API
    return error


def test_a_head_at_the_byte_ceiling_is_served_and_one_byte_more_is_a_431(server: tuple[str, int]) -> None:
    assert len(head_of(HEAD_MAX)) == HEAD_MAX
    assert exchange(server, head_of(HEAD_MAX)).startswith(b"HTTP/1.1 200")
    error = body_of(exchange(server, head_of(HEAD_MAX + 1)))
    assert error["setting"] == "HOPLINE_REQUEST_HEAD_MAX_BYTES" and error["limit"] == HEAD_MAX
    assert error["receivedBytes"] == HEAD_MAX + 1
    assert (error["limit"], error["observed"], error["unit"]) == (HEAD_MAX, HEAD_MAX + 1, "bytes")


def test_a_body_after_a_head_within_the_ceiling_is_no_head(server: tuple[str, int]) -> None:
    body = b"b" * (4 * HEAD_MAX)
    length = b"\r\nContent-Length: %d\r\n\r\n" % len(body)
    raw = head_of(HEAD_MAX - len(length) + 4, fields=2).removesuffix(b"\r\n\r\n") + length
    assert len(raw) == HEAD_MAX  # the head at the ceiling, then 4 ceilings of body
    answer = exchange(server, raw + body)  # one send: the head and the body in the same reads
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert orjson.loads(answer.partition(b"\r\n\r\n")[2])["body"] == len(body)


def test_a_huge_header_is_refused_at_the_ceiling(server: tuple[str, int]) -> None:
    raw = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"x" * (8 * 1024 * 1024)
    error = body_of(exchange(server, raw))  # the server closes long before it is all sent
    assert error["limit"] == HEAD_MAX and error["receivedBytes"] > HEAD_MAX


def test_header_fields_at_the_ceiling_are_served_and_one_more_is_a_431(server: tuple[str, int]) -> None:
    at = exchange(server, head_of(600, fields=HEADERS_MAX))
    assert at.startswith(b"HTTP/1.1 200")
    assert orjson.loads(at.partition(b"\r\n\r\n")[2])["headers"] == HEADERS_MAX
    error = body_of(exchange(server, head_of(600, fields=HEADERS_MAX + 1)))
    assert error["setting"] == "HOPLINE_REQUEST_HEAD_MAX_HEADERS"
    assert error["limit"] == HEADERS_MAX and error["observed"] == HEADERS_MAX + 1
    assert error["unit"] == "count"  # the one limit shape


def test_each_request_on_a_kept_alive_connection_has_its_own_ceiling(server: tuple[str, int]) -> None:
    with socket.create_connection(server, timeout=20) as sock:
        for _ in range(3):  # three heads near the ceiling, one after the other: each within it
            sock.sendall(head_of(HEAD_MAX))
            answer = b""
            while not answer.endswith(b"}"):
                chunk = sock.recv(65536)
                assert chunk, answer
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 200")
