"""The gateway against a hostile client (SPEC B-5, D-10, D-11): bounded hints and nesting, one error
shape, a stalled body, the 413 of a chunked upload sent whole, and per-session tokens."""

from __future__ import annotations

import socket
from typing import Any

import httpx
import orjson
import pytest

from hopline.budget import HOP_GATEWAY, Budget, KiB
from hopline.gateway.app import create_gateway_app
from hopline.gateway.providers import ScriptedProvider
from hopline.http.auth import SessionTokens

from ._server import serve
from .conftest import TOKEN, CountingProvider, Gateway, GatewayFactory

DEPTH_LIMIT = 64


def post(gw: Gateway, body: Any, **headers: str) -> httpx.Response:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    headers = {**gw.auth, "content-type": "application/json", **headers}
    return httpx.post(gw.turn_url, content=raw, headers=headers, timeout=30)


def hopline_error(response: httpx.Response, status: int, kind: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}, body
    assert body["error"]["type"] == kind and body["error"]["hop"] == HOP_GATEWAY, body
    error: dict[str, Any] = body["error"]
    return error


def turn(**params: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "go"}],
            "tools": [{"type": "function", "function": {"name": "read_file", "parameters": {}}}],
            "params": params}


def test_a_scripted_hint_past_its_ceiling_is_refused_before_any_work(gateway_factory: GatewayFactory) -> None:
    gw = gateway_factory(provider=ScriptedProvider())
    at_bound = post(gw, turn(scripted={"toolsPerIteration": 64}))
    assert at_bound.status_code == 200, at_bound.text
    assert len(at_bound.json()["message"]["tool_calls"]) == 64
    # the probe: 112 bytes that grew the gateway to 5.7 GB
    for value in (65, 1_000_000_000):
        error = hopline_error(post(gw, turn(scripted={"toolsPerIteration": value})), 400, "invalid_hint")
        assert error["field"] == "params.scripted.toolsPerIteration"
        assert error["limit"] == 64 and error["observed"] == value
        assert error["setting"] == "HOPLINE_SCRIPTED_MAX_TOOLS_PER_ITERATION"
    write = hopline_error(post(gw, turn(scripted={"writeBytes": 256 * KiB + 1})), 400, "invalid_hint")
    assert write["limit"] == 256 * KiB
    unknown = hopline_error(post(gw, turn(scripted={"toolsPerIteraton": 3})), 400, "invalid_hint")
    assert unknown["field"] == "params.scripted.toolsPerIteraton"
    summary = {**turn(maxBytes=16 * KiB + 1), "purpose": "summary"}
    assert hopline_error(post(gw, summary), 400, "invalid_hint")["limit"] == 16 * KiB
    assert post(gw, {**turn(maxBytes=16 * KiB), "purpose": "summary"}).status_code == 200
    assert httpx.get(f"{gw.url}/health", timeout=10).status_code == 200


def test_a_raised_ceiling_raises_the_bound(gateway_factory: GatewayFactory) -> None:
    gw = gateway_factory(Budget.defaults().replace(scripted_max_tools_per_iteration=100),
                         provider=ScriptedProvider())
    assert post(gw, turn(scripted={"toolsPerIteration": 100})).status_code == 200
    over = post(gw, turn(scripted={"toolsPerIteration": 101}))
    assert hopline_error(over, 400, "invalid_hint")["limit"] == 100


