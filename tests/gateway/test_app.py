"""G-1, G-3: the llm-turn route, its token and its error shapes; mounting inside another app."""

from __future__ import annotations

import httpx
import orjson
import pytest
from fastapi import FastAPI

from hopline.budget import HOP_GATEWAY, Budget, KiB
from hopline.gateway.app import create_gateway_app
from hopline.http.body_limit import BodyLimitStats

from ._bodies import body_of_size
from ._server import serve
from .conftest import TOKEN, CountingProvider, GatewayFactory

JSON = {"content-type": "application/json"}


def _turn(messages: list[dict[str, object]], **extra: object) -> bytes:
    return orjson.dumps({"messages": messages, **extra})


def test_a_turn_returns_the_assistant_message_usage_and_provider(gateway_factory: GatewayFactory) -> None:
    gw = gateway_factory()
    body = _turn([{"role": "user", "content": "hello"}], params={"temperature": 0}, purpose="summary",
                 tools=[{"type": "function", "function": {"name": "read_file", "parameters": {}}}])
    r = httpx.post(gw.turn_url, content=body, headers={**gw.auth, **JSON})
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer == {"message": {"role": "assistant", "content": "1 messages, 5"},
                      "usage": {"prompt_tokens": 1, "completion_tokens": 3}, "provider": "counting"}
    received = gw.provider.requests[0]
    assert received.purpose == "summary" and received.params == {"temperature": 0}
    assert received.tools[0]["function"]["name"] == "read_file"


@pytest.mark.parametrize("authorization", [None, "Bearer wrong-token", "Basic " + TOKEN, "Bearer"])
def test_401_without_the_right_token_and_the_body_is_not_read(gateway_factory: GatewayFactory,
                                                              authorization: str | None) -> None:
    gw = gateway_factory()
    headers = dict(JSON)
    if authorization is not None:
        headers["authorization"] = authorization
    r = httpx.post(gw.turn_url, content=body_of_size(4 * KiB), headers=headers)
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == "Bearer"
    error = r.json()["error"]
    assert error["type"] == "unauthorized" and error["hop"] == HOP_GATEWAY
    assert TOKEN not in r.text
    assert gw.stats.requests == 0  # refused before the body limit (and any body byte) was reached
    assert gw.provider.requests == []
    assert httpx.get(f"{gw.url}/metrics").status_code == 401
    assert httpx.get(f"{gw.url}/health").json()["status"] == "ok"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b'{"messages": [', "(body)"),
        (_turn([]), "messages"),
        (_turn([{"role": "robot", "content": "x"}]), "messages.0.role"),
        (_turn([{"role": "user", "content": "x"}, {"role": "tool", "content": "out"}]), "messages.1"),
        (_turn([{"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]}]),
         "messages.0.tool_calls.0.function.arguments"),
        (_turn([{"role": "user", "content": "x"}], purpose="chat"), "purpose"),
        (_turn([{"role": "user", "content": "x"}], maxBodyBytes=1), "maxBodyBytes"),
        (b"[1, 2]", "(body)"),
    ],
)
def test_400_names_the_field(gateway_factory: GatewayFactory, body: bytes, field: str) -> None:
    gw = gateway_factory()
    r = httpx.post(gw.turn_url, content=body, headers={**gw.auth, **JSON})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["hop"] == HOP_GATEWAY
    assert error["field"] == field
    assert error["type"] in ("invalid_json", "invalid_request")
    assert gw.provider.requests == []


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_415_for_a_body_that_is_not_json(gateway_factory: GatewayFactory, content_type: str | None) -> None:
    gw = gateway_factory()
    headers = dict(gw.auth)
    if content_type:
        headers["content-type"] = content_type
    r = httpx.post(gw.turn_url, content=_turn([{"role": "user", "content": "x"}]), headers=headers)
    assert r.status_code == 415
    assert r.json()["error"]["type"] == "unsupported_media_type"
    ok = httpx.post(gw.turn_url, content=_turn([{"role": "user", "content": "x"}]),
                    headers={**gw.auth, "content-type": "application/json; charset=utf-8"})
    assert ok.status_code == 200


def test_mounted_under_internal_keeps_the_path_the_token_and_the_limit() -> None:
    limit = 16 * KiB
    stats = BodyLimitStats()
    gateway = create_gateway_app(Budget.defaults().replace(api_json_body_limit=limit), token=TOKEN,
                                 provider=CountingProvider(), route_prefix="", body_stats=stats)
    daemon = FastAPI()

    @daemon.get("/api/ping")
    async def ping() -> dict[str, str]:
        return {"pong": "yes"}

    daemon.mount("/internal", gateway)
    with serve(daemon) as server, httpx.Client(base_url=server.url) as client:
        url = "/internal/sessions/s-9/llm-turn"
        auth = {"authorization": f"Bearer {TOKEN}", **JSON}
        assert client.post(url, content=body_of_size(limit), headers=auth).status_code == 200
        over = client.post(url, content=body_of_size(limit + 1), headers=auth)
        assert over.status_code == 413 and over.json()["error"]["limit"] == limit
        assert client.post(url, content=body_of_size(limit), headers=JSON).status_code == 401
        assert client.get("/internal/health").json()["status"] == "ok"
        # The daemon's own routes are outside the gateway's token and limit.
        assert client.get("/api/ping").json() == {"pong": "yes"}


def test_openapi_describes_the_llm_turn_body() -> None:
    app = create_gateway_app(Budget.defaults(), token=TOKEN, provider=CountingProvider())
    spec = app.openapi()
    operation = spec["paths"]["/internal/sessions/{sessionId}/llm-turn"]["post"]
    schema = operation["requestBody"]["content"]["application/json"]["schema"]
    assert schema["required"] == ["messages"]
    assert "purpose" in schema["properties"]
    message_ref = schema["properties"]["messages"]["items"]["$ref"]
    assert message_ref.split("/")[-1] in spec["components"]["schemas"]
