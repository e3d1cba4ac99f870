"""S-3 end to end: `hopline agent` under `hopline serve` writes large outputs to the store itself.

60 iterations of ~200 KiB tool outputs: no pipe frame reaches the large-frame threshold, and every
output that left the wire is retrievable with its sha256 verified.
"""

from __future__ import annotations

from contextlib import aclosing
from pathlib import Path

import pytest

from hopline.budget import Budget
from hopline.client import DaemonClient
from hopline.client.turn import TurnTracker
from hopline.embedded import start_embedded
from hopline.scripted.sample_workspace import make_sample_workspace

pytestmark = pytest.mark.e2e  # every test here starts real processes


async def test_sixty_iterations_of_200_kib_outputs_stay_off_the_pipe(tmp_path: Path) -> None:
    budget = Budget.defaults()
    workspace = make_sample_workspace(tmp_path / "workspace", file_bytes=200 * 1024)
    stack = start_embedded(data_dir=tmp_path / "stack")
    try:
        async with DaemonClient(stack.url, stack.token, budget=budget) as client:
            session_id = await client.create_session(
                cwd=str(workspace), profile="qa_automation", permission_mode="auto",
                scripted={"seed": 1, "iterations": 59, "toolsPerIteration": 2})
            prompt_id = await client.prompt(session_id, "gate the change")
            tracker = TurnTracker(prompt_id)
            async with aclosing(client.turn_events(session_id, prompt_id)) as events:
                async for event in events:
                    tracker.apply(event)
            assert tracker.stop_reason == "end_turn"
            assert tracker.iterations == 60

            inbound = (await client.status())["runtime"]["perf"]["pipe"]["inbound"]
            assert 0 < inbound["maxBytes"] < budget.large_frame_threshold_bytes

            refs = tracker.sidecar_refs()
            assert len(refs) >= 60, "each iteration reads at least one ~200 KiB output"
            assert all(ref.resolvable for ref in refs), "no output fell back to a truncated preview"
            for ref in {ref.id: ref for ref in refs}.values():
                body = await client.resolve_sidecar(session_id, ref)  # size and sha256 verified
                assert len(body) == ref.bytes > budget.sidecar_threshold_bytes
    finally:
        stack.stop()
