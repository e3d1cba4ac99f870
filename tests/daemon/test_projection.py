"""The default inbound projection: an update that would make an SSE event over the limit is stubbed."""

from __future__ import annotations

import orjson

from hopline.budget import Budget
from hopline.daemon.projection import oversize_replacement

EVENT_ENVELOPE_BYTES = Budget.defaults().sse_event_envelope_bytes


def _update(text_bytes: int) -> dict[str, object]:
    return {"sessionUpdate": "tool_call_update", "toolCallId": "c1", "status": "completed",
            "content": [{"type": "content", "content": {"type": "text", "text": "t" * text_bytes}}]}


def test_at_the_limit_passes_one_byte_over_is_stubbed() -> None:
    limit = 64 * 1024
    budget = Budget.defaults().replace(sse_max_event_bytes=limit, client_sse_max_event_bytes=limit,
                                       sidecar_threshold_bytes=1024)
    project = oversize_replacement(budget)
    overhead = len(orjson.dumps(_update(0)))
    fits = _update(limit - EVENT_ENVELOPE_BYTES - overhead)
    assert len(orjson.dumps(fits)) + EVENT_ENVELOPE_BYTES == limit
    assert project("s", fits) is fits
    over = _update(limit - EVENT_ENVELOPE_BYTES - overhead + 1)
    stub = project("s", over)
    assert stub["toolCallId"] == "c1" and stub["status"] == "completed"
    dropped = stub["_meta"]["hopline.dropped"]
    size = len(orjson.dumps(over))
    assert dropped == {"bytes": size, "hop": "daemon.sse", "setting": "HOPLINE_SSE_MAX_EVENT_BYTES",
                       "limit": limit, "observed": size, "unit": "bytes", "reason": "sse_max_event_bytes",
                       "lostBytes": size}
    assert str(limit) in stub["content"][0]["content"]["text"]
    assert len(orjson.dumps(stub)) < 1024


def test_message_chunks_keep_their_kind() -> None:
    budget = Budget.defaults().replace(sse_max_event_bytes=4096, client_sse_max_event_bytes=4096,
                                       sidecar_threshold_bytes=1024)
    stub = oversize_replacement(budget)("s", {"sessionUpdate": "agent_message_chunk",
                                              "content": {"type": "text", "text": "m" * 8192}})
    assert stub["sessionUpdate"] == "agent_message_chunk" and stub["content"]["type"] == "text"
