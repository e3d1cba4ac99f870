"""The chat-completions wire format of OpenAI-compatible providers, sans I/O (SPEC G-4, G-5).

* :func:`chat_request` builds a request that holds only fields of the chat-completions schema:
  the llm-turn's ``params`` are ours (byte budgets such as a summary's ``maxBytes``, the scripted
  model's hints) except the chat parameters listed in :data:`CHAT_PARAMS`, and messages and tool
  schemas keep only the fields their role has in that schema. Real providers answer any other
  field with a 400.
* :class:`ChatStreamAssembler` folds the ``chat.completion.chunk`` objects of a streamed answer
  (``stream: true``): text deltas come out as they arrive; tool-call deltas (several calls
  interleaved by ``index``, arguments in pieces) are assembled; the response ceiling applies to
  the sum of the deltas, and the stream is refused the moment the sum passes it.
"""

from __future__ import annotations

from typing import Any

from hopline.budget import CEILINGS_BY_KEY, LimitExceeded
from hopline.errors import TurnFailure
from hopline.harness.failures import CONTEXT_LENGTH_RE, malformed_output
from hopline.harness.model import LlmTurnRequest, LlmTurnResponse, Usage

# Chat-completions parameters an llm-turn's `params` may carry to the provider. `n` is left out:
# the gateway reads one choice.
CHAT_PARAMS = frozenset({
    "temperature", "top_p", "max_tokens", "max_completion_tokens", "stop", "seed",
    "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "top_logprobs", "user",
    "tool_choice", "parallel_tool_calls", "response_format", "reasoning_effort", "metadata", "store",
    "service_tier", "modalities", "prediction", "verbosity",
})
# The fields each message role has in the schema (H-1's shape is a subset of it).
MESSAGE_FIELDS: dict[str, tuple[str, ...]] = {
    "system": ("role", "content", "name"),
    "developer": ("role", "content", "name"),
    "user": ("role", "content", "name"),
    "assistant": ("role", "content", "name", "tool_calls", "refusal"),
    "tool": ("role", "content", "tool_call_id"),
}
TOOL_FUNCTION_FIELDS = ("name", "description", "parameters", "strict")


