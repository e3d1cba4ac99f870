"""Frame generator: ACP ``session/update`` NDJSON frames of an exact size, and large replay frames.

The relay frames are ``agent_message_chunk`` updates: sidecars only move ``tool_call`` /
``tool_call_update`` output, so these bytes really cross every hop.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

BENCH_SESSION_ID = "bench-session-0001"
_FILL = (b"The quick brown fox jumps over the lazy dog 0123456789. " * 64)


def _filler(n: int, seed: int = 0) -> str:
    if n <= 0:
        return ""
    start = seed % 50
    reps = (n + start) // len(_FILL) + 1
    return (_FILL * reps)[start:start + n].decode("ascii")


def message_chunk(text: str, session_id: str = BENCH_SESSION_ID) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": "session/update",
            "params": {"sessionId": session_id,
                       "update": {"sessionUpdate": "agent_message_chunk",
                                  "content": {"type": "text", "text": text}}}}


def message_chunk_line(frame_bytes: int, seed: int = 0, session_id: str = BENCH_SESSION_ID) -> bytes:
    """One NDJSON line (with ``\\n``) whose frame, without the newline, is exactly ``frame_bytes``."""
    overhead = len(orjson.dumps(message_chunk("", session_id)))
    line = orjson.dumps(message_chunk(_filler(frame_bytes - overhead, seed), session_id))
    assert len(line) == frame_bytes, (len(line), frame_bytes)
    return line + b"\n"


def write_stream(path: Path, frame_bytes: int, count: int, session_id: str = BENCH_SESSION_ID) -> int:
    """Write ``count`` frames of ``frame_bytes`` to ``path``; return the file's size in bytes."""
    with open(path, "wb") as out:
        for i in range(count):
            out.write(message_chunk_line(frame_bytes, i, session_id))
    return path.stat().st_size


def frame_count(frame_bytes: int, total_bytes: int, max_frames: int) -> int:
    """Frames of one size for a run: bounded by total bytes and by count, at least 2."""
    return max(2, min(max_frames, total_bytes // frame_bytes))


def tool_call_update(output_bytes: int, index: int, session_id: str = BENCH_SESSION_ID) -> dict[str, Any]:
    """A finished ``tool_call_update`` notification whose text content is ``output_bytes`` long."""
    return {"jsonrpc": "2.0", "method": "session/update",
            "params": {"sessionId": session_id,
                       "update": {"sessionUpdate": "tool_call_update", "toolCallId": f"call-{index}",
                                  "status": "completed", "kind": "execute",
                                  "content": [{"type": "content",
                                               "content": {"type": "text",
                                                           "text": _filler(output_bytes, index)}}]}}}


def bulk_replay_response(updates: int, frame_bytes: int, session_id: str = BENCH_SESSION_ID) -> bytes:
    """A ``session/load`` bulk-replay response of ``updates`` updates, about ``frame_bytes`` in all."""
    def item(text: str) -> dict[str, Any]:
        return {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}

    def frame(items: list[dict[str, Any]]) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "id": 7,
                "result": {"_meta": {"hopline.session.loadReplay": {"v": 1, "updates": items}}}}

    envelope = len(orjson.dumps(frame([])))
    per_item = len(orjson.dumps(item(""))) + 1  # and its comma
    text = _filler(max(1, (frame_bytes - envelope) // updates - per_item))
    return orjson.dumps(frame([item(text) for _ in range(updates)]))
