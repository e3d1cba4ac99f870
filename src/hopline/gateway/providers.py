"""Model providers behind the gateway (SPEC G-4, G-5) and their error mapping to H-8 origins.

``scripted`` (default) is the offline deterministic model of ``hopline.scripted.model``;
``openai`` is any OpenAI-compatible ``POST {base}/chat/completions``, asked with ``stream: true``
and ``stream_options.include_usage`` (``HOPLINE_PROVIDER_STREAM=0``: one whole answer, for servers
that lack streaming). Its requests hold only chat-completions fields (:mod:`hopline.gateway.chat`).
A provider answers :meth:`complete` with the whole answer, and :meth:`stream` with the text deltas
as they arrive, then the whole answer. Every failure is a :class:`ProviderFailure` (a
``TurnFailure``) that also says which HTTP status the gateway answers:

======================================  =========  ===================  =======
provider outcome                        origin     flags                gateway
======================================  =========  ===================  =======
413, context-length / too-large error   code       size_error           413
other 4xx (bad request, auth, 404)      code       -                    502
429, 500, 502, 503, 504, 408            model      retryable            502
connection error, reset                 model      retryable            502
connect / read timeout                  model      retryable            504
stream cut before it finished           model      retryable            502
malformed answer (not JSON, no choice)  model      -                    502
answer over the response ceiling        model      -                    502
======================================  =========  ===================  =======

The status and exception rules are the harness's (``hopline.harness.failures``): one table.
"""

from __future__ import annotations

import dataclasses
import os
import urllib.parse
from collections.abc import AsyncGenerator, Mapping
from typing import Any, Protocol, runtime_checkable

import httpx
import orjson

from hopline.budget import (
    CEILINGS_BY_KEY,
    EXTRA_HEADERS_ENV,
    HOP_PROVIDER,
    MODEL_ENV,
    OPENAI_API_KEY_ENV,
    OPENAI_BASE_URL_ENV,
    PROVIDER_ENV,
    STREAM_ENV,
    Budget,
    LimitExceeded,
    redact_url,
)
from hopline.errors import Origin, ProviderSettingError, SseEventTooLarge, TurnFailure
from hopline.gateway.chat import (
    ChatStreamAssembler,
    ResponseTooLarge,
    chat_request,
    parse_completion,
    stream_error,
)
from hopline.harness.failures import classify_exception, classify_http_status, malformed_output
from hopline.harness.model import LlmTurnRequest, LlmTurnResponse
from hopline.wire.bounded import read_bounded
from hopline.wire.sse import SseParser

DEFAULT_OPENAI_BASE_URL = "https://api.openai.com/v1"
DEFAULT_OPENAI_MODEL = "gpt-4o-mini"

# Headers the gateway sets itself for the body it sends; an extra header may not replace them.
_FRAMING_HEADERS = frozenset({"content-type", "content-length", "transfer-encoding", "host", "connection",
                              "accept"})
_SSE_DONE = "[DONE]"


class ProviderFailure(TurnFailure):
    """A provider-side failure and the HTTP status the gateway answers it with."""

    def __init__(self, origin: Origin, message: str, *, gateway_status: int, **kwargs: Any) -> None:
        kwargs.setdefault("hop", HOP_PROVIDER)
        super().__init__(origin, message, **kwargs)
        self.gateway_status = gateway_status


def gateway_status(failure: TurnFailure) -> int:
    """The gateway's HTTP status for a failure (any TurnFailure, not only a provider's)."""
    if isinstance(failure, ProviderFailure):
        return failure.gateway_status
    if failure.size_error:
        return 413
    return 502


@dataclasses.dataclass(frozen=True)
class TextDelta:
    """A piece of the assistant's text, as the provider streamed it."""

    text: str


StreamItem = TextDelta | LlmTurnResponse


class Provider(Protocol):
    name: str

    async def complete(self, request: LlmTurnRequest) -> LlmTurnResponse:
        """Answer the request or raise :class:`TurnFailure`."""
        ...

    async def aclose(self) -> None: ...


@runtime_checkable
class StreamingProvider(Provider, Protocol):
    def stream(self, request: LlmTurnRequest) -> AsyncGenerator[StreamItem, None]:
        """Text deltas as they arrive, then the whole answer (the last item); raises TurnFailure."""
        ...


def text_pieces(text: str) -> list[str]:
    """``text`` cut after each run of spaces, as a model streams words (joined, they give it back)."""
    pieces: list[str] = []
    start = 0
    for index in range(1, len(text)):
        if text[index - 1].isspace() and not text[index].isspace():
            pieces.append(text[start:index])
            start = index
    if start < len(text):
        pieces.append(text[start:])
    return pieces


