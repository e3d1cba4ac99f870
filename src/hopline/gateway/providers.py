"""Model providers behind the gateway (SPEC G-4) and their error mapping to H-8 origins.

``scripted`` (default) is the offline deterministic model of ``hopline.harness.scripted``;
``openai`` is any OpenAI-compatible ``POST {base}/chat/completions``. Every failure is a
:class:`ProviderFailure` (a ``TurnFailure``) that also says which HTTP status the gateway answers:

======================================  =========  ===================  =======
provider outcome                        origin     flags                gateway
======================================  =========  ===================  =======
413, context-length / too-large error   code       size_error           413
other 4xx (bad request, auth, 404)      code       -                    502
429, 5xx                                model      retryable            502
connection error, reset                 model      retryable            502
connect / read timeout                  model      retryable            504
malformed answer (not JSON, no choice)  model      retryable            502
======================================  =========  ===================  =======
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any, Protocol

import httpx
import orjson

from hopline.budget import HOP_PROVIDER, Budget
from hopline.harness.model import LlmTurnRequest, LlmTurnResponse, Origin, TurnFailure, Usage

PROVIDER_ENV = "HOPLINE_PROVIDER"
OPENAI_BASE_URL_ENV = "OPENAI_BASE_URL"
OPENAI_API_KEY_ENV = "OPENAI_API_KEY"
MODEL_ENV = "HOPLINE_MODEL"
DEFAULT_OPENAI_BASE_URL = "https://api.openai.com/v1"
DEFAULT_OPENAI_MODEL = "gpt-4o-mini"

# Provider error codes and messages that mean "the request was too large for the model".
_SIZE_CODES = frozenset({"context_length_exceeded", "request_too_large", "string_above_max_length",
                         "tokens_exceeded"})
_SIZE_MESSAGE = re.compile(
    r"context[ _-]?length|context window|maximum context|too many tokens|prompt is too long|"
    r"request too large|reduce the length",
    re.IGNORECASE,
)
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


def is_size_error(status: int, body: Any) -> bool:
    """True when a provider's refusal says the request was too large (413 or a context-length error)."""
    if status == 413:
        return True
    if status not in (400, 422):
        return False
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        if str(error.get("code") or "") in _SIZE_CODES or str(error.get("type") or "") in _SIZE_CODES:
            return True
        return bool(_SIZE_MESSAGE.search(str(error.get("message") or "")))
    if isinstance(error, str):
        return bool(_SIZE_MESSAGE.search(error))
    return False


def failure_for_status(status: int, body: Any, observed_bytes: int) -> ProviderFailure:
    """Map a provider's non-2xx answer to an origin (never echoing the provider's payload)."""
    if is_size_error(status, body):
        return ProviderFailure("code", f"provider refused the request as too large (HTTP {status})",
                               gateway_status=413, status=status, observed_bytes=observed_bytes,
                               size_error=True)
    if status == 429 or status >= 500:
        return ProviderFailure("model", f"provider answered HTTP {status}", gateway_status=502,
                               status=status, retryable=True)
    return ProviderFailure("code", f"provider refused the request (HTTP {status})", gateway_status=502,
                           status=status)


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
        raise ProviderFailure("model", f"malformed provider answer: {type(exc).__name__}: {exc}",
                              gateway_status=502, retryable=True) from None


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
        # The provider's answer is bounded too. There is no dedicated ceiling yet: the gateway's
        # body limit is the fallback (FALLBACK, until the budget declares provider_response_max_bytes).
        self.response_max_bytes = budget.api_json_body_limit

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
        except httpx.TimeoutException as exc:
            raise ProviderFailure("model", f"provider timed out ({type(exc).__name__})", gateway_status=504,
                                  retryable=True) from None
        except httpx.TransportError as exc:
            raise ProviderFailure("model", f"provider connection failed ({type(exc).__name__})",
                                  gateway_status=502, retryable=True) from None
        try:
            body: Any = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            body = None
        if status >= 400:
            raise failure_for_status(status, body, len(payload))
        if body is None:
            raise ProviderFailure("model", "malformed provider answer: not JSON", gateway_status=502,
                                  retryable=True)
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
