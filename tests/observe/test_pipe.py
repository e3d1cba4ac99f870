"""The daemon's pipe instruments (hopline.observe.pipe.PipeObservability): stats, histogram and large
frames through real taps, the frames dropped, and the two A/B switches the benchmarks use."""

from __future__ import annotations

import logging

import pytest

from hopline.budget import Budget
from hopline.observe.pipe import PipeObservability
from hopline.wire.ndjson import Frame, NdjsonDecoder, encode

NO_DROPS = {"dropped": 0, "droppedBytes": 0, "maxDroppedBytes": 0}
BIG = {"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s", "update": {
    "sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "x" * 300_000}}}}
SMALL = {"jsonrpc": "2.0", "id": 1, "result": {}}


def _read(pipe: PipeObservability, budget: Budget, *messages: object) -> None:
    inbound = pipe.tap("inbound")
    decoder = NdjsonDecoder.for_budget(budget)
    for frame in decoder.feed(b"".join(encode(m) for m in messages)):
        assert isinstance(frame, Frame)
        inbound.notify_read(frame.size, frame.message)


async def test_taps_feed_stats_histogram_and_large_frames(caplog: pytest.LogCaptureFixture) -> None:
    budget = Budget.defaults()
    pipe = PipeObservability(budget)
    caplog.set_level(logging.INFO, logger="hopline.observe")
    _read(pipe, budget, BIG, SMALL)
    sent: list[bytes] = []

    async def write(data: bytes) -> None:
        sent.append(data)

    prompt = {"jsonrpc": "2.0", "id": 1, "method": "session/prompt"}
    size = await pipe.tap("outbound").write_observed(write, prompt)
    status = pipe.status()
    big_size = len(encode(BIG)) - 1
    small_size = len(encode(SMALL)) - 1
    perf = status["runtime"]["perf"]["pipe"]
    assert perf["inbound"] == {"count": 2, "totalBytes": big_size + small_size, "maxBytes": big_size,
                               **NO_DROPS}
    assert perf["outbound"] == {"count": 1, "totalBytes": size, "maxBytes": size, **NO_DROPS}
    assert status["largeFrames"] == {"logged": 1, "suppressed": 0,
                                     "thresholdBytes": budget.large_frame_threshold_bytes}
    assert status["framesDropped"] == 0
    assert b'hopline_daemon_pipe_message_bytes_count{direction="inbound"} 2.0' in pipe.metrics.render()
    assert any("hopline.daemon.pipe.large_frame" in r.getMessage() for r in caplog.records)


def test_a_dropped_frame_is_counted_and_an_undecoded_large_one_attributed() -> None:
    budget = Budget.defaults()
    pipe = PipeObservability(budget)
    threshold = budget.large_frame_threshold_bytes
    pipe.record_dropped("inbound", threshold)  # never decoded: a large-frame record, origin unknown
    pipe.record_dropped("inbound", threshold + 1, observed=True)  # decoded: it was observed already
    status = pipe.status()
    assert status["framesDropped"] == 2
    assert status["runtime"]["perf"]["pipe"]["inbound"]["dropped"] == 2
    assert status["runtime"]["perf"]["pipe"]["inbound"]["maxDroppedBytes"] == threshold + 1
    assert status["largeFrames"]["logged"] == 1


def test_the_histogram_switch_leaves_only_the_histogram_out() -> None:
    budget = Budget.defaults()
    pipe = PipeObservability(budget, histogram=False)
    _read(pipe, budget, BIG)
    assert pipe.status()["runtime"]["perf"]["pipe"]["inbound"]["count"] == 1
    assert pipe.status()["largeFrames"]["logged"] == 1
    assert pipe.metrics.snapshot()["inbound"]["count"] == 0


def test_the_hooks_switch_gives_the_taps_no_hooks() -> None:
    budget = Budget.defaults()
    pipe = PipeObservability(budget, hooks=False)
    tap = pipe.tap("inbound")
    assert tap.byte_hooks == [] and tap.sizes_hooks == [] and tap.observers == []
    _read(pipe, budget, BIG)
    status = pipe.status()
    assert status["runtime"]["perf"]["pipe"]["inbound"]["count"] == 0
    assert status["largeFrames"]["logged"] == 0 and pipe.metrics.snapshot()["inbound"]["count"] == 0
