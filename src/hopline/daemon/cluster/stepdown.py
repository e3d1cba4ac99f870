"""Step down before the lease can pass (SPEC T-11).

A lease the heartbeat renews runs until the store's ``now()`` at the renewal plus the lease; the
renewal reached the store after it was sent, so on this daemon's own monotonic clock the lease
cannot end before ``sent + lease``. Counting from the send of the last renewal that succeeded, a
daemon that has not renewed again by ``sent + lease x (1 - HOPLINE_OWNER_LEASE_MARGIN)`` stops
acting on every session it owns (it freezes their agents at once, then stops them): whatever the
network does, it is no longer acting when another daemon may adopt. It resumes only once a
renewal succeeds, on the sessions whose lease it still holds (:meth:`StepDown.renewed` tells).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

log = logging.getLogger("hopline.daemon.cluster")


class StepDown:
    """``step_down()`` is called (synchronously: it freezes the agents at once) when the lease is
    at risk; :meth:`renewed` says whether this daemon had stepped down before this renewal."""

    def __init__(self, lease_seconds: float, margin: float, step_down: Callable[[], None]) -> None:
        self.window = lease_seconds * (1.0 - margin)
        self._step_down = step_down
        self.sent_at: float | None = None  # monotonic: when the last renewal that succeeded was sent
        self.stepped_down = False
        self.count = 0  # how many times this daemon stepped down
        self._timer: asyncio.TimerHandle | None = None

    def started(self) -> None:
        """The daemon registered: its first leases are no older than now."""
        self.renewed(time.monotonic())

    def renewed(self, sent_at: float) -> bool:
        """A renewal sent at ``sent_at`` succeeded; True when this daemon had stepped down (it
        resumes now, on the sessions whose lease it still holds)."""
        self.sent_at = sent_at if self.sent_at is None else max(self.sent_at, sent_at)
        if self._timer is not None:
            self._timer.cancel()
        delay = self.sent_at + self.window - time.monotonic()
        self._timer = asyncio.get_running_loop().call_later(max(0.0, delay), self._check)
        resumed, self.stepped_down = self.stepped_down, False
        if resumed:
            log.warning("lease renewed again: this daemon acts on the sessions it still holds")
        return resumed

    def age(self) -> float | None:
        """Seconds since the last renewal that succeeded was sent."""
        return None if self.sent_at is None else time.monotonic() - self.sent_at

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check(self) -> None:
        self._timer = None
        if self.sent_at is None or self.stepped_down:
            return
        left = self.sent_at + self.window - time.monotonic()
        if left > 0:  # a timer may fire a little early: armed again for what is left
            self._timer = asyncio.get_running_loop().call_later(left, self._check)
            return
        self.stepped_down = True
        self.count += 1
        log.error("lease not renewed within the lease minus its margin: this daemon stops acting on "
                  "its sessions before another can adopt them",
                  extra={"windowSeconds": round(self.window, 3)})
        try:
            self._step_down()
        except Exception:
            log.exception("stepping down failed")
