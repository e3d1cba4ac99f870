"""Large tool output written straight to the daemon's sidecar store by `hopline agent` (SPEC S-3).

Under the daemon on the same machine the agent's environment carries ``HOPLINE_SIDECAR_DIR`` and a
per-session ``HOPLINE_SIDECAR_WRITE_TOKEN`` (:mod:`hopline.sidecars.writer`). Then every
``tool_call`` / ``tool_call_update`` field the daemon's projection would move (``content[i].text``,
a string ``rawOutput``, a non-string ``rawOutput`` whose compact JSON is over the threshold) is
stored here first, and only the stub travels: the same preview text, the same non-string stub and
the same ``_meta["hopline.sidecar"]`` entries as the projection makes, so clients see one format
and the daemon's projection finds nothing left to move. A refused write (quota, disk, revoked
token) gives the projection's fallback: the preview stays, the entry says ``"truncated": true``
with the reason; the update is never dropped.

Without those variables the agent sends output inline and the daemon projects it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import Any

import orjson

from hopline.budget import Budget
from hopline.sidecars.projection import (
    JSON_MEDIA_TYPE,
    META_KEY,
    STUB_KEY,
    STUB_TRUNCATED_KEY,
    TEXT_MEDIA_TYPE,
    TOOL_UPDATE_KINDS,
    preview_text,
)
from hopline.sidecars.store import REASON_DISK_ERROR
from hopline.sidecars.writer import SidecarWriter, SidecarWriterError

log = logging.getLogger("hopline.agent.sidecars")

META_TOOL = "hopline.tool"
PROVENANCE_BUILTIN = "builtin"


def tool_meta(name: str) -> dict[str, str]:
    """``_meta["hopline.tool"]``: the large-frame observer attributes ``toolName`` from it (O-5)."""
    return {"name": name, "provenance": PROVENANCE_BUILTIN}


def writer_from_env(budget: Budget, environ: Mapping[str, str]) -> SidecarWriter | None:
    """The writer when the daemon handed us a store and a token; ``None`` means send inline.

    A set but unusable store or token is logged as an error (without the path or the token) and
    the agent goes on inline: the daemon's projection still moves the output.
    """
    try:
        return SidecarWriter.from_env(budget, environ)
    except (SidecarWriterError, OSError) as exc:
        log.error("sidecar writer unavailable; tool output goes inline",
                  extra={"error": type(exc).__name__})
        return None


def _utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: sized as the projection sizes them
        return text.encode("utf-8", "replace")


def _text_over(value: Any, threshold: int) -> bytes | None:
    if not isinstance(value, str) or len(value) * 4 <= threshold:  # at most 4 bytes per character
        return None
    data = _utf8(value)
    return data if len(data) > threshold else None


def _json_over(value: Any, threshold: int) -> bytes | None:
    if not isinstance(value, (dict, list)):
        return None
    try:
        data = orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError):  # left as it is, like the projection does
        return None
    return data if len(data) > threshold else None


def _text_blocks(update: Mapping[str, Any]) -> list[tuple[int, dict[str, Any], dict[str, Any]]]:
    """(index, content item, its text block) for each ``content[]`` text item."""
    content = update.get("content")
    found: list[tuple[int, dict[str, Any], dict[str, Any]]] = []
    if not isinstance(content, list):
        return found
    for index, item in enumerate(content):
        if isinstance(item, dict) and item.get("type") == "content":
            block = item.get("content")
            if isinstance(block, dict) and block.get("type") == "text":
                found.append((index, item, block))
    return found


def needs_offload(update: Mapping[str, Any], budget: Budget) -> bool:
    """Cheap check (no I/O): does this update carry a field over the sidecar threshold?"""
    if update.get("sessionUpdate") not in TOOL_UPDATE_KINDS:
        return False
    threshold = budget.sidecar_threshold_bytes
    if any(_text_over(block.get("text"), threshold) is not None for _, _, block in _text_blocks(update)):
        return True
    raw = update.get("rawOutput")
    return _text_over(raw, threshold) is not None or _json_over(raw, threshold) is not None


class _Fields:
    """Stores the fields of one update through the writer and collects their ``_meta`` entries."""

    def __init__(self, writer: SidecarWriter, budget: Budget) -> None:
        self.writer = writer
        self.budget = budget
        self.entries: list[dict[str, Any]] = []

    def _write(self, data: bytes, media_type: str, field: str) -> dict[str, Any]:
        try:
            entry = self.writer.write(data, media_type, field=field)
        except Exception as exc:  # a failing disk or database: the update still goes out
            log.warning("sidecar write failed", extra={"error": type(exc).__name__})
            with contextlib.suppress(Exception):  # stats only
                self.writer.store.count_fallback(REASON_DISK_ERROR)
            entry = {"field": field, "truncated": True, "reason": REASON_DISK_ERROR, "bytes": len(data),
                     "mediaType": media_type}
        if entry.get("truncated"):
            log.warning("sidecar refused; truncated preview sent", extra={"reason": entry.get("reason")})
        self.entries.append(entry)
        return entry

    def _preview(self, data: bytes, entry: Mapping[str, Any]) -> str:
        return preview_text(data, self.budget.sidecar_preview_bytes, entry.get("id"), entry.get("reason"))

    def text(self, data: bytes, field: str) -> str:
        return self._preview(data, self._write(data, TEXT_MEDIA_TYPE, field))

    def json(self, data: bytes, field: str) -> dict[str, Any]:
        entry = self._write(data, JSON_MEDIA_TYPE, field)
        preview = self._preview(data, entry)
        if entry.get("id") is not None:
            return {STUB_KEY: entry["id"], "bytes": len(data), "preview": preview}
        return {STUB_TRUNCATED_KEY: True, "reason": entry.get("reason"), "bytes": len(data),
                "preview": preview}


def offload_update(update: dict[str, Any], writer: SidecarWriter, budget: Budget) -> dict[str, Any]:
    """The update with every field over the threshold stored as a sidecar and replaced by its stub.

    Blocking (file write, fsync, SQLite): call it through ``asyncio.to_thread``. Never mutates
    ``update``; returns it unchanged when nothing is over the threshold. Existing
    ``_meta["hopline.sidecar"]`` entries are kept, new ones appended.
    """
    if update.get("sessionUpdate") not in TOOL_UPDATE_KINDS:
        return update
    threshold = budget.sidecar_threshold_bytes
    fields = _Fields(writer, budget)
    changes: dict[str, Any] = {}

    blocks = _text_blocks(update)
    new_content: list[Any] | None = None
    for index, item, block in blocks:
        data = _text_over(block.get("text"), threshold)
        if data is None:
            continue
        if new_content is None:
            new_content = list(update["content"])
        preview = fields.text(data, f"content[{index}].text")
        new_content[index] = {**item, "content": {**block, "text": preview}}
    if new_content is not None:
        changes["content"] = new_content

    raw = update.get("rawOutput")
    text = _text_over(raw, threshold)
    if text is not None:
        changes["rawOutput"] = fields.text(text, "rawOutput")
    else:
        encoded = _json_over(raw, threshold)
        if encoded is not None:
            changes["rawOutput"] = fields.json(encoded, "rawOutput")

    if not changes:
        return update
    meta = update.get("_meta")
    meta = dict(meta) if isinstance(meta, dict) else {}
    previous = meta.get(META_KEY)
    meta[META_KEY] = (list(previous) if isinstance(previous, list) else []) + fields.entries
    return {**update, **changes, "_meta": meta}
