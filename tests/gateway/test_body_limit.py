"""G-2: the gateway's JSON body limit, enforced while reading, exact at the boundary."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import orjson
import psutil
import pytest

from hopline.budget import HOP_GATEWAY, Budget, KiB, MiB

from ._bodies import body_of_size, chunks
from .conftest import GatewayFactory

SMALL_LIMIT = 64 * KiB


def _post(gw, body, *, chunked: bool = False) -> httpx.Response:  # type: ignore[no-untyped-def]
    headers = {**gw.auth, "content-type": "application/json"}
    content = chunks(body) if chunked else body
    with httpx.Client(timeout=30) as client:
        return client.post(gw.turn_url, content=content, headers=headers)


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_exactly_the_limit_passes_and_one_byte_more_is_413(gateway_factory: GatewayFactory,
                                                           chunked: bool) -> None:
    gw = gateway_factory(Budget.defaults().replace(api_json_body_limit=SMALL_LIMIT))

    at_limit = _post(gw, body_of_size(SMALL_LIMIT), chunked=chunked)
    assert at_limit.status_code == 200, at_limit.text
    assert at_limit.json()["provider"] == "counting"
    assert gw.stats.last_consumed_bytes == SMALL_LIMIT

    over = _post(gw, body_of_size(SMALL_LIMIT + 1), chunked=chunked)
    assert over.status_code == 413
    error = over.json()["error"]
    assert error["type"] == "request_entity_too_large"
    assert error["hop"] == HOP_GATEWAY
    assert error["limit"] == SMALL_LIMIT
    assert error["origin"] == "code"
    if chunked:
        # Cut while reading: it read past the limit, by at most one received message.
        assert SMALL_LIMIT < error["receivedBytes"] <= SMALL_LIMIT + gw.stats.max_message_bytes
    else:
        # Refused on Content-Length alone: not one body byte was read.
        assert error["observed"] == SMALL_LIMIT + 1
        assert gw.stats.last_consumed_bytes == 0
    assert len(gw.provider.requests) == 1  # only the at-limit body reached the provider


def test_default_ten_mebibyte_limit_is_exact(gateway_factory: GatewayFactory) -> None:
    budget = Budget.defaults()
    assert budget.api_json_body_limit == 10 * MiB
    gw = gateway_factory(budget)
    assert _post(gw, body_of_size(10 * MiB)).status_code == 200
    over = _post(gw, body_of_size(10 * MiB + 1))
    assert over.status_code == 413
    assert over.json()["error"]["limit"] == 10 * MiB
    assert over.json()["error"]["observed"] == 10 * MiB + 1


def test_a_one_gibibyte_chunked_upload_is_cut_off_unbuffered(gateway_factory: GatewayFactory) -> None:
    limit = 8 * MiB
    gw = gateway_factory(Budget.defaults().replace(api_json_body_limit=limit))
    upload_size = 1024 * MiB
    piece = b"x" * (64 * KiB)  # one buffer, yielded again and again: the upload is never materialized
    yielded = 0

    def upload() -> Iterator[bytes]:
        nonlocal yielded
        yield b'{"messages":[{"role":"user","content":"'
        while yielded < upload_size:
            yielded += len(piece)
            yield piece

    # Warm up the same path once so that the allocator's first growth is not counted.
    _post(gw, body_of_size(limit + 1), chunked=True)

    process = psutil.Process()
    baseline = process.memory_info().rss
    peak = baseline
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.005):
            peak = max(peak, process.memory_info().rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    status: int | None = None
    try:
        with httpx.Client(timeout=30) as client:
            response = client.post(gw.turn_url, content=upload(),
                                   headers={**gw.auth, "content-type": "application/json"})
            status = response.status_code
            assert response.json()["error"]["limit"] == limit
    except (httpx.WriteError, httpx.RemoteProtocolError, httpx.ReadError):
        status = None  # the server closed the connection on us mid-upload: also a refusal
    finally:
        done.set()
        sampler.join(5)
    peak = max(peak, process.memory_info().rss)

    assert status in (413, None)
    assert gw.stats.refused == 2
    # The server read at most the limit plus one received message, and the client could not push
    # more than what the kernel buffers hold before the server closed the connection.
    assert limit < gw.stats.last_consumed_bytes <= limit + gw.stats.max_message_bytes
    assert gw.stats.max_message_bytes <= 1 * MiB
    assert yielded < 64 * MiB
    assert peak - baseline < 2 * limit, f"RSS grew by {peak - baseline} bytes"
    assert gw.provider.requests == []
    # The gateway is still serving.
    assert _post(gw, body_of_size(1024)).status_code == 200


def test_refused_bodies_are_counted_in_metrics(gateway_factory: GatewayFactory) -> None:
    gw = gateway_factory(Budget.defaults().replace(api_json_body_limit=SMALL_LIMIT))
    _post(gw, body_of_size(SMALL_LIMIT))
    _post(gw, body_of_size(SMALL_LIMIT + 1))
    with httpx.Client(timeout=10) as client:
        text = client.get(f"{gw.url}/metrics", headers=gw.auth).text
    assert 'hopline_gateway_requests_total{status="200"} 1.0' in text
    assert 'hopline_gateway_requests_total{status="413"} 1.0' in text
    assert f"hopline_gateway_body_limit_bytes {float(SMALL_LIMIT)}" in text
    # The at-limit body landed in the bucket whose edge is the limit itself.
    assert f'hopline_gateway_request_body_bytes_bucket{{le="{float(SMALL_LIMIT)}"}} 2.0' in text
    assert orjson.loads(client_get_health(gw))["bodyLimitBytes"] == SMALL_LIMIT


def client_get_health(gw) -> bytes:  # type: ignore[no-untyped-def]
    with httpx.Client(timeout=10) as client:
        return client.get(f"{gw.url}/health").content  # no token: /health is open


def test_a_declared_one_gibibyte_body_is_refused_unread(gateway_factory: GatewayFactory) -> None:
    limit = 64 * KiB
    gw = gateway_factory(Budget.defaults().replace(api_json_body_limit=limit))
    declared = 1024 * MiB
    piece = b"x" * (64 * KiB)
    yielded = 0

    def upload() -> Iterator[bytes]:
        nonlocal yielded
        while yielded < declared:
            yielded += len(piece)
            yield piece

    headers = {**gw.auth, "content-type": "application/json", "content-length": str(declared)}
    try:
        with httpx.Client(timeout=30) as client:
            response = client.post(gw.turn_url, content=upload(), headers=headers)
        assert response.status_code == 413
        assert response.json()["error"]["observed"] == declared
    except (httpx.WriteError, httpx.RemoteProtocolError, httpx.ReadError):
        pass  # closed at once: the body is far over what the server discards
    assert gw.stats.refused == 1
    assert gw.stats.max_consumed_bytes == 0  # the app read nothing
    assert yielded < 64 * MiB
    assert gw.provider.requests == []
