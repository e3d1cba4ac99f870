"""``HttpModel``: the harness's :class:`~hopline.harness.model.Model` over HTTP to the gateway
(the harness's side of hop 3; the gateway serves it and imports the harness, never the reverse).

The body is the encoder's exact bytes, sent with its ``Content-Length``; it is checked against the
engine ceiling before a byte leaves (the ceiling of the model's :class:`~hopline.harness.sizing.Sizing`,
the budget's by default). Failures keep the origin the gateway reported; without the gateway's JSON,
413 and a reset while uploading are ``code`` size errors, 429/5xx and timeouts are ``model``.

``complete_streaming`` asks for the streaming form (``Accept: application/x-ndjson``,
:mod:`hopline.gateway.streaming`) and hands each text delta over as it arrives; a stream that ends
or breaks before its answer is a ``model`` failure carrying the bytes of text received.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, get_args
from urllib.parse import quote

import httpx
import orjson

from hopline.budget import HOP_GATEWAY, Budget, KiB, LimitExceeded
from hopline.errors import BODY_TOO_LARGE, Origin, TurnFailure
from hopline.harness.failures import classify_http_status, over_ceiling
from hopline.harness.model import EncodedRequest, LlmTurnResponse, TextSink, Usage
from hopline.harness.sizing import BUDGETED, Sizing
from hopline.vocabulary import LINE_DELTA, LINE_ERROR, LINE_MESSAGE, NDJSON_MEDIA_TYPE
from hopline.wire.bounded import read_bounded
from hopline.wire.ndjson import Frame, NdjsonDecoder

ORIGINS: tuple[str, ...] = get_args(Origin)

# The upload is handed to httpx in slices of this size, so that a failure can tell "during upload"
# from "after the body was sent" (a framing choice, not a ceiling).
UPLOAD_SLICE_BYTES = 64 * KiB


class _Upload:
    """The request body as an async byte stream that remembers how much was handed over."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.sent = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        view = memoryview(self.body)
        for start in range(0, len(view), UPLOAD_SLICE_BYTES):
            piece = bytes(view[start:start + UPLOAD_SLICE_BYTES])
            yield piece
            self.sent = start + len(piece)

    @property
    def complete(self) -> bool:
        return self.sent >= len(self.body)


class HttpModel:
    """POST ``{base_url}/internal/sessions/{session_id}/llm-turn`` with the bearer token."""

    def __init__(
        self,
        base_url: str,
        session_id: str,
        token: str,
        budget: Budget,
        *,
        client: httpx.AsyncClient | None = None,
        sizing: Sizing = BUDGETED,
    ) -> None:
        self.url = f"{base_url.rstrip('/')}/internal/sessions/{quote(session_id, safe='')}/llm-turn"
        self.budget = budget
        self.send_ceiling = sizing.send_ceiling(budget)
        self._token = token
        self._own_client = client is None
        # The gateway waits on the provider: its read timeout covers the provider's plus a connect.
        self._client = client or httpx.AsyncClient(
            timeout=httpx.Timeout(
                connect=budget.provider_connect_timeout_seconds,
                read=budget.provider_read_timeout_seconds + budget.provider_connect_timeout_seconds,
                write=budget.provider_read_timeout_seconds,
                pool=budget.provider_connect_timeout_seconds,
            )
        )

    async def aclose(self) -> None:
        if self._own_client:
            await self._client.aclose()

    async def __aenter__(self) -> HttpModel:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def complete(self, encoded: EncodedRequest) -> LlmTurnResponse:
        return await self._exchange(encoded, None)

    async def complete_streaming(self, encoded: EncodedRequest, on_text: TextSink) -> LlmTurnResponse:
        """The streaming form of llm-turn: ``on_text`` gets each text delta as the gateway relays it."""
        return await self._exchange(encoded, on_text)

    async def _exchange(self, encoded: EncodedRequest, on_text: TextSink | None) -> LlmTurnResponse:
        ceiling = self.send_ceiling
        if ceiling is not None and encoded.size > ceiling:
            raise over_ceiling(encoded.size, ceiling)
        upload = _Upload(encoded.body)
        headers = {
            "content-type": "application/json",
            "content-length": str(encoded.size),  # explicit: the body is streamed but not chunked
            "authorization": f"Bearer {self._token}",
        }
        if on_text is not None:
            headers["accept"] = NDJSON_MEDIA_TYPE
        relay = _StreamReader(self.budget.provider_stream_max_bytes)
        try:
            async with self._client.stream("POST", self.url, content=upload, headers=headers) as response:
                media = response.headers.get("content-type", "").split(";", 1)[0].strip().lower()
                if on_text is not None and response.status_code == 200 and media == NDJSON_MEDIA_TYPE:
                    return await relay.read(response, on_text)
                raw = await _read_bounded(response, self.budget.provider_response_max_bytes)
        except httpx.TimeoutException as exc:
            raise TurnFailure("model", f"gateway timed out ({type(exc).__name__}){relay.so_far()}",
                              hop=HOP_GATEWAY, retryable=True, observed_bytes=relay.observed()) from None
        except (httpx.WriteError, httpx.RemoteProtocolError, httpx.ReadError) as exc:
            # A reset before the answer, on a body the gateway's declared limit refuses, is that
            # refusal too (the reset can overtake the 413 on the wire).
            over_gateway = encoded.size > self.budget.api_json_body_limit
            refused = isinstance(exc, httpx.WriteError) or not upload.complete or over_gateway
            if refused and not relay.started:
                raise TurnFailure(
                    "code",
                    f"connection reset while uploading a {encoded.size}-byte llm-turn body "
                    f"({upload.sent} bytes handed over): the gateway refused its size",
                    hop=HOP_GATEWAY, observed_bytes=encoded.size, size_error=True,
                ) from None
            raise TurnFailure("model", f"gateway connection failed ({type(exc).__name__}){relay.so_far()}",
                              hop=HOP_GATEWAY, retryable=True, observed_bytes=relay.observed()) from None
        except httpx.TransportError as exc:
            raise TurnFailure("model", f"gateway connection failed ({type(exc).__name__})", hop=HOP_GATEWAY,
                              retryable=True) from None
        if response.status_code == 200:
            return _parse_answer(raw)
        raise failure_from_response(response.status_code, raw, encoded.size)


