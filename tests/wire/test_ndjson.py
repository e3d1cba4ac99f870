"""The NDJSON codec (SPEC W-1, W-2): reassembly, limits, bad frames, linear work, bounded memory."""

from __future__ import annotations

import hashlib
import itertools

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hopline.budget import Budget
from hopline.wire.ndjson import (
    Frame,
    FrameError,
    FrameTooLarge,
    IncompleteFrame,
    InvalidFrame,
    NdjsonDecoder,
    encode,
)

MESSAGES = [
    {"jsonrpc": "2.0", "id": 1, "method": "session/prompt", "params": {"text": "héllo wörld ✓ 😀"}},
    {"jsonrpc": "2.0", "method": "session/update", "params": {"update": {"t": "日本語テキスト"}}},
    {"jsonrpc": "2.0", "id": 1, "result": {"stopReason": "end_turn"}},
]
STREAM = b"".join(encode(m) for m in MESSAGES)


def decode_all(decoder: NdjsonDecoder, chunks: list[bytes]) -> list[Frame | FrameError]:
    out: list[Frame | FrameError] = []
    for chunk in chunks:
        out.extend(decoder.feed(chunk))
    out.extend(decoder.eof())
    return out


def messages(items: list[Frame | FrameError]) -> list[object]:
    assert all(isinstance(i, Frame) for i in items), items
    return [i.message for i in items if isinstance(i, Frame)]


def test_encode_is_one_compact_line() -> None:
    line = encode({"a": [1, "é"]})
    assert line == '{"a":[1,"é"]}\n'.encode()
    assert line.count(b"\n") == 1


def test_stream_has_multibyte_utf8() -> None:
    assert len(STREAM) > len(STREAM.decode("utf-8"))


def test_split_at_every_byte_position() -> None:
    for cut in range(len(STREAM) + 1):
        decoder = NdjsonDecoder(1024)
        assert messages(decode_all(decoder, [STREAM[:cut], STREAM[cut:]])) == MESSAGES, cut


def test_split_at_every_pair_of_positions() -> None:
    n = len(STREAM)
    for a in range(0, n + 1, 3):
        for b in range(a, n + 1, 7):
            decoder = NdjsonDecoder(1024)
            assert messages(decode_all(decoder, [STREAM[:a], STREAM[a:b], STREAM[b:]])) == MESSAGES


def test_one_byte_at_a_time() -> None:
    decoder = NdjsonDecoder(1024)
    assert messages(decode_all(decoder, [STREAM[i:i + 1] for i in range(len(STREAM))])) == MESSAGES
    assert decoder.scanned_bytes == len(STREAM)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_arbitrary_chunkings(cuts: list[int]) -> None:
    points = [0, *sorted(cuts), len(STREAM)]
    chunks = [STREAM[a:b] for a, b in itertools.pairwise(points)]
    decoder = NdjsonDecoder(1024)
    assert messages(decode_all(decoder, chunks)) == MESSAGES
    assert decoder.scanned_bytes == len(STREAM)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(max_size=20), min_size=1, max_size=5), st.data())
def test_arbitrary_text_round_trips(texts: list[str], data: st.DataObject) -> None:
    msgs = [{"jsonrpc": "2.0", "method": "m", "params": {"t": t}} for t in texts]
    stream = b"".join(encode(m) for m in msgs)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=8))
    points = [0, *sorted(cuts), len(stream)]
    decoder = NdjsonDecoder(4096)
    got = decode_all(decoder, [stream[a:b] for a, b in itertools.pairwise(points)])
    assert messages(got) == msgs


def test_crlf_and_empty_lines() -> None:
    data = b'\n\r\n{"a":1}\r\n\n\n{"b":2}\n\r\n'
    for cut in range(len(data) + 1):
        decoder = NdjsonDecoder(64)
        got = decode_all(decoder, [data[:cut], data[cut:]])
        assert messages(got) == [{"a": 1}, {"b": 2}]
        assert [f.raw for f in got if isinstance(f, Frame)] == [b'{"a":1}', b'{"b":2}']
        assert [f.size for f in got if isinstance(f, Frame)] == [7, 7]


def _frame_of_size(size: int) -> bytes:
    body = b'{"p":"' + b"x" * (size - 8) + b'"}'
    assert len(body) == size
    return body


