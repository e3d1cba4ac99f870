"""The gate's pending items, the dev agent's state machine (SPEC K-2) and a gate run's own
states. Pure: no I/O.

Each gate agent of a run has one item, whose type is where that gate is. The dev session attached
to the run is ``awaiting_gate`` while any item's type is in :data:`DEV_PENDING_TYPES`: a slow, retried,
compacting or hung gate keeps it waiting; only terminal items (a verdict, or ``gate_error``) let it
move on. :class:`DevStateMachine` holds that rule as a named invariant enforced by code
(:data:`NO_MOVE_WHILE_PENDING`), over an explicit transition table (:data:`DEV_TRANSITIONS`). A run
moves through :data:`RUN_TRANSITIONS` (:class:`RunState`), as a daemon session moves through
``hopline.daemon.sessions.state.TRANSITIONS``.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Iterable, Mapping
from typing import Any

from hopline.errors import InternalError


class GateItem(enum.StrEnum):
    """The type of a gate agent's item: where that gate is."""

    QUEUED = "gate_queued"  # waiting for a slot (HOPLINE_GATE_CONCURRENCY)
    RUNNING = "gate_running"
    RETRYING = "gate_retrying"  # after a transient model-origin failure, or a second attempt
    COMPACTING = "gate_compacting"  # its context is being compacted
    STALLED = "gate_stalled"  # no event for HOPLINE_GATE_STALL_SECONDS: retried once, then error
    PASSED = "gate_passed"
    FAILED = "gate_failed"
    ERROR = "gate_error"  # no valid verdict: never a pass


# K-2: every type that keeps the dev session waiting. Declared once; the gate emits no other
# non-terminal type (tests/gate/test_states.py checks it on real runs).
DEV_PENDING_TYPES: frozenset[GateItem] = frozenset({
    GateItem.QUEUED, GateItem.RUNNING, GateItem.RETRYING, GateItem.COMPACTING, GateItem.STALLED,
})
TERMINAL_TYPES: frozenset[GateItem] = frozenset({GateItem.PASSED, GateItem.FAILED, GateItem.ERROR})
VERDICT_ITEMS: Mapping[str, GateItem] = {"pass": GateItem.PASSED, "fail": GateItem.FAILED,
                                         "error": GateItem.ERROR}


def waiting(items: Iterable[GateItem]) -> bool:
    """True while any item is pending: the dev session must stay ``awaiting_gate``."""
    return any(item in DEV_PENDING_TYPES for item in items)


class DevState(enum.StrEnum):
    IDLE = "idle"
    AWAITING_GATE = "awaiting_gate"
    WORKING = "working"  # the dev agent works on the findings (``--fix``)


class DevEvent(enum.StrEnum):
    GATE_STARTED = "gate_started"  # a gate round began: its items are queued
    GATES_SETTLED = "gates_settled"  # every item is terminal, nothing to fix (or no round left)
    FIX_STARTED = "fix_started"  # every item is terminal, a fail, --fix and a round left
    FIX_DONE = "fix_done"  # the dev turn ended: the gate runs again
    FIX_FAILED = "fix_failed"  # no verified fix (the turn failed, nothing changed, or it does not build
    # or breaks a test): no commit, no next round, and the dev session keeps waiting for a gate it passes
    CANCELLED = "cancelled"


DEV_TRANSITIONS: Mapping[tuple[DevState, DevEvent], DevState] = {
    (DevState.IDLE, DevEvent.GATE_STARTED): DevState.AWAITING_GATE,
    (DevState.AWAITING_GATE, DevEvent.GATES_SETTLED): DevState.IDLE,
    (DevState.AWAITING_GATE, DevEvent.FIX_STARTED): DevState.WORKING,
    (DevState.WORKING, DevEvent.FIX_DONE): DevState.AWAITING_GATE,
    (DevState.WORKING, DevEvent.FIX_FAILED): DevState.AWAITING_GATE,
    (DevState.AWAITING_GATE, DevEvent.CANCELLED): DevState.IDLE,
    (DevState.WORKING, DevEvent.CANCELLED): DevState.IDLE,
}
# The dev session does not leave awaiting_gate while a gate is pending (cancelling aside).
NO_MOVE_WHILE_PENDING = "NO_MOVE_WHILE_PENDING"


class DevStateError(InternalError, RuntimeError):
    """A transition the table or an invariant forbids (a bug in the orchestration, never input)."""


@dataclasses.dataclass
class DevStateMachine:
    """The dev session's state and its history; every change is returned for the caller to journal."""

    state: DevState = DevState.IDLE
    history: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def fire(self, event: DevEvent, items: Iterable[GateItem] = (), **detail: Any) -> dict[str, Any]:
        """Apply ``event``; ``items`` are the gate items now. Returns the change as recorded."""
        target = DEV_TRANSITIONS.get((self.state, event))
        if target is None:
            raise DevStateError(f"no transition from {self.state} on {event}")
        if self.state is DevState.AWAITING_GATE and event is not DevEvent.CANCELLED and waiting(items):
            raise DevStateError(f"{NO_MOVE_WHILE_PENDING}: a gate is still pending, the dev session "
                                "stays awaiting_gate")
        change = {"state": target.value, "previous": self.state.value, "event": event.value,
                  "at": round(time.time(), 3), **detail}
        self.state = target
        self.history.append(change)
        return change


class RunState(enum.StrEnum):
    """Where a gate run is."""

    STARTING = "starting"  # resolving the commits, making the checkout
    RUNNING = "running"  # its rounds
    DONE = "done"  # every round ran: the verdicts count
    CANCELLED = "cancelled"
    FAILED = "failed"  # a bad repository, or a failure of the daemon: never a pass
    # Read back from the journal for a run a stopped daemon left unfinished; never entered live.
    INTERRUPTED = "interrupted"


RUN_TRANSITIONS: Mapping[RunState, frozenset[RunState]] = {
    RunState.STARTING: frozenset({RunState.RUNNING, RunState.CANCELLED, RunState.FAILED}),
    RunState.RUNNING: frozenset({RunState.DONE, RunState.CANCELLED, RunState.FAILED}),
    RunState.DONE: frozenset(),
    RunState.CANCELLED: frozenset(),
    RunState.FAILED: frozenset(),
    RunState.INTERRUPTED: frozenset(),
}
RUN_IN_PROGRESS: frozenset[RunState] = frozenset({RunState.STARTING, RunState.RUNNING})


class IllegalRunTransition(InternalError):
    """A move :data:`RUN_TRANSITIONS` does not allow: a bug in the orchestration, never input."""

    def __init__(self, current: RunState, target: RunState) -> None:
        super().__init__(f"a gate run cannot go from {current} to {target}")
        self.current = current
        self.target = target


def move_run(current: RunState, target: RunState) -> RunState:
    """``target``, or :class:`IllegalRunTransition` when the table forbids the move."""
    if target not in RUN_TRANSITIONS[current]:
        raise IllegalRunTransition(current, target)
    return target
