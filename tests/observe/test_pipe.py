"""The bundle the daemon wires into its taps: stats, histogram and large frames together."""

from __future__ import annotations

import logging

import pytest

from hopline.budget import Budget
from hopline.observe.pipe import PipeObservability
from hopline.wire.ndjson import Frame, NdjsonDecoder, encode

NO_DROPS = {"dropped": 0, "droppedBytes": 0, "maxDroppedBytes": 0}


async def test_taps_feed_stats_histogram_and_large_frames(caplog: pytest.LogCaptureFixture) -> None:
    budget = Budget.defaults()
    pipe = PipeObservability(budget)
    inbound, outbound = pipe.tap("inbound"), pipe.tap("outbound")
    caplog.set_level(logging.INFO, logger="hopline.observe")
    big = {"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s", "update": {
        "sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "x" * 300_000}}}}
    decoder = NdjsonDecoder.for_budget(budget)
    for frame in decoder.feed(encode(big) + encode({"jsonrpc": "2.0", "id": 1, "result": {}})):
        assert isinstance(frame, Frame)
        inbound.notify_read(frame.size, frame.message)
    sent: list[bytes] = []

    async def write(data: bytes) -> None:
        sent.append(data)

    size = await outbound.write_observed(write, {"jsonrpc": "2.0", "id": 1, "method": "session/prompt"})
    status = pipe.status()
    big_size = len(encode(big)) - 1
    small_size = len(b'{"jsonrpc":"2.0","id":1,"result":{}}')
    assert status["inbound"] == {"count": 2, "totalBytes": big_size + small_size, "maxBytes": big_size,
                                 **NO_DROPS}
    assert status["outbound"] == {"count": 1, "totalBytes": size, "maxBytes": size, **NO_DROPS}
    assert status["largeFrames"] == {"logged": 1, "suppressed": 0,
                                     "thresholdBytes": budget.large_frame_threshold_bytes}
    assert b'hopline_daemon_pipe_message_bytes_count{direction="inbound"} 2.0' in pipe.metrics.render()
    assert any("hopline.daemon.pipe.large_frame" in r.getMessage() for r in caplog.records)
    pipe.metrics.shutdown()