@pytest.mark.parametrize("chunk", [1, 7, 64, 10_000])
def test_exact_limit_passes_and_one_more_byte_is_too_large(chunk: int) -> None:
    limit = 1000
    ok, over = _frame_of_size(limit), _frame_of_size(limit + 1)
    data = ok + b"\n" + over + b"\n" + ok + b"\r\n" + over + b"\r\n"
    decoder = NdjsonDecoder(limit)
    got = decode_all(decoder, [data[i:i + chunk] for i in range(0, len(data), chunk)])
    assert [type(g) for g in got] == [Frame, FrameTooLarge, Frame, FrameTooLarge]
    assert got[0].size == limit and got[2].size == limit
    assert got[1] == FrameTooLarge(size=limit + 1, limit=limit)
    assert got[3] == FrameTooLarge(size=limit + 1, limit=limit)
    assert decoder.frames_too_large == 2 and decoder.frames_decoded == 2


def test_limit_with_crlf_split_exactly_before_lf() -> None:
    limit = 100
    ok = _frame_of_size(limit)
    decoder = NdjsonDecoder(limit)
    assert decoder.feed(ok + b"\r") == []
    assert decoder.buffered_bytes == limit + 1  # the pending \r, not part of the frame
    got = decoder.feed(b"\n")
    assert len(got) == 1 and isinstance(got[0], Frame) and got[0].size == limit


def test_oversized_frame_in_the_middle_then_stream_goes_on() -> None:
    limit = 256
    big = _frame_of_size(5000)
    data = encode({"n": 1}) + big + b"\n" + encode({"n": 2})
    for chunk in (1, 13, 100, 300, len(data)):
        decoder = NdjsonDecoder(limit)
        got = decode_all(decoder, [data[i:i + chunk] for i in range(0, len(data), chunk)])
        assert got[0] == Frame(raw=b'{"n":1}', message={"n": 1}, size=7)
        assert got[1] == FrameTooLarge(size=5000, limit=limit)
        assert isinstance(got[2], Frame) and got[2].message == {"n": 2}
        assert len(got) == 3


def test_too_large_is_described_with_hop_limit_and_size() -> None:
    text = FrameTooLarge(size=70_000_000, limit=67_108_864).describe()
    assert "acp.pipe" in text and "67108864" in text and "70000000" in text
    assert "HOPLINE_PIPE_MAX_FRAME_BYTES" in text


def test_invalid_json_and_utf8_are_reported_with_hash_and_stream_goes_on() -> None:
    bad_json = b'{"a": nope}'
    bad_utf8 = b'{"a":"\xff\xfe"}'
    data = bad_json + b"\n" + bad_utf8 + b"\r\n" + encode({"ok": True})
    decoder = NdjsonDecoder(1024)
    got = decode_all(decoder, [data[:5], data[5:]])
    assert got[0] == InvalidFrame(size=len(bad_json), sha256=hashlib.sha256(bad_json).hexdigest(),
                                  reason="invalid_json")
    assert got[1] == InvalidFrame(size=len(bad_utf8), sha256=hashlib.sha256(bad_utf8).hexdigest(),
                                  reason="invalid_utf8")
    assert isinstance(got[2], Frame) and got[2].message == {"ok": True}
    assert decoder.frames_invalid == 2
    assert "nope" not in got[0].describe()


def test_utf8_split_inside_character_reassembles() -> None:
    line = encode({"t": "😀"})
    cut = line.index("😀".encode()) + 2
    decoder = NdjsonDecoder(64)
    assert messages(decode_all(decoder, [line[:cut], line[cut:]])) == [{"t": "😀"}]


def test_eof_inside_frame_is_incomplete() -> None:
    decoder = NdjsonDecoder(64)
    assert messages(decoder.feed(b'{"a":1}\n{"b":')) == [{"a": 1}]
    assert decoder.eof() == [IncompleteFrame(size=5)]
    assert decoder.frames_incomplete == 1


def test_eof_after_newline_is_clean_and_feed_after_eof_fails() -> None:
    decoder = NdjsonDecoder(64)
    decoder.feed(b'{"a":1}\n\n')
    assert decoder.eof() == []
    with pytest.raises(RuntimeError):
        decoder.feed(b"x")


def test_eof_inside_oversized_frame_reports_too_large() -> None:
    decoder = NdjsonDecoder(10)
    assert decoder.feed(b"x" * 25) == []
    assert decoder.eof() == [FrameTooLarge(size=25, limit=10)]


