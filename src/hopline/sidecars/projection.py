"""Projection (SPEC S-1, S-4): a large ``session/update`` of any kind keeps a preview on the wire, its
largest fields move to sidecars. One implementation, used by the daemon (backed by its store:
:func:`~.store_projection.project_update`) and by hopline's own agent (backed by its
:class:`~.writer.SidecarWriter`).

When an update's compact JSON is over ``budget.sidecar_threshold_bytes``, fields are moved, largest
first, until the projected update fits under the threshold:

* the fields its kind names: ``content.text`` of ``agent_message_chunk``, ``agent_thought_chunk`` and
  ``user_message_chunk``; each text ``content[i].content.text`` and ``rawOutput`` of ``tool_call`` /
  ``tool_call_update``; ``entries`` of ``plan``; ``availableCommands`` of
  ``available_commands_update``;
* then (any kind, unknown ones included) its largest string or array field anywhere in the update,
  then its largest object field. A ``rawOutput`` object is not moved whole: its large members are.

Only fields over ``budget.sidecar_preview_bytes`` move; numbers, booleans, nulls and small fields
stay where they are, so a client reads ``rawOutput.exitCode`` without the sidecar (shapes kept).

What stays on the wire keeps the field's JSON type: a string becomes a head and a tail (together at
most ``budget.sidecar_preview_bytes``, cut on UTF-8 boundaries) around a marker naming the sidecar;
an array keeps its first items that fit the preview bytes; an object becomes
``{"hopline.sidecar": id, "bytes", "preview"}``. ``_meta["hopline.sidecar"]`` lists one entry per
moved field: ``field`` (the JSON path, dotted), ``path`` (the same path as a list of keys and
indices), ``id``, ``bytes``, ``sha256``, ``mediaType`` (``text/plain; charset=utf-8`` for strings,
``application/json`` for the rest), and ``items`` / ``itemsShown`` for arrays. Setting each
resolved value at its ``path``, last entry first, gives back the original update exactly
(:func:`restore_update`).

When the store refuses (quota, disk, a revoked token), the preview still goes out and the entry says
``"truncated": true`` with the ``reason`` and ``lostBytes``: the bytes of the field the preview does
not carry (S-2, D-8: an update is never silently dropped).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import orjson

from hopline.budget import Budget
from hopline.errors import InputError
from hopline.sidecars.entry import REASON_DISK_ERROR, SidecarEntry, SidecarRefused
from hopline.vocabulary import META_SIDECAR, META_TRUNCATED

log = logging.getLogger("hopline.sidecars")

TOOL_UPDATE_KINDS = frozenset({"tool_call", "tool_call_update"})
MESSAGE_UPDATE_KINDS = frozenset({"agent_message_chunk", "agent_thought_chunk", "user_message_chunk"})
TEXT_MEDIA_TYPE = "text/plain; charset=utf-8"
JSON_MEDIA_TYPE = "application/json"
# Bound of the field walk (like the large-frame observer's, O-6): nodes deeper than this are sized
# as a whole with their ancestor, never one by one. Work bound, not a payload ceiling.
MAX_FIELD_DEPTH = 32
# A sidecar id as minted by the store (32 characters): sizes a preview before the id exists.
_ID_PLACEHOLDER = "i" * 32

JsonPath = tuple[str | int, ...]


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


def _head_and_tail(data: bytes, preview_bytes: int) -> tuple[str, str]:
    head_limit = preview_bytes // 2
    return utf8_head(data, head_limit), utf8_tail(data, preview_bytes - head_limit)


def preview_text(data: bytes, preview_bytes: int, sidecar_id: str | None, reason: str | None = None) -> str:
    """Head + marker + tail; head and tail together are at most ``preview_bytes`` bytes."""
    head, tail = _head_and_tail(data, preview_bytes)
    shown = len(head.encode("utf-8")) + len(tail.encode("utf-8"))
    return head + sidecar_marker(len(data), shown, sidecar_id, reason) + tail


def preview_items(items: Sequence[Any], preview_bytes: int) -> list[Any]:
    """The leading items of an array whose compact JSON together fits in ``preview_bytes``."""
    kept: list[Any] = []
    used = 2  # the brackets
    for item in items:
        size = _encoded_size(item)
        if size is None or used + size + (1 if kept else 0) > preview_bytes:
            break
        used += size + (1 if kept else 0)
        kept.append(item)
    return kept


def _utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates from a lenient JSON parser
        return text.encode("utf-8", "replace")


def _encoded_size(value: Any) -> int | None:
    try:
        return len(orjson.dumps(value))
    except (TypeError, orjson.JSONEncodeError):  # e.g. an integer over 64 bits: left as it is
        return None


def field_name(path: JsonPath) -> str:
    """``("content", 0, "content", "text")`` -> ``content[0].content.text``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


