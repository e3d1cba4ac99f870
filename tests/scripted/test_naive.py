"""The naive sizing, piece by piece: the model's window alone, the content-only estimate that never
anchors, no ceiling checked before a send and no resend after a size failure."""

from __future__ import annotations

import orjson

from hopline.budget import Budget, KiB
from hopline.harness.context import Bounds
from hopline.harness.model import LlmTurnRequest
from hopline.harness.sizing import BUDGETED
from hopline.scripted.naive import NAIVE, ContentEstimator, ModelWindowBounds

BUDGET = Budget.defaults()


def write_call(args_bytes: int) -> dict:
    arguments = orjson.dumps({"path": "a.txt", "content": "x" * args_bytes}).decode()
    return {"role": "assistant", "content": "",
            "tool_calls": [{"id": "c1", "type": "function",
                            "function": {"name": "write_file", "arguments": arguments}}]}


def test_the_window_is_the_models_and_the_body_never_triggers() -> None:
    budgeted = Bounds(128_000, 256 * KiB, 4, 0.7)
    naive = ModelWindowBounds(128_000, 256 * KiB, 4, 0.7)
    assert budgeted.effective_window == 65_536 and budgeted.trigger_kind == "transport"
    assert naive.effective_window == 128_000 and naive.trigger_kind == "model"
    assert budgeted.should_compact(10, 10 * 1024 * 1024)
    assert not naive.should_compact(10, 10 * 1024 * 1024)
    assert naive.compaction_trigger(int(0.7 * 128_000) + 1, 0) == "model"
    assert naive.target_body_bytes == 128 * KiB  # half the ceiling: a compaction still aims under it


def test_the_estimate_counts_content_only_and_follows_a_compaction() -> None:
    sizer = NAIVE.estimator(BUDGET, LlmTurnRequest([]))
    assert isinstance(sizer, ContentEstimator)
    messages: list[dict] = [{"role": "user", "content": "x" * 400}, write_call(100 * KiB)]
    sizer.sync(messages)
    assert sizer.estimate() == (100, "content")  # 400 bytes of content; the 100 KiB call counts nothing
    budgeted = BUDGETED.estimator(BUDGET, LlmTurnRequest([]))
    budgeted.sync(messages)
    assert budgeted.estimate()[0] > 25 * KiB and budgeted.estimate()[1] == "bytes"
    assert sizer.body_bytes == budgeted.body_bytes  # the exact size is known all the same
    messages[1:] = [{"role": "user", "content": "y" * 40},
                    {"role": "tool", "tool_call_id": "c", "content": "z" * 8}]
    sizer.sync(messages)
    assert sizer.estimate() == (112, "content")


def test_the_estimate_is_never_anchored_on_usage() -> None:
    sizer = NAIVE.estimator(BUDGET, LlmTurnRequest([]))
    budgeted = BUDGETED.estimator(BUDGET, LlmTurnRequest([]))
    for estimator in (sizer, budgeted):
        estimator.sync([{"role": "user", "content": "x" * 40}])
        estimator.anchor(5_000)
    assert budgeted.estimate() == (5_000, "usage")
    assert sizer.estimate() == (10, "content")


def test_no_ceiling_before_a_send_and_no_resend_after_a_size_failure() -> None:
    assert BUDGETED.send_ceiling(BUDGET) == BUDGET.transport_max_body_bytes
    assert BUDGETED.size_retries == 1
    assert NAIVE.send_ceiling(BUDGET) is None
    assert NAIVE.size_retries == 0