class ScriptedProvider:
    """The offline deterministic model (``hopline.scripted.model.ScriptedModel``), the default.

    It streams its text word by word, so the default stack streams like a real model does."""

    name = "scripted"

    def __init__(self, model: Any | None = None) -> None:
        if model is None:
            from hopline.scripted.model import ScriptedModel

            model = ScriptedModel()
        self._model = model

    async def complete(self, request: LlmTurnRequest) -> LlmTurnResponse:
        response: LlmTurnResponse = self._model.respond(request)
        return LlmTurnResponse(response.message, response.usage, self.name)

    async def stream(self, request: LlmTurnRequest) -> AsyncGenerator[StreamItem, None]:
        answer = await self.complete(request)
        content = answer.message.get("content")
        for piece in text_pieces(content if isinstance(content, str) else ""):
            yield TextDelta(piece)
        yield answer

    async def aclose(self) -> None:
        return None


def as_provider_failure(failure: TurnFailure, status: int | None = None) -> ProviderFailure:
    """The same failure, with the gateway's HTTP status (413 size, 504 timeout, else 502)."""
    if status is None:
        status = 413 if failure.size_error else 502
    return ProviderFailure(failure.origin, failure.message, gateway_status=status, status=failure.status,
                           hop=failure.hop or HOP_PROVIDER, limit_bytes=failure.limit_bytes,
                           observed_bytes=failure.observed_bytes, size_error=failure.size_error,
                           retryable=failure.retryable)


def failure_for_status(status: int, body_text: str, observed_bytes: int) -> ProviderFailure:
    """Map a provider's non-2xx answer to an origin with the harness's status table."""
    return as_provider_failure(classify_http_status(status, body_text, hop=HOP_PROVIDER,
                                                    body_bytes=observed_bytes))


def check_base_url(raw: str) -> str:
    """``OPENAI_BASE_URL`` as given, once it names a scheme (http or https) and a host; else the
    variable is named with its value (any password hidden) and what it needs."""
    try:
        parts = urllib.parse.urlsplit(raw.strip())
        host = parts.hostname
    except ValueError:
        parts, host = None, None
    if parts is None or parts.scheme not in ("http", "https") or not host:
        raise ProviderSettingError(f"{OPENAI_BASE_URL_ENV}={redact_url(raw)[:256]!r}: needs a scheme and a "
                                   "host, e.g. https://api.openai.com/v1 or http://127.0.0.1:11434/v1")
    return raw.strip()


def parse_extra_headers(raw: str | None, *, api_key_set: bool) -> dict[str, str]:
    """``HOPLINE_PROVIDER_EXTRA_HEADERS``: a JSON object of header names to string values.

    Framing headers are the gateway's; ``Authorization`` is refused when ``OPENAI_API_KEY`` sets it.
    Errors name the variable and the header, never a value (values may be credentials)."""
    if raw is None or not raw.strip():
        return {}
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        raise ProviderSettingError(f"{EXTRA_HEADERS_ENV}: not a JSON object of header names to values")
    headers: dict[str, str] = {}
    for name, text in value.items():
        lower = name.strip().lower()
        if not lower or not isinstance(text, str) or any(c in name + text for c in "\r\n"):
            raise ProviderSettingError(f"{EXTRA_HEADERS_ENV}: header {name[:64]!r} needs a one-line "
                                       "string value")
        if lower in _FRAMING_HEADERS:
            raise ProviderSettingError(f"{EXTRA_HEADERS_ENV}: {lower} is set by the gateway itself")
        if lower == "authorization" and api_key_set:
            raise ProviderSettingError(f"{EXTRA_HEADERS_ENV}: authorization conflicts with "
                                       f"{OPENAI_API_KEY_ENV}")
        headers[lower] = text
    return headers


