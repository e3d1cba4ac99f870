"""G-4: the OpenAI-compatible provider against a fake provider served by uvicorn on 127.0.0.1,
directly and end to end (HttpModel -> gateway -> provider), with errors mapped to H-8 origins."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from hopline.budget import HOP_PROVIDER, Budget
from hopline.errors import TurnFailure
from hopline.gateway.providers import OpenAIProvider, ProviderFailure, provider_from_env
from hopline.harness.http_model import HttpModel
from hopline.harness.model import LlmTurnRequest, encode_request

from ._server import ServerThread
from .conftest import TOKEN, GatewayFactory

SLOW_SECONDS = 1.0


class FakeOpenAI:
    """Chat completions whose behaviour is chosen by the requested model name."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.app = Starlette(routes=[Route("/v1/chat/completions", self.complete, methods=["POST"])])

    async def complete(self, request: Request) -> Response:
        body = orjson.loads(await request.body())
        self.seen.append({"body": body, "authorization": request.headers.get("authorization")})
        model = body["model"]
        if model == "rate":
            return JSONResponse({"error": {"message": "Rate limit reached: too many tokens per minute"}}, 429)
        if model == "boom":
            return JSONResponse({"error": {"message": "internal"}}, 500)
        if model == "big":
            return PlainTextResponse("request entity too large", 413)
        if model == "ctx":
            return JSONResponse({"error": {"code": "context_length_exceeded", "type": "invalid_request_error",
                                           "message": "This model's maximum context length is 8192 tokens"}},
                                400)
        if model == "badkey":
            return JSONResponse({"error": {"message": "invalid api key"}}, 401)
        if model == "slow":
            await asyncio.sleep(SLOW_SECONDS)
        if model == "garbage":
            return PlainTextResponse("<html>oops</html>")
        if model == "nochoice":
            return JSONResponse({"choices": []})
        return JSONResponse({
            "id": "c-1", "object": "chat.completion",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": None,
                "tool_calls": [{"id": "call_1", "type": "function",
                                "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}]}}],
            "usage": {"prompt_tokens": 17, "completion_tokens": 5, "total_tokens": 22},
        })


@pytest.fixture
def fake_openai() -> Iterator[tuple[FakeOpenAI, str]]:
    fake = FakeOpenAI()
    server = ServerThread(fake.app).start()
    try:
        yield fake, f"{server.url}/v1"
    finally:
        server.stop()


def _budget() -> Budget:
    return Budget.defaults().replace(provider_read_timeout_seconds=0.1, provider_connect_timeout_seconds=2.0)


def _request(model: str) -> LlmTurnRequest:
    return LlmTurnRequest(messages=[{"role": "user", "content": "read a.py"}], model=model,
                          tools=[{"type": "function", "function": {"name": "read_file", "parameters": {}}}],
                          params={"temperature": 0, "model": "ignored", "stream": True})


# model -> (origin, size_error, retryable, gateway status, provider status)
FAILURES = {
    "rate": ("model", False, True, 502, 429),
    "boom": ("model", False, True, 502, 500),
    "big": ("code", True, False, 413, 413),
    "ctx": ("code", True, False, 413, 400),
    "badkey": ("code", False, False, 502, 401),
    "slow": ("model", False, True, 504, None),
    "garbage": ("model", False, False, 502, None),
    "nochoice": ("model", False, False, 502, None),
}


async def test_success_returns_the_assistant_message_and_usage(fake_openai: tuple[FakeOpenAI, str]) -> None:
    fake, base = fake_openai
    provider = OpenAIProvider(_budget(), base_url=base, api_key="sk-test", model="default-model")
    try:
        answer = await provider.complete(_request("ok"))
    finally:
        await provider.aclose()
    assert answer.provider == "openai"
    assert answer.usage.prompt_tokens == 17 and answer.usage.completion_tokens == 5
    call = answer.message["tool_calls"][0]
    assert call["function"] == {"name": "read_file", "arguments": '{"path": "a.py"}'}
    sent = fake.seen[0]
    assert sent["authorization"] == "Bearer sk-test"
    # chat params pass through, but never replace what the gateway sends itself; the answer came
    # whole although a stream was asked for (a server without streaming), and is read as such
    assert sent["body"]["model"] == "ok" and sent["body"]["temperature"] == 0
    assert sent["body"]["stream"] is True and sent["body"]["stream_options"] == {"include_usage": True}
    assert sent["body"]["tools"][0]["function"]["name"] == "read_file"


@pytest.mark.parametrize("model", sorted(FAILURES))
async def test_provider_errors_map_to_origins(fake_openai: tuple[FakeOpenAI, str], model: str) -> None:
    _, base = fake_openai
    origin, size_error, retryable, gateway_status, provider_status = FAILURES[model]
    provider = OpenAIProvider(_budget(), base_url=base, api_key=None, model="x")
    try:
        with pytest.raises(ProviderFailure) as caught:
            await provider.complete(_request(model))
    finally:
        await provider.aclose()
    failure = caught.value
    assert (failure.origin, failure.size_error, failure.retryable) == (origin, size_error, retryable)
    assert failure.gateway_status == gateway_status
    assert failure.status == provider_status
    assert failure.hop == HOP_PROVIDER


async def test_connection_refused_is_a_retryable_model_failure() -> None:
    server = ServerThread(Starlette())  # bind a port, then free it: nothing listens there
    server.sock.close()
    provider = OpenAIProvider(_budget(), base_url=f"{server.url}/v1", api_key=None, model="x")
    try:
        with pytest.raises(ProviderFailure) as caught:
            await provider.complete(_request("ok"))
    finally:
        await provider.aclose()
    assert caught.value.origin == "model" and caught.value.retryable and caught.value.gateway_status == 502


async def _ignore(text: str) -> None:
    return None


@pytest.mark.parametrize("form", ["json", "ndjson"])
@pytest.mark.parametrize("model", ["ok", *sorted(FAILURES)])
async def test_origins_survive_the_http_hop(fake_openai: tuple[FakeOpenAI, str],
                                            gateway_factory: GatewayFactory, model: str, form: str) -> None:
    _, base = fake_openai
    budget = _budget()
    gw = gateway_factory(budget, OpenAIProvider(budget, base_url=base, api_key=None, model="x"))
    async with HttpModel(gw.url, "s-1", TOKEN, Budget.defaults()) as http_model:
        async def call() -> Any:
            encoded = encode_request(_request(model))
            if form == "json":
                return await http_model.complete(encoded)
            return await http_model.complete_streaming(encoded, _ignore)

        if model == "ok":
            answer = await call()
            assert answer.provider == "openai" and answer.usage.prompt_tokens == 17
            return
        with pytest.raises(TurnFailure) as caught:
            await call()
    origin, size_error, retryable, _, provider_status = FAILURES[model]
    failure = caught.value
    assert (failure.origin, failure.size_error, failure.retryable) == (origin, size_error, retryable)
    assert failure.hop == HOP_PROVIDER
    if provider_status is not None and provider_status != 413:
        assert failure.status == provider_status


def test_provider_from_env() -> None:
    budget = Budget.defaults()
    env = {"HOPLINE_PROVIDER": "openai", "OPENAI_BASE_URL": "http://127.0.0.1:9/v1", "HOPLINE_MODEL": "m"}
    provider = provider_from_env(budget, env)
    assert isinstance(provider, OpenAIProvider)
    assert provider.url == "http://127.0.0.1:9/v1/chat/completions" and provider.model == "m"
    asyncio.run(provider.aclose())
    assert provider.streaming
    with pytest.raises(ValueError, match="HOPLINE_PROVIDER"):
        provider_from_env(budget, {"HOPLINE_PROVIDER": "gpt"})
    with pytest.raises(ValueError, match="HOPLINE_PROVIDER_STREAM"):
        provider_from_env(budget, {**env, "HOPLINE_PROVIDER_STREAM": "maybe"})
