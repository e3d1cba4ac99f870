"""The pending items, DEV_PENDING_TYPES, the dev state machine and a run's states (pure)."""

from __future__ import annotations

import pytest

from hopline.gate.states import (
    DEV_PENDING_TYPES,
    DEV_TRANSITIONS,
    NO_MOVE_WHILE_PENDING,
    RUN_IN_PROGRESS,
    RUN_TRANSITIONS,
    TERMINAL_TYPES,
    DevEvent,
    DevState,
    DevStateError,
    DevStateMachine,
    GateItem,
    IllegalRunTransition,
    RunState,
    move_run,
    waiting,
)


def test_dev_pending_types_are_the_five_of_rn_412_and_every_item_is_pending_or_terminal() -> None:
    assert {t.value for t in DEV_PENDING_TYPES} == {
        "gate_queued", "gate_running", "gate_retrying", "gate_compacting", "gate_stalled"}
    assert set(GateItem) == DEV_PENDING_TYPES | TERMINAL_TYPES
    assert not DEV_PENDING_TYPES & TERMINAL_TYPES


def test_the_dev_session_does_not_leave_awaiting_gate_while_a_gate_is_pending() -> None:
    machine = DevStateMachine()
    machine.fire(DevEvent.GATE_STARTED, [GateItem.QUEUED] * 4)
    for pending in DEV_PENDING_TYPES:
        items = [GateItem.PASSED, GateItem.FAILED, GateItem.ERROR, pending]
        assert waiting(items)
        for event in (DevEvent.GATES_SETTLED, DevEvent.FIX_STARTED):
            with pytest.raises(DevStateError, match=NO_MOVE_WHILE_PENDING):
                machine.fire(event, items)
        assert machine.state is DevState.AWAITING_GATE
    machine.fire(DevEvent.FIX_STARTED, [GateItem.PASSED, GateItem.FAILED, GateItem.ERROR, GateItem.PASSED])
    machine.fire(DevEvent.FIX_DONE)
    machine.fire(DevEvent.GATES_SETTLED, [GateItem.PASSED] * 4)
    assert [c["state"] for c in machine.history] == ["awaiting_gate", "working", "awaiting_gate", "idle"]
    assert machine.history[0]["previous"] == "idle"


def test_only_the_table_s_transitions_happen() -> None:
    for state in DevState:
        for event in DevEvent:
            machine = DevStateMachine(state=state)
            if (state, event) in DEV_TRANSITIONS:
                assert machine.fire(event)["state"] == DEV_TRANSITIONS[(state, event)]
            else:
                with pytest.raises(DevStateError, match="no transition"):
                    machine.fire(event)
                assert machine.state is state and machine.history == []
    cancelled = DevStateMachine(state=DevState.AWAITING_GATE)
    cancelled.fire(DevEvent.CANCELLED, [GateItem.STALLED])  # a cancel ends the wait, pending or not
    assert cancelled.state is DevState.IDLE


def test_a_gate_run_moves_through_its_table_only() -> None:
    assert set(RUN_TRANSITIONS) == set(RunState)
    assert {RunState.STARTING, RunState.RUNNING} == RUN_IN_PROGRESS
    for current in RunState:
        for target in RunState:
            if target in RUN_TRANSITIONS[current]:
                assert move_run(current, target) is target
            else:
                with pytest.raises(IllegalRunTransition, match=f"from {current} to {target}"):
                    move_run(current, target)
    ended = set(RunState) - RUN_IN_PROGRESS
    assert all(RUN_TRANSITIONS[state] == frozenset() for state in ended)  # an ended run stays ended
    assert RunState.DONE not in RUN_TRANSITIONS[RunState.STARTING]  # no verdict without running
    assert not any(RunState.INTERRUPTED in targets for targets in RUN_TRANSITIONS.values())