def nested_content(depth: int) -> dict[str, Any]:
    """A body ``depth`` levels deep: body > messages > message > content > part > meta > ..."""
    inner: Any = "x"
    for _ in range(depth - 5):
        inner = [inner]
    return {"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "meta": inner}]}]}


def test_nesting_at_the_ceiling_passes_and_one_level_more_is_a_400(gateway_factory: GatewayFactory) -> None:
    gw = gateway_factory()
    assert post(gw, nested_content(DEPTH_LIMIT)).status_code == 200
    error = hopline_error(post(gw, nested_content(DEPTH_LIMIT + 1)), 400, "json_too_deep")
    assert error["limit"] == DEPTH_LIMIT and error["observed"] == DEPTH_LIMIT + 1
    assert hopline_error(post(gw, b"[" * 5000 + b"]" * 5000), 400, "json_too_deep")["observed"] == 1025
    assert len(gw.provider.requests) == 1


def test_the_frameworks_own_errors_have_hoplines_shape(gateway_factory: GatewayFactory) -> None:
    gw = gateway_factory()
    nowhere = httpx.get(f"{gw.url}/internal/nowhere", headers=gw.auth, timeout=10)
    hopline_error(nowhere, 404, "not_found")
    wrong_method = httpx.get(gw.turn_url, headers=gw.auth, timeout=10)
    hopline_error(wrong_method, 405, "method_not_allowed")
    hopline_error(post(gw, b'{"messages": "\\ud800"}'), 400, "invalid_json")


def raw_exchange(gw: Gateway, head: str, parts: list[bytes]) -> bytes:
    with socket.create_connection(("127.0.0.1", gw.server.port), timeout=30) as sock:
        sock.sendall(head.encode())
        for part in parts:
            sock.sendall(part)
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
        return raw


def test_a_stalled_body_gets_a_408_and_its_connection_closed(gateway_factory: GatewayFactory) -> None:
    gw = gateway_factory(Budget.defaults().replace(body_read_timeout_seconds=0.5))
    head = (f"POST /internal/sessions/s-1/llm-turn HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {TOKEN}\r\n"
            "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
    raw = raw_exchange(gw, head, [b'{"messages'])
    status, _, body = raw.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 408") and b"connection: close" in status.lower()
    error = orjson.loads(body)["error"]
    assert error["type"] == "request_timeout" and error["hop"] == HOP_GATEWAY
    assert error["receivedBytes"] == 10 and error["declaredBytes"] == 1000 and error["timeoutSeconds"] == 0.5


def test_an_over_limit_chunked_upload_sent_whole_still_reads_the_413(gateway_factory: GatewayFactory) -> None:
    # The drain reads up to twice the limit less the largest message; asyncio reads up to 256 KiB at
    # once under load, so the limit is well above that and the overshoot small: the whole body is
    # always drained, and the server never closes while the client still sends (a reset, not a 413).
    limit = 1024 * KiB
    gw = gateway_factory(Budget.defaults().replace(api_json_body_limit=limit))
    body = b'{"messages": [{"role": "user", "content": "' + b"a" * (limit + limit // 8) + b'"}]}'
    size = 16 * KiB
    parts = [b"%x\r\n%s\r\n" % (len(body[i:i + size]), body[i:i + size]) for i in range(0, len(body), size)]
    head = (f"POST /internal/sessions/s-1/llm-turn HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {TOKEN}\r\n"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    raw = raw_exchange(gw, head, [*parts, b"0\r\n\r\n"])
    status, _, payload = raw.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 413")
    error = orjson.loads(payload)["error"]
    assert error["hop"] == HOP_GATEWAY and error["limit"] == limit and error["receivedBytes"] > limit
    # cut at the first received message past the limit; the rest was drained, never handed to the app
    assert error["receivedBytes"] <= limit + gw.stats.max_message_bytes


def test_a_body_that_ends_in_the_message_passing_the_limit_is_answered_at_once(
        gateway_factory: GatewayFactory) -> None:
    # one send: uvicorn hands the whole body over in one message that also ends it; nothing is left
    # to drain, and waiting for more would hold the 413 until the body-read deadline
    limit = 16 * KiB
    gw = gateway_factory(Budget.defaults().replace(api_json_body_limit=limit, body_read_timeout_seconds=3600))
    body = b'{"messages": [{"role": "user", "content": "' + b"a" * limit + b'"}]}'
    head = (f"POST /internal/sessions/s-1/llm-turn HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n")
    raw = raw_exchange(gw, "", [head.encode() + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)])
    status, _, payload = raw.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 413")
    assert orjson.loads(payload)["error"]["receivedBytes"] == len(body)


def test_a_session_token_opens_its_own_sessions_llm_turn_and_nothing_else() -> None:
    tokens = SessionTokens()
    provider = CountingProvider()
    app = create_gateway_app(Budget.defaults(), token=TOKEN, provider=provider, session_tokens=tokens)
    with serve(app) as server:
        def call(path: str, token: str, method: str = "POST") -> httpx.Response:
            return httpx.request(method, f"{server.url}{path}", json=turn(), timeout=10,
                                 headers={"authorization": f"Bearer {token}"})

        token = tokens.mint("daemon-a")
        # minted but not bound yet (the agent has not named its session): it opens nothing
        assert call("/internal/sessions/agent-a/llm-turn", token).status_code == 403
        tokens.bind("daemon-a", "agent-a")
        assert call("/internal/sessions/agent-a/llm-turn", token).status_code == 200
        for path, method in (("/internal/sessions/agent-b/llm-turn", "POST"),
                             ("/internal/sessions/agent-a/llm-turn/x", "POST"), ("/internal/metrics", "GET")):
            refused = call(path, token, method)
            assert refused.status_code == 403 and refused.json()["error"]["type"] == "forbidden", path
        other = tokens.mint("daemon-b", "agent-b")
        assert call("/internal/sessions/agent-b/llm-turn", other).status_code == 200
        assert call("/internal/sessions/agent-b/llm-turn", token).status_code == 403
        # minting again for the same owner revokes the old token; revoke ends the new one
        renewed = tokens.mint("daemon-a", "agent-a")
        assert call("/internal/sessions/agent-a/llm-turn", token).status_code == 401
        assert call("/internal/sessions/agent-a/llm-turn", renewed).status_code == 200
        tokens.revoke("daemon-a")
        assert call("/internal/sessions/agent-a/llm-turn", renewed).status_code == 401
        assert tokens.active == 1
        # the gateway's own token still opens every session
        assert call("/internal/sessions/agent-a/llm-turn", TOKEN).status_code == 200
    assert len(provider.requests) == 4


@pytest.mark.parametrize("path", ["/internal/sessions/a/llm-turn", "/internal/sessions//llm-turn",
                                  "/internal/sessions/a/b/llm-turn"])
def test_llm_turn_session_of_path(path: str) -> None:
    from hopline.gateway.app import llm_turn_session

    expected = {"/internal/sessions/a/llm-turn": "a"}.get(path)
    assert llm_turn_session("/internal")(path) == expected
