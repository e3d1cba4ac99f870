"""The sans-IO SSE parser: line endings, multi-line data, comments, and the exact event bound."""

from __future__ import annotations

import pytest

from hopline.wire.sse import SseEventTooLarge, SseParser

STREAM = (b"\xef\xbb\xbf: heartbeat\n\nid: 1\r\nevent: a\r\ndata: x\r\ndata:  y\r\n\r\n"
          b"id: 2\revent: b\rdata: cr\r\rretry: 5\ndata: {\"k\": 1}\n\n")


def _feed_all(parser: SseParser, stream: bytes, step: int) -> list[tuple[str | None, str, str]]:
    out = []
    for offset in range(0, len(stream), step):
        out += [(m.id, m.event, m.data) for m in parser.feed(stream[offset:offset + step])]
    return out


@pytest.mark.parametrize("step", [1, 2, 3, 7, len(STREAM)])
def test_any_chunking_gives_the_same_events(step: int) -> None:
    events = _feed_all(SseParser(1024), STREAM, step)
    assert events == [("1", "a", "x\n y"), ("2", "b", "cr"), (None, "message", '{"k": 1}')]


def test_comments_are_never_buffered() -> None:
    parser = SseParser(16)
    # A comment far larger than the event limit streams through without error or buffering.
    assert parser.feed(b":" + b"z" * 10_000) == []
    assert parser.feed(b"\ndata: ok\n\n")[0].data == "ok"
    assert parser.max_buffered <= 16


def test_exactly_the_limit_passes_and_one_more_byte_fails() -> None:
    limit = 100
    # Size counts the values delivered: data + event type + id.
    ok = SseParser(limit).feed(b"id: 7\nevent: big\ndata: " + b"x" * (limit - 4) + b"\n\n")
    assert ok[0].size == limit
    with pytest.raises(SseEventTooLarge) as err:
        SseParser(limit).feed(b"id: 7\nevent: big\ndata: " + b"x" * (limit - 3) + b"\n\n")
    assert str(err.value) == f"hop client.sse: event exceeds {limit} bytes (read {limit + 1} so far)"


def test_joined_multiline_data_counts_its_newlines() -> None:
    # "ab\ncd" is 5 bytes; limit 5 passes, a third line (6 + more) fails.
    assert SseParser(5).feed(b"data: ab\ndata: cd\n\n")[0].data == "ab\ncd"
    with pytest.raises(SseEventTooLarge):
        SseParser(5).feed(b"data: ab\ndata: cd\ndata:\n\n")


def test_oversized_event_is_refused_before_it_is_buffered() -> None:
    limit = 1000
    parser = SseParser(limit)
    parser.feed(b"data: ")
    with pytest.raises(SseEventTooLarge) as err:
        for _ in range(100):
            parser.feed(b"y" * 64)
    assert err.value.limit == limit
    assert err.value.observed > limit
    # Never held more than the limit plus the field syntax ("data: ").
    assert parser.max_buffered <= limit + len(b"data: ")


def test_cr_at_chunk_end_then_lf_is_one_line_ending() -> None:
    parser = SseParser(100)
    assert parser.feed(b"data: a\r") == []
    assert parser.feed(b"\n") == []
    out = parser.feed(b"\r\n")
    assert [m.data for m in out] == ["a"]