def test_decoder_for_budget_uses_the_pipe_ceiling() -> None:
    budget = Budget.defaults().replace(pipe_max_frame_bytes=12345)
    assert NdjsonDecoder.for_budget(budget).max_frame_bytes == 12345


def test_work_is_linear_for_a_large_frame_in_small_chunks() -> None:
    """A frame of 8 MiB in 4 KiB chunks: every byte searched once, not once per chunk."""
    size, chunk = 8 * 1024 * 1024, 4096
    payload = b'{"p":"' + b"a" * (size - 8) + b'"}' + b"\n"
    decoder = NdjsonDecoder(64 * 1024 * 1024)
    got: list[Frame | FrameError] = []
    for i in range(0, len(payload), chunk):
        got.extend(decoder.feed(payload[i:i + chunk]))
    assert len(got) == 1 and isinstance(got[0], Frame) and got[0].size == size
    assert decoder.fed_bytes == len(payload)
    # Structural: a rescanning decoder would scan ~ n^2 / (2 * chunk) bytes (about 8 GiB here).
    assert decoder.scanned_bytes <= 2 * decoder.fed_bytes
    assert decoder.scanned_bytes == len(payload)


def test_oversized_200_mib_frame_never_buffers_past_the_limit() -> None:
    limit = 1024 * 1024
    chunk = b"y" * (256 * 1024)
    total = 200 * 1024 * 1024
    decoder = NdjsonDecoder(limit)
    peak = 0
    for _ in range(total // len(chunk)):
        assert decoder.feed(chunk) == []
        peak = max(peak, decoder.buffered_bytes)
    assert decoder.discarding
    assert peak <= limit
    got = decoder.feed(b"\n" + encode({"after": 1}))
    assert got[0] == FrameTooLarge(size=total, limit=limit)
    assert isinstance(got[1], Frame) and got[1].message == {"after": 1}
    assert decoder.buffered_bytes == 0 and not decoder.discarding


def test_many_small_frames_in_one_chunk() -> None:
    msgs = [{"i": i} for i in range(5000)]
    data = b"".join(orjson.dumps(m) + b"\n" for m in msgs)
    decoder = NdjsonDecoder(64)
    assert messages(decode_all(decoder, [data])) == msgs
    assert decoder.scanned_bytes == len(data)


def _reference(data: bytes, limit: int) -> list[object]:
    """What a whole-buffer split would give, as comparable tuples."""
    *lines, tail = data.split(b"\n")
    out: list[object] = []
    for line in lines:
        if line.endswith(b"\r"):
            line = line[:-1]
        if not line:
            continue
        if len(line) > limit:
            out.append(("too_large", len(line)))
            continue
        try:
            out.append(("frame", orjson.loads(line)))
        except orjson.JSONDecodeError:
            out.append(("invalid", len(line)))
    if tail:
        out.append(("too_large", len(tail.rstrip(b"\r"))) if len(tail.rstrip(b"\r")) > limit
                   else ("incomplete", len(tail)))
    return out


def _comparable(items: list[Frame | FrameError]) -> list[object]:
    out: list[object] = []
    for item in items:
        if isinstance(item, Frame):
            out.append(("frame", item.message))
        elif isinstance(item, FrameTooLarge):
            out.append(("too_large", item.size))
        elif isinstance(item, InvalidFrame):
            out.append(("invalid", item.size))
        else:
            out.append(("incomplete", item.size))
    return out


PIECES = [encode({"k": "v"}), encode({"t": "ü" * 30}), b"\r\n", b"\n", b"{bad}\n", b'"\xc3"\n',
          b'{"big":"' + b"z" * 60 + b'"}\r\n', b'{"e":"\xe2\x82\xac"}\r\n', b"\r", b"{"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=12), st.data(), st.integers(min_value=8, max_value=70))
def test_matches_a_whole_buffer_reference_under_any_chunking(pieces: list[bytes], data: st.DataObject,
                                                              limit: int) -> None:
    stream = b"".join(pieces)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=10))
    points = [0, *sorted(cuts), len(stream)]
    decoder = NdjsonDecoder(limit)
    got = decode_all(decoder, [stream[a:b] for a, b in itertools.pairwise(points)])
    assert _comparable(got) == _reference(stream, limit)
    assert decoder.scanned_bytes == len(stream)
