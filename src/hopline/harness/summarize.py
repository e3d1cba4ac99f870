"""Summaries for compaction (SPEC H-5).

The model summarizer sends ``purpose="summary"`` requests through the same :class:`Model` as the
turns; each request is checked against the engine ceiling before it is sent, and the old part is
summarized in chunks (``budget.summary_chunk_bytes``) with a rolling summary when it is too large
for one request. When the model fails, a deterministic extractive summary is used and the failure
is kept for the record.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, Protocol

import orjson

from hopline.budget import Budget
from hopline.errors import TurnFailure
from hopline.harness.model import LlmTurnRequest, Message, Model, encode_request

SUMMARY_SYSTEM_PROMPT = (
    "You compress the earlier part of an agent's tool loop. Keep: the task, decisions, files read "
    "and written, commands run and their outcome, errors, open questions. Drop raw tool output."
)


def clip_utf8(text: str, max_bytes: int) -> str:
    """``text`` cut to at most ``max_bytes`` UTF-8 bytes, never inside a character."""
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text
    return data[:max(0, max_bytes)].decode("utf-8", errors="ignore")


def _content_text(message: Message) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def render_message(message: Message, max_bytes: int) -> str:
    """One line-ish transcript entry, head and tail kept when long."""
    role = message.get("role", "?")
    parts = [f"{role}:"]
    text = _content_text(message)
    if text:
        parts.append(text)
    for call in message.get("tool_calls") or []:
        fn = call.get("function", {}) if isinstance(call, dict) else {}
        parts.append(f"[call {fn.get('name')} {fn.get('arguments', '')}]")
    line = " ".join(parts)
    data = line.encode("utf-8")
    if len(data) <= max_bytes:
        return line
    half = max(0, (max_bytes - 40) // 2)
    head = data[:half].decode("utf-8", errors="ignore")
    tail = data[len(data) - half:].decode("utf-8", errors="ignore")
    return f"{head} [... {len(data) - 2 * half} bytes cut ...] {tail}"


def extractive_summary(messages: list[Message], max_bytes: int) -> str:
    """A deterministic summary: tools used, files touched, and the first words of each message."""
    tool_counts: dict[str, int] = {}
    paths: list[str] = []
    for message in messages:
        for call in message.get("tool_calls") or []:
            fn = call.get("function", {}) if isinstance(call, dict) else {}
            name = str(fn.get("name"))
            tool_counts[name] = tool_counts.get(name, 0) + 1
            try:
                args = orjson.loads(fn.get("arguments") or "{}")
            except orjson.JSONDecodeError:
                continue
            path = args.get("path") if isinstance(args, dict) else None
            if isinstance(path, str) and path not in paths:
                paths.append(path)
    lines = ["Extractive summary of the replaced messages."]
    if tool_counts:
        lines.append("Tools called: " + ", ".join(f"{k} x{v}" for k, v in sorted(tool_counts.items())))
    if paths:
        lines.append("Paths: " + ", ".join(paths[:50]))
    for message in messages:
        lines.append("- " + render_message(message, 160).replace("\n", " "))
    return clip_utf8("\n".join(lines), max_bytes)


class Summarizer(Protocol):
    async def summarize(self, messages: list[Message], max_bytes: int) -> str:
        """A summary of ``messages`` of at most ``max_bytes`` UTF-8 bytes, or raise TurnFailure."""
        ...


class ModelSummarizer:
    """Summaries from the model, chunked so every request fits the engine ceiling."""

    def __init__(self, model: Model, budget: Budget, *, ceiling_bytes: int | None = None) -> None:
        self.model = model
        self.budget = budget
        self.ceiling_bytes = ceiling_bytes if ceiling_bytes is not None else budget.transport_max_body_bytes
        self.requests_sent = 0
        self.largest_request_bytes = 0

    def chunk_bytes(self, max_bytes: int) -> int:
        room = self.ceiling_bytes - self.budget.summary_request_overhead_bytes - 2 * max_bytes
        return max(1024, min(self.budget.summary_chunk_bytes, room))

    def chunks(self, messages: list[Message], max_bytes: int) -> list[str]:
        """Transcript pieces whose JSON-escaped size is at most the chunk size."""
        limit = self.chunk_bytes(max_bytes)
        pieces: list[str] = []
        current: list[str] = []
        size = 0
        for message in messages:
            line = render_message(message, limit // 2)  # escaping at most doubles plain text
            line_size = len(orjson.dumps(line))
            if current and size + line_size > limit:
                pieces.append("\n".join(current))
                current, size = [], 0
            current.append(line)
            size += line_size + 2
        if current:
            pieces.append("\n".join(current))
        return pieces

    async def summarize(self, messages: list[Message], max_bytes: int) -> str:
        summary = ""
        for piece in self.chunks(messages, max_bytes):
            # The bound travels in the text: a real model follows it (params are ours, not sent).
            bound = f"Write the summary in at most {max_bytes} bytes.\n"
            prompt = bound + (f"Summary so far:\n{summary}\n\nTranscript to fold in:\n{piece}" if summary
                              else f"Transcript:\n{piece}")
            request = LlmTurnRequest(
                messages=[{"role": "system", "content": SUMMARY_SYSTEM_PROMPT},
                          {"role": "user", "content": prompt}],
                params={"maxBytes": max_bytes},
                purpose="summary",
            )
            encoded = encode_request(request)
            if encoded.size > self.ceiling_bytes:
                raise TurnFailure(
                    "code", f"summary request of {encoded.size} bytes is over the engine ceiling "
                    f"of {self.ceiling_bytes} bytes", hop="engine.llm_turn",
                    limit_bytes=self.ceiling_bytes, observed_bytes=encoded.size, size_error=True)
            self.requests_sent += 1
            self.largest_request_bytes = max(self.largest_request_bytes, encoded.size)
            response = await self.model.complete(encoded)
            content = response.message.get("content")
            if not isinstance(content, str) or not content.strip():
                raise TurnFailure("model", "the summarizer returned no text")
            summary = clip_utf8(content, max_bytes)
        return summary


@dataclasses.dataclass(frozen=True)
class SummaryOutcome:
    text: str
    summarizer: Literal["model", "extractive"]
    failure: TurnFailure | None = None


async def summarize_with_fallback(summarizer: Summarizer | None, messages: list[Message],
                                  max_bytes: int) -> SummaryOutcome:
    """The model's summary, or the extractive one when there is no summarizer or it fails."""
    if summarizer is not None:
        try:
            text = await summarizer.summarize(messages, max_bytes)
            return SummaryOutcome(clip_utf8(text, max_bytes), "model")
        except TurnFailure as failure:
            return SummaryOutcome(extractive_summary(messages, max_bytes), "extractive", failure)
    return SummaryOutcome(extractive_summary(messages, max_bytes), "extractive")