class OpenAIProvider:
    """Any OpenAI-compatible chat-completions endpoint over ``httpx.AsyncClient``."""

    name = "openai"

    def __init__(
        self,
        budget: Budget,
        *,
        base_url: str,
        api_key: str | None,
        model: str,
        client: httpx.AsyncClient | None = None,
        streaming: bool = True,
        extra_headers: Mapping[str, str] | None = None,
    ) -> None:
        self.budget = budget
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.shown_url = redact_url(base_url)  # what an error names: the endpoint, never a password
        self.api_key_set = bool(api_key)
        self.model = model
        self.streaming = streaming
        self._headers = {**(extra_headers or {}), "content-type": "application/json"}
        if api_key:
            self._headers["authorization"] = f"Bearer {api_key}"
        self._own_client = client is None
        self._client = client or httpx.AsyncClient(
            timeout=httpx.Timeout(
                connect=budget.provider_connect_timeout_seconds,
                read=budget.provider_read_timeout_seconds,
                write=budget.provider_read_timeout_seconds,
                pool=budget.provider_connect_timeout_seconds,
            ),
        )
        # The provider's answer is bounded too: its deltas (or whole body), and a stream's raw bytes.
        self.response_max_bytes = budget.provider_response_max_bytes
        self.stream_max_bytes = budget.provider_stream_max_bytes

    def request_body(self, request: LlmTurnRequest) -> bytes:
        return orjson.dumps(chat_request(request, self.model, stream=self.streaming))

    async def complete(self, request: LlmTurnRequest) -> LlmTurnResponse:
        answer: LlmTurnResponse | None = None
        async for item in self.stream(request):
            if isinstance(item, LlmTurnResponse):
                answer = item
        if answer is None:  # pragma: no cover - stream() always ends with the answer or raises
            raise as_provider_failure(malformed_output("the provider gave no answer"))
        return answer

    async def stream(self, request: LlmTurnRequest) -> AsyncGenerator[StreamItem, None]:
        payload = self.request_body(request)
        received = ChatStreamAssembler(self.response_max_bytes)
        raw_bytes = 0
        headers = {**self._headers, "accept": "text/event-stream" if self.streaming else "application/json"}
        try:
            async with self._client.stream("POST", self.url, content=payload, headers=headers) as resp:
                media = resp.headers.get("content-type", "").split(";", 1)[0].strip().lower()
                if resp.status_code >= 400 or media != "text/event-stream":
                    # An error, or a server that answers whole even when asked to stream.
                    raw = await self._read_bounded(resp)
                    if resp.status_code >= 400:
                        text = raw.decode("utf-8", "replace")
                        raise self._refused(failure_for_status(resp.status_code, text, len(payload)))
                    yield self._whole_answer(raw)
                    return
                parser = SseParser(self.stream_max_bytes, ceiling="provider_stream_max_bytes")
                done = False
                async for chunk in resp.aiter_bytes():
                    raw_bytes += len(chunk)
                    if raw_bytes > self.stream_max_bytes:
                        raise ProviderFailure(
                            "model", f"the provider's stream passed {self.stream_max_bytes} raw bytes "
                            f"(HOPLINE_PROVIDER_STREAM_MAX_BYTES); cut", gateway_status=502,
                            limit_bytes=self.stream_max_bytes, observed_bytes=raw_bytes)
                    for event in parser.feed(chunk):
                        if event.data.strip() == _SSE_DONE:
                            done = True
                            break
                        text = self._fold(received, event.data)
                        if text:
                            yield TextDelta(text)
                    if done:
                        break
                if not done and not received.finished:
                    raise self._cut(received, raw_bytes, "the connection ended")
        except httpx.TransportError as exc:
            timed_out = isinstance(exc, httpx.TimeoutException)
            if not raw_bytes:
                failure = classify_exception(exc, hop=HOP_PROVIDER, body_bytes=len(payload))
                told = self._unreachable(exc)
                if told is not None:
                    failure = TurnFailure(failure.origin, told, hop=failure.hop, retryable=failure.retryable,
                                          observed_bytes=failure.observed_bytes)
                raise as_provider_failure(failure, 504 if timed_out else None) from None
            if not received.finished:  # a break after the finish_reason loses only the usage chunk
                why = self._unreachable(exc) if timed_out else None
                raise self._cut(received, raw_bytes, why or type(exc).__name__, timed_out=timed_out) from None
        except SseEventTooLarge as exc:
            raise ProviderFailure("model", f"one event of the provider's stream passed "
                                  f"{exc.limit} bytes ({exc.setting}); cut", gateway_status=502,
                                  limit_bytes=exc.limit, observed_bytes=exc.observed) from None
        except ResponseTooLarge as exc:
            raise self._too_large(int(exc.observed), "streamed answer") from None
        if not received.chunks:
            raise self._malformed("the stream held no chunk")
        try:
            answer = received.response(self.name)
        except TurnFailure as failure:
            raise as_provider_failure(failure) from None
        yield answer

    def _refused(self, failure: ProviderFailure) -> ProviderFailure:
        """A 401 or 403 says what to check: the key, at this endpoint."""
        if failure.status not in (401, 403):
            return failure
        key = OPENAI_API_KEY_ENV if self.api_key_set else f"{OPENAI_API_KEY_ENV} (it is not set)"
        return ProviderFailure(failure.origin, f"HTTP {failure.status} from {self.shown_url}: the provider "
                               f"refused the credentials; check {key} and {OPENAI_BASE_URL_ENV}",
                               gateway_status=failure.gateway_status, status=failure.status, hop=failure.hop)

    def _unreachable(self, exc: httpx.TransportError) -> str | None:
        """What to check when the endpoint did not answer: the URL and its variable, or the timeout
        setting and its value."""
        if isinstance(exc, httpx.ConnectTimeout | httpx.PoolTimeout):
            ceiling = CEILINGS_BY_KEY["provider_connect_timeout_seconds"]
            value = self.budget.provider_connect_timeout_seconds
            return (f"no connection to {self.shown_url} within {value:g} s ({ceiling.name}={value:g}); "
                    f"check {OPENAI_BASE_URL_ENV}")
        if isinstance(exc, httpx.TimeoutException):
            ceiling = CEILINGS_BY_KEY["provider_read_timeout_seconds"]
            value = self.budget.provider_read_timeout_seconds
            return (f"{self.shown_url} sent nothing for {value:g} s ({ceiling.name}={value:g}, the longest "
                    "silence between two reads)")
        if isinstance(exc, httpx.ConnectError):
            return (f"nothing answers at {self.shown_url} ({str(exc)[:120] or 'ConnectError'}); "
                    f"check {OPENAI_BASE_URL_ENV}")
        return None

    def _fold(self, received: ChatStreamAssembler, data: str) -> str:
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise self._malformed("a stream event is not JSON") from None
        reported = stream_error(chunk)
        if reported is not None:
            raise as_provider_failure(reported)
        try:
            return received.add(chunk)
        except TurnFailure as failure:
            raise as_provider_failure(failure) from None

    def _whole_answer(self, raw: bytes) -> LlmTurnResponse:
        try:
            body: Any = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise self._malformed("the provider's answer is not JSON") from None
        try:
            return parse_completion(body, self.name)
        except TurnFailure as failure:
            raise as_provider_failure(failure) from None

    @staticmethod
    def _malformed(detail: str) -> ProviderFailure:
        return as_provider_failure(malformed_output(detail))

    @staticmethod
    def _cut(received: ChatStreamAssembler, raw_bytes: int, why: str, *,
             timed_out: bool = False) -> ProviderFailure:
        return ProviderFailure(
            "model", f"the provider's stream was cut before it finished ({why}) after {received.delta_bytes} "
            f"bytes of deltas in {received.chunks} chunks ({raw_bytes} bytes read)",
            gateway_status=504 if timed_out else 502, observed_bytes=received.delta_bytes, retryable=True)

    def _too_large(self, observed: int, what: str) -> ProviderFailure:
        return ProviderFailure("model", f"the provider's {what} passed {self.response_max_bytes} bytes "
                               "(HOPLINE_PROVIDER_RESPONSE_MAX_BYTES); cut", gateway_status=502,
                               limit_bytes=self.response_max_bytes, observed_bytes=observed)

    async def _read_bounded(self, resp: httpx.Response) -> bytes:
        try:
            return await read_bounded(resp.aiter_bytes(), self.response_max_bytes,
                                      ceiling="provider_response_max_bytes")
        except LimitExceeded as exc:
            raise self._too_large(int(exc.observed), "answer") from None

    async def aclose(self) -> None:
        if self._own_client:
            await self._client.aclose()


