"""A child's answer to a request the daemon gave up on (its waiter cancelled, as when the daemon stops
while a warm child's initialize is in flight) is dropped at info level; an answer to an id never
asked, or to one given up so long ago that it is no longer remembered (ABANDONED_IDS_KEPT), stays a
warning. A real child on real pipes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Awaitable
from typing import Any

import pytest

from hopline.budget import Budget
from hopline.daemon.child import ABANDONED_IDS_KEPT, AcpChild
from hopline.observe.pipe import PipeObservability
from hopline.wire.ndjson import Frame, FrameError

# Acknowledges each "hold" request with a "got" notification and answers nothing, until an "answer"
# notification names the ids to answer; then says "answered".
CHILD = """
import json, sys
def send(message):
    sys.stdout.write(json.dumps(message) + "\\n"); sys.stdout.flush()
for line in sys.stdin:
    message = json.loads(line)
    if message.get("method") == "hold":
        send({"jsonrpc": "2.0", "method": "got", "params": {"id": message["id"]}})
    elif message.get("method") == "answer":
        for request_id in message["params"]["ids"]:
            send({"jsonrpc": "2.0", "id": request_id, "result": {}})
        send({"jsonrpc": "2.0", "method": "answered", "params": {}})
"""
LATE = "late response to a request given up dropped"
UNKNOWN = "response to an unknown request id dropped"


class Notes:
    def __init__(self) -> None:
        self.got: asyncio.Queue[int] = asyncio.Queue()
        self.answered = asyncio.Event()

    def on_notification(self, frame: Frame) -> None:
        message = frame.message
        if message["method"] == "got":
            self.got.put_nowait(message["params"]["id"])
        elif message["method"] == "answered":
            self.answered.set()

    def on_request(self, frame: Frame) -> None:
        raise AssertionError("the child sends no requests")

    def on_frame_error(self, error: FrameError | None, size: int, reason: str) -> None:
        raise AssertionError(f"frame error {reason}")

    def on_exit(self, returncode: int | None) -> None:
        pass

    def on_stalled(self, failure: object) -> None:
        raise AssertionError("the child reads")

    def batch(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def backpressure(self) -> Awaitable[Any] | None:
        return None


async def give_up(child: AcpChild, notes: Notes) -> int:
    """A request the child has read, whose waiter is then cancelled; returns its id."""
    waiter = asyncio.create_task(child.request("hold", {}))
    request_id = await asyncio.wait_for(notes.got.get(), 30)
    waiter.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiter
    return request_id


async def test_answers_to_given_up_requests_are_info_and_unknown_ones_warnings(
        caplog: pytest.LogCaptureFixture) -> None:
    notes = Notes()
    child = AcpChild([sys.executable, "-c", CHILD], env={}, budget=Budget.defaults(),
                     instruments=PipeObservability(Budget.defaults()), handler=notes)
    await child.start()
    try:
        # one more than are remembered: the oldest is forgotten
        given_up = [await give_up(child, notes) for _ in range(ABANDONED_IDS_KEPT + 1)]
        never_asked = max(given_up) + 1000
        with caplog.at_level(logging.INFO, logger="hopline.daemon.child"):
            await child.notify("answer", {"ids": [*given_up, never_asked]})
            await asyncio.wait_for(notes.answered.wait(), 30)
    finally:
        await child.stop()
    dropped = [r for r in caplog.records if r.name == "hopline.daemon.child"]
    assert [r.levelno for r in dropped if r.getMessage() == LATE] == [logging.INFO] * ABANDONED_IDS_KEPT
    assert [r.levelno for r in dropped if r.getMessage() == UNKNOWN] == [logging.WARNING] * 2
    assert len(dropped) == ABANDONED_IDS_KEPT + 2
    assert all(r.__dict__.get("bytes", 0) > 0 for r in dropped)  # each line says the answer's size
