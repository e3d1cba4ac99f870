from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from hopline.budget import Budget, KiB, MiB
from hopline.harness.context import INTERRUPTED_TEXT, SUMMARY_MARKER, violations
from hopline.harness.failures import classify_http_status
from hopline.harness.loop import REJECTED_TEXT, ToolLoop
from hopline.harness.loop_events import (
    AgentText,
    Compacted,
    IterationProgress,
    LoopEvent,
    ToolCallFinished,
    ToolCallStarted,
)
from hopline.harness.model import EncodedRequest, LlmTurnResponse, Usage
from hopline.harness.profiles import get_profile
from hopline.harness.sizing import BUDGETED, Sizing
from hopline.harness.tools import ReviewRange
from hopline.scripted.model import InProcessModel, ScriptedModel
from hopline.scripted.naive import NAIVE
from hopline.scripted.sample_pull_request import make_sample_pull_request

DEFAULT = Budget.defaults()


class Recorder:
    def __init__(self) -> None:
        self.events: list[LoopEvent] = []

    async def __call__(self, event: LoopEvent) -> None:
        self.events.append(event)

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


class CheckingModel(InProcessModel):
    """The scripted model, also checking every body it receives for protocol violations."""

    def __init__(self, scripted: ScriptedModel, **kw: Any) -> None:
        super().__init__(scripted, **kw)
        self.orphans = 0

    async def complete(self, encoded: EncodedRequest) -> LlmTurnResponse:
        if encoded.request.purpose == "turn":
            self.orphans += len(violations(encoded.request.messages))
        return await super().complete(encoded)


def gate_loop(sample: Path, budget: Budget, *, tools: int = 4, iterations: int = 100, **kw: Any
              ) -> tuple[ToolLoop, CheckingModel, Recorder]:
    model = CheckingModel(ScriptedModel(tools_per_iteration=tools, iterations=iterations))
    recorder = Recorder()
    profile = get_profile("qa_automation", budget)
    return ToolLoop(model, profile, sample, budget, sink=recorder, **kw), model, recorder


@pytest.mark.e2e
async def test_seed_scenario_gate_60_iterations_never_passes_the_ceiling(sample: Path) -> None:
    loop, model, rec = gate_loop(sample, DEFAULT, tools=4)
    conversation: list[dict] = []
    result = await loop.run(conversation, "review this PR")
    assert result.stop_reason in ("max_iterations", "end_turn")
    assert result.iterations == 60
    # 3-4 results of 32 KiB each per iteration: the cap is reached
    finished = rec.of(ToolCallFinished)
    assert sum(1 for f in finished if len(f.model_output.encode()) == 32 * KiB) > 100
    assert result.compactions and all(c.trigger == "model" for c in result.compactions)
    assert max(model.sizes) <= DEFAULT.transport_max_body_bytes
    assert result.max_body_bytes == max(model.sizes)
    assert model.orphans == 0 and violations(conversation) == []
    assert conversation[0]["role"] == "system" and conversation[1]["content"] == "review this PR"
    # events: one progress per llm-turn, started/finished in pairs, one Compacted each
    assert len(rec.of(IterationProgress)) == 60
    assert len(rec.of(ToolCallStarted)) == len(finished) > 0
    assert [e.record for e in rec.of(Compacted)] == result.compactions
    # sizing is incremental, counted: the encoder saw every distinct message of the history about
    # once (twice for tool calls, whose JSON is measured on its own), not once per send
    distinct = {id(m): m for request in model.requests for m in request.messages}
    history = sum(len(orjson.dumps(m)) for m in distinct.values())
    assert loop.sizer.encoded_bytes <= 2 * history
    assert loop.sizer.encoded_bytes < sum(model.sizes) / 2  # what re-encoding every send would cost
    loop.close()


@pytest.mark.e2e
async def test_transport_bound_with_huge_context_window(sample: Path) -> None:
    budget = DEFAULT.replace(context_window_tokens=4_000_000)
    loop, model, _ = gate_loop(sample, budget, tools=8)
    result = await loop.run([], "review")
    assert result.compactions and {c.trigger for c in result.compactions} == {"transport"}
    assert max(model.sizes) <= 8 * MiB
    assert max(model.sizes) > 4 * MiB  # it really grew toward the ceiling
    assert model.orphans == 0


