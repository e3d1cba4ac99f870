"""Large-frame attribution (SPEC O-3..O-6): which payload families make pipe frames large.

Runs only for frames of ``budget.large_frame_threshold_bytes`` or more (inclusive). Records are
sampled: at most ``budget.large_frame_log_quota`` per ``budget.large_frame_log_window_seconds``
window per process; frames over the quota are only counted (never classified), and the suppressed
count and the start of the window where suppression began ride on the next logged record.

A record holds low-sensitivity attribution only (O-5): sizes, kinds, classes, enumerated names.
It never holds payloads, session ids, client ids, file paths, prompts or raw output. In particular
the tool ``title`` is never read (titles carry commands and paths); a tool name comes from ``_meta``
(and must look like an identifier) or from the enumerated ACP tool ``kind``.

Work is bounded (O-6): update arrays over 500 entries are summarized from their first and last 250
(indexed access only, the rest is never touched); nested content is walked to depth 32; non-string
raw output is sized by an iterative hand walk with a byte budget, cycle-safe, that reads only
exact ``dict``/``list``/``tuple``/``str``/``int``/``float``/``bool``/``None`` and counts any other
object as a small constant without calling its ``__str__``, ``__repr__``, ``__len__`` or the like.
"""

from __future__ import annotations

import collections
import logging
import re
import time
from collections.abc import Callable
from typing import Any

import orjson

from hopline.budget import Budget
from hopline.vocabulary import LOAD_REPLAY_META_KEYS, SESSION_UPDATE_METHOD
from hopline.wire.jsonrpc import message_kind, method_of

EVENT_NAME = "hopline.daemon.pipe.large_frame"
LOGGER_NAME = "hopline.observe"

# Bounds of the attribution walk (SPEC O-5, O-6). They bound the observer's work and the length of
# the strings it logs; they are not payload ceilings of any hop, so they live here and not in B-3.
MAX_STRING_CHARS = 128
SAMPLE_HEAD = 250
SAMPLE_TAIL = 250
MAX_WALK_DEPTH = 32
OPAQUE_OBJECT_BYTES = 16  # an object we refuse to inspect counts as this many bytes
STRATEGY_PREFIX_AND_SUFFIX = "prefix_and_suffix"

# ACP ToolKind values: an enumeration, so safe to log.
TOOL_KINDS = frozenset(
    {"read", "edit", "delete", "move", "search", "execute", "think", "fetch", "switch_mode", "other"}
)
TOOL_PROVENANCES = frozenset({"mcp", "builtin", "extension", "unknown"})
_IDENTIFIER = re.compile(r"^[A-Za-z0-9_.:\-]{1,128}$")
_CONTENT_TEXT_KEYS = ("text", "newText", "oldText")

SourceClass = str


