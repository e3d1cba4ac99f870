"""The benchmarks' SSE reader (bench/sse_client.py) counts what a whole-body parse counts, however the
body is cut into reads and chunks: every CPU benchmark's verdict stands on its counts."""

from __future__ import annotations

import asyncio
import itertools
import re
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root holds bench/
from bench.sse_client import (
    READ_AHEAD_BYTES,
    RECEIVE_BUFFER_BYTES,
    HttpStatusError,
    SseCounter,
    stream_sse,
)

MARKER = b"agent_message_chunk"


def _event(number: int, name: str, size: int, marked: bool) -> bytes:
    data = (b'{"sessionUpdate":"' + (MARKER if marked else b"other") + b'","text":"'
            + b"x" * size + b'"}')
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (number, name.encode(), data)


def _stream(shapes: list[tuple[str, int, bool]], crlf: bool = False) -> bytes:
    body = b": ready\n\n" + b"".join(_event(n, name, size, marked)
                                     for n, (name, size, marked) in enumerate(shapes, start=1))
    return body.replace(b"\n", b"\r\n") if crlf else body


def _whole(body: bytes, crlf: bool) -> tuple[int, int, int, dict[str, int], int | None]:
    """The reference: split the whole body at blank lines."""
    sep, nl = (b"\r\n\r\n", b"\r\n") if crlf else (b"\n\n", b"\n")
    events = [e for e in body.split(sep) if e]
    names: dict[str, int] = {}
    real = [e for e in events if not e.startswith(b":")]
    for e in real:
        for line in e.split(nl):
            if line.startswith(b"event:"):
                name = line[6:].strip().decode()
                names[name] = names.get(name, 0) + 1
    last_id = int(real[-1].split(nl)[0][3:]) if real else None
    return len(real), sum(MARKER in e for e in real), len(events) - len(real), names, last_id


def _counts(counter: SseCounter) -> tuple[int, int, int, dict[str, int], int | None]:
    return counter.events, counter.marked, counter.comments, counter.names, counter.last_id


shapes_strategy = st.lists(st.tuples(st.sampled_from(["session_update", "turn_complete"]),
                                     st.integers(0, 3000), st.booleans()), max_size=12)


@settings(max_examples=200, deadline=None)
@given(shapes=shapes_strategy, crlf=st.booleans(), cuts=st.lists(st.integers(0, 40_000), max_size=30))
def test_the_counter_counts_what_a_whole_parse_counts_however_the_body_is_cut(
        shapes: list[tuple[str, int, bool]], crlf: bool, cuts: list[int]) -> None:
    body = _stream(shapes, crlf)
    counter = SseCounter(MARKER)
    bounds = [0, *sorted(c for c in cuts if c < len(body)), len(body)]
    for start, end in itertools.pairwise(bounds):
        piece = bytearray(b"#" * 5 + body[start:end] + b"#" * 5)  # counted in place, bounds honoured
        counter.feed_from(piece, 5, 5 + end - start)
    assert _counts(counter) == _whole(body, crlf)
    assert counter.bytes_received == len(body)


def test_an_event_cut_inside_its_separator_is_counted_once() -> None:
    counter = SseCounter(MARKER)
    event = _event(7, "session_update", 10, True)
    counter.feed(event[:-1])
    assert counter.events == 0
    counter.feed(event[-1:])
    assert (counter.events, counter.marked, counter.last_id) == (1, 1, 7)


def _chunked(body: bytes, sizes: list[int]) -> bytes:
    out, pos, i = bytearray(), 0, 0
    while pos < len(body):
        size = max(1, sizes[i % len(sizes)]) if sizes else len(body)
        piece = body[pos:pos + size]
        out += b"%x;ext=1\r\n" % len(piece) + piece + b"\r\n"
        pos, i = pos + size, i + 1
    return bytes(out + b"0\r\n\r\n")


async def _serve_once(response: bytes, write_sizes: list[int]) -> tuple[asyncio.Server, int]:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        pos, i = 0, 0
        while pos < len(response):  # the response in writes of the given sizes (real socket reads)
            size = max(1, write_sizes[i % len(write_sizes)]) if write_sizes else len(response)
            writer.write(response[pos:pos + size])
            await writer.drain()
            await asyncio.sleep(0)
            pos, i = pos + size, i + 1
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _read(response: bytes, write_sizes: list[int]) -> tuple[SseCounter, int]:
    server, port = await _serve_once(response, write_sizes)
    counter, told = SseCounter(MARKER), 0
    async with server:
        async for nbytes in stream_sse("127.0.0.1", port, "/events", counter.feed_from):
            told += nbytes
    return counter, told


@settings(max_examples=40, deadline=None)
@given(shapes=shapes_strategy, chunks=st.lists(st.integers(1, 5000), max_size=6),
       writes=st.lists(st.integers(1, 7000), max_size=6))
def test_a_chunked_body_over_a_socket_is_counted_whole(shapes: list[tuple[str, int, bool]],
                                                         chunks: list[int], writes: list[int]) -> None:
    body = _stream(shapes)
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    counter, told = asyncio.run(asyncio.wait_for(_read(head + _chunked(body, chunks), writes), 30))
    assert _counts(counter) == _whole(body, False)
    assert told == counter.bytes_received == len(body)


def test_a_body_without_chunks_is_read_to_the_close() -> None:
    body = _stream([("session_update", 100_000, True)] * 5)
    head = b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n"
    counter, told = asyncio.run(asyncio.wait_for(_read(head + body, [65536]), 30))
    assert (counter.events, counter.marked, told) == (5, 5, len(body))


def test_a_status_other_than_200_is_raised_with_the_path() -> None:
    response = b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"
    with pytest.raises(HttpStatusError, match=re.escape("GET /events: HTTP/1.1 404 Not Found")):
        asyncio.run(asyncio.wait_for(_read(response, []), 30))


async def _read_behind(port: int) -> tuple[int, int, SseCounter]:
    """A consumer that stops looking once the reader is READ_AHEAD_BYTES ahead, for a while, then
    reads on: the most the reader counted beyond what it told, and the total it told."""
    counter = SseCounter(MARKER)
    told = most_ahead = 0
    ahead = asyncio.Event()

    def sink(buf: bytearray, start: int, end: int) -> None:
        nonlocal most_ahead
        counter.feed_from(buf, start, end)
        most_ahead = max(most_ahead, counter.bytes_received - told)
        if most_ahead >= READ_AHEAD_BYTES:
            ahead.set()

    reads = stream_sse("127.0.0.1", port, "/events", sink)
    told += await anext(reads)
    await asyncio.wait_for(ahead.wait(), 30)
    for _ in range(50):  # while it does not look, a reader that did not pause would read it all
        await asyncio.sleep(0.01)
    async for nbytes in reads:
        told += nbytes
    return most_ahead, told, counter


def test_a_consumer_that_falls_behind_stops_the_reading_at_the_read_ahead() -> None:
    frames = 3 * READ_AHEAD_BYTES // (1 << 20)
    body = _stream([("session_update", (1 << 20) - 80, True)] * frames)
    head = b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n"

    async def run() -> tuple[int, int, SseCounter]:
        server, port = await _serve_once(head + body, [1 << 20])
        async with server:
            return await _read_behind(port)

    most_ahead, told, counter = asyncio.run(asyncio.wait_for(run(), 60))
    # The read that crosses the read-ahead is the last one until the consumer looks again.
    assert READ_AHEAD_BYTES <= most_ahead < READ_AHEAD_BYTES + RECEIVE_BUFFER_BYTES
    assert told == counter.bytes_received == len(body)
    assert (counter.events, counter.marked) == (frames, frames)
