"""A child's silence deadline (``HOPLINE_AGENT_SILENCE_SECONDS``, SPEC T-9): a child that writes
nothing that long while a request to it is pending is given up.

The deadline counts only while the child owes an answer: a request of ours is pending, the child
waits for no answer of ours (its own requests, a permission a client has not answered yet), and
the daemon reads its stdout (a reader held back by the journal or a slow subscriber is no silence
of the child's). It counts from the child's last bytes, or from when it started counting again.
One timer per child, armed only while the deadline counts: a read moves the deadline, never the
timer, which checks again when it fires.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any


class SilenceDeadline:
    """``owes()`` says a request to the child is pending (and the child may still answer);
    ``expired()`` is called once the deadline passed while it counted."""

    def __init__(self, seconds: float, owes: Callable[[], bool], expired: Callable[[], None]) -> None:
        self.seconds = seconds
        self._owes = owes
        self._expired = expired
        self._heard_at = 0.0  # monotonic
        self._asked: dict[Any, int] = {}  # the child's requests not yet answered, by id
        self.held = True  # its stdout is not being read (not yet, or the reader is held back)
        self._timer: asyncio.TimerHandle | None = None

    def counts(self) -> bool:
        return not self.held and not self._asked and self._owes()

    def heard(self) -> None:
        """The child wrote, or the count starts again (a request to an idle child, an answer of
        ours to the child's request, the reader reading again): the deadline is from now."""
        self._heard_at = time.monotonic()
        if self._timer is None and self.counts():
            self._arm()

    def reading(self, reading: bool) -> None:
        """The reader waits for the child's bytes (True), or handles what it read or is held back."""
        self.held = not reading
        if reading:
            self.heard()

    def asked(self, request_id: Any) -> None:
        """The child sent a request: until it is answered, its silence does not count."""
        with contextlib.suppress(TypeError):  # an id that is no JSON-RPC id (unhashable) is not kept
            self._asked[request_id] = self._asked.get(request_id, 0) + 1

    def answered(self, request_id: Any) -> None:
        with contextlib.suppress(TypeError):
            count = self._asked.pop(request_id, 0)
            if count > 1:
                self._asked[request_id] = count - 1
        self.heard()

    def stop(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()

    def _arm(self) -> None:
        delay = self._heard_at + self.seconds - time.monotonic()
        self._timer = asyncio.get_running_loop().call_later(max(delay, 0.0), self._check)

    def _check(self) -> None:
        self._timer = None
        if not self.counts():
            return  # armed again when it counts again
        if time.monotonic() < self._heard_at + self.seconds:
            self._arm()
            return
        self._expired()
