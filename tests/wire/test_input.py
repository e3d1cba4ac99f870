"""The client input parsers (SPEC D-10): decimal ids (cursor, Last-Event-ID) and bounded JSON."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hopline.errors import InputRefused
from hopline.wire.input import MAX_DECIMAL_ID, loads_bounded, nesting_depth, parse_decimal_id


def nested(depth: int) -> bytes:
    """A JSON document exactly ``depth`` levels deep: objects and arrays alternating."""
    doc = b"1"
    for level in range(depth):
        doc = b'{"k":' + doc + b"}" if level % 2 else b"[" + doc + b"]"
    return doc


@given(st.text(max_size=40))
def test_any_text_is_an_id_in_range_or_refused_naming_the_field(text: str) -> None:
    try:
        value = parse_decimal_id(text, "Last-Event-ID")
    except InputRefused as refused:
        assert refused.kind == "invalid_last_event_id" and refused.fields["field"] == "Last-Event-ID"
        assert refused.fields["limit"] == MAX_DECIMAL_ID
        return
    assert 0 <= value <= MAX_DECIMAL_ID
    assert text.strip() and all(c in "0123456789" for c in text.strip())


@given(st.integers(min_value=0, max_value=MAX_DECIMAL_ID))
def test_every_id_in_range_round_trips(value: int) -> None:
    assert parse_decimal_id(str(value), "cursor") == value
    assert parse_decimal_id(f" {value:0>5} ", "cursor") == value


@given(st.integers(min_value=MAX_DECIMAL_ID + 1, max_value=10**40))
def test_every_id_past_the_range_is_refused(value: int) -> None:
    with pytest.raises(InputRefused) as refused:
        parse_decimal_id(str(value), "cursor")
    assert refused.value.kind == "invalid_cursor"


@pytest.mark.parametrize("text", ["²", "\xb2", "١٢", "1_000", "+1", "-1", "0x10", "1e3", "", "   ",
                                  "99999999999999999999"])
def test_ids_that_str_isdigit_or_int_would_take_are_refused(text: str) -> None:
    with pytest.raises(InputRefused):
        parse_decimal_id(text, "cursor")


def test_the_largest_id_passes_and_one_more_is_refused() -> None:
    assert parse_decimal_id(str(MAX_DECIMAL_ID), "cursor") == MAX_DECIMAL_ID
    with pytest.raises(InputRefused):
        parse_decimal_id(str(MAX_DECIMAL_ID + 1), "cursor")


@pytest.mark.parametrize("limit", [2, 64, 128])
def test_nesting_at_the_limit_passes_and_one_more_is_refused(limit: int) -> None:
    assert nesting_depth(loads_bounded(nested(limit), limit), limit) == limit
    with pytest.raises(InputRefused) as refused:
        loads_bounded(nested(limit + 1), limit)
    assert refused.value.kind == "json_too_deep"
    assert refused.value.fields == {"field": "(body)", "limit": limit, "observed": limit + 1,
                                    "setting": "HOPLINE_JSON_MAX_DEPTH", "unit": "count"}


def test_nesting_past_the_parsers_own_limit_is_the_same_refusal() -> None:
    with pytest.raises(InputRefused) as refused:
        loads_bounded(nested(5000), 64)
    assert refused.value.kind == "json_too_deep" and refused.value.fields["observed"] > 1024


@pytest.mark.parametrize("raw", [
    b'{"text":"\\ud800"}', b'{"text":"\\udfff x"}', b'["\\ud83d"]', b'{"\\ud800":1}',
    b'{"text":"\xff"}', b'{"text":"\xed\xa0\x80"}', b'{"text":"abc', b"", b"nul\x00",
])
def test_lone_surrogates_and_invalid_utf8_are_refused(raw: bytes) -> None:
    with pytest.raises(InputRefused) as refused:
        loads_bounded(raw, 64)
    assert refused.value.kind == "invalid_json" and refused.value.fields == {"field": "(body)"}


def test_a_surrogate_pair_is_one_character() -> None:
    assert loads_bounded(b'{"text":"\\ud83d\\ude00"}', 64) == {"text": "\U0001f600"}


json_values = st.recursive(st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner,
                                                                                     max_size=4),
                           max_leaves=30)


@given(json_values)
def test_what_loads_bounded_returns_always_encodes(value: Any) -> None:
    raw = orjson.dumps(value)
    depth = nesting_depth(value, 1000)
    if depth <= 8:
        assert loads_bounded(raw, 8) == value
    else:
        with pytest.raises(InputRefused):
            loads_bounded(raw, 8)


@given(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), st.text(max_size=5))
def test_any_lone_surrogate_in_any_string_is_refused(surrogate: str, other: str) -> None:
    raw = json.dumps({"text": other + surrogate + other}).encode()  # "\udXXX" escapes, as a client sends
    with pytest.raises(InputRefused):
        loads_bounded(raw, 64)
