"""Typed daemon events, as the SSE stream of ``GET /session/{id}/events`` delivers them."""

from __future__ import annotations

import dataclasses
from typing import Any

# Event types the daemon emits with an id (journaled) and without one (synthetic, SPEC D-3).
SESSION_UPDATE = "session_update"
PROGRESS = "progress"
COMPACTION = "compaction"
TURN_COMPLETE = "turn_complete"
TURN_ERROR = "turn_error"
PERMISSION_REQUEST = "permission_request"
SYNTHETIC_TYPES = frozenset({
    "replay_complete", "slow_client_warning", "client_evicted", "state_resync_required",
    "stream_error", "frame_dropped",
})
TURN_END_TYPES = frozenset({TURN_COMPLETE, TURN_ERROR})
SIDECAR_META_KEY = "hopline.sidecar"


@dataclasses.dataclass(frozen=True)
class SidecarRef:
    """One ``_meta["hopline.sidecar"]`` entry: a field moved off the wire, or a truncated one."""

    field: str
    bytes: int
    id: str | None = None
    sha256: str | None = None
    media_type: str | None = None
    truncated: bool = False
    reason: str | None = None

    @classmethod
    def from_json(cls, entry: dict[str, Any]) -> SidecarRef:
        return cls(
            field=str(entry.get("field", "")),
            bytes=int(entry.get("bytes") or 0),
            id=entry.get("id"),
            sha256=entry.get("sha256"),
            media_type=entry.get("mediaType"),
            truncated=bool(entry.get("truncated", False)),
            reason=entry.get("reason"),
        )

    @property
    def resolvable(self) -> bool:
        return self.id is not None and self.sha256 is not None and not self.truncated


@dataclasses.dataclass(frozen=True)
class Event:
    """One event: ``id`` is None for synthetic events; ``size`` is its bytes on the SSE wire."""

    id: int | None
    type: str
    data: dict[str, Any]
    size: int = 0

    @property
    def synthetic(self) -> bool:
        return self.id is None

    @property
    def prompt_id(self) -> str | None:
        value = self.data.get("promptId")
        return value if isinstance(value, str) else None

    @property
    def update(self) -> dict[str, Any]:
        """The ACP update of a ``session_update`` event (empty for other types)."""
        update = self.data.get("update") if self.type == SESSION_UPDATE else None
        return update if isinstance(update, dict) else {}

    @property
    def update_kind(self) -> str | None:
        kind = self.update.get("sessionUpdate")
        return kind if isinstance(kind, str) else None

    @property
    def is_turn_end(self) -> bool:
        return self.type in TURN_END_TYPES

    def message_text(self) -> str:
        """The text of an ``agent_message_chunk`` update ("" otherwise)."""
        if self.update_kind != "agent_message_chunk":
            return ""
        return content_text(self.update.get("content"))

    def sidecars(self) -> list[SidecarRef]:
        """The sidecar entries of a ``tool_call`` / ``tool_call_update`` update."""
        meta = self.update.get("_meta")
        if not isinstance(meta, dict):
            return []
        entries = meta.get(SIDECAR_META_KEY)
        if isinstance(entries, dict):
            entries = [entries]
        if not isinstance(entries, list):
            return []
        return [SidecarRef.from_json(e) for e in entries if isinstance(e, dict)]

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "type": self.type, "data": self.data}


def content_text(content: Any) -> str:
    """Text of an ACP content block, a list of blocks or a tool-call content entry."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(content_text(c) for c in content)
    if isinstance(content, dict):
        if content.get("type") == "text" and isinstance(content.get("text"), str):
            return str(content["text"])
        if content.get("type") == "content":  # tool-call content wraps a content block
            return content_text(content.get("content"))
    return ""
