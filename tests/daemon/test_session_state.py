"""The daemon session's state machine: the transition table, whole (every pair of states)."""

from __future__ import annotations

import itertools

import orjson
import pytest

from hopline.daemon.sessions.state import TRANSITIONS, DaemonSession, IllegalTransition, SessionState

S = SessionState
ALLOWED = {(S.STARTING, S.READY), (S.READY, S.DETACHED), (S.READY, S.LOADING), (S.LOADING, S.READY),
           (S.LOADING, S.DETACHED), (S.DETACHED, S.LOADING)}


@pytest.mark.parametrize(("current", "target"), list(itertools.product(S, S)))
def test_every_move_is_allowed_or_refused_by_the_table(current: SessionState, target: SessionState) -> None:
    session = DaemonSession("s", {}, None, state=current)
    if (current, target) in ALLOWED:
        session.move(target)
        assert session.state is target
    else:
        with pytest.raises(IllegalTransition) as refused:
            session.move(target)
        assert (refused.value.current, refused.value.target) == (current, target)
        assert session.state is current


def test_the_table_is_the_one_tested_and_states_keep_their_wire_names() -> None:
    assert {(a, b) for a, targets in TRANSITIONS.items() for b in targets} == ALLOWED
    assert DaemonSession("s", {}, None).state is S.DETACHED  # a session restored from the journal
    assert orjson.dumps({"state": S.LOADING}) == b'{"state":"loading"}'
