"""The tool loop (SPEC H-7, H-8).

One iteration: compaction check -> repair -> size check -> llm-turn -> execute tool calls ->
append -> repeat, until a final answer, cancellation, a failure or the profile's max iterations.

The conversation is a plain list of OpenAI-shape message dicts, extended in place, so the ACP agent
can persist it. The exact body size is known before every send (``IncrementalEstimator``); a body
over the engine ceiling is never sent: compaction runs first, and if even the compacted body cannot
fit, the turn fails with origin ``code`` naming the ceiling and the size. These rules are the
loop's :class:`~hopline.harness.sizing.Sizing` (the budget's by default).

A model that streams (:class:`~hopline.harness.model.StreamingModel`) hands its text over as it is
produced: each delta is an ``AgentText`` event right away. After every answer the token estimate is
anchored on the provider's ``usage.prompt_tokens`` (H-2); the progress event says which estimate
the compaction decision used. A compaction after a size failure is labelled ``transport``
(reactive), and a summarizer failure is carried in the compaction's record.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path
from typing import Any, Literal

import orjson

from hopline.budget import HOP_ENGINE, Budget
from hopline.errors import TurnFailure
from hopline.harness import failures
from hopline.harness.context import RepairReport, Trigger, apply_compaction, plan_compaction, repair
from hopline.harness.loop_events import (
    AgentText,
    Compacted,
    CompactionRecord,
    EventSink,
    IterationProgress,
    LoopEvent,
    PermissionHook,
    PlanUpdated,
    ToolCallFinished,
    ToolCallStarted,
)
from hopline.harness.model import (
    EncodedRequest,
    LlmTurnRequest,
    LlmTurnResponse,
    Message,
    Model,
    StreamingModel,
)
from hopline.harness.plan import PlanTracker
from hopline.harness.profiles import Profile, model_context_window
from hopline.harness.sizing import BUDGETED, Sizing
from hopline.harness.summarize import ModelSummarizer, summarize_with_fallback
from hopline.harness.tokens import bytes_per_token
from hopline.harness.tools import ReviewRange, ToolOutcome, Workspace, tool_schemas
from hopline.vocabulary import MESSAGE_META

log = logging.getLogger("hopline.harness")

StopReason = Literal["end_turn", "max_iterations", "cancelled", "failed"]
PERMISSION_TOOLS = frozenset({"run_command", "write_file"})
REJECTED_TEXT = "rejected by the user: the tool call was not run"


@dataclasses.dataclass
class TurnResult:
    stop_reason: StopReason
    final_text: str = ""
    failure: TurnFailure | None = None
    iterations: int = 0
    compactions: list[CompactionRecord] = dataclasses.field(default_factory=list)
    max_body_bytes: int = 0
    repairs: RepairReport = dataclasses.field(default_factory=RepairReport)
    summarizer_failures: list[TurnFailure] = dataclasses.field(default_factory=list)
    model_retries: int = 0
    size_retries: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "stopReason": self.stop_reason,
            "finalText": self.final_text,
            "failure": self.failure.to_json()["error"] if self.failure else None,
            "iterations": self.iterations,
            "compactions": [c.to_json() for c in self.compactions],
            "maxBodyBytes": self.max_body_bytes,
            "repairs": self.repairs.to_json(),
            "summarizerFailures": [f.to_json()["error"] for f in self.summarizer_failures],
            "modelRetries": self.model_retries,
            "sizeRetries": self.size_retries,
        }


class ToolLoop:
    """Runs turns of one agent profile over one workspace; see the module docstring."""

    def __init__(
        self,
        model: Model,
        profile: Profile,
        workspace: Path,
        budget: Budget,
        *,
        sink: EventSink | None = None,
        permit: PermissionHook | None = None,
        summarizer_model: Model | None = None,
        sizing: Sizing = BUDGETED,
        model_name: str | None = None,
        params: dict[str, Any] | None = None,
        review: ReviewRange | None = None,
    ) -> None:
        self.model = model
        self.profile = profile
        self.budget = budget
        self.sink = sink
        self.permit = permit
        self.sizing = sizing
        self.send_ceiling = sizing.send_ceiling(budget)
        self.tools = Workspace(workspace, budget, allow_write="write_file" in profile.tools, review=review)
        self.bounds = sizing.bounds(model_context_window(profile, budget), budget.transport_max_body_bytes,
                                    bytes_per_token(budget), profile.compaction_threshold)
        self.envelope = LlmTurnRequest([], tools=tool_schemas(profile.tools), model=model_name,
                                       params=dict(params or {}))
        self.sizer = sizing.estimator(budget, self.envelope)
        self.summarizer = ModelSummarizer(summarizer_model or model, budget)
        self._task: asyncio.Task[Any] | None = None
        self._plan = PlanTracker(budget.plan_max_entries)

    @property
    def ceiling_bytes(self) -> int:
        return self.budget.transport_max_body_bytes

    def close(self) -> None:
        """Drop the kept (cut) tool outputs; the loop's tools are unusable afterwards."""
        self.tools.close()

    def cancel(self) -> None:
        """End the running turn with stop reason ``cancelled`` (the conversation stays valid)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()

    async def run(self, conversation: list[Message], user_text: str) -> TurnResult:
        result = TurnResult(stop_reason="failed")
        self._task = asyncio.current_task()
        try:
            await self._run(conversation, user_text, result)
        except asyncio.CancelledError:
            if self._task is not None:
                self._task.uncancel()
            result.stop_reason = "cancelled"
            result.failure = failures.cancelled()
            result.final_text = "cancelled"
        except TurnFailure as failure:
            result.stop_reason = "failed"
            result.failure = failure
            result.final_text = f"turn failed (origin {failure.origin}): {failure.message}"
            log.warning("turn failed", extra={"origin": failure.origin, "status": failure.status,
                                              "limit_bytes": failure.limit_bytes,
                                              "observed_bytes": failure.observed_bytes})
        finally:
            self._task = None
            # Whatever happened, leave a history the provider accepts (no orphan, no unanswered call).
            self._repair(conversation, result)
        return result

    # --- the loop --------------------------------------------------------------------------------

    async def _emit(self, event: LoopEvent) -> None:
        if self.sink is not None:
            await self.sink(event)

    async def _run(self, conversation: list[Message], user_text: str, result: TurnResult) -> None:
        if not conversation or conversation[0].get("role") != "system":
            conversation.insert(0, {"role": "system", "content": self.profile.system_prompt})
        conversation.append({"role": "user", "content": user_text})
        self._plan = PlanTracker(self.budget.plan_max_entries)
        for iteration in range(1, self.profile.max_iterations + 1):
            result.iterations = iteration
            compacted = await self._compaction_check(conversation, result)
            self._repair(conversation, result)
            compacted = await self._size_check(conversation, result) or compacted
            response, streamed = await self._send(conversation, result, iteration, compacted)
            message = _validated(response)
            conversation.append(message)
            text = message.get("content") or ""
            if text and not streamed:  # a streamed answer's text went out delta by delta already
                await self._emit(AgentText(text))
            calls = message.get("tool_calls")
            if not calls:
                await self._emit(PlanUpdated(self._plan.answered()))
                result.stop_reason = "end_turn"
                result.final_text = text
                return
            await self._emit(PlanUpdated(self._plan.iteration_started(
                iteration, [str(c["function"]["name"]) for c in calls])))
            await self._execute(calls, conversation)
            finished = self._plan.iteration_finished()
            if finished is not None:
                await self._emit(PlanUpdated(finished))
        result.stop_reason = "max_iterations"
        result.final_text = next((m["content"] for m in reversed(conversation)
                                  if m.get("role") == "assistant" and m.get("content")),
                                 f"stopped after {self.profile.max_iterations} iterations")

    def _repair(self, conversation: list[Message], result: TurnResult) -> None:
        fixed, report = repair(conversation)
        if report.total:
            conversation[:] = fixed
            result.repairs.add(report)
            log.warning("history repaired before send", extra=report.to_json())

    async def _compaction_check(self, conversation: list[Message],
                                result: TurnResult) -> CompactionRecord | None:
        """Compact when the estimate or the body passes its trigger; the compaction, if one ran."""
        self.sizer.sync(conversation)
        trigger = self.bounds.compaction_trigger(self.sizer.estimate()[0], self.sizer.body_bytes)
        if trigger is None:
            return None
        return await self._compact(conversation, result, trigger=trigger)

    async def _size_check(self, conversation: list[Message], result: TurnResult) -> CompactionRecord | None:
        """A body over the engine ceiling is never sent: compact first, else fail with origin code."""
        ceiling = self.send_ceiling
        if ceiling is None:
            return None
        self.sizer.sync(conversation)
        size = self.sizer.body_bytes
        if size <= ceiling:
            return None
        record = await self._compact(conversation, result, trigger="transport")
        self.sizer.sync(conversation)
        after = self.sizer.body_bytes
        if after > ceiling:
            why = record.reason if record else "nothing could be compacted"
            raise failures.over_ceiling(after, ceiling,
                                        f"after compaction from {size} bytes; {why}")
        return record

    async def _compact(self, conversation: list[Message], result: TurnResult, *, trigger: Trigger,
                       target_body_bytes: int | None = None,
                       reactive: bool = False) -> CompactionRecord | None:
        self._repair(conversation, result)  # groups must be whole before a cut
        self.sizer.sync(conversation)
        target_body = target_body_bytes if target_body_bytes is not None else self.bounds.target_body_bytes
        target_tokens = min(self.bounds.target_tokens, target_body // self.bounds.bytes_per_token)
        tokens, source = self.sizer.estimate()
        if source == "usage" and tokens > self.sizer.estimate_tokens > 0:
            # The provider counts more tokens than the bytes estimate: the plan (in estimate units)
            # aims lower by the same ratio, so the next usage lands near the target, not over it.
            target_tokens = target_tokens * self.sizer.estimate_tokens // tokens
        plan = plan_compaction(
            conversation, target_tokens=target_tokens, target_body_bytes=target_body,
            bytes_per_token=self.bounds.bytes_per_token, envelope_bytes=self.sizer.envelope_bytes,
            summary_max_bytes=self.budget.summary_max_bytes, sizes=self.sizer.message_sizes(),
            summary_frame_bytes=self.budget.summary_frame_bytes)
        if not plan.possible:
            return None
        outcome = await summarize_with_fallback(self.summarizer, plan.old, plan.summary_max_bytes)
        summarizer_error: dict[str, Any] | None = None
        if outcome.failure is not None:
            result.summarizer_failures.append(outcome.failure)
            summarizer_error = failures.failure_brief(outcome.failure)
            log.warning("summarizer failed; extractive summary used", extra=summarizer_error)
        compacted, record = apply_compaction(
            plan, outcome.text, summarizer=outcome.summarizer, trigger=trigger,
            envelope_bytes=self.sizer.envelope_bytes, target_body_bytes=target_body,
            bytes_before=self.sizer.body_bytes, reactive=reactive, summarizer_error=summarizer_error)
        conversation[:] = compacted
        result.compactions.append(record)
        await self._emit(Compacted(record))
        return record

    async def _send(self, conversation: list[Message], result: TurnResult, iteration: int,
                    compacted: CompactionRecord | None) -> tuple[LlmTurnResponse, bool]:
        """The answer, and whether its text was streamed (handed out as AgentText deltas).

        ``compacted``: this iteration's compaction, if any (its trigger labels the progress). A
        failed send is answered by :func:`hopline.harness.failures.react`."""
        attempt = failures.Attempt(self.budget.model_retry_attempts, self.budget.model_retry_backoff_seconds,
                                   max_size_retries=self.sizing.size_retries)
        retry: dict[str, Any] | None = None  # what the next send retries, for its progress event
        sends = 0
        while True:
            self.sizer.sync(conversation)
            encoded = self.sizer.encoded()
            # _size_check guards this already; kept as the last net before the wire
            if self.send_ceiling is not None and encoded.size > self.send_ceiling:
                raise failures.over_ceiling(encoded.size, self.send_ceiling)
            await self._emit(self._progress(iteration, encoded.size, result, compacted, retry))
            result.max_body_bytes = max(result.max_body_bytes, encoded.size)
            sends += 1
            streamed = _Streamed()
            try:
                return await self._complete(encoded, streamed), streamed.bytes > 0
            except TurnFailure as failure:
                retry = {**failures.failure_brief(failure), "attempt": sends, "streamedBytes": streamed.bytes}
                reaction = failures.react(failure, attempt)
                if reaction.kind is failures.ReactionKind.COMPACT_AND_RETRY:
                    compacted = await self._compact_to_resend(conversation, result, failure, encoded.size) \
                        or compacted
                    attempt = attempt.retried_size()
                elif reaction.kind is failures.ReactionKind.RETRY:
                    await asyncio.sleep(reaction.delay_seconds)
                    result.model_retries += 1
                    attempt = attempt.retried_model()
                elif failure.size_error:
                    raise TurnFailure(
                        "code", f"{failure.message} {reaction.detail}", status=failure.status,
                        hop=failure.hop, limit_bytes=failure.limit_bytes, observed_bytes=encoded.size,
                        size_error=True, setting=failure.setting) from None
                else:
                    raise failures.retries_spent(failure, sends, attempt) from None
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a Model broke its contract: classify, never guess "code" (no retry)
                raise failures.classify_exception(exc, hop=HOP_ENGINE, body_bytes=encoded.size) from exc

    def _progress(self, iteration: int, body_bytes: int, result: TurnResult,
                  compacted: CompactionRecord | None, retry: dict[str, Any] | None) -> IterationProgress:
        tokens, source = self.sizer.estimate()
        return IterationProgress(
            iteration=iteration, max_iterations=self.profile.max_iterations, body_bytes=body_bytes,
            ceiling_bytes=self.ceiling_bytes, estimate_tokens=tokens,
            effective_window_tokens=self.bounds.effective_window, compactions=len(result.compactions),
            trigger=compacted.trigger if compacted else None, estimate_source=source, retry=retry)

    async def _complete(self, encoded: EncodedRequest, streamed: _Streamed) -> LlmTurnResponse:
        """One llm-turn; the text a streaming model hands out goes out as AgentText at once."""

        async def on_text(text: str) -> None:
            streamed.bytes += len(text.encode("utf-8"))
            await self._emit(AgentText(text))

        if isinstance(self.model, StreamingModel):
            response = await self.model.complete_streaming(encoded, on_text)
        else:
            response = await self.model.complete(encoded)
        self.sizer.anchor(response.usage.prompt_tokens)
        return response

    async def _compact_to_resend(self, conversation: list[Message], result: TurnResult, failure: TurnFailure,
                                 sent: int) -> CompactionRecord | None:
        """After a size failure: compact to half the refused body; never resend the same body."""
        result.size_retries += 1
        record = await self._compact(conversation, result, trigger="transport", reactive=True,
                                     target_body_bytes=min(self.bounds.target_body_bytes, sent // 2))
        self._repair(conversation, result)
        self.sizer.sync(conversation)
        if self.sizer.body_bytes >= sent:
            raise TurnFailure(
                "code", f"{failure.message}; compaction could not make the body smaller than "
                f"{sent} bytes, so it is not resent", status=failure.status, hop=failure.hop,
                limit_bytes=failure.limit_bytes, observed_bytes=sent, size_error=True,
                setting=failure.setting)
        return record

    async def _execute(self, calls: list[dict[str, Any]], conversation: list[Message]) -> None:
        """Each call checked, started and permitted in order; run one after the other, or all at once
        in a gate review (its tools only read); their results in the calls' order."""
        ready: list[tuple[str, str, dict[str, Any], ToolOutcome | None]] = []
        for index, call in enumerate(calls):
            name, args, outcome = self._checked(index, call, len(calls))
            info = self.tools.describe(name, args)
            started = ToolCallStarted(call["id"], name, info.kind, info.title, args, info.locations)
            await self._emit(started)
            outcome = await self._permitted(started, outcome)
            if self.tools.reads_only:
                ready.append((call["id"], name, args, outcome))
                continue
            ran, crash = await self._run_tool(name, args, call["id"], outcome)  # it may need the last one's
            await self._finish(call["id"], name, ran, crash, conversation)
        if not ready:
            return
        runs = await asyncio.gather(*(self._run_tool(name, args, call_id, outcome)
                                      for call_id, name, args, outcome in ready))
        crashed = None
        for (call_id, name, _, _), (ran, crash) in zip(ready, runs, strict=True):
            try:
                await self._finish(call_id, name, ran, crash, conversation)
            except failures.TurnFailure as exc:
                crashed = crashed or exc
        if crashed is not None:
            raise crashed

    def _checked(self, index: int, call: dict[str, Any], count: int
                 ) -> tuple[str, dict[str, Any], ToolOutcome | None]:
        """The call's name and arguments, and the error outcome of a call that is not run."""
        budget = self.budget
        limit = budget.tool_calls_per_iteration_max
        function = call["function"]
        name: str = function["name"]
        arguments: str = function["arguments"]
        size = len(arguments.encode("utf-8"))
        if index >= limit:
            return name, {}, self.tools.error(
                f"not executed: the answer had {count} tool calls, over the limit of {limit} per "
                "iteration (HOPLINE_TOOL_CALLS_PER_ITERATION)")
        if size > budget.tool_arguments_max_bytes:
            return name, {}, self.tools.error(
                f"not executed: arguments of {size} bytes are over the limit of "
                f"{budget.tool_arguments_max_bytes} bytes (HOPLINE_TOOL_ARGUMENTS_MAX_BYTES)")
        if name not in self.profile.tools:
            return name, {}, self.tools.error(f"tool {name!r} is not available to this agent")
        try:
            parsed = orjson.loads(arguments or "{}")
        except orjson.JSONDecodeError as exc:
            return name, {}, self.tools.error(f"arguments are not valid JSON: {exc}")
        if not isinstance(parsed, dict):
            return name, {}, self.tools.error("arguments must be a JSON object")
        return name, parsed, None

    async def _permitted(self, started: ToolCallStarted, outcome: ToolOutcome | None) -> ToolOutcome | None:
        if outcome is None and started.name in PERMISSION_TOOLS and self.permit is not None \
                and not await self.permit(started):
            return ToolOutcome(REJECTED_TEXT, REJECTED_TEXT, "failed")
        return outcome

    async def _run_tool(self, name: str, args: dict[str, Any], call_id: str, outcome: ToolOutcome | None
                        ) -> tuple[ToolOutcome, BaseException | None]:
        if outcome is not None:
            return outcome, None
        try:
            return await self.tools.run(name, args, call_id), None
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return self.tools.error(f"tool {name} crashed: {type(exc).__name__}"), exc

    async def _finish(self, call_id: str, name: str, outcome: ToolOutcome, crash: BaseException | None,
                      conversation: list[Message]) -> None:
        result_message: Message = {"role": "tool", "tool_call_id": call_id, "content": outcome.model_output}
        if outcome.meta:  # for programs that read results (the offline reviewer); no provider gets it
            result_message[MESSAGE_META] = outcome.meta
        conversation.append(result_message)
        await self._emit(ToolCallFinished(call_id, outcome.status, outcome.output, outcome.model_output,
                                          outcome.raw_output))
        if crash is not None:
            raise failures.tool_crash(name, crash) from crash


