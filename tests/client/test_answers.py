"""The SDK's typed answers (SPEC A-1) against a real daemon: what `hopline serve` answers has the
keys and the types ``hopline.client.answers`` declares, no more and no fewer."""

from __future__ import annotations

from contextlib import aclosing
from pathlib import Path

import pytest

from hopline.budget import Budget
from hopline.client import (
    Cancelled,
    DaemonClient,
    DaemonStatus,
    Health,
    Loaded,
    PermissionAnswered,
    SessionRow,
    SessionShown,
    SessionSummary,
    TranscriptEvent,
)
from hopline.embedded import EmbeddedStack

from .shapes import assert_shape

pytestmark = pytest.mark.e2e  # every test here starts real processes

SCRIPT = {"iterations": 3, "toolsPerIteration": 2}  # enough to run a command: a permission request


async def test_every_answer_of_a_session_has_its_declared_shape(daemon: EmbeddedStack,
                                                                  workspace: Path) -> None:
    async with DaemonClient(daemon.url, daemon.token, budget=Budget.defaults()) as client:
        assert_shape(await client.health(), Health)
        session_id = await client.create_session(cwd=str(workspace), profile="qa_automation",
                                                 permission_mode="ask", scripted=SCRIPT)
        prompt_id = await client.prompt(session_id, "run the tests")
        answers: list[PermissionAnswered] = []
        async with aclosing(client.turn_events(session_id, prompt_id)) as stream:
            async for event in stream:
                if event.type == "permission_request":
                    option = "allow_once" if not answers else "reject_once"
                    answers.append(await client.answer_permission(session_id, event.data["requestId"],
                                                                  option))
        assert answers, "the scripted gate runs commands, which ask for permission"
        for answer in answers:
            assert_shape(answer, PermissionAnswered)
        assert answers[0]["outcome"] == {"outcome": "selected", "optionId": "allow_once"}

        status = await client.status()
        assert_shape(status, DaemonStatus)
        assert [row["sessionId"] for row in status["sessions"]] == [session_id]
        assert_shape(status["sessions"][0], SessionRow)

        listed, total = await client.sessions()
        assert total >= 1 and session_id in [row["sessionId"] for row in listed]
        for row in listed:
            assert_shape(row, SessionSummary)
        shown = await client.session(session_id)
        assert_shape(shown, SessionShown)

        page = await client.transcript(session_id)
        assert page.events
        for event in page.events:
            assert_shape(event, TranscriptEvent)

        loaded = await client.load(session_id)
        assert_shape(loaded, Loaded)
        assert loaded["source"] == "journal" and loaded["lastEventId"] == page.events[-1]["id"]
        cancelled = await client.cancel(session_id)
        assert_shape(cancelled, Cancelled)
        assert cancelled == {"cancelled": False}  # the turn had ended
        await client.delete_session(session_id)


def test_the_checker_refuses_a_missing_an_undeclared_and_a_mistyped_key() -> None:
    loaded = {"sessionId": "s", "source": "journal", "replayedUpdates": 0, "lastEventId": 3}
    assert_shape(loaded, Loaded)
    for wrong in ({k: v for k, v in loaded.items() if k != "lastEventId"}, {**loaded, "extra": 1},
                  {**loaded, "source": "disk"}, {**loaded, "replayedUpdates": "0"}):
        with pytest.raises((AssertionError, ValueError)):
            assert_shape(wrong, Loaded)
    answered = {"requestId": "r", "outcome": {"outcome": "selected", "optionId": "o", "why": "?"}}
    with pytest.raises(AssertionError, match=r"outcome\[0\]: undeclared \['why'\]"):
        assert_shape(answered, PermissionAnswered)
