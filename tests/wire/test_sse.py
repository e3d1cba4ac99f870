"""The sans-IO SSE parser: line endings, multi-line data, comments, and the exact event bound."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hopline.errors import SseEventTooLarge
from hopline.wire.sse import SseParser

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


_line_endings = st.sampled_from([b"\n", b"\r\n", b"\r"])
_values = st.binary(max_size=40).map(lambda v: v.replace(b"\r", b"").replace(b"\n", b""))
_lines = st.one_of(
    st.tuples(st.sampled_from([b"data", b"event", b"id", b"retry", b"other", b"dat"]),
              st.sampled_from([b":", b": ", b":  "]), _values).map(b"".join),
    st.sampled_from([b"data", b"event", b"id", b"", b": comment", b":"]),
    _values.map(lambda v: b"id: " + v + b"\x00"),  # an id with NUL is ignored
)


@settings(max_examples=300, deadline=None)
@given(body=st.lists(st.tuples(_lines, _line_endings), max_size=30), bom=st.booleans(),
       cuts=st.lists(st.integers(0, 2000), max_size=12), limit=st.integers(1, 200))
def test_lines_read_whole_in_a_chunk_and_across_chunks_give_the_same_events(
        body: list[tuple[bytes, bytes]], bom: bool, cuts: list[int], limit: int) -> None:
    """Whole lines in a chunk are read where they lie; lines across chunks are buffered: the same
    events and sizes however the stream is cut (one byte at a time is all buffered, the whole
    stream at once all in place). A line cut before its colon counts in full against the limit
    while it is pending (its name could be any length), so a cut stream may be refused where the
    whole one is not, never the other way."""
    stream = (b"\xef\xbb\xbf" if bom else b"") + b"".join(line + end for line, end in body) + b"\n\n"
    bounds = [0, *sorted(c for c in cuts if c < len(stream)), len(stream)]
    cuttings = {"whole": [stream], "bytes": [stream[i:i + 1] for i in range(len(stream))],
                "cuts": [stream[a:b] for a, b in itertools.pairwise(bounds)]}
    for max_event in (len(stream), limit):  # the first: nothing can be refused
        outcomes = {}
        for name, chunks in cuttings.items():
            parser, events, refused = SseParser(max_event), [], False
            try:
                for chunk in chunks:
                    events += [(m.id, m.event, m.data, m.size) for m in parser.feed(chunk)]
            except SseEventTooLarge as err:
                assert err.observed > max_event
                refused = True
            outcomes[name] = (refused, events)
        whole = outcomes.pop("whole")
        for refused, events in outcomes.values():
            if max_event == len(stream):
                assert not refused and events == whole[1]
            elif whole[0]:
                assert refused
            elif not refused:
                assert events == whole[1]


@pytest.mark.parametrize("cut", [1, 2])
def test_a_bom_cut_across_chunks_is_still_skipped(cut: int) -> None:
    parser = SseParser(100)
    stream = b"\xef\xbb\xbfdata: a\n\n"
    assert parser.feed(stream[:cut]) == []
    assert [m.data for m in parser.feed(stream[cut:])] == ["a"]


def test_a_first_line_that_starts_like_a_bom_names_no_field() -> None:
    parser = SseParser(100)
    assert parser.feed(b"\xef") == []
    assert [m.data for m in parser.feed(b"data: a\ndata: b\n\n")] == ["b"]
