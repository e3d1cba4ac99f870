"""llm-turn bodies of an exact byte size, encoded by the harness's one encoder."""

from __future__ import annotations

from collections.abc import Iterator

from hopline.harness.model import LlmTurnRequest, encode_request


def body_of_size(size: int) -> bytes:
    """A valid llm-turn JSON body of exactly ``size`` bytes (a user message padded with ASCII)."""
    empty = len(encode_request(_request("")).body)
    if size < empty:
        raise ValueError(f"the smallest body is {empty} bytes")
    body = encode_request(_request("x" * (size - empty))).body
    assert len(body) == size
    return body


def _request(content: str) -> LlmTurnRequest:
    return LlmTurnRequest(messages=[{"role": "system", "content": "be brief"},
                                    {"role": "user", "content": content}])


def chunks(body: bytes, size: int = 16 * 1024) -> Iterator[bytes]:
    """The body as a generator: httpx sends it with Transfer-Encoding: chunked."""
    for start in range(0, len(body), size):
        yield body[start:start + size]
