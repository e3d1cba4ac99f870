"""The agent's plan as the tool loop actually runs it (ACP ``plan`` updates), pure.

One entry per iteration that called tools ("Iteration 3: read_file x2, run_command"), ``in_progress``
while its tools run and ``completed`` once they answered, then one ``completed`` entry for the final
answer. When there are more than ``max_entries`` entries, the oldest finished iterations fold into
one entry ("Iterations 1-12: 36 tool calls"), so an update stays small over 60 iterations. Every
method returns the new entries when the plan changed and ``None`` when it did not: the loop sends a
plan update only on a change.
"""

from __future__ import annotations

import dataclasses
from typing import Any

PLAN_PRIORITY = "medium"


@dataclasses.dataclass
class _Step:
    first: int  # the first iteration it covers
    last: int
    calls: int
    content: str
    status: str  # pending | in_progress | completed


class PlanTracker:
    def __init__(self, max_entries: int) -> None:
        if max_entries < 2:
            raise ValueError("a plan needs room for a folded entry and the current one")
        self.max_entries = max_entries
        self._steps: list[_Step] = []

    def entries(self) -> list[dict[str, Any]]:
        return [{"content": s.content, "priority": PLAN_PRIORITY, "status": s.status} for s in self._steps]

    def iteration_started(self, iteration: int, tool_names: list[str]) -> list[dict[str, Any]]:
        counts: dict[str, int] = {}
        for name in tool_names:
            counts[name] = counts.get(name, 0) + 1
        tools = ", ".join(f"{name} x{n}" if n > 1 else name for name, n in counts.items())
        self._steps.append(_Step(iteration, iteration, len(tool_names), f"Iteration {iteration}: {tools}",
                                 "in_progress"))
        self._fold()
        return self.entries()

    def iteration_finished(self) -> list[dict[str, Any]] | None:
        step = self._steps[-1] if self._steps else None
        if step is None or step.status == "completed":
            return None
        step.status = "completed"
        return self.entries()

    def answered(self) -> list[dict[str, Any]]:
        self._steps.append(_Step(0, 0, 0, "Answer with the findings", "completed"))
        self._fold()
        return self.entries()

    def _fold(self) -> None:
        """Merge the oldest finished iteration entries until the plan fits ``max_entries``."""
        while len(self._steps) > self.max_entries:
            first, second = self._steps[0], self._steps[1]
            if first.status != "completed" or second.status != "completed" or second.first == 0:
                return
            calls = first.calls + second.calls
            self._steps[0:2] = [_Step(first.first, second.last, calls,
                                      f"Iterations {first.first}-{second.last}: {calls} tool calls",
                                      "completed")]
