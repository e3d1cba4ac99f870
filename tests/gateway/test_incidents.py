"""The last resort (SPEC T-5): an exception no route handles reaches the client as hopline's JSON
error with an ``incidentId``; the log line with that id names the raising function and line, and
never the exception's message unless the exception is hopline's own (a canary proves it)."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from starlette.types import Receive, Scope, Send

from hopline.budget import Budget, HoplineError
from hopline.gateway.app import create_gateway_app
from hopline.harness.model import LlmTurnRequest, LlmTurnResponse
from hopline.http.incidents import LastResort
from hopline.logs import JsonLineFormatter

from ._server import serve
from .conftest import TOKEN

CANARY = "canary-payload-7f3a9c"
TURN = {"messages": [{"role": "user", "content": "hi"}]}


class OwnError(HoplineError):
    pass


class RaisingProvider:
    name = "raising"

    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    async def complete(self, request: LlmTurnRequest) -> LlmTurnResponse:
        raise self.exc

    async def aclose(self) -> None:
        return None


@pytest.fixture
def incident_log() -> Iterator[io.StringIO]:
    """What the ``hopline.incident`` logger writes, through the JSON formatter every process uses."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonLineFormatter())
    logger = logging.getLogger("hopline.incident")
    logger.addHandler(handler)
    try:
        yield stream
    finally:
        logger.removeHandler(handler)


def entry_for(log: io.StringIO, incident_id: str) -> dict[str, Any]:
    entries = [orjson.loads(line) for line in log.getvalue().splitlines() if line]
    matching = [e for e in entries if e.get("incidentId") == incident_id]
    assert len(matching) == 1, entries
    return matching[0]


def test_a_route_that_raises_answers_the_json_shape_and_logs_its_frames(incident_log: io.StringIO) -> None:
    app = create_gateway_app(Budget.defaults(), token=TOKEN, provider=RaisingProvider(RuntimeError(CANARY)))
    with serve(app) as server:
        response = httpx.post(f"{server.url}/internal/sessions/s-1/llm-turn", json=TURN,
                              headers={"authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 500
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert (error["type"], error["hop"]) == ("internal_error", "gateway.llm_turn")
    assert CANARY not in response.text
    entry = entry_for(incident_log, error["incidentId"])
    assert entry["exception"] == "RuntimeError"
    assert "exceptionMessage" not in entry and CANARY not in incident_log.getvalue()
    innermost = entry["frames"][-1]
    assert innermost["module"] == __name__
    assert innermost["function"] == "RaisingProvider.complete"
    assert innermost["line"] == RaisingProvider.complete.__code__.co_firstlineno + 1


def test_hoplines_own_exception_message_is_logged(incident_log: io.StringIO) -> None:
    provider = RaisingProvider(OwnError("the own message"))
    app = create_gateway_app(Budget.defaults(), token=TOKEN, provider=provider)
    with serve(app) as server:
        response = httpx.post(f"{server.url}/internal/sessions/s-1/llm-turn", json=TURN,
                              headers={"authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 500
    entry = entry_for(incident_log, response.json()["error"]["incidentId"])
    assert (entry["exception"], entry["exceptionMessage"]) == ("OwnError", "the own message")


async def raising_app(scope: Scope, receive: Receive, send: Send) -> None:
    raise RuntimeError(CANARY)


async def raising_after_start(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"partial", "more_body": True})
    raise RuntimeError(CANARY)


def test_an_exception_outside_fastapi_is_answered_once(incident_log: io.StringIO) -> None:
    with serve(LastResort(raising_app, "daemon.api"), lifespan="off") as server:
        response = httpx.get(f"{server.url}/anything")
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["hop"] == "daemon.api"
    entry = entry_for(incident_log, error["incidentId"])
    assert entry["frames"][-1]["function"] == "raising_app"


def test_an_exception_after_the_response_started_is_logged_and_the_stream_ends(
        incident_log: io.StringIO) -> None:
    with serve(LastResort(raising_after_start, "daemon.api"), lifespan="off") as server, \
            pytest.raises(httpx.RemoteProtocolError):
        httpx.get(f"{server.url}/stream")  # the body never completes: the client sees a cut stream
    entries = [orjson.loads(line) for line in incident_log.getvalue().splitlines()]
    assert [e["frames"][-1]["function"] for e in entries] == ["raising_after_start"]
