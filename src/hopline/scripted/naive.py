"""An engine without hopline's budget, replayed on purpose (``hopline demo --naive``, ``hopline
simulate --naive``, ``HOPLINE_NAIVE=1`` for ``hopline agent``): the sizing a tool loop ran by before
the hops had a coordinated budget, so the incident it caused can be shown.

* The window is the model's context window alone: the transport ceiling bounds nothing, and the
  body's exact size never triggers a compaction (:class:`ModelWindowBounds`).
* The estimate counts message content only: an assistant message's tool-call arguments count as
  nothing, however large, and the provider's usage is never read back (:class:`ContentEstimator`).
* No body is checked against the engine ceiling before it is sent, and a body a hop refused for its
  size is not compacted and sent again.

Against the gateway's implicit ``100kb`` limit, a turn that writes large files dies with a 413 of
origin ``code`` long before the content estimate nears the window.
"""

from __future__ import annotations

import dataclasses

from hopline.budget import Budget
from hopline.harness.context import Bounds, Trigger
from hopline.harness.loop_events import EstimateSource
from hopline.harness.model import LlmTurnRequest, Message
from hopline.harness.sizing import Sizing
from hopline.harness.tokens import IncrementalEstimator, content_bytes, tokens_for_bytes


@dataclasses.dataclass(frozen=True)
class ModelWindowBounds(Bounds):
    """Compaction bounded by the model's window alone, never by the transport ceiling."""

    @property
    def effective_window(self) -> int:
        return self.context_window

    @property
    def trigger_kind(self) -> Trigger:
        return "model"

    @property
    def trigger_body_bytes(self) -> int | None:
        return None


class ContentEstimator(IncrementalEstimator):
    """The estimate of message content only (``"content"``), never anchored on the provider's usage.
    The exact body size is still known (the replay reports it), just never acted on."""

    def __init__(self, budget: Budget, envelope: LlmTurnRequest) -> None:
        self._content_bytes: list[int] = []
        self._sum_content = 0
        super().__init__(budget, envelope)

    def estimate(self) -> tuple[int, EstimateSource]:
        return tokens_for_bytes(self._sum_content, self.budget), "content"

    def anchor(self, prompt_tokens: int) -> None:
        return None

    def _truncate(self, length: int) -> None:
        self._sum_content -= sum(self._content_bytes[length:])
        del self._content_bytes[length:]
        super()._truncate(length)

    def _append(self, message: Message) -> None:
        size = content_bytes(message.get("content"))
        self._content_bytes.append(size)
        self._sum_content += size
        super()._append(message)


@dataclasses.dataclass(frozen=True)
class NaiveSizing(Sizing):
    checks_ceiling: bool = False
    size_retries: int = 0

    def bounds(self, context_window: int, ceiling_bytes: int, bytes_per_token: int,
               threshold: float) -> Bounds:
        return ModelWindowBounds(context_window, ceiling_bytes, bytes_per_token, threshold)

    def estimator(self, budget: Budget, envelope: LlmTurnRequest) -> IncrementalEstimator:
        return ContentEstimator(budget, envelope)


NAIVE = NaiveSizing()