def chat_message(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` with only its role's schema fields (tool calls reduced to id, type, function)."""
    fields = MESSAGE_FIELDS.get(str(message.get("role")), ("role", "content"))
    out = {key: message[key] for key in fields if key in message}
    calls = out.get("tool_calls")
    if isinstance(calls, list):
        out["tool_calls"] = [
            {"id": call.get("id"), "type": "function",
             "function": {"name": (call.get("function") or {}).get("name"),
                          "arguments": (call.get("function") or {}).get("arguments", "")}}
            for call in calls if isinstance(call, dict)]
        if not out["tool_calls"]:
            del out["tool_calls"]
    return out


def chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    function: dict[str, Any] = tool["function"] if isinstance(tool.get("function"), dict) else {}
    return {"type": tool.get("type", "function"),
            "function": {key: function[key] for key in TOOL_FUNCTION_FIELDS if key in function}}


def chat_request(request: LlmTurnRequest, model: str, *, stream: bool) -> dict[str, Any]:
    """The provider's request body: chat-completions fields only (see the module docstring)."""
    body: dict[str, Any] = {key: value for key, value in request.params.items() if key in CHAT_PARAMS}
    body["model"] = request.model or model
    body["messages"] = [chat_message(m) for m in request.messages]
    if request.tools:
        body["tools"] = [chat_tool(t) for t in request.tools]
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


def usage_of(body: dict[str, Any]) -> Usage:
    usage = body.get("usage") or {}
    return Usage(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0))


def parse_completion(body: Any, provider: str) -> LlmTurnResponse:
    """The assistant message and usage of a (non-streamed) chat-completions answer.

    Raises the harness's malformed-output failure (origin ``model``)."""
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
        return LlmTurnResponse(out, usage_of(body), provider)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        raise malformed_output(f"{type(exc).__name__}: {exc}") from None


def _utf8(text: str) -> int:
    return len(text.encode("utf-8"))


class ResponseTooLarge(LimitExceeded):
    """The deltas of a streamed answer passed the response ceiling."""


class _CallParts:
    def __init__(self) -> None:
        self.id = ""
        self.name = ""
        self.arguments: list[str] = []


class ChatStreamAssembler:
    """Folds streamed ``chat.completion.chunk`` objects into one answer (see the module docstring).

    ``delta_bytes`` is the UTF-8 size of every delta string received (text, refusal, tool-call id,
    name and arguments); passing ``max_delta_bytes`` raises :class:`ResponseTooLarge` before the
    offending delta is kept or handed out.
    """

    def __init__(self, max_delta_bytes: int) -> None:
        self.max_delta_bytes = max_delta_bytes
        self.delta_bytes = 0
        self.chunks = 0
        self.finish_reason: str | None = None
        self.usage = Usage(0, 0)
        self._text: list[str] = []
        self._calls: dict[int, _CallParts] = {}
        self._last_index: int | None = None

    @property
    def finished(self) -> bool:
        """A choice reported its ``finish_reason`` (the answer is whole even without ``[DONE]``)."""
        return self.finish_reason is not None

    def _count(self, *pieces: str) -> None:
        added = sum(_utf8(p) for p in pieces)
        if self.delta_bytes + added > self.max_delta_bytes:
            ceiling = CEILINGS_BY_KEY["provider_response_max_bytes"]
            observed = self.delta_bytes + added
            raise ResponseTooLarge(ceiling.hop, ceiling.name, self.max_delta_bytes, observed,
                                   f"streamed answer passed {self.max_delta_bytes} bytes")
        self.delta_bytes += added

    def add(self, chunk: Any) -> str:
        """Fold one chunk in; return its text delta ("" when it has none)."""
        if not isinstance(chunk, dict):
            raise malformed_output("a stream chunk is not a JSON object")
        self.chunks += 1
        if chunk.get("usage"):
            self.usage = usage_of(chunk)
        choices = chunk.get("choices") or []
        if not isinstance(choices, list):
            raise malformed_output("choices is not a list")
        text = ""
        for choice in choices[:1]:  # one choice is asked for
            if not isinstance(choice, dict):
                raise malformed_output("a choice is not an object")
            delta = choice.get("delta") or {}
            if not isinstance(delta, dict):
                raise malformed_output("a delta is not an object")
            for key in ("content", "refusal"):
                piece = delta.get(key)
                if isinstance(piece, str) and piece:
                    self._count(piece)
                    self._text.append(piece)
                    text += piece
            calls = delta.get("tool_calls")
            if calls is not None:
                self._add_calls(calls)
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
        return text

    def _add_calls(self, calls: Any) -> None:
        if not isinstance(calls, list):
            raise malformed_output("delta.tool_calls is not a list")
        for call in calls:
            if not isinstance(call, dict):
                raise malformed_output("a tool-call delta is not an object")
            function = call.get("function") or {}
            pieces = [call.get("id"), function.get("name"), function.get("arguments")]
            if not all(p is None or isinstance(p, str) for p in pieces):
                raise malformed_output("tool-call id, name and arguments must be strings")
            self._count(*(p for p in pieces if p))
            parts = self._slot(call)
            if call.get("id"):
                parts.id = call["id"]
            if function.get("name"):
                parts.name += function["name"]
            if function.get("arguments"):
                parts.arguments.append(function["arguments"])

    def _slot(self, call: dict[str, Any]) -> _CallParts:
        index = call.get("index")
        if not isinstance(index, int) or isinstance(index, bool):
            # No index (some compatible servers): a new id opens a call, else the last one goes on.
            known = self._calls.get(self._last_index) if self._last_index is not None else None
            if known is not None and (not call.get("id") or call.get("id") == known.id):
                return known
            index = max(self._calls, default=-1) + 1
        self._last_index = index
        return self._calls.setdefault(index, _CallParts())

    def response(self, provider: str) -> LlmTurnResponse:
        """The assembled assistant message; a tool call without id or name is malformed output."""
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self._text)}
        if self._calls:
            calls = []
            for index in sorted(self._calls):
                parts = self._calls[index]
                if not parts.id or not parts.name:
                    raise malformed_output(f"streamed tool call {index} has no id or no name")
                calls.append({"id": parts.id, "type": "function",
                              "function": {"name": parts.name, "arguments": "".join(parts.arguments)}})
            message["tool_calls"] = calls
        return LlmTurnResponse(message, self.usage, provider)


def stream_error(chunk: Any) -> TurnFailure | None:
    """An ``{"error": ...}`` object sent inside the stream, as a failure (else None)."""
    if not isinstance(chunk, dict) or not isinstance(chunk.get("error"), dict):
        return None
    text = str(chunk["error"].get("message") or chunk["error"].get("code") or "")
    detail = text.strip().replace("\n", " ")[:200]
    if CONTEXT_LENGTH_RE.search(text):
        return TurnFailure("code", f"the provider refused the request inside its stream: {detail}",
                           size_error=True)
    return TurnFailure("model", f"the provider reported an error inside its stream: {detail}", retryable=True)
