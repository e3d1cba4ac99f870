from __future__ import annotations

import orjson

from hopline.budget import Budget
from hopline.harness.model import LlmTurnRequest, encode_request
from hopline.harness.tokens import (
    IncrementalEstimator,
    bytes_per_token,
    estimate,
    message_bytes,
)

TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]


def call_message(args_bytes: int, n: int = 1) -> dict:
    calls = [{"id": f"c{i}", "type": "function",
              "function": {"name": "write_file",
                           "arguments": orjson.dumps({"content": "x" * args_bytes}).decode()}}
             for i in range(n)]
    return {"role": "assistant", "content": "", "tool_calls": calls}


def test_bytes_per_token_reads_budget() -> None:
    assert bytes_per_token() == Budget.defaults().bytes_per_token == 4
    assert bytes_per_token(Budget.defaults().replace(bytes_per_token=3)) == 3


def test_assistant_with_tool_calls_and_empty_content_counted_by_calls_json() -> None:
    message = call_message(4000)
    calls_json = orjson.dumps(message["tool_calls"])
    assert message_bytes(message) == len(calls_json)
    assert estimate([message]) == -(-len(calls_json) // 4)


def test_every_content_counted_including_parts_and_utf8() -> None:
    messages = [
        {"role": "system", "content": "é" * 10},  # 20 bytes
        {"role": "user", "content": [{"type": "text", "text": "abcd"}, {"type": "text", "text": "ef"}]},
        {"role": "tool", "tool_call_id": "c", "content": "12345678"},
    ]
    assert sum(message_bytes(m) for m in messages) == 20 + 6 + 8
    assert estimate(messages) == -(-34 // 4)


def test_incremental_body_size_equals_encoder() -> None:
    budget = Budget.defaults()
    envelope = LlmTurnRequest([], tools=TOOLS, model="m", params={"scripted": {"seed": 1}})
    sizer = IncrementalEstimator(budget, envelope)
    messages: list[dict] = []
    sizer.sync(messages)
    assert sizer.body_bytes == len(encode_request(envelope).body)
    for i in range(5):
        messages.append({"role": "user", "content": f"q{i} ünïcode \"quoted\"\n"})
        messages.append(call_message(100 * i, n=2))
        sizer.sync(messages)
        expected = encode_request(LlmTurnRequest(list(messages), TOOLS, "m", {"scripted": {"seed": 1}}))
        assert sizer.body_bytes == expected.size
        assert sizer.encoded().body == expected.body
        assert sizer.estimate_tokens == estimate(messages, budget)
    # replacing the middle (a compaction) re-syncs from the first difference
    messages[3:7] = [{"role": "user", "content": "summary"}]
    sizer.sync(messages)
    expected = encode_request(LlmTurnRequest(list(messages), TOOLS, "m", {"scripted": {"seed": 1}}))
    assert sizer.encoded().body == expected.body
    assert sizer.estimate_tokens == estimate(messages, budget)


def test_incremental_cost_is_linear_in_history_by_counting() -> None:
    """60 iterations of 4 tool results: the encoder sees each message about once, not once per send."""
    sizer = IncrementalEstimator(Budget.defaults(), LlmTurnRequest([], tools=TOOLS))
    messages: list[dict] = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"}]
    appended = 0
    for _ in range(60):
        call = call_message(50, n=4)
        results = [{"role": "tool", "tool_call_id": f"c{i}", "content": "r" * 32 * 1024} for i in range(4)]
        for m in [call, *results]:
            messages.append(m)
            appended += len(orjson.dumps(m))
        sizer.sync(messages)
        assert sizer.body_bytes > 0  # the size is read before every send
    history = sum(len(orjson.dumps(m)) for m in messages)
    # each message is encoded once (+ the calls' JSON again): at most twice the history, plus envelope
    assert sizer.encoded_bytes <= 2 * history + 1024
    # what a per-send full re-encode would have cost: quadratic
    quadratic = sum(range(1, 61)) * (history // 60)
    assert sizer.encoded_bytes < quadratic / 10
