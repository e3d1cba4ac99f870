"""The whole tool loop over real HTTP: ToolLoop -> HttpModel -> gateway (scripted provider).

The scenario K-5 replays: a gate agent, 60 iterations, 3-4 tool results of 32 KiB each.
With the coordinated budget it never meets a 413; with the incident's configuration (a gateway
limit of 100 KB and the harness's naive rules) the turn dies with a 413, classified ``code``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hopline.budget import Budget, KiB
from hopline.errors import TurnFailure
from hopline.gateway.providers import ScriptedProvider
from hopline.harness.http_model import HttpModel
from hopline.harness.loop import ToolLoop, TurnResult
from hopline.harness.loop_events import LoopEvent, ToolCallFinished
from hopline.harness.model import EncodedRequest, LlmTurnResponse, TextSink
from hopline.harness.profiles import get_profile
from hopline.harness.sizing import BUDGETED, Sizing
from hopline.scripted.naive import NAIVE
from hopline.scripted.sample_workspace import make_sample_workspace

from .conftest import TOKEN, GatewayFactory

pytestmark = pytest.mark.e2e  # every test here starts real processes

# Scripted provider settings: 4 tool calls per iteration, and more iterations than the gate allows.
SCRIPT = {"scripted": {"toolsPerIteration": 4, "iterations": 100}}


class RecordingHttpModel(HttpModel):
    """The HTTP model, remembering the size of every body it sent and every failure it raised."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.sizes: list[int] = []
        self.failures: list[TurnFailure] = []

    async def complete(self, encoded: EncodedRequest) -> LlmTurnResponse:
        self.sizes.append(encoded.size)
        try:
            return await super().complete(encoded)
        except TurnFailure as failure:
            self.failures.append(failure)
            raise

    async def complete_streaming(self, encoded: EncodedRequest, on_text: TextSink) -> LlmTurnResponse:
        self.sizes.append(encoded.size)
        try:
            return await super().complete_streaming(encoded, on_text)
        except TurnFailure as failure:
            self.failures.append(failure)
            raise


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    return make_sample_workspace(tmp_path / "ws", file_bytes=100 * KiB)


async def _run_gate(gateway_url: str, workspace: Path, budget: Budget, *, sizing: Sizing
                    ) -> tuple[TurnResult, RecordingHttpModel, list[LoopEvent]]:
    events: list[LoopEvent] = []

    async def sink(event: LoopEvent) -> None:
        events.append(event)

    model = RecordingHttpModel(gateway_url, "gate-session", TOKEN, budget, sizing=sizing)
    loop = ToolLoop(model, get_profile("qa_automation", budget), workspace, budget, sink=sink,
                    sizing=sizing, params=SCRIPT)
    try:
        result = await loop.run([], "review this PR")
    finally:
        loop.close()
        await model.aclose()
    return result, model, events


async def test_gate_agent_60_iterations_over_http_never_meets_a_413(gateway_factory: GatewayFactory,
                                                                    workspace: Path) -> None:
    budget = Budget.defaults()
    gw = gateway_factory(budget, ScriptedProvider())
    result, model, events = await _run_gate(gw.url, workspace, budget, sizing=BUDGETED)

    assert result.stop_reason == "max_iterations", result.to_json()
    assert result.iterations == 60
    capped = [e for e in events if isinstance(e, ToolCallFinished)
              and len(e.model_output.encode()) == budget.tool_result_max_bytes]
    # The 32 KiB per-result cap is really reached, iteration after iteration.
    assert len(capped) >= 3 * 60 // 2
    assert result.compactions
    assert model.failures == []
    assert gw.stats.refused == 0  # zero 413s at the gateway
    assert max(model.sizes) <= budget.transport_max_body_bytes
    assert gw.stats.max_consumed_bytes == max(model.sizes)  # the gateway read exactly what was sent
    assert gw.stats.requests == len(model.sizes)  # turns and summaries: every one reached the gateway


async def test_the_seed_incident_413_is_code_and_the_defaults_complete(gateway_factory: GatewayFactory,
                                                                       workspace: Path) -> None:
    harness_budget = Budget.defaults()
    # The incident's gateway: Express's implicit 100 KB limit, and the engine's naive rules.
    seed_api = Budget.defaults().replace(api_json_body_limit=100 * KiB)
    old_gateway = gateway_factory(seed_api, ScriptedProvider())
    result, model, _ = await _run_gate(old_gateway.url, workspace, harness_budget, sizing=NAIVE)

    failure = result.failure
    assert result.stop_reason == "failed"
    assert failure is not None
    assert failure.origin == "code" and failure.origin != "model"
    assert failure.status == 413 and failure.size_error
    assert failure.limit_bytes == 100 * KiB
    assert old_gateway.stats.refused == 1
    assert model.sizes[-1] > 100 * KiB  # the body that was refused
    assert result.iterations < 60

    # The same run with the defaults (10 MiB gateway, coordinated harness) completes.
    gateway = gateway_factory(Budget.defaults(), ScriptedProvider())
    fixed, fixed_model, _ = await _run_gate(gateway.url, workspace, harness_budget, sizing=BUDGETED)
    assert fixed.stop_reason == "max_iterations" and fixed.iterations == 60
    assert fixed.failure is None
    assert gateway.stats.refused == 0 and fixed_model.failures == []