@dataclasses.dataclass
class _Streamed:
    bytes: int = 0  # text bytes a streaming model handed out during one send


def _validated(response: LlmTurnResponse) -> Message:
    """The assistant message, normalized; anything we cannot act on is a model-origin failure."""
    message = response.message
    if not isinstance(message, dict) or message.get("role") not in ("assistant", None):
        raise failures.malformed_output("the answer is not an assistant message")
    content = message.get("content")
    if content is not None and not isinstance(content, str | list):
        raise failures.malformed_output("content is neither text nor parts")
    out: Message = {"role": "assistant", "content": content if content is not None else ""}
    calls = message.get("tool_calls")
    if calls:
        if not isinstance(calls, list):
            raise failures.malformed_output("tool_calls is not a list")
        seen: set[str] = set()
        clean: list[dict[str, Any]] = []
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            call_id = call.get("id") if isinstance(call, dict) else None
            if not isinstance(call_id, str) or not call_id or call_id in seen or not isinstance(fn, dict) \
                    or not isinstance(fn.get("name"), str) or not isinstance(fn.get("arguments", ""), str):
                raise failures.malformed_output("a tool call lacks a unique id, a name or string arguments")
            seen.add(call_id)
            clean.append({"id": call_id, "type": "function",
                          "function": {"name": fn["name"], "arguments": fn.get("arguments", "")}})
        out["tool_calls"] = clean
    return out