# --- paths (pure) ---------------------------------------------------------------------------


def value_at(obj: Any, path: JsonPath) -> Any:
    for part in path:
        obj = obj[part]
    return obj


def with_value_at(obj: Any, path: JsonPath, value: Any) -> Any:
    """A copy of ``obj`` with ``value`` at ``path``; only the containers along the path are copied."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    copy: Any = list(obj) if isinstance(obj, list) else dict(obj)
    copy[head] = with_value_at(obj[head], rest, value)
    return copy


def _is_under(path: JsonPath, prefix: JsonPath) -> bool:
    return len(path) >= len(prefix) and path[:len(prefix)] == prefix


def _protected(path: JsonPath) -> bool:
    """Never moved: the update's kind and our own sidecar entries (``_meta`` itself neither)."""
    return path in (("sessionUpdate",), ("_meta",)) or _is_under(path, ("_meta", META_SIDECAR))


def _kind_fields(update: dict[str, Any]) -> list[JsonPath]:
    """The fields the update's kind names (S-4), whatever their size."""
    kind = update.get("sessionUpdate")
    paths: list[JsonPath] = []
    if kind in MESSAGE_UPDATE_KINDS:
        content = update.get("content")
        if isinstance(content, dict) and isinstance(content.get("text"), str):
            paths.append(("content", "text"))
    elif kind in TOOL_UPDATE_KINDS:
        content = update.get("content")
        if isinstance(content, list):
            for index, item in enumerate(content):
                if not isinstance(item, dict) or item.get("type") != "content":
                    continue
                block = item.get("content")
                text = block.get("text") if isinstance(block, dict) and block.get("type") == "text" else None
                if isinstance(text, str):
                    paths.append(("content", index, "content", "text"))
        if isinstance(update.get("rawOutput"), (str, list)):  # an object: its large fields move, below
            paths.append(("rawOutput",))
    elif kind == "plan" and isinstance(update.get("entries"), list):
        paths.append(("entries",))
    elif kind == "available_commands_update" and isinstance(update.get("availableCommands"), list):
        paths.append(("availableCommands",))
    return paths


def _walk_fields(update: dict[str, Any]) -> Iterator[tuple[int, JsonPath, Any]]:
    """(encoded size, path, value) of every string, array and object below the root, to
    :data:`MAX_FIELD_DEPTH`; sizes are exact compact-JSON byte counts, computed bottom-up once."""
    found: list[tuple[int, JsonPath, Any]] = []

    def size_of(node: Any, path: JsonPath) -> int:
        if len(path) >= MAX_FIELD_DEPTH or not isinstance(node, (dict, list)):
            size = _encoded_size(node)
            if size is None:
                raise _Unencodable
        elif isinstance(node, dict):
            size = 2 + max(len(node) - 1, 0)
            for key, item in node.items():
                size += len(orjson.dumps(key)) + 1 + size_of(item, (*path, key))
        else:
            size = 2 + max(len(node) - 1, 0)
            for index, item in enumerate(node):
                size += size_of(item, (*path, index))
        if path and isinstance(node, (str, list, dict)):
            found.append((size, path, node))
        return size

    try:
        size_of(update, ())
    except (_Unencodable, TypeError):
        return iter(())
    return iter(found)


class _Unencodable(InputError):
    """An agent's update holds a value JSON cannot encode: it is walked no further."""


# --- the projection -------------------------------------------------------------------------


class SidecarSink(Protocol):
    """Where moved fields go: the daemon's store for one session, or the agent's writer."""

    def put(self, data: bytes, media_type: str) -> SidecarEntry:
        """Store ``data``; raises :class:`~.store.SidecarRefused` when refused."""
        ...

    def count_fallback(self, reason: str) -> None: ...

    def count_kept_off_wire(self, nbytes: int) -> None: ...


