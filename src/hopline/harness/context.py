"""The context manager (SPEC H-3..H-6): pure functions, no I/O.

* the effective window is ``min(context_window, transport_max_body_bytes // bytes_per_token)``:
  compaction must fire before the body passes the real HTTP ceiling, not only before the model
  "forgets" its window (H-3);
* ``group_by_iteration`` gives the only places a cut may fall;
* ``plan_compaction`` / ``apply_compaction`` replace the oldest groups with one summary message;
* ``repair`` restores the tool-use protocol before every send, and reports what it did.

One walker, :func:`walk_calls`, reads "an assistant message plus its tool results" for every rule
here: ``group_by_iteration``, ``violations`` and ``repair`` are each a few lines over its segments.

Named invariants, each enforced by code:

* ``TOOL_RESULT_FOLLOWS_CALL`` every tool message answers a call of the assistant message right
  before its run of tool messages;
* ``CALL_HAS_RESULT`` every tool call is answered by exactly one tool message;
* ``NO_DUPLICATE_RESULT`` no call is answered twice
  (the three: reported by ``violations``, restored by ``repair`` before every send);
* ``SYSTEM_KEPT`` / ``TASK_KEPT`` compaction keeps the system prompt and the first user message;
* ``CUT_BETWEEN_GROUPS`` compaction replaces whole groups only
  (the three: reported by ``compaction_violations``; ``plan_compaction`` refuses a plan that breaks
  one with :class:`InvariantBroken`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, Literal, ParamSpec

import orjson

from hopline.budget import CEILINGS_BY_KEY
from hopline.errors import InternalError
from hopline.harness.loop_events import CompactionRecord
from hopline.harness.model import Message
from hopline.harness.tokens import body_bytes_for, message_bytes

TOOL_RESULT_FOLLOWS_CALL = "TOOL_RESULT_FOLLOWS_CALL"
CALL_HAS_RESULT = "CALL_HAS_RESULT"
NO_DUPLICATE_RESULT = "NO_DUPLICATE_RESULT"
SYSTEM_KEPT = "SYSTEM_KEPT"
TASK_KEPT = "TASK_KEPT"
CUT_BETWEEN_GROUPS = "CUT_BETWEEN_GROUPS"

Trigger = Literal["model", "transport"]
P = ParamSpec("P")

SUMMARY_MARKER = "[hopline compaction summary]"
INTERRUPTED_TEXT = "interrupted: the tool call did not complete (no result was recorded)"


def effective_window(context_window: int, transport_max_body_bytes: int, bytes_per_token: int) -> int:
    """The smaller of the model window and what the transport ceiling can carry, in tokens."""
    return min(context_window, transport_max_body_bytes // bytes_per_token)


@dataclasses.dataclass(frozen=True)
class Bounds:
    """The compaction bounds of one loop: model window, transport ceiling, threshold.

    Compaction fires at ``threshold`` of the effective window (in tokens) or of the transport
    ceiling (in exact body bytes), whichever is passed first.
    """

    context_window: int
    ceiling_bytes: int
    bytes_per_token: int
    threshold: float

    @property
    def transport_window(self) -> int:
        return self.ceiling_bytes // self.bytes_per_token

    @property
    def effective_window(self) -> int:
        return effective_window(self.context_window, self.ceiling_bytes, self.bytes_per_token)

    @property
    def trigger_kind(self) -> Trigger:
        """Which bound is the smaller one (ties go to the model)."""
        return "model" if self.context_window <= self.transport_window else "transport"

    @property
    def trigger_tokens(self) -> int:
        return int(self.threshold * self.effective_window)

    @property
    def trigger_body_bytes(self) -> int | None:
        """Exact body bytes above which compaction fires (None: the body alone never triggers it)."""
        return int(self.threshold * self.ceiling_bytes)

    @property
    def target_tokens(self) -> int:
        return self.trigger_tokens // 2

    @property
    def target_body_bytes(self) -> int:
        trigger = self.trigger_body_bytes
        return (trigger if trigger is not None else self.ceiling_bytes) // 2

    def should_compact(self, estimate_tokens: int, body_bytes: int) -> bool:
        return self.compaction_trigger(estimate_tokens, body_bytes) is not None

    def compaction_trigger(self, estimate_tokens: int, body_bytes: int) -> Trigger | None:
        """Which bound asks for a compaction: the token estimate over the effective window's
        trigger (labelled by the smaller bound), else the exact body over the transport trigger."""
        if estimate_tokens > self.trigger_tokens:
            return self.trigger_kind
        trigger = self.trigger_body_bytes
        return "transport" if trigger is not None and body_bytes > trigger else None


# --- groups -------------------------------------------------------------------------------------

GroupKind = Literal["system", "task", "message", "iteration", "orphan"]


@dataclasses.dataclass(frozen=True)
class Group:
    """Messages ``[start, end)``: one iteration (assistant with calls + its answers) or one message."""

    start: int
    end: int
    kind: GroupKind

    def __len__(self) -> int:
        return self.end - self.start


def call_ids(message: Message) -> list[str]:
    ids: list[str] = []
    for call in message.get("tool_calls") or []:
        call_id = call.get("id") if isinstance(call, dict) else None
        if isinstance(call_id, str) and call_id not in ids:
            ids.append(call_id)
    return ids


def has_calls(message: Message) -> bool:
    return message.get("role") == "assistant" and bool(message.get("tool_calls"))


Verdict = Literal["answer", "duplicate", "stray"]


@dataclasses.dataclass(frozen=True)
class Segment:
    """One step of :func:`walk_calls`: the message at ``index``; when it is an assistant message with
    tool calls, also the run of tool messages right after it (``results``: index and verdict, an
    ``answer`` to one of its ``calls``, a ``duplicate`` answer, or a ``stray`` that answers none)
    and the calls no result answers (``missing``). ``orphan``: a tool message outside any run."""

    index: int
    calls: tuple[str, ...] = ()
    results: tuple[tuple[int, Verdict], ...] = ()
    missing: tuple[str, ...] = ()
    orphan: bool = False


def walk_calls(messages: list[Message]) -> list[Segment]:
    """``messages`` as segments, in order; every message is in exactly one segment."""
    segments: list[Segment] = []
    i, n = 0, len(messages)
    while i < n:
        message = messages[i]
        if message.get("role") == "tool":
            segments.append(Segment(i, orphan=True))
            i += 1
            continue
        if not has_calls(message):
            segments.append(Segment(i))
            i += 1
            continue
        ids = call_ids(message)
        answered: set[str] = set()
        results: list[tuple[int, Verdict]] = []
        j = i + 1
        while j < n and messages[j].get("role") == "tool":
            call_id = messages[j].get("tool_call_id")
            verdict: Verdict = "stray"
            if call_id in ids:
                verdict = "duplicate" if call_id in answered else "answer"
                answered.add(call_id)
            results.append((j, verdict))
            j += 1
        segments.append(Segment(i, tuple(ids), tuple(results), tuple(c for c in ids if c not in answered)))
        i = j
    return segments


def group_by_iteration(messages: list[Message]) -> list[Group]:
    """Split ``messages`` into groups; a cut between groups never separates a result from its call.

    An assistant message with ``tool_calls`` takes the run of tool messages right after it that
    answer its calls (up to the first that answers none). A tool message outside such a run is an
    ``orphan`` group (``repair`` removes those before a send).
    """
    groups: list[Group] = []
    task_seen = False
    for segment in walk_calls(messages):
        i = segment.index
        if segment.calls:
            verdicts = [verdict for _, verdict in segment.results]
            whole = verdicts.index("stray") if "stray" in verdicts else len(verdicts)
            groups.append(Group(i, i + 1 + whole, "iteration"))
            groups.extend(Group(j, j + 1, "orphan") for j, _ in segment.results[whole:])
            continue
        role = messages[i].get("role")
        if segment.orphan:
            kind: GroupKind = "orphan"
        elif role == "system":
            kind = "system"
        elif role == "user" and not task_seen:
            kind = "task"
            task_seen = True
        else:
            kind = "message"
        groups.append(Group(i, i + 1, kind))
    return groups


def violations(messages: list[Message]) -> list[tuple[str, int]]:
    """Protocol invariant violations as (invariant, message index); empty when valid."""
    found: list[tuple[str, int]] = []
    for segment in walk_calls(messages):
        if segment.orphan:
            found.append((TOOL_RESULT_FOLLOWS_CALL, segment.index))
        for index, verdict in segment.results:
            if verdict == "stray":
                found.append((TOOL_RESULT_FOLLOWS_CALL, index))
            elif verdict == "duplicate":
                found.append((NO_DUPLICATE_RESULT, index))
        found.extend((CALL_HAS_RESULT, segment.index) for _ in segment.missing)
    return found


def orphan_tool_messages(messages: list[Message]) -> int:
    """Tool messages that do not answer a call right before them (the provider would refuse)."""
    bad = (TOOL_RESULT_FOLLOWS_CALL, NO_DUPLICATE_RESULT)
    return sum(1 for name, _ in violations(messages) if name in bad)


# --- repair -------------------------------------------------------------------------------------


@dataclasses.dataclass
class RepairReport:
    """What ``repair`` changed; never silent (SPEC H-6)."""

    orphan_results_removed: int = 0
    interrupted_results_added: int = 0

    @property
    def total(self) -> int:
        return self.orphan_results_removed + self.interrupted_results_added

    def add(self, other: RepairReport) -> None:
        self.orphan_results_removed += other.orphan_results_removed
        self.interrupted_results_added += other.interrupted_results_added

    def to_json(self) -> dict[str, int]:
        return {"orphanResultsRemoved": self.orphan_results_removed,
                "interruptedResultsAdded": self.interrupted_results_added}


def interrupted_result(call_id: str) -> Message:
    return {"role": "tool", "tool_call_id": call_id, "content": INTERRUPTED_TEXT}


def repair(messages: list[Message]) -> tuple[list[Message], RepairReport]:
    """A copy of ``messages`` (same message objects) satisfying the tool-use invariants.

    Orphan or duplicate tool results are removed; a call without an answer gets an "interrupted"
    result at the end of its run of answers.
    """
    report = RepairReport()
    out: list[Message] = []
    for segment in walk_calls(messages):
        if segment.orphan:
            report.orphan_results_removed += 1
            continue
        out.append(messages[segment.index])
        for index, verdict in segment.results:
            if verdict == "answer":
                out.append(messages[index])
            else:
                report.orphan_results_removed += 1
        for call_id in segment.missing:
            out.append(interrupted_result(call_id))
            report.interrupted_results_added += 1
    return out, report


# --- compaction ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CompactionPlan:
    """Where the cut falls: ``head`` (system + task) and ``tail`` kept, ``old`` summarized."""

    head: list[Message]
    old: list[Message]
    tail: list[Message]
    summary_max_bytes: int
    reason: str = ""  # why the target cannot be reached (empty when it can)
    # The latest user prompt when it falls in the summarized part: kept verbatim after the summary,
    # so a later turn's request survives compaction like the original task does.
    pinned: list[Message] = dataclasses.field(default_factory=list)

    @property
    def possible(self) -> bool:
        return bool(self.old)


def _sizes(messages: list[Message]) -> tuple[list[int], list[int]]:
    return [message_bytes(m) for m in messages], [len(orjson.dumps(m)) for m in messages]


# Room for the summary message's own framing beyond its text: the budget's, unless a caller says.
SUMMARY_FRAME_BYTES = int(CEILINGS_BY_KEY["summary_frame_bytes"].default)


class InvariantBroken(InternalError):
    """A compaction plan that breaks a named invariant: a bug in the planner, never sent."""

    def __init__(self, broken: list[str]) -> None:
        super().__init__(f"compaction plan breaks {', '.join(broken)}")
        self.broken = broken


def compaction_violations(messages: list[Message], plan: CompactionPlan) -> list[str]:
    """The compaction invariants ``plan`` (made from ``messages``) breaks: ``SYSTEM_KEPT`` and
    ``TASK_KEPT`` (those messages stay before the summary, verbatim), ``CUT_BETWEEN_GROUPS`` (the
    summarized part starts and ends on group boundaries)."""
    groups = group_by_iteration(messages)
    start, cut = len(plan.head), len(messages) - len(plan.tail)
    broken: list[str] = []
    kept = plan.head == messages[:start]
    if not kept or any(g.kind == "system" and g.start >= start for g in groups):
        broken.append(SYSTEM_KEPT)
    if not kept or any(g.kind == "task" and g.start >= start for g in groups):
        broken.append(TASK_KEPT)
    boundaries = {g.start for g in groups} | {len(messages)}
    if start not in boundaries or cut not in boundaries or plan.tail != messages[cut:]:
        broken.append(CUT_BETWEEN_GROUPS)
    return broken


def _enforcing_invariants(planner: Callable[P, CompactionPlan]) -> Callable[P, CompactionPlan]:
    """The planner, refusing any plan that breaks a compaction invariant (:class:`InvariantBroken`)."""

    @functools.wraps(planner)
    def checked(*args: P.args, **kwargs: P.kwargs) -> CompactionPlan:
        plan = planner(*args, **kwargs)
        messages: list[Message] = args[0] if args else kwargs["messages"]  # type: ignore[assignment]
        broken = compaction_violations(messages, plan)
        if broken:
            raise InvariantBroken(broken)
        return plan

    return checked


@_enforcing_invariants
def plan_compaction(
    messages: list[Message],
    *,
    target_tokens: int,
    target_body_bytes: int,
    bytes_per_token: int,
    envelope_bytes: int,
    summary_max_bytes: int,
    sizes: tuple[list[int], list[int]] | None = None,
    summary_frame_bytes: int = SUMMARY_FRAME_BYTES,
) -> CompactionPlan:
    """Choose the cut: keep head and the newest groups that fit the targets, summarize the rest.

    The newest group is always kept (the model needs the last iteration's results); if it alone
    overshoots, the plan says why. ``summary_max_bytes`` is shrunk so the summary cannot by itself
    eat the target. A plan that breaks a compaction invariant is refused (:class:`InvariantBroken`).
    """
    est, enc = sizes if sizes is not None else _sizes(messages)
    groups = group_by_iteration(messages)
    head_end = 0
    for index, group in enumerate(groups):
        if group.kind == "task":
            head_end = index + 1
            break
    else:
        while head_end < len(groups) and groups[head_end].kind == "system":
            head_end += 1
    head_groups, rest = groups[:head_end], groups[head_end:]
    head_stop = head_groups[-1].end if head_groups else 0
    summary_max = max(64, min(summary_max_bytes, target_body_bytes // 4))
    if len(rest) <= 1:
        return CompactionPlan(messages[:head_stop], [], messages[head_stop:], summary_max,
                              reason="nothing older than the newest iteration to summarize")

    def group_est(g: Group) -> int:
        return sum(est[g.start:g.end])

    def group_enc(g: Group) -> int:
        return sum(enc[g.start:g.end]) + len(g)  # + separators

    # JSON escaping can at most double ordinary text; reserve for the worst plausible summary.
    reserve_est = summary_max + summary_frame_bytes
    reserve_enc = 2 * summary_max + summary_frame_bytes
    used_est = sum(group_est(g) for g in head_groups) + reserve_est
    used_enc = envelope_bytes + sum(group_enc(g) for g in head_groups) + reserve_enc
    prompt = _latest_prompt(messages, groups, head_end)
    if prompt is not None:  # reserved up front: it stays whichever side of the cut it falls on
        used_est += group_est(prompt)
        used_enc += group_enc(prompt)
    target_est_bytes = target_tokens * bytes_per_token
    keep = 0
    reason = ""
    for group in reversed(rest[1:]):
        counted = group is prompt  # already reserved
        next_est = used_est + (0 if counted else group_est(group))
        next_enc = used_enc + (0 if counted else group_enc(group))
        if keep >= 1 and (next_est > target_est_bytes or next_enc > target_body_bytes):
            break
        if keep == 0 and (next_est > target_est_bytes or next_enc > target_body_bytes):
            reason = (f"the newest iteration alone ({group_enc(group)} bytes) with the system prompt, task "
                      f"and summary does not fit the target ({target_body_bytes} body bytes, "
                      f"{target_tokens} tokens); it is kept whole because a cut inside it would separate "
                      "tool results from their calls")
        used_est, used_enc = next_est, next_enc
        keep += 1
    cut = rest[len(rest) - keep].start if keep else rest[-1].end
    old_start = rest[0].start
    if cut <= old_start:
        return CompactionPlan(messages[:head_stop], [], messages[head_stop:], summary_max,
                              reason="already under the target")
    old = messages[old_start:cut]
    pinned: list[Message] = []
    if prompt is not None and old_start <= prompt.start < cut:
        pinned = [messages[prompt.start]]
        old = [m for i, m in enumerate(old, old_start) if i != prompt.start]
        if not old:
            return CompactionPlan(messages[:head_stop], [], messages[head_stop:], summary_max,
                                  reason="nothing older than the latest prompt and the newest iteration")
    return CompactionPlan(messages[:old_start], old, messages[cut:], summary_max, reason, pinned)


def _latest_prompt(messages: list[Message], groups: list[Group], head_end: int) -> Group | None:
    """The group of the latest user prompt after the task (not a compaction summary), if any."""
    for group in reversed(groups[head_end:]):
        message = messages[group.start]
        if group.kind == "message" and message.get("role") == "user":
            content = message.get("content")
            if not (isinstance(content, str) and content.startswith(SUMMARY_MARKER)):
                return group
    return None


def summary_message(summary_text: str, messages_replaced: int, bytes_replaced: int,
                    summarizer: str) -> Message:
    text = (f"{SUMMARY_MARKER} This summary replaces {messages_replaced} earlier messages "
            f"({bytes_replaced} bytes) of this conversation (summarizer: {summarizer}).\n{summary_text}")
    return {"role": "user", "content": text}


def apply_compaction(
    plan: CompactionPlan,
    summary_text: str,
    *,
    summarizer: Literal["model", "extractive"],
    trigger: Trigger,
    envelope_bytes: int,
    target_body_bytes: int,
    bytes_before: int | None = None,
    reactive: bool = False,
    summarizer_error: dict[str, Any] | None = None,
) -> tuple[list[Message], CompactionRecord]:
    """The compacted history and its record (how many messages and bytes the summary replaced)."""
    old_enc = [len(orjson.dumps(m)) for m in plan.old]
    bytes_replaced = sum(old_enc)
    summary = summary_message(summary_text, len(plan.old), bytes_replaced, summarizer)
    result = [*plan.head, summary, *plan.pinned, *plan.tail]
    if bytes_before is None:
        bytes_before = body_bytes_for(envelope_bytes, [len(orjson.dumps(m)) for m in
                                                       [*plan.head, *plan.old, *plan.pinned, *plan.tail]])
    bytes_after = body_bytes_for(envelope_bytes, [len(orjson.dumps(m)) for m in result])
    reason = plan.reason
    if not reason and bytes_after > target_body_bytes:
        reason = f"compacted body is {bytes_after} bytes, over the target of {target_body_bytes} bytes"
    record = CompactionRecord(trigger=trigger, messages_replaced=len(plan.old), bytes_replaced=bytes_replaced,
                              bytes_before=bytes_before, bytes_after=bytes_after, summarizer=summarizer,
                              reason=reason, reactive=reactive, summarizer_error=summarizer_error)
    return result, record
