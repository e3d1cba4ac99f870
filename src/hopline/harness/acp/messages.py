"""What `hopline agent` sends, built from its loop's events (SPEC H-10): the tool updates (a call
started, a status changed, a result; each names its tool in ``_meta["hopline.tool"]``), the
permission request for a tool call, a turn's stop reason, a failed turn's JSON-RPC error."""

from __future__ import annotations

from typing import Any

from acp import RequestError

from hopline.errors import TurnFailure
from hopline.harness.acp.sidecars import tool_meta
from hopline.harness.loop_events import ToolCallFinished, ToolCallStarted
from hopline.vocabulary import META_TOOL

TURN_FAILED_CODE = -32603
ALLOW_ONCE = "allow_once"
REJECT_ONCE = "reject_once"


def tool_call_update_of(event: ToolCallStarted, status: str) -> dict[str, Any]:
    return {
        "sessionUpdate": "tool_call",
        "toolCallId": event.call_id,
        "title": event.title,
        "kind": event.kind,
        "status": status,
        "rawInput": event.raw_input,
        "locations": [{"path": p} for p in event.locations],
        "_meta": {META_TOOL: tool_meta(event.name)},
    }


def tool_status_update_of(call_id: str, name: str | None, status: str,
                          text: str | None = None) -> dict[str, Any]:
    """A ``tool_call_update`` changing only the status (and optionally a short text)."""
    update: dict[str, Any] = {"sessionUpdate": "tool_call_update", "toolCallId": call_id, "status": status}
    if text is not None:
        update["content"] = [{"type": "content", "content": {"type": "text", "text": text}}]
    if name is not None:
        update["_meta"] = {META_TOOL: tool_meta(name)}
    return update


def tool_result_update_of(event: ToolCallFinished, name: str | None = None) -> dict[str, Any]:
    """The full result; large fields are moved to sidecars afterwards (:meth:`HoplineAgent._offload`)."""
    update: dict[str, Any] = {
        "sessionUpdate": "tool_call_update",
        "toolCallId": event.call_id,
        "status": event.status,
        "content": [{"type": "content", "content": {"type": "text", "text": event.output}}],
    }
    if name is not None:
        update["_meta"] = {META_TOOL: tool_meta(name)}
    if event.raw_output is not None:
        update["rawOutput"] = event.raw_output
    else:  # the full text is in content[]; repeating it here would double the frame
        update["rawOutput"] = {"bytes": len(event.output.encode("utf-8")),
                               "modelBytes": len(event.model_output.encode("utf-8"))}
    return update


def permission_request_of(session_id: str, event: ToolCallStarted) -> dict[str, Any]:
    """The ``session/request_permission`` params for a tool call: allow once, or reject."""
    return {
        "sessionId": session_id,
        "toolCall": {
            "toolCallId": event.call_id, "title": event.title, "kind": event.kind,
            "status": "pending", "rawInput": event.raw_input,
            "locations": [{"path": p} for p in event.locations],
        },
        "options": [
            {"optionId": ALLOW_ONCE, "name": "Allow once", "kind": "allow_once"},
            {"optionId": REJECT_ONCE, "name": "Reject", "kind": "reject_once"},
        ],
    }


def stop_reason_of(loop_stop: str) -> str:
    return {"end_turn": "end_turn", "max_iterations": "max_turn_requests",
            "cancelled": "cancelled"}.get(loop_stop, "end_turn")


def turn_error_of(failure: TurnFailure) -> RequestError:
    return RequestError(TURN_FAILED_CODE, f"turn failed ({failure.origin}): {failure.message}",
                        failure.fields())
