"""A write whose answer is lost runs once (SPEC T-12): the SDK sends every write with an
Idempotency-Key and, when the connection closes before the answer, sends it again with the same key;
the daemon answers the retry with the first answer and runs nothing.

The loss is real: a TCP proxy (tests/lossy_proxy.py) forwards the whole request to a real daemon
(`hopline serve`, the tests' ACP agent) and closes the client's socket at the first byte of the
answer. The agent writes every prompt it gets to a file: each prompt reaches it once."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import aclosing
from pathlib import Path

import pytest

from daemon.support import Daemon, read_events, running_daemon
from hopline.budget import Budget
from hopline.client import DaemonClient
from lossy_proxy import AnswerDroppingProxy

pytestmark = pytest.mark.e2e


@pytest.fixture
def daemon_and_proxy(tmp_path: Path) -> Iterator[tuple[Daemon, AnswerDroppingProxy]]:
    env = {"HOPLINE_AGENT_ENV": "BIG_AGENT_PROMPT_LOG", "BIG_AGENT_PROMPT_LOG": str(tmp_path / "prompts.log"),
           "HOPLINE_WARM_CHILDREN": "0"}
    with running_daemon(tmp_path, env=env) as daemon, \
            AnswerDroppingProxy(int(daemon.url.rsplit(":", 1)[1])) as proxy:
        yield daemon, proxy


def prompts_seen(daemon: Daemon) -> list[str]:
    log = daemon.data_dir.parent / "prompts.log"
    return log.read_text().splitlines() if log.exists() else []


async def test_every_write_whose_answer_is_lost_runs_once(
        daemon_and_proxy: tuple[Daemon, AnswerDroppingProxy], tmp_path: Path) -> None:
    daemon, proxy = daemon_and_proxy
    budget = Budget.defaults().replace(client_write_retry_backoff_seconds=0.05)
    async with DaemonClient(proxy.url, daemon.token, budget=budget) as client, daemon.client() as direct:
        proxy.arm(rb"^POST /session HTTP")
        session_id = await client.create_session(cwd=str(tmp_path))
        assert (proxy.dropped, client.write_retries) == (1, 1)
        sessions = (await direct.get("/daemon/status")).json()["sessions"]
        assert [s["sessionId"] for s in sessions] == [session_id]  # one session, not two

        proxy.arm(rb"^POST /session/\w+/prompt HTTP")
        prompt_id = await client.prompt(session_id, "permission")
        assert (proxy.dropped, client.write_retries) == (2, 2)
        async with aclosing(client.events(session_id, last_event_id=0)) as stream:
            request = await anext(e async for e in stream if e.type == "permission_request")
            proxy.arm(rb"^POST /session/\w+/permission/\w+ HTTP")
            answered = await client.answer_permission(session_id, request.data["requestId"],
                                                      request.data["options"][0]["optionId"])
            assert answered["outcome"]["outcome"] == "selected"  # the first answer, not a 404
            assert (proxy.dropped, client.write_retries) == (3, 3)
            ends = [e async for e in _until_end(stream, prompt_id)]
        assert ends[-1].type == "turn_complete"
        assert prompts_seen(daemon) == ["permission"]  # the agent was prompted once

        proxy.arm(rb"^POST /session/\w+/cancel HTTP")
        assert await client.cancel(session_id) == {"cancelled": False}
        assert (proxy.dropped, client.write_retries) == (4, 4)
        page = (await direct.get(f"/session/{session_id}/transcript")).json()["events"]
        kinds = [e["type"] for e in page]
        assert kinds.count("turn_complete") == 1 and kinds.count("cancel_requested") == 1
        assert kinds.count("permission_resolved") == 1

        proxy.arm(rb"^DELETE /session/\w+ HTTP")
        await client.delete_session(session_id)  # the retry's 404: the lost first attempt did it
        assert (proxy.dropped, client.write_retries) == (5, 5)
        assert (await direct.get("/daemon/status")).json()["sessions"] == []


async def _until_end(stream: object, prompt_id: str):  # type: ignore[no-untyped-def]
    async for event in stream:  # type: ignore[attr-defined]
        yield event
        if event.is_turn_end and event.prompt_id == prompt_id:
            return


async def test_a_prompt_retried_while_it_is_being_accepted_runs_once(
        daemon_and_proxy: tuple[Daemon, AnswerDroppingProxy], tmp_path: Path) -> None:
    """Two sends of one keyed prompt at once (a client that gave up on the first and sent again):
    the second waits for the first and gets its answer."""
    daemon, _ = daemon_and_proxy
    async with daemon.client() as direct:
        session_id = (await direct.post("/session", json={"cwd": str(tmp_path)})).json()["sessionId"]
        headers = {"Idempotency-Key": "one-prompt-sent-twice"}
        answers = await asyncio.gather(*(direct.post(f"/session/{session_id}/prompt", json={"text": "twice"},
                                                     headers=headers) for _ in range(2)))
        assert [a.status_code for a in answers] == [202, 202]
        assert len({a.json()["promptId"] for a in answers}) == 1
        assert sorted(a.headers.get("idempotent-replayed", "") for a in answers) == ["", "true"]
        prompt_id = answers[0].json()["promptId"]
        await read_events(direct, session_id, lambda e: e.type == "turn_complete"
                          and e.data["promptId"] == prompt_id)
        after = (await direct.post(f"/session/{session_id}/prompt", json={"text": "after"})).json()
        await read_events(direct, session_id, lambda e: e.type == "turn_complete"
                          and e.data["promptId"] == after["promptId"])
    assert prompts_seen(daemon) == ["twice", "after"]  # the turns after it run in order: it ran once
