"""What a turn's end keeps of the agent's answer (SPEC T-8): ``turn_error`` carries the JSON-RPC
error's ``data`` and ``turn_complete`` the prompt response's ``_meta``, both bounded.

``data`` travels whole up to ``error_data_echo_max_bytes``; larger, it is projected to a sidecar of
the session (the one projection, :func:`hopline.sidecars.projection.project_fields`, under that
row), so ``_meta["hopline.sidecar"]`` of the event restores it exactly. Without a sidecar store only
its size travels (``{"omittedBytes": n}``) and the bytes count as lost (D-8). ``_meta`` goes through
the same projection under the sidecar threshold, as any update would.

Blocking (the sidecar store writes files): the daemon calls these off the event loop.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson

from hopline.budget import Budget
from hopline.daemon.child import AgentRpcError
from hopline.daemon.errors import echoed, echoed_message
from hopline.sidecars.projection import SidecarSink, project_fields
from hopline.vocabulary import META_SIDECAR, META_TURN

# Fields of a hopline agent's error data that its turn_error carries at the top level: the status,
# the hop, and a limit passed in the one limit shape (hopline.errors.TurnFailure.fields), and
# whether the failure was a transient one the agent's loop already retried.
_LIFTED = ("status", "hop", "setting", "limit", "observed", "unit", "retryable")
# An origin is one word of H-8 (code, model, tool, cancelled, ...): a longer one is not an origin.
_ORIGIN_CHARS = 32


@dataclasses.dataclass(frozen=True)
class TurnEnd:
    payload: dict[str, Any]
    lost_bytes: int = 0  # what the event could not carry (no store, or the store refused)


def _size(value: Any) -> int:
    return len(orjson.dumps(value, default=str))


def _project(payload: dict[str, Any], key: str, limit: int, sink: SidecarSink | None,
             budget: Budget) -> int:
    """``payload[key]`` bounded by ``limit`` in place; the bytes lost."""
    value = payload[key]
    size = _size(value)
    if size <= limit:
        return 0
    if sink is None:
        payload[key] = echoed(value, limit)
        return size
    projected = project_fields({key: value}, sink, budget.replace(sidecar_threshold_bytes=limit))
    moved = projected.update
    if key == "_meta":  # its own sidecar entries are in it already
        payload["_meta"] = moved["_meta"]
    else:
        payload[key] = moved[key]
        entries = moved["_meta"][META_SIDECAR] if "_meta" in moved else []
        if entries:
            meta = payload.setdefault("_meta", {})
            meta[META_SIDECAR] = [*meta.get(META_SIDECAR, []), *entries]
    return projected.lost_bytes


def turn_error_of(prompt_id: str, exc: AgentRpcError, budget: Budget, sink: SidecarSink | None) -> TurnEnd:
    """The ``turn_error`` of an agent's JSON-RPC error answer to ``session/prompt``."""
    data = exc.data
    fields = data if isinstance(data, dict) else {}
    message, omitted = echoed_message(
        fields["message"] if isinstance(fields.get("message"), str) else exc.message,
        budget.error_message_echo_max_bytes)
    payload: dict[str, Any] = {
        "promptId": prompt_id,
        "origin": origin if isinstance(origin := fields.get("origin"), str) and len(origin) <= _ORIGIN_CHARS
        else "agent",
        "message": message,
        "code": exc.code,
    }
    if omitted:
        payload["omittedMessageBytes"] = omitted
    for key in _LIFTED:  # scalars only, a short string at most: the whole data follows anyway
        value = fields.get(key)
        if isinstance(value, (int, float, bool)) or (isinstance(value, str)
                                                     and _size(value) <= budget.error_message_echo_max_bytes):
            payload[key] = value
    lost = 0
    if data is not None:
        payload["data"] = data
        lost = _project(payload, "data", budget.error_data_echo_max_bytes, sink, budget)
    return TurnEnd(payload, lost)


def turn_complete_of(prompt_id: str, result: Any, budget: Budget, sink: SidecarSink | None) -> TurnEnd:
    """The ``turn_complete`` of a ``session/prompt`` answer: its stopReason, hopline's own turn
    figures (``turn``, from ``_meta["hopline.turn"]``) and the whole ``_meta``, bounded."""
    result = result if isinstance(result, dict) else {}
    meta = result.get("_meta")
    turn = meta.get(META_TURN) if isinstance(meta, dict) else None
    payload: dict[str, Any] = {"promptId": prompt_id, "stopReason": result.get("stopReason"),
                               "turn": turn if isinstance(turn, dict) else None}
    lost = 0
    if isinstance(meta, dict) and meta:
        payload["_meta"] = meta
        lost = _project(payload, "_meta", budget.sidecar_threshold_bytes, sink, budget)
    return TurnEnd(payload, lost)
