"""The approximate tokenizer and the exact body sizer (SPEC H-2).

``bytes_per_token`` is the one place the bytes-per-token constant is read (from the budget).
``estimate`` counts the UTF-8 bytes of every message's content PLUS the JSON of assistant
``tool_calls``: an assistant message that calls tools has empty content, yet its arguments are real
bytes in the HTTP body (counted as zero, a turn of large tool calls passes the gateway's limit
unseen).

``IncrementalEstimator`` keeps per-message sizes and per-message encodings so that appending a
message costs O(that message), and builds the exact body (same encoder as ``encode_request``) by
joining cached encodings: the size of what will be sent is known before every send.

Anchoring (H-2, G-5): after an answer, ``anchor(usage.prompt_tokens)`` records what the provider
counted for the messages just sent; until that prefix changes (a compaction), the estimate is those
tokens plus the bytes-per-token estimate of the messages added since.
"""

from __future__ import annotations

from typing import Any

import orjson

from hopline.budget import Budget
from hopline.harness.loop_events import EstimateSource
from hopline.harness.model import EncodedRequest, LlmTurnRequest, Message


def bytes_per_token(budget: Budget | None = None) -> int:
    """Bytes per token of the approximate tokenizer; the only reader of the constant."""
    return (budget if budget is not None else Budget.defaults()).bytes_per_token


