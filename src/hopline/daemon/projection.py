"""The inbound projection point (SPEC D-3, S-1, S-4): every ``session/update`` from a child whose
frame is over the sidecar threshold passes one ``InboundProjector`` before it is journaled, put in
the ring or sent on SSE (a smaller frame holds a smaller update: nothing to move, and under the SSE
event limit by the budget's coherence rules); so does every update of a bulk replay.

The default projector keeps every event under ``sse_max_event_bytes``: an update whose JSON would
make a larger event is replaced by a small stub of the same ``sessionUpdate`` kind (tool call id and
status kept, so the client's state machine goes on) carrying ``_meta["hopline.dropped"]`` with the
size and the limit. The sidecar store (S-1) plugs in here instead and keeps the payload.

:func:`losses` reads what an update says it lost (D-8): the ``lostBytes`` of its truncated sidecar
entries and of a ``hopline.dropped`` stub; the daemon counts them per turn and in its status.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from hopline.budget import CEILINGS_BY_KEY, HOP_DAEMON_SSE, Budget
from hopline.sidecars.entry import FALLBACK_KEYS
from hopline.sidecars.projection import MESSAGE_UPDATE_KINDS, TOOL_UPDATE_KINDS
from hopline.vocabulary import META_DROPPED, META_SIDECAR

InboundProjector = Callable[[str, dict[str, Any]], dict[str, Any]]  # (session id, update) -> update

_MESSAGE_KINDS = MESSAGE_UPDATE_KINDS
_TOOL_KINDS = TOOL_UPDATE_KINDS
# Reasons a loss may name; anything else an agent wrote there is reported as "other" (it is the
# agent's text, and reasons are logged).
LOSS_REASONS = frozenset({*FALLBACK_KEYS, "sse_max_event_bytes"})


def dropped_note(size: int, limit: int) -> str:
    return (f"[{HOP_DAEMON_SSE}: update of {size} bytes exceeds the SSE event limit of {limit} bytes "
            f"({CEILINGS_BY_KEY['sse_max_event_bytes'].name}); its payload was not relayed]")


def stub_update(update: dict[str, Any], size: int, limit: int, title_max_chars: int) -> dict[str, Any]:
    kind = update.get("sessionUpdate")
    note = dropped_note(size, limit)
    stub: dict[str, Any] = {"sessionUpdate": kind}
    if kind in _MESSAGE_KINDS:
        stub["content"] = {"type": "text", "text": note}
    elif kind in _TOOL_KINDS:
        for key in ("toolCallId", "status", "kind"):
            if isinstance(update.get(key), str):
                stub[key] = update[key]
        title = update.get("title")
        if isinstance(title, str):
            stub["title"] = title[:title_max_chars]
        stub["content"] = [{"type": "content", "content": {"type": "text", "text": note}}]
    exceeded = CEILINGS_BY_KEY["sse_max_event_bytes"].exceeded(limit, size)
    stub["_meta"] = {META_DROPPED: {"bytes": size, **exceeded.fields(), "reason": "sse_max_event_bytes",
                                    "lostBytes": size}}
    return stub


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def losses(update: Any) -> tuple[int, list[str]]:
    """(bytes lost, their reasons) as the update's ``_meta`` declares them; (0, []) for a whole one."""
    meta = update.get("_meta") if isinstance(update, dict) else None
    if not isinstance(meta, dict):
        return 0, []
    lost = 0
    reasons: list[str] = []
    entries = meta.get(META_SIDECAR)
    for entry in entries if isinstance(entries, list) else ():
        if isinstance(entry, dict) and entry.get("truncated"):
            # An entry from an older agent has no lostBytes: the whole field counts.
            lost += _count(entry.get("lostBytes", entry.get("bytes")))
            reasons.append(_reason(entry.get("reason")))
    dropped = meta.get(META_DROPPED)
    if isinstance(dropped, dict):
        lost += _count(dropped.get("lostBytes", dropped.get("bytes")))
        reasons.append(_reason(dropped.get("reason")))
    return lost, reasons


def _reason(value: Any) -> str:
    return value if isinstance(value, str) and value in LOSS_REASONS else "other"


def oversize_replacement(budget: Budget) -> InboundProjector:
    limit = budget.sse_max_event_bytes

    def project(session_id: str, update: dict[str, Any]) -> dict[str, Any]:
        size = len(orjson.dumps(update))
        if size + budget.sse_event_envelope_bytes <= limit:
            return update
        return stub_update(update, size, limit, budget.stub_title_max_chars)

    return project
