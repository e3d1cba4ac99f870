"""G-5 against a strict server (tests/strict_openai.py): requests hold only chat-completions fields,
answers stream (interleaved tool-call deltas, usage last), the response ceiling applies to the sum
of the deltas, a cut stream is origin model with the bytes received, and a cancel closes the
upstream connection — directly and through the gateway's streaming form."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import orjson
import pytest

from hopline.budget import HOP_PROVIDER, Budget
from hopline.errors import ProviderSettingError, TurnFailure
from hopline.gateway.providers import (
    OpenAIProvider,
    ProviderFailure,
    TextDelta,
    parse_extra_headers,
    provider_from_env,
    text_pieces,
)
from hopline.harness.http_model import HttpModel
from hopline.harness.model import LlmTurnRequest, LlmTurnResponse, encode_request
from hopline.harness.summarize import SUMMARY_SYSTEM_PROMPT
from hopline.harness.tools import tool_schemas
from strict_openai import Reply, StrictOpenAI

from .conftest import TOKEN, GatewayFactory

# Three calls whose arguments arrive in 7-character pieces, interleaved by index.
CALLS = [{"id": f"call_{i}", "type": "function",
          "function": {"name": name, "arguments": orjson.dumps(args).decode()}}
         for i, (name, args) in enumerate([("read_file", {"path": "logs/a.log", "offset": 0}),
                                           ("run_command", {"command": "cat logs/b.log | tail -n 40"}),
                                           ("search_workspace", {"query": "ERROR", "regex": False})])]
TEXT = "Let me look at the failing logs first, then the report."
REPLY = Reply(TEXT, CALLS)
DELTA_BYTES = len(TEXT.encode()) + sum(
    len(c["id"]) + len(c["function"]["name"]) + len(c["function"]["arguments"]) for c in CALLS)


class TextLog(list[str]):
    """A text sink that keeps every delta it is handed, in order."""

    async def __call__(self, text: str) -> None:
        self.append(text)


@pytest.fixture
def strict() -> Iterator[StrictOpenAI]:
    with StrictOpenAI(arg_piece_chars=7) as server:
        yield server


def _turn(**params: object) -> LlmTurnRequest:
    return LlmTurnRequest(messages=[{"role": "system", "content": "you review"},
                                    {"role": "user", "content": "gate this", "x-hopline": "ours"}],
                          tools=tool_schemas(("read_file", "run_command", "search_workspace")),
                          params=params)


def _provider(strict: StrictOpenAI, budget: Budget | None = None, **kw: object) -> OpenAIProvider:
    return OpenAIProvider(budget or Budget.defaults(), base_url=strict.base_url, api_key="sk-test",
                          model="strict-model", **kw)  # type: ignore[arg-type]


async def _collect(provider: OpenAIProvider, request: LlmTurnRequest,
                   texts: list[str] | None = None) -> tuple[list[str], LlmTurnResponse]:
    """The text deltas (into ``texts`` when given, so a failure leaves what came) and the answer."""
    texts = [] if texts is None else texts
    answer: LlmTurnResponse | None = None
    try:
        async for item in provider.stream(request):
            if isinstance(item, TextDelta):
                texts.append(item.text)
            else:
                answer = item
    finally:
        await provider.aclose()
    assert answer is not None
    return texts, answer


def test_the_strict_server_refuses_unknown_fields_like_the_real_apis(strict: StrictOpenAI) -> None:
    url = strict.base_url + "/chat/completions"
    good = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(url, json=good).status_code == 200
    for bad, param in (({**good, "maxBytes": 16384}, "maxBytes"),
                       ({**good, "scripted": {"iterations": 3}}, "scripted"),
                       ({**good, "messages": [{"role": "user", "content": "hi", "purpose": "summary"}]},
                        "messages.0"),
                       ({**good, "stream_options": {"include_usage": True}}, "stream_options")):
        answer = httpx.post(url, json=bad)
        assert answer.status_code == 400
        assert answer.json()["error"]["type"] == "invalid_request_error"
        assert answer.json()["error"]["param"] == param
    assert [r["param"] for r in strict.rejections] == ["maxBytes", "scripted", "messages.0", "stream_options"]


async def test_only_chat_completions_fields_reach_the_provider(strict: StrictOpenAI) -> None:
    # A summarization request: our byte budget and hints travel in params, the chat params too.
    request = LlmTurnRequest(messages=[{"role": "system", "content": SUMMARY_SYSTEM_PROMPT},
                                       {"role": "user", "content": "Transcript:\nuser: go"}],
                             params={"maxBytes": 16384, "scripted": {"iterations": 3}, "temperature": 0.2,
                                     "model": "not-this", "stream": False},
                             purpose="summary")
    texts, answer = await _collect(_provider(strict), request)
    assert strict.rejections == [] and strict.summaries == 1
    sent = strict.requests[0]
    assert set(sent) == {"model", "messages", "stream", "stream_options", "temperature"}
    assert sent["model"] == "strict-model" and sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True}
    assert "".join(texts) == answer.message["content"]
    assert answer.message["content"].startswith("Scripted summary")
    assert answer.usage.prompt_tokens > 0  # from the usage chunk
    # a message field of ours is dropped; the message itself is not
    _, turn_answer = await _collect(_provider(strict), _turn())
    assert strict.requests[1]["messages"][1] == {"role": "user", "content": "gate this"}
    assert turn_answer.message["tool_calls"]


async def test_interleaved_tool_call_deltas_are_assembled(strict: StrictOpenAI) -> None:
    strict.reply = REPLY
    texts, answer = await _collect(_provider(strict), _turn())
    assert texts == text_pieces(TEXT) and len(texts) > 5
    assert answer.message == {"role": "assistant", "content": TEXT, "tool_calls": CALLS}
    assert answer.provider == "openai"
    usage = strict.usage(strict.requests[0], REPLY)  # from the last chunk (include_usage)
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == \
        (usage["prompt_tokens"], usage["completion_tokens"])
    # the pieces really interleaved: call 1's first argument piece came before call 0's last one
    deltas = strict.deltas(REPLY)
    order = [d["tool_calls"][0]["index"] for d in deltas
             if "tool_calls" in d and "id" not in d["tool_calls"][0]]
    assert order[:3] == [0, 1, 2]


@pytest.mark.parametrize("mode", ["close", "drop", "reset"])
async def test_a_stream_cut_in_the_middle_is_model_origin_with_the_bytes_received(strict: StrictOpenAI,
                                                                                 mode: str) -> None:
    strict.reply = Reply(TEXT, [])
    strict.cut_after = 4
    strict.cut_mode = mode
    received: list[str] = []
    provider = _provider(strict)
    with pytest.raises(ProviderFailure) as caught:
        await _collect(provider, _turn(), received)
    failure = caught.value
    assert received == text_pieces(TEXT)[:4]
    assert failure.origin == "model" and failure.retryable and failure.hop == HOP_PROVIDER
    assert failure.observed_bytes == len("".join(received).encode())
    assert f"after {failure.observed_bytes} bytes of deltas" in failure.message


async def test_a_break_after_the_finish_reason_keeps_the_answer(strict: StrictOpenAI) -> None:
    strict.reply = REPLY
    strict.drop_after_finish = True  # the connection breaks: the usage chunk and [DONE] never come
    texts, answer = await _collect(_provider(strict), _turn())
    assert "".join(texts) == TEXT and answer.message["tool_calls"] == CALLS
    assert answer.usage.prompt_tokens == 0  # not reported: the loop keeps the bytes estimate


@pytest.mark.parametrize("slack", [0, -1])
async def test_the_response_ceiling_applies_to_the_sum_of_the_deltas(strict: StrictOpenAI,
                                                                     slack: int) -> None:
    strict.reply = REPLY
    limit = DELTA_BYTES + slack
    provider = _provider(strict, Budget.defaults().replace(provider_response_max_bytes=limit))
    if slack == 0:  # exactly at the limit: the whole answer
        _, answer = await _collect(provider, _turn())
        assert answer.message["tool_calls"] == CALLS
        return
    received: list[str] = []
    with pytest.raises(ProviderFailure) as caught:
        await _collect(provider, _turn(), received)
    failure = caught.value  # one byte over: cut at the ceiling, the last piece never kept
    assert failure.origin == "model" and not failure.retryable
    assert failure.limit_bytes == limit and failure.observed_bytes == DELTA_BYTES
    assert "HOPLINE_PROVIDER_RESPONSE_MAX_BYTES" in failure.message
    assert "".join(received) == TEXT  # the text fit; a tool-call piece passed the ceiling


async def test_the_raw_stream_is_bounded_too(strict: StrictOpenAI) -> None:
    strict.reply = REPLY
    budget = Budget.defaults().replace(provider_response_max_bytes=1024, provider_stream_max_bytes=2048)
    with pytest.raises(ProviderFailure) as caught:
        await _provider(strict, budget).complete(_turn())
    assert caught.value.limit_bytes == 2048 and caught.value.observed_bytes > 2048
    assert "HOPLINE_PROVIDER_STREAM_MAX_BYTES" in caught.value.message


@pytest.mark.parametrize("slack", [0, -1])
async def test_a_stream_of_exactly_the_raw_ceiling_passes_and_one_byte_less_cuts_it(
        strict: StrictOpenAI, slack: int) -> None:
    """HOPLINE_PROVIDER_STREAM_MAX_BYTES at its limit: the stream's raw bytes (SSE framing included),
    measured by a plain client on the same request, are exactly the ceiling: the whole answer; with a
    ceiling one byte smaller, it is cut."""
    strict.reply = REPLY
    payload = _provider(strict).request_body(_turn())
    measured = httpx.post(strict.base_url + "/chat/completions", content=payload,
                          headers={"content-type": "application/json"})
    assert measured.headers["content-type"] == "text/event-stream"
    raw = len(measured.content)
    assert raw > DELTA_BYTES  # the framing counts
    budget = Budget.defaults().replace(provider_response_max_bytes=DELTA_BYTES,
                                       provider_stream_max_bytes=raw + slack)
    if slack == 0:
        answer = await _provider(strict, budget).complete(_turn())
        assert answer.message["tool_calls"] == CALLS and answer.message["content"] == TEXT
        return
    with pytest.raises(ProviderFailure) as caught:
        await _provider(strict, budget).complete(_turn())
    assert caught.value.origin == "model"
    assert caught.value.limit_bytes == raw - 1 and caught.value.observed_bytes > raw - 1
    assert "HOPLINE_PROVIDER_STREAM_MAX_BYTES" in caught.value.message


async def test_without_streaming_the_whole_answer_is_asked_for(strict: StrictOpenAI) -> None:
    strict.reply = REPLY
    env = {"HOPLINE_PROVIDER": "openai", "OPENAI_BASE_URL": strict.base_url, "HOPLINE_PROVIDER_STREAM": "0"}
    provider = provider_from_env(Budget.defaults(), env)
    texts, answer = await _collect(provider, _turn())  # type: ignore[arg-type]
    assert "stream" not in strict.requests[0] and "stream_options" not in strict.requests[0]
    assert texts == [] and answer.message == {"role": "assistant", "content": TEXT, "tool_calls": CALLS}


async def test_extra_headers_reach_the_provider_and_bad_ones_stop_startup(strict: StrictOpenAI) -> None:
    env = {"HOPLINE_PROVIDER": "openai", "OPENAI_BASE_URL": strict.base_url, "OPENAI_API_KEY": "sk-1",
           "HOPLINE_PROVIDER_EXTRA_HEADERS": '{"OpenAI-Organization": "org-7", "X-Trace": "t1"}'}
    provider = provider_from_env(Budget.defaults(), env)
    await provider.complete(_turn())
    await provider.aclose()
    seen = strict.headers[0]
    assert seen["openai-organization"] == "org-7" and seen["x-trace"] == "t1"
    assert seen["authorization"] == "Bearer sk-1"
    for raw, needle in (('["a"]', "not a JSON object"), ("{bad", "not a JSON object"),
                        ('{"Content-Length": "1"}', "content-length is set by the gateway"),
                        ('{"Authorization": "Bearer sk-secret-value"}', "conflicts with OPENAI_API_KEY"),
                        ('{"X-A": "line\\nbreak"}', "one-line")):
        with pytest.raises(ProviderSettingError, match=needle) as caught:
            parse_extra_headers(raw, api_key_set=True)
        assert "HOPLINE_PROVIDER_EXTRA_HEADERS" in str(caught.value)
        assert "sk-secret-value" not in str(caught.value)  # a value is never echoed
    without_key = parse_extra_headers('{"Authorization": "Bearer x"}', api_key_set=False)
    assert without_key == {"authorization": "Bearer x"}


# --- through the gateway's streaming form ---------------------------------------------------------


async def test_the_gateway_relays_deltas_in_order_and_the_final_message(
        strict: StrictOpenAI, gateway_factory: GatewayFactory) -> None:
    strict.reply = REPLY
    budget = Budget.defaults()
    gw = gateway_factory(budget, _provider(strict, budget))
    texts = TextLog()
    async with HttpModel(gw.url, "s-1", TOKEN, budget) as model:
        answer = await model.complete_streaming(encode_request(_turn()), texts)
    assert texts == text_pieces(TEXT)
    assert "".join(texts) == answer.message["content"] == TEXT
    assert answer.message["tool_calls"] == CALLS and answer.usage.prompt_tokens > 0


async def test_a_cut_stream_through_the_gateway_is_model_origin_with_the_bytes_received(
        strict: StrictOpenAI, gateway_factory: GatewayFactory) -> None:
    strict.reply = Reply(TEXT, [])
    strict.cut_after = 3
    budget = Budget.defaults()
    gw = gateway_factory(budget, _provider(strict, budget))
    texts = TextLog()
    async with HttpModel(gw.url, "s-1", TOKEN, budget) as model:
        with pytest.raises(TurnFailure) as caught:
            await model.complete_streaming(encode_request(_turn()), texts)
    failure = caught.value
    assert texts == text_pieces(TEXT)[:3]
    assert failure.origin == "model" and failure.retryable and failure.hop == HOP_PROVIDER
    assert failure.observed_bytes == len("".join(texts).encode())


@pytest.mark.parametrize("held_after", [2, 0])
async def test_a_cancel_mid_stream_closes_the_upstream_connection(strict: StrictOpenAI,
                                                                  gateway_factory: GatewayFactory,
                                                                  held_after: int) -> None:
    # 2: two deltas, then the server waits for its client to leave; 0: it waits before the first
    # delta (a model still thinking), when the gateway has not begun its answer yet
    strict.reply = Reply(TEXT, [])
    strict.hold_after = held_after
    budget = Budget.defaults()
    gw = gateway_factory(budget, _provider(strict, budget))
    texts = TextLog()

    async with HttpModel(gw.url, "s-1", TOKEN, budget) as model:
        task = asyncio.create_task(model.complete_streaming(encode_request(_turn()), texts))
        assert await asyncio.to_thread(strict.holding.wait, 10)  # the provider holds its stream open

        async def relayed() -> None:  # every delta sent before the hold reached the caller
            while len(texts) < held_after:
                await asyncio.sleep(0.01)

        await asyncio.wait_for(relayed(), 10)
        assert len(texts) == held_after and not strict.disconnected.is_set() and not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    # the gateway noticed its client left and closed the provider's stream: the upstream socket closed
    assert await asyncio.to_thread(strict.disconnected.wait, 10)