def tokens_for_bytes(size: int, budget: Budget | None = None) -> int:
    """Tokens for ``size`` bytes, rounded up (a partial token is still a token)."""
    bpt = bytes_per_token(budget)
    return -(-size // bpt)


def content_bytes(content: Any) -> int:
    """UTF-8 bytes of a message content: a string, or a list of parts (text parts by their text,
    other parts by their JSON), or anything else by its JSON."""
    if content is None:
        return 0
    if isinstance(content, str):
        return len(content.encode("utf-8"))
    if isinstance(content, list):
        total = 0
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                total += len(part["text"].encode("utf-8"))
            else:
                total += len(orjson.dumps(part))
        return total
    return len(orjson.dumps(content))


def message_bytes(message: Message) -> int:
    """Estimate bytes of one message: its content plus the JSON of its tool calls."""
    total = content_bytes(message.get("content"))
    calls = message.get("tool_calls")
    if calls:
        total += len(orjson.dumps(calls))
    return total


def estimate(messages: list[Message], budget: Budget | None = None) -> int:
    """Estimated prompt tokens of ``messages`` (SPEC H-2)."""
    return tokens_for_bytes(sum(message_bytes(m) for m in messages), budget)


_MESSAGES_PREFIX = b'{"messages":['


class IncrementalEstimator:
    """Sizes of a growing conversation, maintained incrementally.

    ``sync(messages)`` compares the list with what it has seen by identity (a count of items, no
    bytes) and encodes only the messages from the first difference on: appending costs O(the new
    message), a compaction costs O(the kept part). ``encoded_bytes`` counts every byte the encoder
    produced, so tests can assert the total stays O(history) by counting.
    """

    def __init__(self, budget: Budget, envelope: LlmTurnRequest) -> None:
        self.budget = budget
        self.encoded_bytes = 0
        self._objects: list[Message] = []
        self._encoded: list[bytes] = []
        self._estimate_bytes: list[int] = []
        self._sum_encoded = 0
        self._sum_estimate = 0
        # (prompt tokens the provider reported, messages they covered, estimate bytes at that point)
        self._anchor: tuple[int, int, int] | None = None
        self.set_envelope(envelope)

    def set_envelope(self, envelope: LlmTurnRequest) -> None:
        """The request without its messages (tools, model, params, purpose)."""
        empty = orjson.dumps(LlmTurnRequest([], envelope.tools, envelope.model, envelope.params,
                                            envelope.purpose).to_json())
        self.encoded_bytes += len(empty)
        assert empty.startswith(_MESSAGES_PREFIX + b"]")  # messages is the first key of to_json
        self._envelope = envelope
        self._suffix = empty[len(_MESSAGES_PREFIX):]
        self._envelope_bytes = len(empty)

    @property
    def envelope_bytes(self) -> int:
        """Body bytes of the request with no messages."""
        return self._envelope_bytes

    def sync(self, messages: list[Message]) -> None:
        n = min(len(messages), len(self._objects))
        first_diff = n
        for i in range(n):
            if messages[i] is not self._objects[i]:
                first_diff = i
                break
        if first_diff < len(self._objects):
            self._truncate(first_diff)
        for message in messages[len(self._objects):]:
            self._append(message)

    def anchor(self, prompt_tokens: int) -> None:
        """The provider counted the synced messages (with the envelope) as ``prompt_tokens``;
        0 (not reported) leaves no anchor."""
        self._anchor = (prompt_tokens, len(self._objects), self._sum_estimate) if prompt_tokens > 0 else None

    def estimate(self) -> tuple[int, EstimateSource]:
        """The token estimate compaction decides on, and which one it is: anchored on the
        provider's usage when there is an anchor, else the bytes estimate (H-2)."""
        anchored = self.anchored_estimate_tokens
        if anchored is not None:
            return anchored, "usage"
        return self.estimate_tokens, "bytes"

    @property
    def anchored_estimate_tokens(self) -> int | None:
        """The provider's last prompt tokens plus the estimate of what was added since; None
        without a valid anchor (no usage reported yet, or the anchored messages changed)."""
        if self._anchor is None:
            return None
        tokens, _, estimate_then = self._anchor
        return tokens + tokens_for_bytes(self._sum_estimate - estimate_then, self.budget)

    def _truncate(self, length: int) -> None:
        if self._anchor is not None and length < self._anchor[1]:
            self._anchor = None  # the provider counted messages that are no longer there
        self._sum_encoded -= sum(len(b) for b in self._encoded[length:])
        self._sum_estimate -= sum(self._estimate_bytes[length:])
        del self._objects[length:], self._encoded[length:]
        del self._estimate_bytes[length:]

    def _append(self, message: Message) -> None:
        encoded = orjson.dumps(message)
        self.encoded_bytes += len(encoded)
        est = content_bytes(message.get("content"))
        calls = message.get("tool_calls")
        if calls:
            # The calls' JSON is a slice of the message's encoding, but measured on its own so the
            # estimate is the documented one (content + JSON of tool_calls).
            calls_json = orjson.dumps(calls)
            self.encoded_bytes += len(calls_json)
            est += len(calls_json)
        self._objects.append(message)
        self._encoded.append(encoded)
        self._estimate_bytes.append(est)
        self._sum_encoded += len(encoded)
        self._sum_estimate += est

    @property
    def count(self) -> int:
        return len(self._objects)

    @property
    def estimate_tokens(self) -> int:
        return tokens_for_bytes(self._sum_estimate, self.budget)

    @property
    def body_bytes(self) -> int:
        """Exact size of the body ``encode_request`` would produce for the synced messages."""
        separators = max(0, len(self._encoded) - 1)
        return self._envelope_bytes + self._sum_encoded + separators

    def message_sizes(self) -> tuple[list[int], list[int]]:
        """Per-message (estimate bytes, encoded bytes) of the synced messages."""
        return list(self._estimate_bytes), [len(b) for b in self._encoded]

    def encoded(self) -> EncodedRequest:
        """The request and its exact body, joined from the cached encodings (no re-encoding)."""
        body = _MESSAGES_PREFIX + b",".join(self._encoded) + self._suffix
        env = self._envelope
        request = LlmTurnRequest(list(self._objects), env.tools, env.model, env.params, env.purpose)
        return EncodedRequest(request, body)


def body_bytes_for(envelope_bytes: int, encoded_sizes: list[int]) -> int:
    """Body size from the empty-envelope size and per-message encoded sizes (comma separators)."""
    return envelope_bytes + sum(encoded_sizes) + max(0, len(encoded_sizes) - 1)
