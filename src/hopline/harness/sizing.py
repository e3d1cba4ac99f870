"""How a tool loop sizes its conversation (SPEC H-2, H-3, H-8): the bounds its compactions keep, the
estimate they decide on, the ceiling a body is held to before it is sent, and how many times a body
a hop refused for its size is compacted and sent again. Pure: no I/O.

:data:`BUDGETED` is the budget's rule, the one every agent runs by: the effective window (the
smaller of the model's window and what the transport ceiling carries), the bytes estimate anchored
on the provider's usage, the engine ceiling checked before every send, and one compaction and resend
after a size failure. The loop (:class:`hopline.harness.loop.ToolLoop`) and the HTTP model
(:class:`hopline.harness.http_model.HttpModel`) take a :class:`Sizing`, so a caller can pass another
one (``hopline demo --naive`` passes one that replays an engine without the budget).
"""

from __future__ import annotations

import dataclasses

from hopline.budget import Budget
from hopline.harness.context import Bounds
from hopline.harness.model import LlmTurnRequest
from hopline.harness.tokens import IncrementalEstimator


@dataclasses.dataclass(frozen=True)
class Sizing:
    """The budget's sizing rule; a subclass overrides :meth:`bounds` or :meth:`estimator`."""

    checks_ceiling: bool = True  # a body over the engine ceiling is compacted first, else never sent
    size_retries: int = 1  # compactions and resends after a hop refused a body for its size

    def bounds(self, context_window: int, ceiling_bytes: int, bytes_per_token: int,
               threshold: float) -> Bounds:
        return Bounds(context_window, ceiling_bytes, bytes_per_token, threshold)

    def estimator(self, budget: Budget, envelope: LlmTurnRequest) -> IncrementalEstimator:
        return IncrementalEstimator(budget, envelope)

    def send_ceiling(self, budget: Budget) -> int | None:
        """The body size no send may pass (the engine ceiling), or None when nothing is checked."""
        return budget.transport_max_body_bytes if self.checks_ceiling else None


BUDGETED = Sizing()