@dataclasses.dataclass(frozen=True)
class Projection:
    """The projected update (the same object when nothing moved) and what the projection did."""

    update: Any
    entries: tuple[dict[str, Any], ...] = ()
    lost_bytes: int = 0  # bytes of truncated fields the wire does not carry
    kept_off_wire: int = 0


class _Mover:
    """Moves fields of one update to the sink, keeps its running size and its ``_meta`` entries."""

    def __init__(self, update: dict[str, Any], size: int, sink: SidecarSink, budget: Budget) -> None:
        self.update = update
        self.size = size  # compact JSON bytes of self.update, without the new entries
        self.sink = sink
        self.preview_bytes = budget.sidecar_preview_bytes
        self.threshold = budget.sidecar_threshold_bytes
        self.entries: list[dict[str, Any]] = []
        self.entries_bytes = 0
        self.moved: list[JsonPath] = []
        self.lost = 0
        self.kept_off_wire = 0

    @property
    def fits(self) -> bool:
        # Each entry adds its JSON and a comma; the key and brackets of the list are in the margin
        # of the previews (a few bytes), so the final size is checked once more by the caller.
        return self.size + self.entries_bytes <= self.threshold

    def _replacement(self, value: Any, data: bytes, sidecar_id: str | None,
                     reason: str | None) -> tuple[Any, int]:
        """(what stays on the wire, how many of the field's bytes it carries verbatim)."""
        if isinstance(value, str):
            head, tail = _head_and_tail(data, self.preview_bytes)
            return preview_text(data, self.preview_bytes, sidecar_id, reason), len(_utf8(head + tail))
        if isinstance(value, list):
            kept = preview_items(value, self.preview_bytes)
            return kept, len(orjson.dumps(kept)) if kept else 0
        head, tail = _head_and_tail(data, self.preview_bytes)
        preview = preview_text(data, self.preview_bytes, sidecar_id, reason)
        stub: dict[str, Any]
        if sidecar_id is not None:
            stub = {META_SIDECAR: sidecar_id, "bytes": len(data), "preview": preview}
        else:
            stub = {META_TRUNCATED: True, "reason": reason, "bytes": len(data), "preview": preview}
        return stub, len(_utf8(head + tail))

    def move(self, path: JsonPath) -> None:
        if any(_is_under(path, done) for done in self.moved):
            return  # inside a field already moved: what is there now is a preview
        try:
            value = value_at(self.update, path)
        except (KeyError, IndexError, TypeError):
            return
        try:
            encoded = orjson.dumps(value)
        except (TypeError, orjson.JSONEncodeError):
            return
        old_size = len(encoded)
        if isinstance(value, str):
            data, media = _utf8(value), TEXT_MEDIA_TYPE
        else:
            data, media = encoded, JSON_MEDIA_TYPE
        sized, _ = self._replacement(value, data, _ID_PLACEHOLDER, None)
        if len(orjson.dumps(sized)) >= old_size:
            return  # moving it would not shrink the update
        name = field_name(path)
        sidecar_id: str | None
        reason: str | None
        try:
            entry = self.sink.put(data, media)
        except SidecarRefused as refused:
            sidecar_id, reason = None, refused.reason
        except Exception as exc:  # never raise on the update path; the update still goes out
            log.warning("sidecar store failed", extra={"error": type(exc).__name__})
            with contextlib.suppress(Exception):  # stats only
                self.sink.count_fallback(REASON_DISK_ERROR)
            sidecar_id, reason = None, REASON_DISK_ERROR
        else:
            sidecar_id, reason = entry.id, None
        replacement, shown = self._replacement(value, data, sidecar_id, reason)
        new_size = len(orjson.dumps(replacement))
        meta: dict[str, Any]
        if sidecar_id is not None:
            meta = {**entry.meta(name), "path": list(path)}
            self.kept_off_wire += max(len(data) - new_size, 0)
        else:
            lost = max(len(data) - shown, 0)
            meta = {"field": name, "path": list(path), "truncated": True, "reason": reason,
                    "bytes": len(data), "mediaType": media, "lostBytes": lost}
            self.lost += lost
        if isinstance(value, list):
            meta.update(items=len(value), itemsShown=len(replacement))
        self.update = with_value_at(self.update, path, replacement)
        self.size += new_size - old_size
        self.entries.append(meta)
        self.entries_bytes += len(orjson.dumps(meta)) + 1
        self.moved.append(path)

    def move_largest(self, fields: list[tuple[int, JsonPath, Any]], min_bytes: int = 0) -> None:
        for size, path, _ in sorted(fields, key=lambda f: f[0], reverse=True):
            if self.fits or size <= min_bytes:
                return
            if not _protected(path):
                self.move(path)


