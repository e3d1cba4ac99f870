"""End to end: `hopline serve` with its default child (`hopline agent`), the embedded gateway and the
offline scripted model. A prompt runs a tool loop whose updates reach the SSE client in order."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hopline.scripted.sample_workspace import make_sample_workspace

from .support import read_events, running_daemon
from .test_serve import kill_child_until_detached, new_session, prompt, turns_done

pytestmark = pytest.mark.e2e  # every test here starts real processes


async def test_prompt_runs_through_the_embedded_gateway_and_streams_in_order(tmp_path: Path) -> None:
    workspace = make_sample_workspace(tmp_path / "workspace")
    # a small bulk page makes the agent page its replay (hasMore + _hopline/session/loadUpdates)
    with running_daemon(tmp_path, agent_cmd=None, env={"HOPLINE_BULK_REPLAY_MAX_UPDATES": "5"}) as daemon:
        async with daemon.client(timeout=60) as client:
            sid = await new_session(client, workspace, permissionMode="auto",
                                    scripted={"iterations": 2, "toolsPerIteration": 2})
            pid = await prompt(client, sid, "review the sample service")
            events = await read_events(client, sid, turns_done(1))
            done = events[-1]
            assert done.type == "turn_complete", done.data
            assert done.data["promptId"] == pid and done.data["stopReason"] == "end_turn"
            assert done.data["turn"]["iterations"] >= 2
            ids = [e.id for e in events if e.id is not None]
            assert ids == list(range(1, len(ids) + 1))
            updates = [e.data["update"] for e in events if e.type == "session_update"]
            kinds = [u["sessionUpdate"] for u in updates]
            assert kinds[0] == "user_message_chunk"
            # the answer streamed as several chunks, then the plan's last step completed
            assert kinds[-3:] == ["agent_message_chunk", "agent_message_chunk", "plan"]
            assert updates[-1]["entries"][-1]["status"] == "completed"
            # every tool call starts before its results, and every started call gets a result
            started: list[str] = []
            finished: list[str] = []
            for update in updates:
                if update["sessionUpdate"] == "tool_call":
                    started.append(update["toolCallId"])
                elif update["sessionUpdate"] == "tool_call_update" and update.get("status") in (
                        "completed", "failed"):
                    assert update["toolCallId"] in started
                    finished.append(update["toolCallId"])
            assert len(started) >= 3 and sorted(started) == sorted(finished)
            progress = [e for e in events if e.type == "progress"]
            assert progress and all(e.data["promptId"] == pid for e in progress)
            assert progress[0].data["progress"]["iteration"] >= 1
            # the llm-turn requests went through the embedded gateway of this daemon
            metrics = (await client.get("/metrics")).text
            pattern = r'^hopline_gateway_requests_total\{[^}]*status="200"[^}]*\} (\S+)'
            served = [float(v) for v in re.findall(pattern, metrics, flags=re.M)]
            assert sum(served) >= 3

            # the agent process goes away; load restores the session with a paged bulk replay of
            # exactly the updates the agent sent (the journal already holds them: none republished)
            await kill_child_until_detached(client, sid)
            loaded = await client.post(f"/session/{sid}/load")
            assert loaded.status_code == 200, loaded.text
            assert loaded.json()["replayedUpdates"] == len(updates) > 5
            assert loaded.json()["publishedUpdates"] == 0
            await prompt(client, sid, "and again")
            again = await read_events(client, sid, turns_done(1), last_event_id=ids[-1])
            assert again[-1].type == "turn_complete", again[-1].data