@pytest.mark.e2e
async def test_small_transport_ceiling_every_body_under_256k(sample: Path) -> None:
    budget = DEFAULT.replace(transport_max_body_bytes=256 * KiB)
    loop, model, rec = gate_loop(sample, budget, tools=4)
    result = await loop.run([], "review")
    assert result.stop_reason == "max_iterations"
    assert max(model.sizes) <= 256 * KiB
    assert {c.trigger for c in result.compactions} == {"transport"}
    progress = rec.of(IterationProgress)
    assert all(p.effective_window_tokens == 64 * KiB for p in progress)
    assert model.orphans == 0


def dev_loop(sample: Path, budget: Budget, sizing: Sizing) -> tuple[ToolLoop, InProcessModel]:
    model = InProcessModel(ScriptedModel(tools_per_iteration=2, iterations=30, write_bytes=32 * KiB))
    profile = get_profile("dev", budget).replace(max_iterations=20)
    return ToolLoop(model, profile, sample, budget, sizing=sizing), model


async def test_naive_sizing_passes_the_ceiling_the_budgets_does_not(sample: Path) -> None:
    budget = DEFAULT.replace(transport_max_body_bytes=256 * KiB)
    naive, naive_model = dev_loop(sample, budget, NAIVE)
    naive_result = await naive.run([], "implement")
    assert not naive_result.compactions
    assert max(naive_model.sizes) > 256 * KiB  # the tool calls' arguments were invisible to it
    fixed, fixed_model = dev_loop(sample, budget, BUDGETED)
    fixed_result = await fixed.run([], "implement")
    assert fixed_result.compactions
    assert max(fixed_model.sizes) <= 256 * KiB
    assert len(list((sample / "generated").iterdir())) == 40


@pytest.mark.e2e
async def test_size_error_compacts_and_retries_once_with_a_smaller_body(sample: Path) -> None:
    model = CheckingModel(ScriptedModel(tools_per_iteration=3, iterations=100), max_body_bytes=300 * KiB)
    profile = get_profile("qa_strategy", DEFAULT).replace(max_iterations=12)
    loop = ToolLoop(model, profile, sample, DEFAULT)
    result = await loop.run([], "review")
    assert result.stop_reason == "max_iterations", result.failure
    assert result.size_retries >= 1
    refused = [i for i, s in enumerate(model.sizes) if s > 300 * KiB]
    assert refused
    for i in refused:  # the retry right after each refusal is a different, smaller body
        assert model.sizes[i + 1] < model.sizes[i]
        assert model.requests[i + 1].messages != model.requests[i].messages
    assert model.orphans == 0
    # the compaction after a refusal is the transport's, reactive (not the model window's)
    reactive = [c for c in result.compactions if c.reactive]
    assert len(reactive) == result.size_retries
    assert all(c.trigger == "transport" and c.to_json()["reactive"] for c in reactive)


class Always413:
    def __init__(self) -> None:
        self.sizes: list[int] = []

    async def complete(self, encoded: EncodedRequest) -> LlmTurnResponse:
        if encoded.request.purpose == "summary":
            return LlmTurnResponse({"role": "assistant", "content": "s"}, Usage(1, 1), "fake")
        self.sizes.append(encoded.size)
        raise classify_http_status(413, "request entity too large", body_bytes=encoded.size)