def _cut(text: str) -> str:
    return text[:MAX_STRING_CHARS]


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def approx_json_bytes(value: Any, budget_bytes: int, max_depth: int = MAX_WALK_DEPTH) -> tuple[int, bool]:
    """Approximate JSON size of ``value``, walking at most ``budget_bytes`` worth of it.

    Returns ``(bytes, capped)``: ``capped`` is true when the walk stopped at the byte budget or at
    the depth bound (the size is then a lower bound, at most ``budget_bytes``). Iterative, so deep
    nesting cannot raise ``RecursionError``; containers are visited once (``id`` set), so cycles end.
    """
    total = 0
    capped = False
    seen: set[int] = set()
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        if total >= budget_bytes:
            return budget_bytes, True
        node, depth = stack.pop()
        kind = type(node)
        if kind is str:
            total += _utf8_len(node) + 2
        elif node is None or kind is bool:
            total += 5
        elif kind is int:
            total += max(1, (node.bit_length() * 30103) // 100000 + 1)
        elif kind is float:
            total += 16
        elif kind is dict or kind is list or kind is tuple:
            if id(node) in seen:
                total += OPAQUE_OBJECT_BYTES  # a cycle or a shared node: count a reference only
                continue
            if depth >= max_depth:
                capped = True
                total += OPAQUE_OBJECT_BYTES
                continue
            seen.add(id(node))
            total += 2
            if kind is dict:
                for key, item in dict.items(node):
                    total += 2  # colon and comma
                    if total >= budget_bytes:
                        break  # the stack never holds more than the budget's worth of entries
                    stack.append((key, depth + 1))
                    stack.append((item, depth + 1))
            else:
                items = list.__iter__(node) if kind is list else tuple.__iter__(node)
                for item in items:
                    total += 1
                    if total >= budget_bytes:
                        break
                    stack.append((item, depth + 1))
        else:
            total += OPAQUE_OBJECT_BYTES
    if total >= budget_bytes:
        return budget_bytes, True
    return total, capped


def max_content_text_bytes(content: Any) -> int:
    """The largest text field (``text``, ``newText``, ``oldText``) in ``content``, to depth 32."""
    best = 0
    seen: set[int] = set()
    stack: list[tuple[Any, int]] = [(content, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_WALK_DEPTH or id(node) in seen:
            continue
        if type(node) is dict:
            seen.add(id(node))
            for key in _CONTENT_TEXT_KEYS:
                text = dict.get(node, key)
                if type(text) is str:
                    best = max(best, _utf8_len(text))
            for item in dict.values(node):
                if type(item) is dict or type(item) is list:
                    stack.append((item, depth + 1))
        elif type(node) is list:
            seen.add(id(node))
            for item in list.__iter__(node):
                if type(item) is dict or type(item) is list:
                    stack.append((item, depth + 1))
    return best


def _json_kind(value: Any) -> str:
    kind = type(value)
    if kind is str:
        return "string"
    if value is None:
        return "null"
    if kind is bool:
        return "boolean"
    if kind is int or kind is float:
        return "number"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, (list, tuple)):
        return "array"
    return "other"


def _dict_get(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, dict) else None


def source_class(message: Any) -> tuple[SourceClass, list[Any] | None]:
    """The provable origin class of ``message`` (O-4) and its update array, when it has one."""
    kind = message_kind(message)
    if kind == "invalid":
        return "unknown", None
    if kind == "notification":
        update = _dict_get(_dict_get(message, "params"), "update")
        if method_of(message) == SESSION_UPDATE_METHOD and isinstance(update, dict):
            return "session_update_notification", [update]
        return "jsonrpc_request", None
    if kind == "request":
        return "jsonrpc_request", None
    result = _dict_get(message, "result")
    if kind == "response" and isinstance(result, dict):
        meta = result.get("_meta")
        if isinstance(meta, dict):
            for key in LOAD_REPLAY_META_KEYS:
                if key in meta:
                    updates = _dict_get(meta[key], "updates")
                    return "load_session_bulk_replay_response", updates if isinstance(updates, list) else None
        updates = result.get("updates")
        if isinstance(updates, list) and _has_load_update_marker(result):
            return "load_updates_response", updates
    return "jsonrpc_response", None


def _has_load_update_marker(result: dict[str, Any]) -> bool:
    for key in ("startTime", "lastUpdated", "replayError"):
        if isinstance(result.get(key), str):
            return True
    return isinstance(result.get("partial"), bool)


def _sample_indices(count: int) -> tuple[range, ...]:
    if count <= SAMPLE_HEAD + SAMPLE_TAIL:
        return (range(count),)
    return range(SAMPLE_HEAD), range(count - SAMPLE_TAIL, count)


def _the_update(entry: Any) -> Any:
    """A replayed entry is either an update or a ``session/update`` params object around one."""
    if isinstance(entry, dict):
        inner = entry.get("update")
        if isinstance(inner, dict) and "sessionUpdate" not in entry:
            return inner
    return entry


def _tool_identity(update: dict[str, Any]) -> tuple[str | None, str | None]:
    """(toolName, toolProvenance) from provable fields only; never the free-text title."""
    meta = update.get("_meta")
    name: str | None = None
    provenance: str | None = None
    if isinstance(meta, dict):
        tool = meta.get("hopline.tool")
        candidates = [meta.get("toolName"), meta.get("hopline.toolName"), _dict_get(tool, "name"),
                      _dict_get(meta.get("claudeCode"), "toolName")]
        for candidate in candidates:
            if isinstance(candidate, str) and _IDENTIFIER.match(candidate):
                name = candidate
                break
        for candidate in (meta.get("toolProvenance"), meta.get("hopline.toolProvenance"),
                          _dict_get(tool, "provenance")):
            if isinstance(candidate, str) and candidate in TOOL_PROVENANCES:
                provenance = candidate
                break
        if name is not None and provenance is None:
            provenance = "mcp" if name.startswith(("mcp__", "mcp:", "mcp.")) else "unknown"
    if name is None:
        kind = update.get("kind")
        if isinstance(kind, str) and kind in TOOL_KINDS:
            name = kind
    return (_cut(name) if name else None), provenance


def attribute_frame(direction: str, nbytes: int, message: Any, *, threshold_bytes: int,
                    approx_budget_bytes: int) -> dict[str, Any]:
    """The attribution record of one large frame (O-4, O-5), without the suppression counters."""
    record: dict[str, Any] = {
        "direction": direction,
        "bytes": nbytes,
        "thresholdBytes": threshold_bytes,
        "messageKind": message_kind(message),
    }
    cls, updates = source_class(message)
    record["sourceClass"] = cls
    method = method_of(message)
    if method is not None:
        record["method"] = _cut(method)
    if updates is None:
        return record
    count = len(updates)
    record["updateCount"] = count
    indices = _sample_indices(count)
    if len(indices) > 1:
        record["summarizedUpdateCount"] = sum(len(r) for r in indices)
        record["summarizedUpdateStrategy"] = STRATEGY_PREFIX_AND_SUFFIX
    kinds: set[str] = set()
    heaviest: dict[str, Any] | None = None
    heaviest_bytes = -1
    max_content = max_raw_text = max_raw_approx = 0
    raw_text_seen = raw_approx_seen = raw_capped = content_seen = False
    for span in indices:
        for i in span:
            update = _the_update(updates[i])  # indexed access: only the sample is touched
            if not isinstance(update, dict):
                continue
            kind = update.get("sessionUpdate")
            if isinstance(kind, str):
                kinds.add(_cut(kind))
            weight, _ = approx_json_bytes(update, approx_budget_bytes)
            if weight > heaviest_bytes:
                heaviest, heaviest_bytes = update, weight
            if "content" in update:
                content_seen = True
                max_content = max(max_content, max_content_text_bytes(update["content"]))
            if "rawOutput" in update:
                raw = update["rawOutput"]
                if type(raw) is str:
                    raw_text_seen = True
                    max_raw_text = max(max_raw_text, _utf8_len(raw))
                elif raw is not None:
                    raw_approx_seen = True
                    size, capped = approx_json_bytes(raw, approx_budget_bytes)
                    max_raw_approx = max(max_raw_approx, size)
                    raw_capped = raw_capped or capped
    if count > 1:
        record["mixedSessionUpdate"] = len(kinds) > 1
    if heaviest is not None:
        kind = heaviest.get("sessionUpdate")
        if isinstance(kind, str):
            record["sessionUpdate"] = _cut(kind)
        tool_name, provenance = _tool_identity(heaviest)
        if tool_name is not None:
            record["toolName"] = tool_name
        if provenance is not None:
            record["toolProvenance"] = provenance
        if "rawOutput" in heaviest:
            record["rawOutputKind"] = _json_kind(heaviest["rawOutput"])
    if content_seen:
        record["maxContentTextBytes"] = max_content
    if raw_text_seen:
        record["maxRawOutputTextBytes"] = max_raw_text
    if raw_approx_seen:
        record["maxRawOutputApproxBytes"] = max_raw_approx
        record["maxRawOutputApproxBytesCapped"] = raw_capped
    return record


def _wall_clock_ms() -> int:
    return int(time.time() * 1000)


class LargeFrameObserver:
    """Samples, attributes and logs large pipe frames; one per daemon process."""

    def __init__(self, budget: Budget, *, clock: Callable[[], float] = time.monotonic,
                 wall_clock_ms: Callable[[], int] = _wall_clock_ms,
                 logger: logging.Logger | None = None,
                 approx_budget_bytes: int | None = None) -> None:
        self.threshold_bytes = budget.large_frame_threshold_bytes
        self.quota = budget.large_frame_log_quota
        self.window_seconds = budget.large_frame_log_window_seconds
        # SPEC O-5: the budget of the raw-output walk is 256 KiB, the same number as the threshold;
        # it is read from the budget rather than declared twice.
        self.approx_budget_bytes = (budget.large_frame_threshold_bytes if approx_budget_bytes is None
                                    else approx_budget_bytes)
        self._clock = clock
        self._wall_clock_ms = wall_clock_ms
        self._logger = logger if logger is not None else logging.getLogger(LOGGER_NAME)
        self._window_start: float | None = None
        self._window_start_ms = 0
        self._window_logged = 0
        self._pending_suppressed = 0
        self._pending_suppressed_since_ms: int | None = None
        self.logged_count = 0
        self.suppressed_count = 0
        self.failed_count = 0  # attribution or logging raised (swallowed)
        # The latest logged records, for GET /daemon/frames; they hold what the log line holds.
        self._recent: collections.deque[dict[str, Any]] = collections.deque(
            maxlen=budget.large_frame_recent_records)

    def observe(self, direction: str, nbytes: int, message: Any) -> dict[str, Any] | None:
        """Attribute and log ``message`` if it is large and within the quota; return the record."""
        if nbytes < self.threshold_bytes:
            return None
        now = self._clock()
        if self._window_start is None or now - self._window_start >= self.window_seconds:
            self._window_start = now
            self._window_start_ms = self._wall_clock_ms()
            self._window_logged = 0
        if self._window_logged >= self.quota:
            self.suppressed_count += 1
            self._pending_suppressed += 1
            if self._pending_suppressed_since_ms is None:
                self._pending_suppressed_since_ms = self._window_start_ms
            return None
        self._window_logged += 1
        try:
            record = attribute_frame(direction, nbytes, message, threshold_bytes=self.threshold_bytes,
                                     approx_budget_bytes=self.approx_budget_bytes)
        except Exception:
            self.failed_count += 1
            record = {"direction": direction, "bytes": nbytes, "thresholdBytes": self.threshold_bytes,
                      "messageKind": "invalid", "sourceClass": "unknown"}
        if self._pending_suppressed:
            record["suppressedCount"] = self._pending_suppressed
            record["suppressedWindowStartMs"] = self._pending_suppressed_since_ms
            self._pending_suppressed = 0
            self._pending_suppressed_since_ms = None
        self.logged_count += 1
        self._emit(record)
        self._recent.append({**record, "atMs": self._wall_clock_ms()})
        return record

    def _emit(self, record: dict[str, Any]) -> None:
        try:
            line = orjson.dumps({"event": EVENT_NAME, **record}).decode()
            self._logger.info(line, extra={"event": EVENT_NAME, "record": record})
        except Exception:
            self.failed_count += 1

    def snapshot(self) -> dict[str, int]:
        return {"logged": self.logged_count, "suppressed": self.suppressed_count,
                "thresholdBytes": self.threshold_bytes}

    def recent(self) -> list[dict[str, Any]]:
        """The latest logged records (at most ``budget.large_frame_recent_records``), newest first,
        each with ``atMs``, the wall-clock time it was logged."""
        return list(reversed(self._recent))
