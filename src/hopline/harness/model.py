"""The harness's model interface: how one llm-turn request reaches a model (SPEC H-8, G-1).

A request is encoded once (``encode_request``); its exact byte size is known before it is sent, and
the same bytes are what an HTTP model posts. Implementations: the in-process scripted model
(``hopline.scripted.model``) and the HTTP model that posts to the gateway (``hopline.gateway``).
Every failure is a :class:`TurnFailure` carrying its origin.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any, Literal, Protocol, runtime_checkable

import orjson

Purpose = Literal["turn", "summary"]

Message = dict[str, Any]  # OpenAI chat shape (SPEC H-1)


@dataclasses.dataclass(frozen=True)
class LlmTurnRequest:
    """The body of ``POST /internal/sessions/{sessionId}/llm-turn``."""

    messages: list[Message]
    tools: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    model: str | None = None
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    purpose: Purpose = "turn"

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"messages": self.messages, "purpose": self.purpose}
        if self.tools:
            body["tools"] = self.tools
        if self.model is not None:
            body["model"] = self.model
        if self.params:
            body["params"] = self.params
        return body


@dataclasses.dataclass(frozen=True)
class EncodedRequest:
    """A request and the exact bytes that will be sent for it."""

    request: LlmTurnRequest
    body: bytes

    @property
    def size(self) -> int:
        return len(self.body)


def encode_request(request: LlmTurnRequest) -> EncodedRequest:
    """The one encoder of llm-turn bodies (orjson), used for sizing and for sending."""
    return EncodedRequest(request, orjson.dumps(request.to_json()))


@dataclasses.dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    def to_json(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens}


@dataclasses.dataclass(frozen=True)
class LlmTurnResponse:
    """The answer of an llm-turn: the assistant message, usage and the provider's name."""

    message: Message
    usage: Usage
    provider: str

    def to_json(self) -> dict[str, Any]:
        return {"message": self.message, "usage": self.usage.to_json(), "provider": self.provider}


class Model(Protocol):
    """Anything that answers an encoded llm-turn request."""

    async def complete(self, encoded: EncodedRequest) -> LlmTurnResponse:
        """Answer the request or raise :class:`TurnFailure`."""
        ...


# Receives each piece of the assistant's text as the model produces it (awaited: a slow consumer
# slows the stream instead of growing a buffer).
TextSink = Callable[[str], Awaitable[None]]


@runtime_checkable
class StreamingModel(Protocol):
    """A model that can also hand over its text while it is produced (SPEC G-5)."""

    async def complete(self, encoded: EncodedRequest) -> LlmTurnResponse: ...

    async def complete_streaming(self, encoded: EncodedRequest, on_text: TextSink) -> LlmTurnResponse:
        """Answer like :meth:`complete`, awaiting ``on_text`` for each text delta first; the
        concatenated deltas are the final message's content."""
        ...