def _flag(environ: Mapping[str, str], name: str, default: bool) -> bool:
    raw = (environ.get(name) or "").strip().lower()
    if not raw:
        return default
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ProviderSettingError(f"{name}={raw[:16]!r}: expected 1 or 0")


def provider_from_env(budget: Budget, environ: Mapping[str, str] | None = None) -> Provider:
    """``HOPLINE_PROVIDER`` = scripted (default) | openai, with ``OPENAI_*``, ``HOPLINE_MODEL``,
    ``HOPLINE_PROVIDER_STREAM`` and ``HOPLINE_PROVIDER_EXTRA_HEADERS``."""
    env = os.environ if environ is None else environ
    kind = (env.get(PROVIDER_ENV) or "scripted").strip().lower()
    if kind == "scripted":
        return ScriptedProvider()
    if kind == "openai":
        api_key = env.get(OPENAI_API_KEY_ENV)
        return OpenAIProvider(
            budget,
            base_url=check_base_url(env.get(OPENAI_BASE_URL_ENV) or DEFAULT_OPENAI_BASE_URL),
            api_key=api_key,
            model=env.get(MODEL_ENV) or DEFAULT_OPENAI_MODEL,
            streaming=_flag(env, STREAM_ENV, True),
            extra_headers=parse_extra_headers(env.get(EXTRA_HEADERS_ENV), api_key_set=bool(api_key)),
        )
    raise ProviderSettingError(f"{PROVIDER_ENV}={kind!r}: expected scripted or openai")
