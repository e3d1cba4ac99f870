"""The tool loop with a real provider's behaviour (SPEC G-5, H-2): streamed text, usage anchoring,
a plan that follows the loop, and the context window the operator sets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hopline.budget import Budget
from hopline.gateway.providers import text_pieces
from hopline.harness.failures import classify_http_status
from hopline.harness.loop import ToolLoop
from hopline.harness.loop_events import AgentText, IterationProgress, PlanUpdated
from hopline.harness.model import EncodedRequest, LlmTurnResponse, TextSink, Usage
from hopline.harness.plan import PlanTracker
from hopline.harness.profiles import get_profile
from hopline.harness.tokens import estimate
from hopline.scripted.model import InProcessModel, ScriptedModel

from .test_loop import Recorder

DEFAULT = Budget.defaults()


class StreamingScripted(InProcessModel):
    """The scripted model streaming its text word by word; ``fail_after`` pieces on the first
    attempt, the stream breaks (origin model, retryable) after that many pieces were handed over."""

    def __init__(self, scripted: ScriptedModel, *, fail_after: int | None = None) -> None:
        super().__init__(scripted)
        self.fail_after = fail_after
        self.streamed: list[list[str]] = []

    async def complete_streaming(self, encoded: EncodedRequest, on_text: TextSink) -> LlmTurnResponse:
        answer = await self.complete(encoded)
        pieces = text_pieces(str(answer.message.get("content") or ""))
        self.streamed.append(pieces)
        for index, piece in enumerate(pieces):
            if self.fail_after is not None and index == self.fail_after:
                self.fail_after = None
                raise classify_http_status(502, "stream cut")
            await on_text(piece)
        return answer


@pytest.mark.e2e
async def test_streamed_text_reaches_the_sink_piece_by_piece_and_only_once(sample: Path) -> None:
    model = StreamingScripted(ScriptedModel(iterations=2))
    rec = Recorder()
    result = await ToolLoop(model, get_profile("appsec", DEFAULT), sample, DEFAULT, sink=rec).run([], "go")
    assert result.stop_reason == "end_turn"
    texts = [e.text for e in rec.of(AgentText)]
    streamed = [piece for pieces in model.streamed for piece in pieces]
    assert texts == streamed and len(texts) > 2  # each delta as it came, none repeated whole
    assert "".join(model.streamed[-1]) == result.final_text


async def test_a_stream_cut_mid_reply_is_retried_and_the_retry_is_announced(sample: Path) -> None:
    budget = DEFAULT.replace(model_retry_backoff_seconds=0.001)
    model = StreamingScripted(ScriptedModel(iterations=1), fail_after=2)
    rec = Recorder()
    result = await ToolLoop(model, get_profile("appsec", budget), sample, budget, sink=rec).run([], "go")
    assert result.stop_reason == "end_turn" and result.model_retries == 1
    progress = rec.of(IterationProgress)
    assert progress[0].retry is None
    retry = progress[1].retry
    first_two = model.streamed[0][:2]
    assert retry == {"origin": "model", "status": 502, "hop": "gateway.provider", "attempt": 1,
                     "streamedBytes": len("".join(first_two).encode())}
    assert progress[1].to_json()["retry"] == retry
    # the client saw the cut reply's two pieces, then the whole retried reply
    texts = [e.text for e in rec.of(AgentText)]
    assert texts[:2] == first_two and texts[2:2 + len(model.streamed[1])] == model.streamed[1]


class DenseTokenizer(InProcessModel):
    """Reports ``usage.prompt_tokens`` at ``factor`` x the bytes estimate (0: reports no usage)."""

    def __init__(self, scripted: ScriptedModel, factor: int) -> None:
        super().__init__(scripted)
        self.factor = factor

    async def complete(self, encoded: EncodedRequest) -> LlmTurnResponse:
        answer = await super().complete(encoded)
        return LlmTurnResponse(answer.message, Usage(self.factor * estimate(encoded.request.messages), 1),
                               answer.provider)


async def _run_dense(sample: Path, factor: int) -> tuple[Any, Recorder]:
    budget = Budget.from_env({"HOPLINE_MODEL_CONTEXT_WINDOW": "200000"})
    model = DenseTokenizer(ScriptedModel(tools_per_iteration=3, iterations=100), factor)
    profile = get_profile("qa_automation", budget).replace(max_iterations=5)
    rec = Recorder()
    loop = ToolLoop(model, profile, sample, budget, sink=rec)
    try:
        return await loop.run([], "go"), rec
    finally:
        loop.close()


@pytest.mark.e2e
async def test_usage_anchoring_changes_the_compaction_decision(sample: Path) -> None:
    plain, plain_rec = await _run_dense(sample, 0)  # no usage: the bytes estimate decides
    dense, dense_rec = await _run_dense(sample, 3)  # the provider counts 3x the bytes estimate
    assert plain.stop_reason == dense.stop_reason == "max_iterations"
    assert plain.compactions == []
    assert {p.estimate_source for p in plain_rec.of(IterationProgress)} == {"bytes"}
    assert dense.compactions and {c.trigger for c in dense.compactions} == {"model"}
    sources = [p.estimate_source for p in dense_rec.of(IterationProgress)]
    assert sources[0] == "bytes" and "usage" in sources  # usage after the first answer
    # the window is the operator's (HOPLINE_MODEL_CONTEXT_WINDOW), the profile keeps 128,000
    assert {p.effective_window_tokens for p in dense_rec.of(IterationProgress)} == {200_000}
    assert get_profile("qa_automation", DEFAULT).context_window == 128_000
    # the same history: the usage-anchored estimate is about 3x the bytes one, and only it passed the
    # trigger (0.7 x 200,000) before the fifth send
    plain_by_iteration = {p.iteration: p for p in plain_rec.of(IterationProgress)}
    dense_by_iteration = {p.iteration: p for p in dense_rec.of(IterationProgress)}
    assert dense_by_iteration[4].estimate_tokens > 1.9 * plain_by_iteration[4].estimate_tokens
    assert plain_by_iteration[5].estimate_tokens < int(0.7 * 200_000)
    assert dense_by_iteration[5].trigger == "model" and plain_by_iteration[5].trigger is None
    # the compaction aimed lower by the provider's ratio: 3x what is left stays under the trigger
    assert dense_by_iteration[5].estimate_source == "bytes"  # the anchored messages were replaced
    assert 3 * dense_by_iteration[5].estimate_tokens < int(0.7 * 200_000)
    # the transport check stays on exact bytes: both runs sent the same bodies until the compaction
    assert [plain_by_iteration[i].body_bytes for i in range(1, 5)] == \
        [dense_by_iteration[i].body_bytes for i in range(1, 5)]


@pytest.mark.e2e
async def test_plan_follows_the_loop_and_only_changes_are_sent(sample: Path) -> None:
    budget = DEFAULT.replace(plan_max_entries=3)
    rec = Recorder()
    model = InProcessModel(ScriptedModel(tools_per_iteration=2, iterations=4))
    result = await ToolLoop(model, get_profile("appsec", budget), sample, budget, sink=rec).run([], "go")
    assert result.stop_reason == "end_turn" and result.iterations == 5
    plans = [e.entries for e in rec.of(PlanUpdated)]
    assert len(plans) == 2 * 4 + 1  # each tool iteration starts and finishes, then the answer
    for k in range(4):
        started, finished = plans[2 * k], plans[2 * k + 1]
        assert started[-1]["status"] == "in_progress"
        assert started[-1]["content"].startswith(f"Iteration {k + 1}:")
        assert finished[-1] == {**started[-1], "status": "completed"}
    assert all(len(p) <= 3 for p in plans)
    assert plans[-1] == [
        {"content": "Iterations 1-3: 5 tool calls", "priority": "medium", "status": "completed"},
        {"content": "Iteration 4: " + plans[-2][-1]["content"].split(": ", 1)[1], "priority": "medium",
         "status": "completed"},
        {"content": "Answer with the findings", "priority": "medium", "status": "completed"},
    ]
    assert plans[0][0]["content"] == "Iteration 1: list_files"


def test_plan_tracker_statuses_advance_and_unchanged_plans_are_not_repeated() -> None:
    plan = PlanTracker(4)
    assert plan.iteration_started(1, ["read_file", "read_file", "run_command"]) == [
        {"content": "Iteration 1: read_file x2, run_command", "priority": "medium", "status": "in_progress"}]
    assert plan.iteration_finished() is not None
    assert plan.iteration_finished() is None  # nothing changed: nothing to send
    with pytest.raises(ValueError):
        PlanTracker(1)
