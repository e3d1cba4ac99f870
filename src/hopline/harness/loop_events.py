"""What the tool loop tells the outside while it runs (the ACP agent turns these into
``session/update`` notifications; ``hopline simulate`` and ``hopline run`` print them).

A sink is an async callable; the loop awaits it, so a slow consumer slows the loop rather than
growing a buffer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any, Literal

EstimateSource = Literal["usage", "bytes", "content"]
ToolKind = Literal["read", "edit", "delete", "move", "search", "execute", "think", "fetch", "other"]


@dataclasses.dataclass(frozen=True)
class AgentText:
    """Assistant text for the user (ACP ``agent_message_chunk``)."""

    text: str


@dataclasses.dataclass(frozen=True)
class PlanUpdated:
    """The agent's plan (ACP ``plan``): entries of ``{content, priority, status}``."""

    entries: list[dict[str, str]]


@dataclasses.dataclass(frozen=True)
class ToolCallStarted:
    """A tool call about to run (ACP ``tool_call``)."""

    call_id: str
    name: str
    kind: ToolKind
    title: str
    raw_input: dict[str, Any]
    locations: list[str]  # workspace-relative or absolute paths the call touches


@dataclasses.dataclass(frozen=True)
class ToolCallFinished:
    """A tool call's result (ACP ``tool_call_update``).

    ``output`` is the full output as the tool produced it (bounded by the budget's capture
    limits), for the user; ``model_output`` is what the model sees (capped at the tool result
    ceiling, head and tail with a marker).
    """

    call_id: str
    status: Literal["completed", "failed"]
    output: str
    model_output: str
    raw_output: Any = None


@dataclasses.dataclass(frozen=True)
class CompactionRecord:
    """One compaction (SPEC H-5): which bound triggered it and what it replaced."""

    trigger: Literal["model", "transport"]
    messages_replaced: int
    bytes_replaced: int
    bytes_before: int
    bytes_after: int
    summarizer: Literal["model", "extractive"]
    reason: str = ""  # set when the target could not be reached
    reactive: bool = False  # after a size failure (a 413 or a reset), not before the send
    # Why the model's summary was not used ({origin, status, hop}); None when it was.
    summarizer_error: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "trigger": self.trigger,
            "messagesReplaced": self.messages_replaced,
            "bytesReplaced": self.bytes_replaced,
            "bytesBefore": self.bytes_before,
            "bytesAfter": self.bytes_after,
            "summarizer": self.summarizer,
            "reason": self.reason,
            "reactive": self.reactive,
        }
        if self.summarizer_error is not None:
            out["summarizerError"] = self.summarizer_error
        return out


@dataclasses.dataclass(frozen=True)
class Compacted:
    record: CompactionRecord


@dataclasses.dataclass(frozen=True)
class IterationProgress:
    """Sent before each llm-turn: the numbers `hopline run` shows on its progress line."""

    iteration: int
    max_iterations: int
    body_bytes: int
    ceiling_bytes: int
    estimate_tokens: int
    effective_window_tokens: int
    compactions: int
    trigger: Literal["model", "transport"] | None = None
    # "usage": the provider's last prompt_tokens plus the estimate of what was added since (H-2);
    # "bytes": the bytes-per-token estimate; "content": message content only (a sizing without the budget).
    estimate_source: EstimateSource = "bytes"
    # Set when this send retries the iteration's llm-turn: what failed ({origin, status, hop}), which
    # send of the iteration it was (``attempt``, from 1) and the bytes of text it had streamed.
    retry: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "iteration": self.iteration,
            "maxIterations": self.max_iterations,
            "bodyBytes": self.body_bytes,
            "ceilingBytes": self.ceiling_bytes,
            "estimateTokens": self.estimate_tokens,
            "estimateSource": self.estimate_source,
            "effectiveWindowTokens": self.effective_window_tokens,
            "compactions": self.compactions,
            "trigger": self.trigger,
        }
        if self.retry is not None:
            out["retry"] = self.retry
        return out


LoopEvent = AgentText | PlanUpdated | ToolCallStarted | ToolCallFinished | Compacted | IterationProgress
EventSink = Callable[[LoopEvent], Awaitable[None]]
# Asked before run_command and write_file unless the session auto-approves; False rejects the call
# (the model gets a "rejected by the user" result and the turn goes on).
PermissionHook = Callable[[ToolCallStarted], Awaitable[bool]]
