"""Model providers behind the gateway (SPEC G-4) and their error mapping to H-8 origins.

``scripted`` (default) is the offline deterministic model of ``hopline.harness.scripted``;
``openai`` is any OpenAI-compatible ``POST {base}/chat/completions``. Every failure is a
:class:`ProviderFailure` (a ``TurnFailure``) that also says which HTTP status the gateway answers:

======================================  =========  ===================  =======
provider outcome                        origin     flags                gateway
======================================  =========  ===================  =======
413, context-length / too-large error   code       size_error           413
other 4xx (bad request, auth, 404)      code       -                    502
429, 500, 502, 503, 504, 408            model      retryable            502
connection error, reset                 model      retryable            502
connect / read timeout                  model      retryable            504
malformed answer (not JSON, no choice)  model      -                    502
======================================  =========  ===================  =======

The status and exception rules are the harness's (``hopline.harness.failures``): one table.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Protocol

import httpx
import orjson

from hopline.budget import HOP_PROVIDER, Budget
from hopline.harness.failures import classify_exception, classify_http_status, malformed_output
from hopline.harness.model import LlmTurnRequest, LlmTurnResponse, Origin, TurnFailure, Usage

PROVIDER_ENV = "HOPLINE_PROVIDER"
OPENAI_BASE_URL_ENV = "OPENAI_BASE_URL"
OPENAI_API_KEY_ENV = "OPENAI_API_KEY"
MODEL_ENV = "HOPLINE_MODEL"
DEFAULT_OPENAI_BASE_URL = "https://api.openai.com/v1"
DEFAULT_OPENAI_MODEL = "gpt-4o-mini"

# Keys of `params` that would replace what the gateway itself sends.
_RESERVED_PARAMS = frozenset({"model", "messages", "tools", "stream"})


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


class Provider(Protocol):
    name: str

    async def complete(self, request: LlmTurnRequest) -> LlmTurnResponse:
        """Answer the request or raise :class:`TurnFailure`."""
        ...

    async def aclose(self) -> None: ...


class ScriptedProvider:
    """The offline deterministic model (``hopline.harness.scripted.ScriptedModel``), the default."""

    name = "scripted"

    def __init__(self, model: Any | None = None) -> None:
        if model is None:
            from hopline.harness.scripted import ScriptedModel

            model = ScriptedModel()
        self._model = model

    async def complete(self, request: LlmTurnRequest) -> LlmTurnResponse:
        response: LlmTurnResponse = self._model.respond(request)
        return LlmTurnResponse(response.message, response.usage, self.name)

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


def parse_completion(body: Any, provider: str) -> LlmTurnResponse:
    """The assistant message and usage of a chat-completions answer; malformed -> model origin."""
    try:
        choice = body["choices"][0]
        message = choice["message"]
        if not isinstance(message, dict) or message.get("role", "assistant") != "assistant":
            raise ValueError("choices[0].message is not an assistant message")
        out: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
        tool_calls = message.get("tool_calls")
        if tool_calls:
            calls = []
            for call in tool_calls:
                function = call["function"]
                if not isinstance(function["name"], str) or not isinstance(function["arguments"], str):
                    raise ValueError("tool call name and arguments must be strings")
                calls.append({"id": str(call["id"]), "type": "function",
                              "function": {"name": function["name"], "arguments": function["arguments"]}})
            out["tool_calls"] = calls
        usage = body.get("usage") or {}
        return LlmTurnResponse(
            out,
            Usage(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)),
            provider,
        )
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        raise as_provider_failure(malformed_output(f"{type(exc).__name__}: {exc}")) from None


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
    ) -> None:
        self.budget = budget
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self._headers = {"content-type": "application/json"}
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
        # The provider's answer is bounded too.
        self.response_max_bytes = budget.provider_response_max_bytes

    def request_body(self, request: LlmTurnRequest) -> bytes:
        body: dict[str, Any] = {k: v for k, v in request.params.items() if k not in _RESERVED_PARAMS}
        body["model"] = request.model or self.model
        body["messages"] = request.messages
        if request.tools:
            body["tools"] = request.tools
        return orjson.dumps(body)

    async def complete(self, request: LlmTurnRequest) -> LlmTurnResponse:
        payload = self.request_body(request)
        try:
            async with self._client.stream("POST", self.url, content=payload, headers=self._headers) as resp:
                raw = await self._read_bounded(resp)
                status = resp.status_code
        except httpx.TransportError as exc:
            failure = classify_exception(exc, hop=HOP_PROVIDER, body_bytes=len(payload))
            timed_out = isinstance(exc, httpx.TimeoutException)
            raise as_provider_failure(failure, 504 if timed_out else None) from None
        if status >= 400:
            raise failure_for_status(status, raw.decode("utf-8", "replace"), len(payload))
        try:
            body: Any = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise as_provider_failure(malformed_output("the provider's answer is not JSON")) from None
        return parse_completion(body, self.name)

    async def _read_bounded(self, resp: httpx.Response) -> bytes:
        chunks: list[bytes] = []
        total = 0
        async for chunk in resp.aiter_bytes():
            total += len(chunk)
            if total > self.response_max_bytes:
                raise ProviderFailure("model", f"provider answer passed {self.response_max_bytes} bytes",
                                      gateway_status=502, limit_bytes=self.response_max_bytes)
            chunks.append(chunk)
        return b"".join(chunks)

    async def aclose(self) -> None:
        if self._own_client:
            await self._client.aclose()


def provider_from_env(budget: Budget, environ: Mapping[str, str] | None = None) -> Provider:
    """``HOPLINE_PROVIDER`` = scripted (default) | openai, with ``OPENAI_*`` and ``HOPLINE_MODEL``."""
    env = os.environ if environ is None else environ
    kind = (env.get(PROVIDER_ENV) or "scripted").strip().lower()
    if kind == "scripted":
        return ScriptedProvider()
    if kind == "openai":
        return OpenAIProvider(
            budget,
            base_url=env.get(OPENAI_BASE_URL_ENV) or DEFAULT_OPENAI_BASE_URL,
            api_key=env.get(OPENAI_API_KEY_ENV),
            model=env.get(MODEL_ENV) or DEFAULT_OPENAI_MODEL,
        )
    raise ValueError(f"{PROVIDER_ENV}={kind!r}: expected scripted or openai")
