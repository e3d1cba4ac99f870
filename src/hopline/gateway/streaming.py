"""The streaming form of llm-turn (SPEC G-5): an NDJSON answer of deltas, then the whole message.

A request with ``Accept: application/x-ndjson`` is answered, once the provider has produced its
first item, with ``200`` and one JSON object per line:

* ``{"type": "delta", "text": "..."}`` for each piece of the assistant's text, as it arrives;
* ``{"type": "message", "message": {...}, "usage": {...}, "provider": "..."}`` last, the answer
  the JSON form would have given (its content is the concatenated deltas);
* or ``{"type": "error", "error": {...}}`` last, the JSON form's error object, when the provider
  fails after the stream began (a stream cut in the middle: origin ``model``, with the bytes
  received).

A failure before the first item keeps the JSON form's status and body (413 stays 413). When the
client goes away — while the provider thinks or while it streams — the provider's stream is closed,
so the upstream connection is closed too.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator

import anyio
import orjson
from fastapi.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from hopline.errors import TurnFailure
from hopline.gateway.providers import Provider, StreamingProvider, StreamItem, TextDelta, gateway_status
from hopline.harness.model import LlmTurnRequest, LlmTurnResponse
from hopline.vocabulary import LINE_DELTA, LINE_ERROR, LINE_MESSAGE, NDJSON_MEDIA_TYPE
from hopline.wire.ndjson import encode

log = logging.getLogger("hopline.gateway")



def _no_answer() -> TurnFailure:
    return TurnFailure("model", "the provider's stream ended without an answer")


def accepts_ndjson(accept: str | None) -> bool:
    """True when the client asked for the streaming form."""
    if not accept:
        return False
    return any(part.split(";", 1)[0].strip().lower() == NDJSON_MEDIA_TYPE for part in accept.split(","))


def turn_failure_response(failure: TurnFailure) -> Response:
    """The JSON form's error answer (status from the provider's failure), logged by sizes only."""
    status = gateway_status(failure)
    log.warning("llm-turn failed", extra={"origin": failure.origin, "status": status,
                                          "providerStatus": failure.status})
    return Response(orjson.dumps(failure.to_json()), status_code=status, media_type="application/json")


async def _items(provider: Provider, turn: LlmTurnRequest) -> AsyncGenerator[StreamItem, None]:
    if isinstance(provider, StreamingProvider):
        stream = provider.stream(turn)
        try:
            async for item in stream:
                yield item
        finally:
            await stream.aclose()
    else:  # a provider without streaming: the whole answer is the only item
        yield await provider.complete(turn)


def _line(item: StreamItem) -> bytes:
    if isinstance(item, TextDelta):
        return encode({"type": LINE_DELTA, "text": item.text})
    return encode({"type": LINE_MESSAGE, **item.to_json()})


async def _lines(first: StreamItem, items: AsyncGenerator[StreamItem, None]) -> AsyncGenerator[bytes, None]:
    try:
        yield _line(first)
        if isinstance(first, LlmTurnResponse):
            return
        async for item in items:
            yield _line(item)
            if isinstance(item, LlmTurnResponse):
                return
        yield encode({"type": LINE_ERROR, **_no_answer().to_json()})
    except TurnFailure as failure:
        log.warning("llm-turn stream failed", extra={
            "origin": failure.origin, "status": gateway_status(failure), "providerStatus": failure.status,
            "observed": failure.observed_bytes})
        yield encode({"type": LINE_ERROR, **failure.to_json()})
    finally:
        await items.aclose()


class NdjsonTurnAnswer(Response):
    """The streaming form's whole answer as one ASGI response. It listens for the client's
    disconnect from the start, while waiting for the provider's first item too, and then closes the
    provider's stream (so its upstream connection) at once."""

    media_type = NDJSON_MEDIA_TYPE

    def __init__(self, items: AsyncGenerator[StreamItem, None]) -> None:
        super().__init__(media_type=NDJSON_MEDIA_TYPE)
        self._items = items
        self._lines: AsyncGenerator[bytes, None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:
                async def answer() -> None:
                    with contextlib.suppress(OSError):  # the client went away while a line was sent
                        await self._answer(scope, receive, send)
                    group.cancel_scope.cancel()

                group.start_soon(answer)
                while (await receive())["type"] != "http.disconnect":
                    pass  # the request body was read already: only its end can come
                group.cancel_scope.cancel()
        finally:
            if self._lines is not None:
                await self._lines.aclose()
            await self._items.aclose()

    async def _answer(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            first = await self._items.__anext__()
        except TurnFailure as failure:  # before the stream began: the JSON form's status and body
            await turn_failure_response(failure)(scope, receive, send)
            return
        except StopAsyncIteration:
            await turn_failure_response(_no_answer())(scope, receive, send)
            return
        self._lines = _lines(first, self._items)
        await StreamingResponse(self._lines, media_type=NDJSON_MEDIA_TYPE).stream_response(send)


def stream_llm_turn(provider: Provider, turn: LlmTurnRequest) -> Response:
    """The streaming form's answer (see the module docstring)."""
    return NdjsonTurnAnswer(_items(provider, turn))
