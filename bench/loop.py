"""Benchmark 3: estimation and compaction over a 60-iteration gate loop (SPEC H-2, H-3, H-5, H-7).

In process: ``hopline.harness.loop.ToolLoop`` with the ``qa_automation`` gate profile (60
iterations), the offline scripted model (``InProcessModel``, 4 tool calls per iteration) over the
sample workspace. Two runs:

* ``compacting``: 100 KiB logs, so tool results hit the 32 KiB cap and the history compacts;
* ``growing``: small files, so the history never compacts and the final history holds every message.

Figures: bytes handed to the encoder (``IncrementalEstimator.encoded_bytes``) over the whole loop,
divided by the final history's bytes (target <= 2: each message encoded about once; a per-send
re-encode would approach the sum of all bodies sent, also shown) and by the bytes of every distinct
message that was ever part of the history (the same target, meaningful when compaction shrinks
the final history); time per compaction event; estimation cost per iteration.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson

from bench.common import BenchResult, Settings, Verdict, say
from hopline.budget import Budget, KiB
from hopline.harness.loop import ToolLoop
from hopline.harness.profiles import get_profile
from hopline.scripted.model import InProcessModel, ScriptedModel
from hopline.scripted.sample_workspace import make_sample_workspace

TARGET_ENCODE_RATIO = 2.0
TOOLS_PER_ITERATION = 4


async def _run_loop(workspace: Path, budget: Budget, iterations: int) -> dict[str, Any]:
    model = InProcessModel(ScriptedModel(tools_per_iteration=TOOLS_PER_ITERATION, iterations=iterations + 40))
    profile = get_profile("qa_automation", budget).replace(max_iterations=iterations)
    loop = ToolLoop(model, profile, workspace, budget)
    compaction_times: list[float] = []
    check_times: list[float] = []
    original_compact = loop._compact
    original_check = loop._compaction_check
    original_size = loop._size_check

    async def timed_compact(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return await original_compact(*args, **kwargs)
        finally:
            compaction_times.append(time.perf_counter() - started)

    async def timed_check(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return await original_check(*args, **kwargs)
        finally:
            check_times.append(time.perf_counter() - started)

    async def timed_size(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return await original_size(*args, **kwargs)
        finally:
            check_times[-1] += time.perf_counter() - started

    loop._compact = timed_compact  # type: ignore[method-assign]
    loop._compaction_check = timed_check  # type: ignore[method-assign]
    loop._size_check = timed_size  # type: ignore[method-assign]
    conversation: list[dict[str, Any]] = []
    started = time.perf_counter()
    result = await loop.run(conversation, "review this change and report the failures")
    elapsed = time.perf_counter() - started
    try:
        final_bytes = len(orjson.dumps(conversation))
        # Every distinct message that was ever part of a history sent (plus the final history).
        seen: dict[int, dict[str, Any]] = {}
        for request in model.requests:
            if request.purpose != "turn":
                continue  # summarization requests carry rendered copies, not history messages
            for message in request.messages:
                seen.setdefault(id(message), message)
        for message in conversation:
            seen.setdefault(id(message), message)
        distinct_bytes = sum(len(orjson.dumps(m)) for m in seen.values())
        compaction_only = list(compaction_times)  # every _compact call is one event
        mean_ms = sum(compaction_only) / len(compaction_only) * 1e3 if compaction_only else None
        out = {
            "iterations": result.iterations,
            "stopReason": result.stop_reason,
            "seconds": elapsed,
            "compactions": len(result.compactions),
            "compactionSeconds": compaction_only,
            "compactionMsMean": mean_ms,
            "compactionMsMax": max(compaction_only) * 1e3 if compaction_only else None,
            "checkMsPerIteration": sum(check_times) / max(1, len(check_times)) * 1e3,
            "checkMsPerIterationExcludingCompaction":
                (sum(check_times) - sum(compaction_only)) / max(1, len(check_times)) * 1e3,
            "encodedBytes": loop.sizer.encoded_bytes,
            "finalHistoryBytes": final_bytes,
            "distinctMessageBytes": distinct_bytes,
            "bodiesSentBytes": sum(model.sizes),
            "maxBodyBytes": result.max_body_bytes,
            "encodedOverFinal": loop.sizer.encoded_bytes / final_bytes,
            "encodedOverDistinct": loop.sizer.encoded_bytes / distinct_bytes,
            "reencodeOverFinal": sum(model.sizes) / final_bytes,
            "compactionRecords": [c.to_json() for c in result.compactions],
        }
    finally:
        loop.close()
    return out


def run(settings: Settings) -> BenchResult:
    result = BenchResult("loop")
    budget = Budget.defaults()
    iterations = settings.pick(60, 60)
    runs: dict[str, Any] = {}
    for name, file_bytes in (("compacting", 100 * KiB), ("growing", 2 * KiB)):
        workspace = make_sample_workspace(settings.workdir / f"ws-{name}", file_bytes=file_bytes)
        out = asyncio.run(asyncio.wait_for(_run_loop(workspace, budget, iterations), 300))
        runs[name] = out
        mean = out["compactionMsMean"]
        say(f"  {name:>10}: {out['iterations']} iterations ({out['stopReason']}) in {out['seconds']:.2f} s; "
            f"{out['compactions']} compactions"
            + (f" ({mean:.1f} ms mean, {out['compactionMsMax']:.1f} ms max)" if mean is not None else "")
            + f"; estimate+size checks {out['checkMsPerIterationExcludingCompaction']:.3f} ms/iteration")
        say(f"  {'':>10}  encoder {out['encodedBytes'] / 1e6:.2f} MB, final history "
            f"{out['finalHistoryBytes'] / 1e6:.2f} MB, distinct messages "
            f"{out['distinctMessageBytes'] / 1e6:.2f} MB, bodies sent "
            f"{out['bodiesSentBytes'] / 1e6:.1f} MB -> encoder/final "
            f"{out['encodedOverFinal']:.2f}, encoder/distinct {out['encodedOverDistinct']:.2f}, "
            f"re-encode/final {out['reencodeOverFinal']:.1f}")
    result.figures = runs
    growing, compacting = runs["growing"], runs["compacting"]
    result.verdicts.append(Verdict("encoder bytes / final history bytes (60 iterations, no compaction)",
                                   growing["encodedOverFinal"], TARGET_ENCODE_RATIO, False))
    result.verdicts.append(Verdict("encoder bytes / distinct message bytes (60 iterations, compacting)",
                                   compacting["encodedOverDistinct"], TARGET_ENCODE_RATIO, False))
    result.notes.append(
        f"compacting run, encoder/final history = {compacting['encodedOverFinal']:.1f} (not a verdict: "
        "compaction discards most of what was appended, so the final history is far smaller than what "
        "had to be encoded once; encoder/distinct is the same ratio with the right denominator)")
    if compacting["compactions"]:
        result.figures["compactionMsPerEvent"] = compacting["compactionMsMean"]
    else:
        result.notes.append("the compacting run did not compact: no time per compaction event")
    return result