class _StreamReader:
    """Reads the streaming form's NDJSON lines (served by :mod:`hopline.gateway.streaming`), bounded by the
    stream ceiling; remembers how much text it relayed, for the failure of a cut stream."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.started = False
        self.raw_bytes = 0
        self.text_bytes = 0

    def observed(self) -> int | None:
        return self.text_bytes if self.started else None

    def so_far(self) -> str:
        if not self.started:
            return ""
        return f" after {self.text_bytes} bytes of streamed text ({self.raw_bytes} bytes read)"

    async def read(self, response: httpx.Response, on_text: TextSink) -> LlmTurnResponse:
        self.started = True
        decoder = NdjsonDecoder(self.max_bytes)
        async for chunk in response.aiter_bytes():
            self.raw_bytes += len(chunk)
            if self.raw_bytes > self.max_bytes:
                raise TurnFailure("model", f"the gateway's stream passed {self.max_bytes} bytes "
                                  "(HOPLINE_PROVIDER_STREAM_MAX_BYTES)", hop=HOP_GATEWAY,
                                  limit_bytes=self.max_bytes, observed_bytes=self.raw_bytes)
            for frame in decoder.feed(chunk):
                if not isinstance(frame, Frame) or not isinstance(frame.message, dict):
                    raise TurnFailure("model", f"malformed gateway stream line of {frame.size} bytes",
                                      hop=HOP_GATEWAY, retryable=True)
                line = frame.message
                kind = line.get("type")
                if kind == LINE_DELTA and isinstance(line.get("text"), str):
                    self.text_bytes += len(line["text"].encode("utf-8"))
                    await on_text(line["text"])
                elif kind == LINE_MESSAGE:
                    return _answer_of(line)
                elif kind == LINE_ERROR and isinstance(line.get("error"), dict):
                    raise failure_from_error(line["error"], None, None)
                else:
                    raise TurnFailure("model", f"unknown gateway stream line of {frame.size} bytes",
                                      hop=HOP_GATEWAY, retryable=True)
        raise TurnFailure("model", f"the gateway's stream ended before its answer{self.so_far()}",
                          hop=HOP_GATEWAY, observed_bytes=self.text_bytes, retryable=True)


async def _read_bounded(response: httpx.Response, limit: int) -> bytes:
    """The answer's bytes; past ``limit`` the read stops and the turn fails (origin model)."""
    try:
        return await read_bounded(response.aiter_bytes(), limit, ceiling="provider_response_max_bytes")
    except LimitExceeded as exc:
        raise TurnFailure("model", f"gateway answer passed {limit} bytes ({exc.setting})", hop=HOP_GATEWAY,
                          limit_bytes=limit, observed_bytes=int(exc.observed)) from None


def _parse_answer(raw: bytes) -> LlmTurnResponse:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise TurnFailure("model", "malformed gateway answer: JSONDecodeError", hop=HOP_GATEWAY,
                          retryable=True) from None
    return _answer_of(body)


def _answer_of(body: Any) -> LlmTurnResponse:
    try:
        message = body["message"]
        if not isinstance(message, dict):
            raise TypeError("message is not an object")
        usage = body.get("usage") or {}
        return LlmTurnResponse(
            message,
            Usage(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)),
            str(body.get("provider") or ""),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise TurnFailure("model", f"malformed gateway answer: {type(exc).__name__}", hop=HOP_GATEWAY,
                          retryable=True) from None


def failure_from_response(status: int, raw: bytes, size: int) -> TurnFailure:
    """A TurnFailure for a non-200 gateway answer, keeping the origin the gateway reported."""
    error: dict[str, Any] = {}
    try:
        body = orjson.loads(raw)
        if isinstance(body, dict) and isinstance(body.get("error"), dict):
            error = body["error"]
    except orjson.JSONDecodeError:
        pass
    if error.get("origin") in ORIGINS or status == 413:
        return failure_from_error(error, status, size)
    # Not our gateway's JSON (a proxy, a crashed gateway): the harness's status table decides.
    text = raw[:512].decode("utf-8", "replace")
    return classify_http_status(status, text, hop=HOP_GATEWAY, body_bytes=size)


def failure_from_error(error: dict[str, Any], status: int | None, size: int | None) -> TurnFailure:
    """The failure of our gateway's error object; ``status`` is None inside a stream (answered 200)."""
    hop = error.get("hop") or HOP_GATEWAY
    limit, observed = error.get("limit"), error.get("observed")
    message = str(error.get("message") or f"gateway answered HTTP {status}")
    if status == 413:
        # 413 is code, never model (SPEC H-8), whatever the body says.
        return TurnFailure("code", message, status=error.get("status", 413), hop=hop, limit_bytes=limit,
                           observed_bytes=observed if observed is not None else size, size_error=True)
    origin = error.get("origin")
    return TurnFailure(origin if origin in ORIGINS else "model", message, status=error.get("status", status),
                       hop=hop, limit_bytes=limit, observed_bytes=observed,
                       size_error=error.get("type") == BODY_TOO_LARGE, retryable=bool(error.get("retryable")))
