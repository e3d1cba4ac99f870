"""Typed daemon events, as the SSE stream of ``GET /session/{id}/events`` delivers them."""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson

from hopline.budget import HOP_CLIENT_SSE
from hopline.vocabulary import (
    META_SIDECAR,
    SESSION_UPDATE,
    TURN_END_TYPES,
)
from hopline.wire.sse import SseMessage

# Event types the daemon emits with an id (journaled) and without one (synthetic, SPEC D-3).


@dataclasses.dataclass(frozen=True)
class SidecarRef:
    """One ``_meta["hopline.sidecar"]`` entry: a field moved off the wire, or a truncated one.

    ``field`` is the JSON path (dotted), ``path`` the same as keys and indices; ``lost_bytes`` is
    what a truncated field lost; ``items`` / ``items_shown`` count an array and its preview."""

    field: str
    bytes: int
    id: str | None = None
    sha256: str | None = None
    media_type: str | None = None
    truncated: bool = False
    reason: str | None = None
    path: tuple[str | int, ...] = ()
    lost_bytes: int = 0
    items: int | None = None
    items_shown: int | None = None

    @classmethod
    def from_json(cls, entry: dict[str, Any]) -> SidecarRef:
        path = entry.get("path")
        return cls(
            field=str(entry.get("field", "")),
            bytes=int(entry.get("bytes") or 0),
            id=entry.get("id"),
            sha256=entry.get("sha256"),
            media_type=entry.get("mediaType"),
            truncated=bool(entry.get("truncated", False)),
            reason=entry.get("reason"),
            path=tuple(p for p in path if isinstance(p, (str, int))) if isinstance(path, list) else (),
            lost_bytes=int(entry.get("lostBytes") or 0),
            items=entry.get("items") if isinstance(entry.get("items"), int) else None,
            items_shown=entry.get("itemsShown") if isinstance(entry.get("itemsShown"), int) else None,
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

    @property
    def lost_bytes(self) -> int:
        """Bytes this event says could not be delivered (D-8): an update's, or a whole turn's."""
        value = self.data.get("lostBytes")
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0

    def message_text(self) -> str:
        """The text of an ``agent_message_chunk`` update ("" otherwise)."""
        if self.update_kind != "agent_message_chunk":
            return ""
        return content_text(self.update.get("content"))

    def sidecars(self) -> list[SidecarRef]:
        """The sidecar entries of a ``session_update`` (any update kind, S-4)."""
        meta = self.update.get("_meta")
        if not isinstance(meta, dict):
            return []
        entries = meta.get(META_SIDECAR)
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


def to_event(message: SseMessage) -> Event:
    """An SSE message as a typed event; an undecodable one becomes ``invalid_event`` (no payload)."""
    event_id: int | None = None
    if message.id is not None and message.id.strip().isdigit():
        event_id = int(message.id)
    try:
        data = orjson.loads(message.data)
    except orjson.JSONDecodeError:
        return Event(event_id, "invalid_event",
                     {"hop": HOP_CLIENT_SSE, "event": message.event[:128], "bytes": message.size,
                      "error": "data is not JSON"}, message.size)
    if not isinstance(data, dict):
        data = {"value": data}
    return Event(event_id, message.event, data, message.size)
