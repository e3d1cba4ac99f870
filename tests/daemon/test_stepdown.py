"""The step-down clock (SPEC T-11) alone: it counts from the send of the last renewal that
succeeded, steps down once past the lease minus its margin (whenever its timer fires, early or
late), once, and says when a renewal resumes it. Deadlines are small; nothing asserts how fast."""

from __future__ import annotations

import asyncio
import time

from hopline.daemon.cluster.stepdown import StepDown

LEASE = 0.3
MARGIN = 1 / 3  # steps down 0.2 s after the last renewal's send


async def test_it_steps_down_once_past_the_lease_minus_its_margin_and_resumes_on_a_renewal() -> None:
    calls: list[float] = []
    clock = StepDown(LEASE, MARGIN, lambda: calls.append(time.monotonic()))
    sent = time.monotonic()
    assert clock.renewed(sent) is False
    await asyncio.sleep(3 * LEASE)
    assert len(calls) == 1 and clock.stepped_down and clock.count == 1
    assert calls[0] - sent >= LEASE * (1 - MARGIN)  # never before the window's end
    assert clock.renewed(time.monotonic()) is True  # it had stepped down: it resumes now
    assert not clock.stepped_down
    clock.stop()


async def test_renewals_in_time_keep_it_acting() -> None:
    calls: list[None] = []
    clock = StepDown(LEASE, MARGIN, lambda: calls.append(None))
    for _ in range(8):
        assert clock.renewed(time.monotonic()) is False
        await asyncio.sleep(LEASE / 6)
    assert calls == [] and not clock.stepped_down
    clock.stop()


async def test_a_renewal_sent_before_an_older_success_does_not_move_the_clock_back() -> None:
    calls: list[None] = []
    clock = StepDown(LEASE, MARGIN, lambda: calls.append(None))
    now = time.monotonic()
    clock.renewed(now)
    clock.renewed(now - 10)  # an answer that came late, for a renewal sent long ago
    assert clock.sent_at == now
    await asyncio.sleep(LEASE / 6)
    assert calls == []
    clock.stop()