async def test_model_that_keeps_refusing_413_fails_with_origin_code(sample: Path) -> None:
    model = Always413()
    loop = ToolLoop(model, get_profile("appsec", DEFAULT), sample, DEFAULT)
    conversation: list[dict] = [{"role": "system", "content": "s"}, {"role": "user", "content": "old task"}]
    for k in range(6):  # some history, so compaction has something to replace
        conversation += [{"role": "assistant", "content": "", "tool_calls": [
            {"id": f"h{k}", "type": "function", "function": {"name": "list_files", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": f"h{k}", "content": "r" * 20_000}]
    result = await loop.run(conversation, "go")
    assert result.stop_reason == "failed"
    assert result.failure is not None and result.failure.origin == "code" and result.failure.status == 413
    turns = model.sizes
    assert len(turns) == 2 and turns[1] < turns[0]  # one retry, smaller
    assert violations(conversation) == []


class Flaky:
    def __init__(self, failures: list[int], inner: InProcessModel) -> None:
        self.failures = failures
        self.inner = inner
        self.calls = 0

    async def complete(self, encoded: EncodedRequest) -> LlmTurnResponse:
        self.calls += 1
        if self.failures:
            raise classify_http_status(self.failures.pop(0), "busy")
        return await self.inner.complete(encoded)


@pytest.mark.e2e
async def test_transient_503_is_retried_then_succeeds(sample: Path) -> None:
    budget = DEFAULT.replace(model_retry_backoff_seconds=0.001, model_retry_attempts=3)
    model = Flaky([503, 429], InProcessModel(ScriptedModel(iterations=2)))
    result = await ToolLoop(model, get_profile("appsec", budget), sample, budget).run([], "go")
    assert result.stop_reason == "end_turn" and result.model_retries == 2
    assert result.final_text.startswith("Done after 2 tool iterations")


async def test_persistent_503_fails_with_origin_model(sample: Path) -> None:
    budget = DEFAULT.replace(model_retry_backoff_seconds=0.001, model_retry_attempts=2)
    model = Flaky([503] * 10, InProcessModel(ScriptedModel()))
    result = await ToolLoop(model, get_profile("appsec", budget), sample, budget).run([], "go")
    assert result.stop_reason == "failed" and result.failure is not None
    assert result.failure.origin == "model" and model.calls == 3


class Malformed:
    async def complete(self, encoded: EncodedRequest) -> LlmTurnResponse:
        return LlmTurnResponse({"role": "assistant", "tool_calls": [{"function": {"name": "x"}}]},
                               Usage(0, 0), "fake")


async def test_malformed_output_fails_with_origin_model(sample: Path) -> None:
    result = await ToolLoop(Malformed(), get_profile("appsec", DEFAULT), sample, DEFAULT).run([], "go")
    assert result.failure is not None and result.failure.origin == "model"
    assert "malformed" in result.failure.message


async def test_body_that_cannot_fit_even_compacted_is_never_sent(sample: Path) -> None:
    budget = DEFAULT.replace(transport_max_body_bytes=64 * KiB)
    model = InProcessModel(ScriptedModel())
    result = await ToolLoop(model, get_profile("appsec", budget), sample, budget).run([], "x" * 70 * KiB)
    assert result.stop_reason == "failed" and result.failure is not None
    assert result.failure.origin == "code"
    assert str(64 * KiB) in result.failure.message
    assert "HOPLINE_TRANSPORT_MAX_BODY_BYTES" in result.failure.message
    assert model.sizes == []


class OneShot:
    """Answers with the given tool calls once, then a final answer."""

    def __init__(self, calls: list[tuple[str, str]]) -> None:
        self.calls = calls
        self.turns = 0

    async def complete(self, encoded: EncodedRequest) -> LlmTurnResponse:
        self.turns += 1
        if self.turns == 1:
            message = {"role": "assistant", "content": "working", "tool_calls": [
                {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}}
                for i, (n, a) in enumerate(self.calls)]}
        else:
            message = {"role": "assistant", "content": "final"}
        return LlmTurnResponse(message, Usage(0, 0), "fake")


async def test_permission_rejection_limits_and_bad_arguments(sample: Path) -> None:
    budget = DEFAULT.replace(tool_calls_per_iteration_max=4, tool_arguments_max_bytes=1000)
    asked: list[str] = []

    async def deny(started: ToolCallStarted) -> bool:
        asked.append(started.name)
        return False

    model = OneShot([("run_command", '{"command": "touch made"}'), ("read_file", "{not json"),
                     ("read_file", '{"path": "' + "a" * 2000 + '"}'),
                     ("write_file", '{"path":"x","content":"y"}'),
                     ("list_files", "{}")])
    rec = Recorder()
    conversation: list[dict] = []
    result = await ToolLoop(model, get_profile("qa_automation", budget), sample, budget, sink=rec,
                            permit=deny).run(conversation, "go")
    assert result.stop_reason == "end_turn" and result.final_text == "final"
    assert asked == ["run_command"] and not (sample / "made").exists()
    tools = {m["tool_call_id"]: m["content"] for m in conversation if m["role"] == "tool"}
    assert tools["c0"] == REJECTED_TEXT
    assert "not valid JSON" in tools["c1"]
    assert "over the limit of 1000 bytes" in tools["c2"]
    assert "not available to this agent" in tools["c3"]
    assert "over the limit of 4 per iteration" in tools["c4"]
    assert [e.text for e in rec.of(AgentText)] == ["working", "final"]


class Hangs:
    def __init__(self, inner: InProcessModel, after: int) -> None:
        self.inner = inner
        self.after = after
        self.turns = 0

    async def complete(self, encoded: EncodedRequest) -> LlmTurnResponse:
        self.turns += 1
        if self.turns > self.after:
            await asyncio.Event().wait()
        return await self.inner.complete(encoded)


@pytest.mark.e2e
async def test_cancel_while_waiting_for_the_model(sample: Path) -> None:
    model = Hangs(InProcessModel(ScriptedModel()), after=2)
    loop = ToolLoop(model, get_profile("appsec", DEFAULT), sample, DEFAULT)
    conversation: list[dict] = []
    task = asyncio.create_task(loop.run(conversation, "go"))

    async def third_turn_waiting() -> None:
        while model.turns < 3:
            await asyncio.sleep(0.01)

    await asyncio.wait_for(third_turn_waiting(), 30)  # a poll with a deadline, never an endless one
    loop.cancel()
    result = await asyncio.wait_for(task, 5)
    assert result.stop_reason == "cancelled" and result.failure is not None
    assert result.failure.origin == "cancelled"
    assert violations(conversation) == []


@pytest.mark.e2e
async def test_cancel_during_a_tool_leaves_no_unanswered_call(sample: Path) -> None:
    model = OneShot([("run_command", '{"command": "sleep 5"}'), ("list_files", "{}")])
    started = asyncio.Event()

    async def sink(event: LoopEvent) -> None:
        if isinstance(event, ToolCallStarted) and event.name == "run_command":
            started.set()  # the tool runs right after this event: cancel it there

    loop = ToolLoop(model, get_profile("appsec", DEFAULT), sample, DEFAULT, sink=sink)
    conversation: list[dict] = []
    task = asyncio.create_task(loop.run(conversation, "go"))
    await asyncio.wait_for(started.wait(), 5)
    task.cancel()
    result = await asyncio.wait_for(task, 5)
    assert result.stop_reason == "cancelled"
    assert violations(conversation) == []
    assert result.repairs.interrupted_results_added == 2
    assert [m["content"] for m in conversation if m["role"] == "tool"] == [INTERRUPTED_TEXT] * 2


class FailingSummarizer:
    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, encoded: EncodedRequest) -> LlmTurnResponse:
        self.calls += 1
        raise classify_http_status(500, "boom")


@pytest.mark.e2e
async def test_summarizer_failure_falls_back_to_extractive_and_is_recorded(sample: Path) -> None:
    budget = DEFAULT.replace(transport_max_body_bytes=256 * KiB)
    summarizer = FailingSummarizer()
    loop, _, _ = gate_loop(sample, budget, summarizer_model=summarizer)
    loop.profile = loop.profile.replace(max_iterations=10)
    conversation: list[dict] = []
    result = await loop.run(conversation, "go")
    assert result.compactions and all(c.summarizer == "extractive" for c in result.compactions)
    assert len(result.summarizer_failures) == len(result.compactions) == summarizer.calls
    # the compaction event says why the model's summary was not used (no provider text in it)
    for record in result.compactions:
        assert record.to_json()["summarizerError"] == {"origin": "model", "status": 500,
                                                       "hop": "gateway.provider"}
    summaries = [m for m in conversation if SUMMARY_MARKER in str(m.get("content"))]
    assert len(summaries) == 1 and "Extractive summary" in summaries[0]["content"]


@pytest.mark.e2e
async def test_model_summary_is_chunked_under_the_ceiling(sample: Path) -> None:
    budget = DEFAULT.replace(transport_max_body_bytes=512 * KiB, summary_chunk_bytes=64 * KiB,
                             summary_request_overhead_bytes=16 * KiB)
    summarizer = CheckingModel(ScriptedModel())
    loop, _, _ = gate_loop(sample, budget, summarizer_model=summarizer)
    loop.profile = loop.profile.replace(max_iterations=14)
    result = await loop.run([], "go")
    assert result.compactions and all(c.summarizer == "model" for c in result.compactions)
    assert len(summarizer.sizes) > len(result.compactions)  # several chunks per compaction
    assert max(summarizer.sizes) <= 64 * KiB + 16 * KiB + 2 * budget.summary_max_bytes


def test_profiles() -> None:
    for name in ("qa_automation", "qa_performance_security", "qa_strategy", "appsec"):
        p = get_profile(name, DEFAULT)
        assert p.context_window == 128_000 and p.max_iterations == 60 and p.compaction_threshold == 0.7
        assert "write_file" not in p.tools and p.gate
    dev = get_profile("dev", DEFAULT)
    assert "write_file" in dev.tools and dev.context_window == 128_000 and dev.max_iterations == 40
    with pytest.raises(KeyError):
        get_profile("nope", DEFAULT)


def test_scripted_respond_is_pure_and_deterministic() -> None:
    from hopline.harness.model import LlmTurnRequest
    from hopline.harness.tools import tool_schemas

    model = ScriptedModel()
    request = LlmTurnRequest([{"role": "user", "content": "go"},
                              {"role": "assistant", "content": "", "tool_calls": [
                                  {"id": "call_1_1_0", "type": "function",
                                   "function": {"name": "list_files", "arguments": "{}"}}]},
                              {"role": "tool", "tool_call_id": "call_1_1_0",
                               "content": "200000\tlogs/a.log\n10\tREADME.md"}],
                             tools=tool_schemas(("read_file", "list_files", "run_command")),
                             params={"scripted": {"seed": 7, "toolsPerIteration": 2}})
    first = model.respond(request)
    assert first == ScriptedModel().respond(request)
    calls = first.message["tool_calls"]
    assert len(calls) == 2 and all(c["id"].startswith("call_1_2_") for c in calls)
    assert all("logs/a.log" in c["function"]["arguments"] for c in calls)
    summary = model.respond(LlmTurnRequest([{"role": "user", "content": "x" * 100_000}], purpose="summary",
                                           params={"maxBytes": 500}))
    assert 0 < len(summary.message["content"].encode()) <= 500


@pytest.mark.parametrize("review", [True, False])
async def test_a_gate_review_runs_the_calls_of_one_answer_at_once(tmp_path: Path, review: bool) -> None:
    """A gate review's tools only read: the calls of one answer are all started, then run at once; a
    session that may write runs each call after the one before. The results keep the calls' order."""
    repo, base, head = make_sample_pull_request(tmp_path / "pr")
    calls = [("read_file", '{"path": "src/sample/cache.py"}'), ("git_diff", '{"stat": true}'),
             ("list_files", "not json"), ("read_file", '{"path": "src/sample/settings.py"}')]
    recorder = Recorder()
    profile = get_profile("appsec", DEFAULT)
    loop = ToolLoop(OneShot(calls), profile, repo, DEFAULT, sink=recorder,
                    review=ReviewRange(base, head) if review else None)
    conversation: list[dict] = []
    result = await loop.run(conversation, "go")
    assert result.stop_reason == "end_turn"
    kinds = [type(e).__name__ for e in recorder.events if isinstance(e, ToolCallStarted | ToolCallFinished)]
    assert kinds == (["ToolCallStarted"] * 4 + ["ToolCallFinished"] * 4 if review
                     else ["ToolCallStarted", "ToolCallFinished"] * 4)
    results = [m for m in conversation if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in results] == ["c0", "c1", "c2", "c3"]
    assert "parse(text" in results[0]["content"] and "AWS_ACCESS_KEY_ID" in results[3]["content"]
    assert "not valid JSON" in results[2]["content"]
    assert ("src/sample/cache.py" in results[1]["content"]) is review  # git_diff is a review's tool
    assert violations(conversation) == []
