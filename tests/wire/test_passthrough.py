"""The raw bytes of a text chunk's update: exact when the frame is the compact form, None for any
other spelling, never bytes that differ from the decoded update's meaning."""

from __future__ import annotations

import json
from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from hopline.wire.passthrough import MAX_QUOTES_CHECKED, text_chunk_update_bytes


def _frame(text: str, *, kind: str = "agent_message_chunk", session: str = "sess-1") -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": "session/update",
            "params": {"sessionId": session, "update": {"sessionUpdate": kind,
                                                        "content": {"type": "text", "text": text}}}}


def _span(raw: bytes) -> bytes | None:
    found = text_chunk_update_bytes(raw, orjson.loads(raw))
    return None if found is None else bytes(found)


def _envelope(prompt_id: str, span: bytes) -> bytes:
    """How the daemon splices it (SessionManager.publish_update)."""
    return b'{"promptId":' + orjson.dumps(prompt_id) + b',"update":' + span + b"}"


def test_a_compact_frame_gives_the_updates_bytes_and_the_same_event_as_encoding() -> None:
    message = _frame('he said "hi" \\ and left \\\\')
    raw = orjson.dumps(message)
    span = _span(raw)
    assert span == orjson.dumps(message["params"]["update"])
    # byte for byte what encoding the decoded update gives, so the same JSON as before
    assert _envelope("p_1", span) == orjson.dumps({"promptId": "p_1", "update": message["params"]["update"]})


def test_other_escapes_are_kept_as_written_and_mean_the_same() -> None:
    message = _frame("caf\u00e9 \u2603 \n tab\t")
    raw = json.dumps(message, separators=(",", ":")).encode()  # the ACP SDK's spelling: \\u escapes
    span = _span(raw)
    assert span is not None and b"\\u00e9" in span  # the agent's bytes, not re-encoded
    assert orjson.loads(_envelope("p_1", span)) == {"promptId": "p_1", "update": message["params"]["update"]}


def test_every_kind_of_text_chunk_and_only_those() -> None:
    for kind in ("agent_message_chunk", "agent_thought_chunk", "user_message_chunk"):
        assert _span(orjson.dumps(_frame("x", kind=kind))) is not None
    tool = {"jsonrpc": "2.0", "method": "session/update",
            "params": {"sessionId": "s", "update": {"sessionUpdate": "tool_call", "toolCallId": "t"}}}
    assert _span(orjson.dumps(tool)) is None


def test_any_other_spelling_is_encoded_instead() -> None:
    message = _frame("text")
    spaced = json.dumps(message).encode()  # separators with spaces
    assert _span(spaced) is None
    reordered = orjson.dumps({"method": "session/update", "jsonrpc": "2.0", "params": message["params"]})
    assert _span(reordered) is None
    with_meta = orjson.dumps({**message, "params": {**message["params"], "_meta": {"k": 1}}})
    assert _span(with_meta) is None
    update_meta = _frame("text")
    update_meta["params"]["update"]["_meta"] = {"hopline.sidecar": []}
    assert _span(orjson.dumps(update_meta)) is None
    image = _frame("text")
    image["params"]["update"]["content"] = {"type": "image", "text": "x"}
    assert _span(orjson.dumps(image)) is None
    assert _span(orjson.dumps(message) + b" ") is None  # a trailing space


def test_duplicate_keys_are_never_spliced() -> None:
    first = orjson.dumps(_frame("first")["params"]["update"])
    second = orjson.dumps(_frame("second")["params"]["update"])
    head = b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"sess-1","update":'
    twice = head + first + b',"update":' + second + b"}}"
    assert orjson.loads(twice)["params"]["update"]["content"]["text"] == "second"  # the last one wins
    assert _span(twice) is None
    params_twice = head + first + b'},"params":{"sessionId":"sess-1","update":' + second + b"}}"
    assert orjson.loads(params_twice)["params"]["update"]["content"]["text"] == "second"
    assert _span(params_twice) is None


def test_the_quote_check_is_bounded_at_its_limit_and_one_over() -> None:
    at_limit = orjson.dumps(_frame('"' * MAX_QUOTES_CHECKED))
    assert _span(at_limit) is not None
    assert _span(orjson.dumps(_frame('"' * (MAX_QUOTES_CHECKED + 1)))) is None  # encoded instead


@given(st.text(), st.sampled_from(["agent_message_chunk", "agent_thought_chunk"]), st.text(min_size=1))
def test_a_span_is_always_the_update_exactly(text: str, kind: str, session: str) -> None:
    message = _frame(text, kind=kind, session=session)
    for raw in (orjson.dumps(message), json.dumps(message, separators=(",", ":")).encode()):
        span = _span(raw)
        if span is not None:
            assert orjson.loads(span) == message["params"]["update"]
    # orjson's own spelling always qualifies while the text has few quotes
    if text.count('"') <= MAX_QUOTES_CHECKED:
        assert _span(orjson.dumps(message)) == orjson.dumps(message["params"]["update"])


def test_both_orders_of_both_objects_qualify() -> None:
    # ACP's Python SDK writes content first and text before type; the TypeScript SDK the other way
    for kind_first in (True, False):
        for type_first in (True, False):
            content = {"type": "text", "text": 'a "b"'} if type_first else {"text": 'a "b"', "type": "text"}
            update = ({"sessionUpdate": "agent_message_chunk", "content": content} if kind_first
                      else {"content": content, "sessionUpdate": "agent_message_chunk"})
            params = {"sessionId": "s", "update": update}
            message = {"jsonrpc": "2.0", "method": "session/update", "params": params}
            assert _span(orjson.dumps(message)) == orjson.dumps(update)