def project_fields(update: Any, sink: SidecarSink, budget: Budget) -> Projection:
    """Move the largest fields of ``update`` to ``sink`` until it fits under the sidecar threshold.

    Blocking (the sink writes files): call it off the event loop. Never mutates ``update``, never
    raises on odd shapes (they pass through unchanged). Existing ``_meta["hopline.sidecar"]`` entries
    are kept, new ones appended.
    """
    if not isinstance(update, dict):
        return Projection(update)
    size = _encoded_size(update)
    if size is None or size <= budget.sidecar_threshold_bytes:
        return Projection(update)
    mover = _Mover(update, size, sink, budget)
    # A field is worth a sidecar when it is over twice the preview: moving it saves half its bytes
    # or more. Smaller ones move only when nothing else makes the update fit (the last pass).
    worth = 2 * budget.sidecar_preview_bytes
    # No field of sidecar_preview_bytes or less ever moves, and no number, boolean or null: what
    # stays keeps its place and type (rawOutput.exitCode beside a moved rawOutput.output). Strings
    # and arrays move before any object, so an object is replaced by a stub only when moving its
    # large members was not enough.
    floor = max(budget.sidecar_preview_bytes, 0)
    named = [(_encoded_size(value_at(update, path)) or 0, path, None) for path in _kind_fields(update)]
    mover.move_largest(named, max(worth, floor))
    for objects, min_bytes in ((False, worth), (False, floor), (True, worth), (True, floor)):
        if mover.fits:
            break
        fields = [f for f in _walk_fields(mover.update) if isinstance(f[2], dict) is objects]
        mover.move_largest(fields, max(min_bytes, floor))
    if not mover.entries:
        return Projection(update)
    projected = dict(mover.update)
    meta = projected.get("_meta")
    meta = dict(meta) if isinstance(meta, dict) else {}
    previous = meta.get(META_SIDECAR)
    meta[META_SIDECAR] = (list(previous) if isinstance(previous, list) else []) + mover.entries
    projected["_meta"] = meta
    if mover.kept_off_wire > 0:
        with contextlib.suppress(Exception):  # stats only
            sink.count_kept_off_wire(mover.kept_off_wire)
    return Projection(projected, tuple(mover.entries), mover.lost, mover.kept_off_wire)


def restore_update(update: dict[str, Any], bodies: Callable[[dict[str, Any]], bytes]) -> dict[str, Any]:
    """The original of a projected update: each ``_meta["hopline.sidecar"]`` entry's body (from
    ``bodies(entry)``) set back at its ``path``, last entry first; then the entries are removed
    (and ``_meta`` with them when nothing else is in it). Raises ``ValueError`` for an entry that
    cannot be resolved (truncated, or without a path)."""
    meta = update.get("_meta")
    entries = meta.get(META_SIDECAR) if isinstance(meta, dict) else None
    if not isinstance(entries, list):
        return update
    restored: Any = update
    for entry in reversed(entries):
        path = entry.get("path") if isinstance(entry, dict) else None
        if entry.get("truncated") or not isinstance(path, list) or entry.get("id") is None:
            raise ValueError(f"sidecar entry for {entry.get('field')!r} cannot be resolved "
                             f"(truncated: {bool(entry.get('truncated'))}, reason: {entry.get('reason')})")
        body = bodies(entry)
        is_text = str(entry.get("mediaType", "")).startswith("text/")
        value = body.decode("utf-8") if is_text else orjson.loads(body)
        restored = with_value_at(restored, tuple(path), value)
    restored = dict(restored)
    rest = {k: v for k, v in restored["_meta"].items() if k != META_SIDECAR}
    if rest:
        restored["_meta"] = rest
    else:
        del restored["_meta"]
    return restored
