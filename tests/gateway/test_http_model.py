"""HttpModel: the harness's model over HTTP; the ceiling is checked before sending, origins are kept."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Iterator

import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from hopline.budget import HOP_ENGINE, HOP_GATEWAY, Budget, KiB, MiB
from hopline.errors import TurnFailure
from hopline.gateway.providers import ScriptedProvider
from hopline.harness.failures import classify_http_status, over_ceiling
from hopline.harness.http_model import HttpModel, failure_from_error
from hopline.harness.model import EncodedRequest, LlmTurnRequest, encode_request
from hopline.scripted.naive import NAIVE

from ._bodies import body_of_size
from ._server import ServerThread, serve
from .conftest import TOKEN, GatewayFactory


def _encoded(size: int) -> EncodedRequest:
    body = body_of_size(size)
    return EncodedRequest(LlmTurnRequest(**orjson.loads(body)), body)


async def test_a_body_over_the_engine_ceiling_is_never_sent(gateway_factory: GatewayFactory) -> None:
    gw = gateway_factory()
    budget = Budget.defaults().replace(transport_max_body_bytes=32 * KiB)
    async with HttpModel(gw.url, "s-1", TOKEN, budget) as model:
        assert (await model.complete(_encoded(32 * KiB))).provider == "counting"  # exactly the ceiling
        with pytest.raises(TurnFailure) as caught:
            await model.complete(_encoded(32 * KiB + 1))
    failure = caught.value
    assert failure.origin == "code" and failure.size_error and not failure.retryable
    assert failure.hop == HOP_ENGINE
    assert (failure.limit_bytes, failure.observed_bytes) == (32 * KiB, 32 * KiB + 1)
    assert "32769" in failure.message and "32768" in failure.message
    assert gw.stats.requests == 1  # the over-ceiling body never reached the gateway


async def test_naive_sizing_sends_it_and_the_gateway_413_is_code(gateway_factory: GatewayFactory) -> None:
    gw = gateway_factory(Budget.defaults().replace(api_json_body_limit=100 * KiB))
    async with HttpModel(gw.url, "s-1", TOKEN, Budget.defaults(), sizing=NAIVE) as model:
        with pytest.raises(TurnFailure) as caught:
            await model.complete(_encoded(100 * KiB + 1))
    failure = caught.value
    assert failure.origin == "code" and failure.size_error
    assert failure.status == 413 and failure.hop == HOP_GATEWAY
    assert (failure.limit_bytes, failure.observed_bytes) == (100 * KiB, 100 * KiB + 1)


async def test_naive_sizing_far_over_the_limit_is_code_413_or_reset(gateway_factory: GatewayFactory) -> None:
    # Far over the limit the gateway closes at once: the client sees the 413 or a reset, both `code`.
    budget = Budget.defaults().replace(api_json_body_limit=100 * KiB, transport_max_body_bytes=100 * KiB)
    gw = gateway_factory(budget)  # discards refused bodies up to 200 KiB, closes on larger ones
    async with HttpModel(gw.url, "s-1", TOKEN, budget, sizing=NAIVE) as model:
        for _ in range(3):
            with pytest.raises(TurnFailure) as caught:
                await model.complete(_encoded(4 * MiB))
            assert caught.value.origin == "code" and caught.value.size_error
    assert gw.provider.requests == []


async def test_a_wrong_token_is_a_code_failure(gateway_factory: GatewayFactory) -> None:
    gw = gateway_factory()
    async with HttpModel(gw.url, "s-1", "not-the-token", Budget.defaults()) as model:
        with pytest.raises(TurnFailure) as caught:
            await model.complete(_encoded(1 * KiB))
    assert caught.value.origin == "code" and caught.value.status == 401 and not caught.value.retryable


async def test_the_scripted_provider_answers_over_http(gateway_factory: GatewayFactory) -> None:
    gw = gateway_factory(provider=ScriptedProvider())
    request = LlmTurnRequest(messages=[{"role": "system", "content": "you are qa"},
                                       {"role": "user", "content": "check the repo"}],
                             tools=[{"type": "function",
                                     "function": {"name": "list_files", "parameters": {}}}])
    async with HttpModel(gw.url, "session with spaces", TOKEN, Budget.defaults()) as model:
        answer = await model.complete(encode_request(request))
    assert answer.provider == "scripted"
    assert answer.message["role"] == "assistant"
    assert answer.message["tool_calls"][0]["function"]["name"] == "list_files"


async def _slow(request: Request) -> Response:
    await request.body()
    await asyncio.sleep(1.0)
    return PlainTextResponse("late")


async def _status(request: Request) -> Response:
    await request.body()
    code = int(request.path_params["code"])
    return PlainTextResponse("upstream says no", status_code=code)


async def _sized_answer(request: Request) -> Response:
    await request.body()
    size = int(request.path_params["size"])
    # A valid llm-turn answer padded to exactly ``size`` bytes.
    empty = orjson.dumps({"message": {"role": "assistant", "content": ""}, "provider": "p"})
    content = "x" * (size - len(empty))
    body = orjson.dumps({"message": {"role": "assistant", "content": content}, "provider": "p"})
    assert len(body) == size
    return Response(body, media_type="application/json")


@pytest.fixture
def plain_server() -> Iterator[ServerThread]:
    """A server that is not our gateway: plain-text errors and a slow route."""
    app = Starlette(routes=[Route("/{code:int}/internal/sessions/{sid}/llm-turn", _status, methods=["POST"]),
                            Route("/slow/internal/sessions/{sid}/llm-turn", _slow, methods=["POST"]),
                            Route("/answer/{size:int}/internal/sessions/{sid}/llm-turn", _sized_answer,
                                  methods=["POST"])])
    with serve(app) as server:
        yield server


@pytest.mark.parametrize(("code", "origin", "retryable", "size_error"), [
    (429, "model", True, False), (500, "model", True, False), (503, "model", True, False),
    (413, "code", False, True), (404, "code", False, False),
])
async def test_answers_without_our_json_are_classified_by_status(
        plain_server: ServerThread, code: int, origin: str, retryable: bool, size_error: bool) -> None:
    async with HttpModel(f"{plain_server.url}/{code}", "s", TOKEN, Budget.defaults()) as model:
        with pytest.raises(TurnFailure) as caught:
            await model.complete(_encoded(2 * KiB))
    failure = caught.value
    assert (failure.origin, failure.retryable, failure.size_error, failure.status) == (
        origin, retryable, size_error, code)


async def test_a_timeout_is_a_retryable_model_failure(plain_server: ServerThread) -> None:
    budget = Budget.defaults().replace(provider_read_timeout_seconds=0.1,
                                       provider_connect_timeout_seconds=0.1)
    async with HttpModel(f"{plain_server.url}/slow", "s", TOKEN, budget) as model:
        with pytest.raises(TurnFailure) as caught:
            await model.complete(_encoded(2 * KiB))
    assert caught.value.origin == "model" and caught.value.retryable


async def test_the_gateways_answer_is_read_up_to_the_response_ceiling(plain_server: ServerThread) -> None:
    limit = 64 * KiB
    budget = Budget.defaults().replace(provider_response_max_bytes=limit)
    async with HttpModel(f"{plain_server.url}/answer/{limit}", "s", TOKEN, budget) as model:
        answer = await model.complete(_encoded(2 * KiB))
    assert len(answer.message["content"]) > limit - 100
    async with HttpModel(f"{plain_server.url}/answer/{limit + 1}", "s", TOKEN, budget) as model:
        with pytest.raises(TurnFailure) as caught:
            await model.complete(_encoded(2 * KiB))
    assert caught.value.origin == "model" and caught.value.limit_bytes == limit
    assert caught.value.observed_bytes is not None and caught.value.observed_bytes > limit


# Far below the 4 MiB bodies the reset tests upload (the kernel doubles it for bookkeeping).
SMALL_SOCKET_BUFFER = 16 * KiB


@contextlib.contextmanager
def resetting_server() -> Iterator[str]:
    """Reads the request head and a little body, then resets the connection (RST), as a proxy
    refusing a large upload does."""
    listener = socket.socket()
    # A clamped receive buffer (inherited by the accepted socket) keeps the kernel from taking the
    # whole upload before the reset; with autotuning it could hold megabytes (tcp_rmem).
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL_SOCKET_BUFFER)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(10)

    def run() -> None:
        with contextlib.suppress(OSError):
            conn, _ = listener.accept()
            conn.settimeout(10)
            conn.recv(4096)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()
        thread.join(10)


async def test_a_reset_while_uploading_is_a_code_size_error() -> None:
    # Both ends' socket buffers are small, so the reset surely lands while the body is still being
    # handed over: with default buffers the kernels could take all 4 MiB first, and the reset would
    # then be one after a whole upload (a retryable connection failure, which CI once saw).
    transport = httpx.AsyncHTTPTransport(
        socket_options=[(socket.SOL_SOCKET, socket.SO_SNDBUF, SMALL_SOCKET_BUFFER)])
    with resetting_server() as url:
        async with httpx.AsyncClient(transport=transport, timeout=10) as client, \
                HttpModel(url, "s", TOKEN, Budget.defaults(), client=client) as model:
            with pytest.raises(TurnFailure) as caught:
                await model.complete(_encoded(4 * MiB))
    failure = caught.value
    assert failure.origin == "code" and failure.size_error and not failure.retryable
    assert failure.observed_bytes == 4 * MiB


async def test_nothing_listening_is_a_retryable_model_failure() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    async with HttpModel(f"http://127.0.0.1:{port}", "s", TOKEN, Budget.defaults()) as model:
        with pytest.raises(TurnFailure) as caught:
            await model.complete(_encoded(1 * KiB))
    assert caught.value.origin == "model" and caught.value.retryable


@pytest.mark.parametrize("failure", [
    over_ceiling(9 * 1024 * 1024, 8 * 1024 * 1024),
    classify_http_status(400, "maximum context length is 128000 tokens", body_bytes=600_000),
    classify_http_status(429, "slow down", body_bytes=1200),
    TurnFailure("model", "malformed model output: no message"),
], ids=["over-ceiling", "context-length", "rate-limited", "malformed"])
def test_a_failure_read_back_from_its_json_inside_a_stream_keeps_its_reaction(failure: TurnFailure) -> None:
    """The gateway's error line (answered 200, so no status says 413): the type alone says a size
    error, and the byte limit travels in the one limit shape."""
    error = orjson.loads(orjson.dumps(failure.to_json()))["error"]
    shape = {"type", "origin", "message", "status", "hop", "setting", "limit", "observed", "unit",
             "retryable"}
    assert set(error) <= shape  # the one limit shape's keys: no other spelling of a size
    back = failure_from_error(error, None, None)
    assert (back.origin, back.size_error, back.retryable) == (failure.origin, failure.size_error,
                                                              failure.retryable)
    assert (back.limit_bytes, back.observed_bytes) == (failure.limit_bytes, failure.observed_bytes)
    assert back.hop == (failure.hop or HOP_GATEWAY)  # a failure that names no hop is the gateway's
    if failure.observed_bytes is not None:
        assert error["unit"] == "bytes"
