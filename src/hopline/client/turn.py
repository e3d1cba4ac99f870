"""``TurnTracker``: the state of one prompt's turn, folded from its events (pure, no I/O).

``hopline run`` and ``hopline demo`` render it; tests assert on it. It keeps the agent's text, each
tool call with its status and sidecars, the latest progress numbers, the compactions, the largest
llm-turn body seen against its ceiling, and how the turn ended.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from hopline.client.events import Event, SidecarRef, content_text
from hopline.vocabulary import (
    COMPACTION,
    PERMISSION_REQUEST,
    PERMISSION_RESOLVED,
    PROGRESS,
    SESSION_UPDATE,
    TURN_COMPLETE,
    TURN_ERROR,
)

# How much of a tool output the tracker keeps for a preview line, head and tail together (the wire
# already holds only a preview when the output went to a sidecar; a display bound, not a ceiling).
PREVIEW_CHARS = 160
# The marker between the head and the tail of a sidecar preview (hopline.sidecars.projection).
_SIDECAR_MARKER = re.compile(r"\n… \[hopline: [^\]\n]*\] …\n")


def head_and_tail(text: str, chars: int = PREVIEW_CHARS) -> str:
    """One line: the start and the end of ``text`` (at most ``chars`` together, whitespace folded).

    A sidecar preview is cut at its marker, so what shows is the output's real head and tail (the
    end of a long line, where a path often is, is kept)."""
    marker = _SIDECAR_MARKER.search(text)
    if marker is None and len(text) <= chars:
        return " ".join(text.split())
    half = chars // 2
    head, tail = (text[:marker.start()], text[marker.end():]) if marker else (text[:half], text[-half:])
    head, tail = " ".join(head.split()), " ".join(tail.split())
    return f"{head[:half]} … {tail[-half:] if tail else ''}".rstrip()


@dataclasses.dataclass
class ToolCallView:
    call_id: str
    title: str = ""
    kind: str = "other"
    status: str = "pending"
    output_chars: int = 0
    preview: str = ""
    sidecars: list[SidecarRef] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class TurnTracker:
    prompt_id: str | None = None
    text_parts: list[str] = dataclasses.field(default_factory=list)
    # The agent's messages: chunks separated by any other update start a new message.
    messages: list[str] = dataclasses.field(default_factory=list)
    _in_message: bool = False
    tool_calls: dict[str, ToolCallView] = dataclasses.field(default_factory=dict)
    plan: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    progress: dict[str, Any] = dataclasses.field(default_factory=dict)
    compactions: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    max_body_bytes: int = 0
    ceiling_bytes: int = 0
    iterations: int = 0
    stop_reason: str | None = None
    turn: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    permission_requests: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    # requestId -> its permission_resolved (outcome, resolvedBy: client, cancel, timeout, agent_exited)
    permission_resolutions: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    synthetic: list[Event] = dataclasses.field(default_factory=list)
    # Fields of other updates (messages, plans, commands...) that went to sidecars: (kind, ref).
    moved: list[tuple[str, SidecarRef]] = dataclasses.field(default_factory=list)
    lost_bytes: int = 0  # what the turn could not deliver (D-8); the turn end's figure wins
    events_seen: int = 0
    sse_bytes: int = 0

    @property
    def text(self) -> str:
        """Everything the agent said in this turn."""
        return "".join(self.text_parts)

    @property
    def final_text(self) -> str:
        """The final answer: the agent's last message of the turn."""
        return self.messages[-1] if self.messages else ""

    @property
    def done(self) -> bool:
        return self.stop_reason is not None or self.error is not None

    @property
    def failed(self) -> bool:
        return self.error is not None

    def summarizer_errors(self) -> list[dict[str, Any]]:
        """Why each compaction that fell back to the extractive summary did so ({origin, status, hop})."""
        return [c["summarizerError"] for c in self.compactions if isinstance(c.get("summarizerError"), dict)]

    @property
    def degraded(self) -> bool:
        return self.lost_bytes > 0

    def sidecar_refs(self) -> list[SidecarRef]:
        tools = [ref for call in self.tool_calls.values() for ref in call.sidecars]
        return tools + [ref for _, ref in self.moved]

    def mine(self, event: Event) -> bool:
        """True when ``event`` belongs to this turn (or carries no prompt id at all)."""
        return self.prompt_id is None or event.prompt_id in (None, self.prompt_id)

    def apply(self, event: Event) -> ToolCallView | None:
        """Fold one event in; returns the tool call it changed, if any."""
        if event.synthetic:
            self.synthetic.append(event)
            return None
        if not self.mine(event):
            return None
        self.events_seen += 1
        self.sse_bytes += event.size
        if event.type != SESSION_UPDATE:
            self._in_message = False
        if event.type == SESSION_UPDATE:
            return self._apply_update(event)
        if event.type == PROGRESS:
            progress = event.data.get("progress") or {}
            self.progress = dict(progress)
            self.iterations = max(self.iterations, int(progress.get("iteration") or 0))
            self.max_body_bytes = max(self.max_body_bytes, int(progress.get("bodyBytes") or 0))
            self.ceiling_bytes = int(progress.get("ceilingBytes") or self.ceiling_bytes)
        elif event.type == COMPACTION:
            self.compactions.append(dict(event.data.get("compaction") or {}))
        elif event.type == TURN_COMPLETE:
            self.stop_reason = str(event.data.get("stopReason") or "end_turn")
            self.lost_bytes = max(self.lost_bytes, event.lost_bytes)
            turn = event.data.get("turn")
            if isinstance(turn, dict):
                self.turn = turn
                self.iterations = max(self.iterations, int(turn.get("iterations") or 0))
                self.max_body_bytes = max(self.max_body_bytes, int(turn.get("maxBodyBytes") or 0))
                self.ceiling_bytes = int(turn.get("ceilingBytes") or self.ceiling_bytes)
        elif event.type == TURN_ERROR:
            self.error = dict(event.data)
            self.lost_bytes = max(self.lost_bytes, event.lost_bytes)
        elif event.type == PERMISSION_REQUEST:
            self.permission_requests.append(dict(event.data))
        elif event.type == PERMISSION_RESOLVED:
            self.permission_resolutions[str(event.data.get("requestId"))] = dict(event.data)
        return None

    def open_permission_requests(self) -> list[dict[str, Any]]:
        """The requests no one has answered yet (another client's answer, a cancel, a deadline
        resolve them for every reader)."""
        return [r for r in self.permission_requests
                if str(r.get("requestId")) not in self.permission_resolutions]

    def _apply_update(self, event: Event) -> ToolCallView | None:
        update = event.update
        kind = event.update_kind
        self.lost_bytes += event.lost_bytes
        if kind not in ("tool_call", "tool_call_update"):
            self.moved += [(str(kind), ref) for ref in event.sidecars()]
        if kind == "agent_message_chunk":
            chunk = event.message_text()
            self.text_parts.append(chunk)
            if self._in_message:
                self.messages[-1] += chunk
            else:
                self.messages.append(chunk)
                self._in_message = True
            return None
        self._in_message = False
        if kind == "plan":
            entries = update.get("entries")
            self.plan = list(entries) if isinstance(entries, list) else []
            return None
        if kind not in ("tool_call", "tool_call_update"):
            return None
        call_id = str(update.get("toolCallId") or "")
        view = self.tool_calls.get(call_id)
        if view is None:
            view = self.tool_calls[call_id] = ToolCallView(call_id)
        if update.get("title"):
            view.title = str(update["title"])
        if update.get("kind"):
            view.kind = str(update["kind"])
        if update.get("status"):
            view.status = str(update["status"])
        output = content_text(update.get("content"))
        raw = update.get("rawOutput")
        if not output and isinstance(raw, str):
            output = raw
        if output:
            view.output_chars = len(output)
            view.preview = head_and_tail(output)
        sidecars = event.sidecars()
        if sidecars:
            view.sidecars = sidecars
        return view

    def error_summary(self) -> str:
        """One line naming the origin, the hop and the sizes of a failed turn."""
        if self.error is None:
            return ""
        e = self.error
        parts = [f"turn failed: origin {e.get('origin', '?')}"]
        if e.get("hop"):
            parts.append(f"hop {e['hop']}")
        unit = e.get("unit", "bytes")
        if e.get("observed") is not None:
            parts.append(f"body {e['observed']} {unit}")
        if e.get("limit") is not None:
            parts.append(f"limit {e['limit']} {unit}")
        return ", ".join(parts) + f": {e.get('message', '')}"
