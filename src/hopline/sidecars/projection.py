"""Projection (SPEC S-1): large tool output in an ACP update moves to a sidecar, a preview stays.

The daemon calls :func:`project_message` (or :func:`project_update` on ``params.update``) on every
inbound frame before it journals, rings or publishes it, so live updates, the journal, the ring
and replays all carry the same small update.

What moves, in ``tool_call`` / ``tool_call_update`` updates only:

* each ``content[i]`` of shape ``{"type": "content", "content": {"type": "text", "text": str}}``
  whose text is over ``budget.sidecar_threshold_bytes`` in UTF-8 (field ``content[i].text``);
* a string ``rawOutput`` over the threshold (field ``rawOutput``);
* a non-string ``rawOutput`` whose compact JSON is over it (field ``rawOutput``, stored as
  ``application/json``, replaced on the wire by ``{"hopline.sidecar": id, "bytes", "preview"}``).

Texts keep a head and a tail (together at most ``budget.sidecar_preview_bytes``, cut on UTF-8
character boundaries) around a marker naming the sidecar, so a client that ignores ``_meta``
still reads something sensible. ``_meta["hopline.sidecar"]`` lists one entry per moved field.
When the store refuses (quota, disk), the update still goes out with the preview and the entry
says ``"truncated": true`` with the reason (S-2: an update is never silently dropped).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import orjson

from hopline.budget import Budget
from hopline.sidecars.store import REASON_DISK_ERROR, SidecarRefused, SidecarStore

log = logging.getLogger("hopline.sidecars")

META_KEY = "hopline.sidecar"
STUB_KEY = "hopline.sidecar"
STUB_TRUNCATED_KEY = "hopline.truncated"
TOOL_UPDATE_KINDS = frozenset({"tool_call", "tool_call_update"})
TEXT_MEDIA_TYPE = "text/plain; charset=utf-8"
JSON_MEDIA_TYPE = "application/json"
LOAD_REPLAY_META_KEYS = ("hopline.session.loadReplay", "qwen.session.loadReplay")


# --- previews (pure) ------------------------------------------------------------------------


def utf8_head(data: bytes, limit: int) -> str:
    """At most ``limit`` leading bytes of ``data``, never splitting a character."""
    return data[:max(limit, 0)].decode("utf-8", "ignore")


def utf8_tail(data: bytes, limit: int) -> str:
    """At most ``limit`` trailing bytes of ``data``, never splitting a character."""
    if limit <= 0:
        return ""
    return data[-limit:].decode("utf-8", "ignore")


def sidecar_marker(total: int, shown: int, sidecar_id: str | None, reason: str | None = None) -> str:
    if sidecar_id is not None:
        return f"\n… [hopline: {total} bytes in sidecar {sidecar_id}; {shown} shown] …\n"
    return f"\n… [hopline: {total} bytes, truncated ({reason}); {shown} shown] …\n"


def preview_text(data: bytes, preview_bytes: int, sidecar_id: str | None, reason: str | None = None) -> str:
    """Head + marker + tail; head and tail together are at most ``preview_bytes`` bytes."""
    head_limit = preview_bytes // 2
    head = utf8_head(data, head_limit)
    tail = utf8_tail(data, preview_bytes - head_limit)
    shown = len(head.encode("utf-8")) + len(tail.encode("utf-8"))
    return head + sidecar_marker(len(data), shown, sidecar_id, reason) + tail


def _utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates from a lenient JSON parser
        return text.encode("utf-8", "replace")


def _compact_json(value: Any) -> bytes | None:
    try:
        return orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError):  # e.g. an integer over 64 bits: left as it is
        return None


# --- one field ------------------------------------------------------------------------------


class _Offloader:
    """Moves fields of one update to the store and collects their ``_meta`` entries."""

    def __init__(self, session_id: str, store: SidecarStore, budget: Budget) -> None:
        self.session_id = session_id
        self.store = store
        self.budget = budget
        self.entries: list[dict[str, Any]] = []
        self.kept_off_wire = 0

    def _store(self, data: bytes, media_type: str, field: str) -> tuple[str | None, str | None]:
        """(sidecar id, None) when stored, (None, reason) when refused; records the meta entry."""
        try:
            entry = self.store.put(self.session_id, data, media_type)
        except SidecarRefused as refused:
            reason = refused.reason
        except Exception as exc:  # never raise on the inbound path; the update still goes out
            log.warning("sidecar store failed", extra={"error": type(exc).__name__})
            self.store.count_fallback(REASON_DISK_ERROR)
            reason = REASON_DISK_ERROR
        else:
            self.entries.append(entry.meta(field))
            return entry.id, None
        self.entries.append({"field": field, "truncated": True, "reason": reason, "bytes": len(data),
                             "mediaType": media_type})
        return None, reason

    def text(self, data: bytes, field: str) -> str:
        sidecar_id, reason = self._store(data, TEXT_MEDIA_TYPE, field)
        preview = preview_text(data, self.budget.sidecar_preview_bytes, sidecar_id, reason)
        if sidecar_id is not None:
            self.kept_off_wire += len(data) - len(_utf8(preview))
        return preview

    def json(self, data: bytes, field: str) -> dict[str, Any]:
        sidecar_id, reason = self._store(data, JSON_MEDIA_TYPE, field)
        preview = preview_text(data, self.budget.sidecar_preview_bytes, sidecar_id, reason)
        stub: dict[str, Any]
        if sidecar_id is not None:
            stub = {STUB_KEY: sidecar_id, "bytes": len(data), "preview": preview}
            self.kept_off_wire += len(data) - len(orjson.dumps(stub))
        else:
            stub = {STUB_TRUNCATED_KEY: True, "reason": reason, "bytes": len(data), "preview": preview}
        return stub


# --- updates and messages -------------------------------------------------------------------


def _text_over(value: Any, threshold: int) -> bytes | None:
    """The UTF-8 bytes of ``value`` if it is a string over ``threshold`` bytes, else None."""
    if not isinstance(value, str) or len(value) * 4 <= threshold:  # at most 4 bytes per character
        return None
    data = _utf8(value)
    return data if len(data) > threshold else None


def _is_tool_update(update: Any) -> bool:
    if not isinstance(update, dict):
        return False
    kind = update.get("sessionUpdate")
    return isinstance(kind, str) and kind in TOOL_UPDATE_KINDS


def project_update(update: Any, session_id: str, store: SidecarStore, budget: Budget) -> Any:
    """The update with large tool output moved to sidecars; the same object when nothing moves.

    Never mutates ``update``; never raises on odd shapes (they pass through unchanged).
    """
    if not _is_tool_update(update):
        return update
    threshold = budget.sidecar_threshold_bytes
    offloader = _Offloader(session_id, store, budget)
    projected: dict[str, Any] | None = None

    content = update.get("content")
    if isinstance(content, list):
        new_content: list[Any] | None = None
        for index, item in enumerate(content):
            if not isinstance(item, dict) or item.get("type") != "content":
                continue
            block = item.get("content")
            if not isinstance(block, dict) or block.get("type") != "text":
                continue
            data = _text_over(block.get("text"), threshold)
            if data is None:
                continue
            if new_content is None:
                new_content = list(content)
            preview = offloader.text(data, f"content[{index}].text")
            new_content[index] = {**item, "content": {**block, "text": preview}}
        if new_content is not None:
            projected = {**update, "content": new_content}

    if "rawOutput" in update:
        raw = update["rawOutput"]
        replacement: Any = None
        moved = False
        if isinstance(raw, str):
            data = _text_over(raw, threshold)
            if data is not None:
                replacement, moved = offloader.text(data, "rawOutput"), True
        elif isinstance(raw, (dict, list)):
            encoded = _compact_json(raw)
            if encoded is not None and len(encoded) > threshold:
                replacement, moved = offloader.json(encoded, "rawOutput"), True
        if moved:
            projected = {**(projected or update), "rawOutput": replacement}

    if projected is None:
        return update
    meta = update.get("_meta")
    meta = dict(meta) if isinstance(meta, dict) else {}
    previous = meta.get(META_KEY)
    meta[META_KEY] = (list(previous) if isinstance(previous, list) else []) + offloader.entries
    projected["_meta"] = meta
    if offloader.kept_off_wire > 0:
        with contextlib.suppress(Exception):  # stats only
            store.count_kept_off_wire(offloader.kept_off_wire)
    return projected


def _project_entries(entries: list[Any], project: Callable[[Any], Any]) -> list[Any] | None:
    """A replayed entry is an update or a ``session/update`` params object around one."""
    out: list[Any] | None = None
    for index, entry in enumerate(entries):
        if isinstance(entry, dict) and "sessionUpdate" not in entry and isinstance(entry.get("update"), dict):
            inner = project(entry["update"])
            new = entry if inner is entry["update"] else {**entry, "update": inner}
        else:
            new = project(entry)
        if new is not entry:
            if out is None:
                out = list(entries)
            out[index] = new
    return out


def project_message(message: Any, session_id: str, store: SidecarStore, budget: Budget) -> Any:
    """Project one inbound JSON-RPC message (child -> daemon); the same object when nothing moves.

    Covers ``session/update`` notifications (``params.update``), bulk replay responses
    (``result._meta["hopline.session.loadReplay"].updates``, also ``qwen.``) and load-updates
    pages (``result.updates``). ``session_id`` is the daemon's session (the sidecars' owner).
    """
    if not isinstance(message, dict):
        return message

    def project(update: Any) -> Any:
        return project_update(update, session_id, store, budget)

    params = message.get("params")
    if message.get("method") == "session/update" and isinstance(params, dict):
        update = params.get("update")
        new_update = project(update)
        if new_update is update:
            return message
        return {**message, "params": {**params, "update": new_update}}

    result = message.get("result")
    if not isinstance(result, dict):
        return message
    new_result: dict[str, Any] | None = None
    meta = result.get("_meta")
    if isinstance(meta, dict):
        for key in LOAD_REPLAY_META_KEYS:
            replay = meta.get(key)
            if isinstance(replay, dict) and isinstance(replay.get("updates"), list):
                updates = _project_entries(replay["updates"], project)
                if updates is not None:
                    new_meta = dict((new_result or result)["_meta"])
                    new_meta[key] = {**replay, "updates": updates}
                    new_result = {**(new_result or result), "_meta": new_meta}
    if isinstance(result.get("updates"), list):
        updates = _project_entries(result["updates"], project)
        if updates is not None:
            new_result = {**(new_result or result), "updates": updates}
    if new_result is None:
        return message
    return {**message, "result": new_result}


def needs_projection(message: Any) -> bool:
    """Cheap pre-check: could this message carry tool output? (The daemon may skip the thread hop.)"""
    if not isinstance(message, dict):
        return False
    if message.get("method") == "session/update":
        params = message.get("params")
        update = params.get("update") if isinstance(params, dict) else None
        return _is_tool_update(update)
    result = message.get("result")
    if not isinstance(result, dict):
        return False
    meta = result.get("_meta")
    return isinstance(result.get("updates"), list) or (
        isinstance(meta, dict) and any(key in meta for key in LOAD_REPLAY_META_KEYS))


async def aproject_message(message: Any, session_id: str, store: SidecarStore, budget: Budget) -> Any:
    """:func:`project_message` off the event loop (the store writes and fsyncs files)."""
    if not needs_projection(message):
        return message
    return await asyncio.to_thread(project_message, message, session_id, store, budget)


def sidecar_projector(store: SidecarStore, budget: Budget,
                      then: Callable[[str, dict[str, Any]], dict[str, Any]] | None = None,
                      ) -> Callable[[str, dict[str, Any]], dict[str, Any]]:
    """The daemon's ``InboundProjector`` ``(session id, update) -> update`` backed by the store.

    ``then`` runs on the projected update (e.g. the daemon's ``oversize_replacement(budget)``, which
    still guards the SSE event limit for anything a sidecar does not cover).
    """

    def project(session_id: str, update: dict[str, Any]) -> dict[str, Any]:
        projected: dict[str, Any] = project_update(update, session_id, store, budget)
        return then(session_id, projected) if then is not None else projected

    return project
