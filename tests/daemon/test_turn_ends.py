"""Every turn ends (SPEC T-9): a child's end is seen, a cancel ends the turn within its grace, and a
peer's own notices are not drops. Each test runs a real `hopline serve` with a real child
(``agents/hostile_agent.py`` misbehaving on purpose, or the SDK agent of ``agents/big_update_agent.py``)
and sets the deadline under test small (1 s); it asserts that the turn ends before three times that
deadline, never how fast. The storage fault (inodes exhausted) is in ``test_turn_ends_storage.py``."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from .support import BIG_AGENT_CMD, Daemon, SseEvent, read_events, running_daemon
from .test_hostile_child import HOSTILE_CMD, _alive, wait_status
from .test_serve import new_session, prompt, session_status, texts

pytestmark = pytest.mark.e2e  # every test here starts real processes

GRACE = 1.0  # every deadline under test here
WAIT = 20.0  # a bound on any wait of a test, so a turn that never ends fails instead of hanging


def _env(**extra: str) -> dict[str, str]:
    return {"HOPLINE_CANCEL_GRACE_SECONDS": str(GRACE), "HOPLINE_CHILD_STOP_GRACE_SECONDS": str(GRACE),
            "HOPLINE_WARM_CHILDREN": "0", **extra}


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with running_daemon(tmp_path_factory.mktemp("turn-ends-hostile"), agent_cmd=HOSTILE_CMD, env=_env()) as d:
        yield d


@pytest.fixture(scope="module")
def hushed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """The silence deadline at 1 s."""
    env = _env(HOPLINE_AGENT_SILENCE_SECONDS=str(GRACE))
    with running_daemon(tmp_path_factory.mktemp("turn-ends-silence"), agent_cmd=HOSTILE_CMD, env=env) as d:
        yield d


def ends(events: list[SseEvent], prompt_id: str) -> list[SseEvent]:
    return [e for e in events
            if e.type in ("turn_complete", "turn_error") and e.data.get("promptId") == prompt_id]


async def until_ended(client: httpx.AsyncClient, sid: str, prompt_ids: list[str],
                      also: Callable[[SseEvent], bool] = lambda _e: True) -> list[SseEvent]:
    """The session's events until every one of ``prompt_ids`` ended (and ``also`` held for one
    event), bounded by WAIT."""
    left = set(prompt_ids)
    seen = [False]

    def done(event: SseEvent) -> bool:
        if event.type in ("turn_complete", "turn_error"):
            left.discard(event.data.get("promptId"))
        seen[0] = seen[0] or also(event)
        return not left and seen[0]

    return await asyncio.wait_for(read_events(client, sid, done), WAIT)


async def gone(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while _alive(pid) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return not _alive(pid)


async def test_a_child_that_closes_its_stdout_and_keeps_running_is_ended(hostile: Daemon,
                                                                         tmp_path: Path) -> None:
    async with hostile.client() as client:
        sid = await new_session(client, tmp_path)
        pid = (await session_status(client, sid))["childPid"]
        assert isinstance(pid, int)
        started = time.monotonic()
        closing = await prompt(client, sid, "closeout")
        [end] = ends(await until_ended(client, sid, [closing]), closing)
        ended_after = time.monotonic() - started
        assert end.type == "turn_error" and end.data["reason"] == "agent_exited", end.data
        assert ended_after < 3 * GRACE, f"the turn ended {ended_after:.1f} s after the prompt"
        # its stdin closed, the grace; SIGTERM (ignored), the grace; SIGKILL: gone within 3x that
        assert await gone(pid, 3 * 2 * GRACE), "the child that closed its stdout still runs"
        row = await wait_status(client, sid, lambda r: r["state"] == "detached", "detached")
        assert row["childPid"] is None and row["pendingPrompts"] == 0
        refused = await client.post(f"/session/{sid}/prompt", json={"text": "again"})
        assert refused.status_code == 409  # no agent: said at once, not accepted and left to hang
        assert (await client.delete(f"/session/{sid}")).status_code == 200


async def test_a_child_that_stops_reading_and_ignores_the_cancel_ends_all_three_prompts(
        hostile: Daemon, tmp_path: Path) -> None:
    """Three 900 KB prompts behind a child that reads nothing (the write deadline is 30 s, far
    off): the cancel ends all three within its grace; the next prompt starts a new agent (this one
    cannot load: session/new) and runs."""
    async with hostile.client() as client:
        sid = await new_session(client, tmp_path)
        first = await prompt(client, sid, "stopread")
        await until_ended(client, sid, [first])
        old_pid = (await session_status(client, sid))["childPid"]
        assert isinstance(old_pid, int)
        big = "echo " + "x" * 900_000
        accepted = [await prompt(client, sid, big) for _ in range(3)]
        cancelled_at = time.monotonic()
        cancel = await client.post(f"/session/{sid}/cancel")
        assert cancel.status_code == 200 and cancel.json() == {"cancelled": True}
        events = await until_ended(client, sid, accepted)
        ended_after = time.monotonic() - cancelled_at
        assert ended_after < 3 * GRACE, f"the three turns ended {ended_after:.1f} s after the cancel"
        for prompt_id, started in zip(accepted, (True, False, False), strict=True):
            [end] = ends(events, prompt_id)
            assert end.type == "turn_complete", end.data
            assert end.data["stopReason"] == "cancelled" and end.data["origin"] == "daemon"
            assert end.data["agentStopped"] is started  # the queued two were never sent
            assert end.data["setting"] == "HOPLINE_CANCEL_GRACE_SECONDS"
        assert await gone(old_pid, 3 * 2 * GRACE)
        after = await prompt(client, sid, "echo after")
        events = await until_ended(client, sid, [after])
        [end] = ends(events, after)
        assert end.type == "turn_complete" and end.data["stopReason"] == "end_turn"
        assert texts(events)[-1] == "echo: echo after"
        [restarted] = [e for e in events if e.type == "agent_restarted"]
        assert restarted.data["restoredWith"] == "session/new"
        assert restarted.data["agentMemoryRestored"] is False
        new_pid = (await session_status(client, sid))["childPid"]
        assert isinstance(new_pid, int) and new_pid != old_pid
        assert (await client.delete(f"/session/{sid}")).status_code == 200


@pytest.fixture(scope="module")
def sdk_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, Path]]:
    tmp = tmp_path_factory.mktemp("turn-ends-sdk")
    actions = tmp / "actions.log"
    env = _env(HOPLINE_AGENT_ENV="BIG_AGENT_ACTION_LOG", BIG_AGENT_ACTION_LOG=str(actions))
    with running_daemon(tmp, agent_cmd=BIG_AGENT_CMD, env=env) as d:
        yield d, actions


async def test_a_frozen_child_is_cancelled_within_the_grace_and_the_next_prompt_loads_a_new_one(
        sdk_agent: tuple[Daemon, Path], tmp_path: Path) -> None:
    daemon, actions = sdk_agent
    async with daemon.client() as client:
        sid = await new_session(client, tmp_path)
        sleeping = await prompt(client, sid, "sleep 60")
        await asyncio.wait_for(read_events(client, sid, lambda e: "sleeping" in texts([e])), WAIT)
        queued = [await prompt(client, sid, f"echo queued {i}") for i in range(2)]
        pid = (await session_status(client, sid))["childPid"]
        assert isinstance(pid, int)
        os.kill(pid, signal.SIGSTOP)  # it reads nothing, answers nothing, exits never
        cancelled_at = time.monotonic()
        cancel = await client.post(f"/session/{sid}/cancel")
        assert cancel.status_code == 200 and cancel.json() == {"cancelled": True}
        events = await until_ended(client, sid, [sleeping, *queued])
        ended_after = time.monotonic() - cancelled_at
        assert ended_after < 3 * GRACE, f"the turns ended {ended_after:.1f} s after the cancel"
        [end] = ends(events, sleeping)
        assert end.type == "turn_complete" and end.data["stopReason"] == "cancelled"
        assert end.data["origin"] == "daemon" and end.data["agentStopped"] is True
        for prompt_id in queued:
            [end] = ends(events, prompt_id)
            assert end.data["stopReason"] == "cancelled" and end.data["agentStopped"] is False
        assert await gone(pid, 3 * 3 * GRACE), "the frozen child was not stopped"
        after = await prompt(client, sid, "echo after")
        events = await until_ended(client, sid, [after])
        assert texts(events)[-1] == "echo: echo after"
        [restarted] = [e for e in events if e.type == "agent_restarted"]
        assert restarted.data["restoredWith"] == "session/load" and restarted.data["agentMemoryRestored"]
        new_pid = (await session_status(client, sid))["childPid"]
        assert isinstance(new_pid, int) and new_pid != pid
        runs = actions.read_text().splitlines()
        assert f"{pid} sleep 60" in runs and f"{new_pid} echo after" in runs
        assert not [line for line in runs if "queued" in line]  # cancelled before they started
        assert (await client.delete(f"/session/{sid}")).status_code == 200


async def test_an_agent_that_answers_the_cancel_ends_its_own_turn(sdk_agent: tuple[Daemon, Path],
                                                                   tmp_path: Path) -> None:
    daemon, _ = sdk_agent
    async with daemon.client() as client:
        sid = await new_session(client, tmp_path)
        pid = (await session_status(client, sid))["childPid"]
        sleeping = await prompt(client, sid, "sleep 60")
        await asyncio.wait_for(read_events(client, sid, lambda e: "sleeping" in texts([e])), WAIT)
        assert (await client.post(f"/session/{sid}/cancel")).status_code == 200
        [end] = ends(await until_ended(client, sid, [sleeping]), sleeping)
        assert end.type == "turn_complete" and end.data["stopReason"] == "cancelled"
        assert "origin" not in end.data  # the agent's own answer
        await asyncio.sleep(2 * GRACE)  # past the grace: the agent that answered is kept
        row = await session_status(client, sid)
        assert row["childPid"] == pid and row["state"] == "ready"
        assert (await client.delete(f"/session/{sid}")).status_code == 200


async def test_a_silent_child_with_a_request_pending_is_ended_unresponsive(hushed: Daemon,
                                                                           tmp_path: Path) -> None:
    async with hushed.client() as client:
        sid = await new_session(client, tmp_path)
        pid = (await session_status(client, sid))["childPid"]
        assert isinstance(pid, int)
        started = time.monotonic()
        silent = await prompt(client, sid, "silent")
        [end] = ends(await until_ended(client, sid, [silent]), silent)
        ended_after = time.monotonic() - started
        assert end.type == "turn_error" and end.data["reason"] == "agent_unresponsive", end.data
        assert end.data["setting"] == "HOPLINE_AGENT_SILENCE_SECONDS" and end.data["timeoutSeconds"] == GRACE
        assert end.data["origin"] == "daemon" and end.data["hop"] == "acp.pipe"
        assert ended_after < 3 * GRACE, f"the turn ended {ended_after:.1f} s after the prompt"
        assert await gone(pid, 3 * 3 * GRACE)
        await wait_status(client, sid, lambda r: r["state"] == "detached", "detached")
        assert (await client.delete(f"/session/{sid}")).status_code == 200


async def test_waiting_for_a_permission_answer_is_not_silence(hushed: Daemon, tmp_path: Path) -> None:
    async with hushed.client() as client:
        sid = await new_session(client, tmp_path)
        waiting = await prompt(client, sid, "permwait")
        asked = read_events(client, sid, lambda e: e.type == "permission_request")
        events = await asyncio.wait_for(asked, WAIT)
        request_id = events[-1].data["requestId"]
        await asyncio.sleep(3 * GRACE)  # the agent writes nothing meanwhile: it waits for the client
        answered = await client.post(f"/session/{sid}/permission/{request_id}", json={"optionId": "allow"})
        assert answered.status_code == 200, answered.text
        events = await until_ended(client, sid, [waiting])
        [end] = ends(events, waiting)
        assert end.type == "turn_complete", end.data
        assert texts(events)[-1] == "permwait: allow=1"
        assert (await client.delete(f"/session/{sid}")).status_code == 200


async def test_an_extension_notification_without_a_session_is_ignored_not_counted(tmp_path: Path) -> None:
    env = {"HOPLINE_WARM_CHILDREN": "2", "HOPLINE_AGENT_ENV": "HOSTILE_EXTENSION_NOTICE",
           "HOSTILE_EXTENSION_NOTICE": "1"}
    with running_daemon(tmp_path, agent_cmd=HOSTILE_CMD, env=env) as daemon:
        async with daemon.client() as client:
            status: dict[str, Any] = {}
            for _ in range(400):  # both warm children initialized (each sent its notice then)
                status = (await client.get("/daemon/status")).json()
                if status["warmChildren"]["ready"] == 2:
                    break
                await asyncio.sleep(0.05)
            assert status["warmChildren"]["ready"] == 2, status["warmChildren"]
            sid = await new_session(client, tmp_path)
            echoed = await prompt(client, sid, "hello")
            events = await until_ended(client, sid, [echoed])
            assert texts(events)[-1] == "echo: hello"
            status = (await client.get("/daemon/status")).json()
            assert status["delivery"]["droppedFrames"] == {}, status["delivery"]
            assert not [e for e in events if e.type == "frame_dropped"]
        assert "pipe frame dropped" not in daemon.log_text()
