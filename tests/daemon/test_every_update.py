"""Issue 13 with real processes: every update of any size and kind reaches the client (S-4), nothing
is silently lost (D-8), only the session's own updates are relayed, warm children (D-9), and a turn
cut by a daemon crash ends.

The agent is a third-party one written on the `agent-client-protocol` SDK only
(``agents/big_update_agent.py``); the client is hopline's Python SDK.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from hopline.client import DaemonClient, Event
from hopline.sidecars.projection import value_at

from .support import Daemon, free_port, running_daemon, start_daemon, stop_daemon_proc

sys.path.insert(0, str(Path(__file__).parent / "agents"))
from big_update_agent import as_sent, kind_updates

pytestmark = pytest.mark.e2e  # every test here starts real processes

KiB = 1024
MiB = 1024 * KiB
EVENT_MAX = 64 * KiB  # every event the client gets is under this
PREVIEW = 2048  # the default sidecar preview (head + tail)


def sdk(daemon: Daemon, **kwargs: Any) -> DaemonClient:
    return DaemonClient(daemon.url, daemon.token, **kwargs)


async def turn(client: DaemonClient, session_id: str, text: str) -> tuple[str, list[Event]]:
    prompt_id = await client.prompt(session_id, text)
    events = [e async for e in client.turn_events(session_id, prompt_id, last_event_id=0)]
    return prompt_id, [e for e in events if e.synthetic or e.prompt_id in (None, prompt_id)]


def expected_kinds() -> list[dict[str, Any]]:
    return [as_sent("any", u) for u in kind_updates()]


def digest(update: dict[str, Any]) -> str:
    return hashlib.sha256(orjson.dumps(update, option=orjson.OPT_SORT_KEYS)).hexdigest()


async def assert_every_kind_resolves(client: DaemonClient, session_id: str, events: list[Event]) -> None:
    """Every event is under 64 KiB; the large updates resolve back to exactly what the agent sent."""
    assert events and max(e.size for e in events) < EVENT_MAX
    updates = [e for e in events if e.type == "session_update"]
    expected = expected_kinds()
    start = next(i for i, e in enumerate(updates) if e.update_kind == "agent_message_chunk" and e.sidecars())
    got = updates[start:start + len(expected)]
    assert [e.update_kind for e in got] == [u["sessionUpdate"] for u in expected]
    for event, original in zip(got, expected, strict=True):
        resolved = await client.resolve_update(session_id, event.update)
        assert digest(resolved) == digest(original)
        for ref in event.sidecars():
            assert not ref.truncated
            moved = value_at(original, ref.path)
            body = moved.encode() if isinstance(moved, str) else orjson.dumps(moved)
            assert hashlib.sha256(body).hexdigest() == ref.sha256 and len(body) == ref.bytes
    by_kind = {e.update_kind: e for e in got}
    assert [r.field for r in by_kind["agent_message_chunk"].sidecars()] == ["content.text"]
    assert [r.field for r in by_kind["agent_thought_chunk"].sidecars()] == ["content.text"]
    assert [r.field for r in by_kind["tool_call_update"].sidecars()] == ["content[0].content.text"]
    [commands] = by_kind["available_commands_update"].sidecars()
    assert commands.field == "availableCommands" and commands.items == 5000
    shown = by_kind["available_commands_update"].update["availableCommands"]
    assert shown == expected[1]["availableCommands"][:commands.items_shown] and shown  # still an array
    assert by_kind["agent_message_chunk"].update["content"]["text"].startswith("message 00000000 ")


async def test_every_kind_reaches_the_client_small_and_resolves_exactly(tmp_path: Path) -> None:
    data_dir, port = tmp_path / "data", free_port()
    daemon = start_daemon(tmp_path, data_dir=data_dir, port=port)
    try:
        async with sdk(daemon) as client:
            sid = await client.create_session(cwd=str(tmp_path), scripted={"replayKinds": True})
            # a second session with no events yet: restored later by /load, whose bulk replay carries
            # the same large updates
            quiet = await client.create_session(
                cwd=str(tmp_path), scripted={"quiet": True, "replayKinds": True, "replayUpdates": 0})
            prompt_id, events = await turn(client, sid, "kinds")
            await assert_every_kind_resolves(client, sid, events)
            end = events[-1]
            assert end.type == "turn_complete"
            assert end.data["lostBytes"] == 0 and end.data["degraded"] is False
            status = await client.status()
            assert status["runtime"]["perf"]["pipe"]["inbound"]["maxBytes"] > 20 * MiB  # it crossed whole
            assert status["sse"]["oversizeDropped"] == 0 and status["delivery"]["lostBytes"] == 0
            first_id = next(e.id for e in events if e.prompt_id == prompt_id)
    finally:
        stop_daemon_proc(daemon.proc)

    # a new daemon on the same data dir: Last-Event-ID replay from the journal, then /load
    with running_daemon(tmp_path, data_dir=data_dir, port=port, log_name="daemon2.log") as again:
        async with sdk(again) as client:
            replayed = [e async for e in client.turn_events(sid, prompt_id, last_event_id=first_id - 1)]
            await assert_every_kind_resolves(client, sid, replayed)
            loaded = await client.load(quiet)
            assert loaded["source"] == "child" and loaded["publishedUpdates"] == len(expected_kinds())
            restored: list[Event] = []
            async for event in client.events(quiet, last_event_id=0):
                restored.append(event)
                if len([e for e in restored if e.type == "session_update"]) == len(expected_kinds()):
                    break
            await assert_every_kind_resolves(client, quiet, restored)


async def test_over_quota_message_arrives_as_a_flagged_preview_and_the_turn_counts_it(tmp_path: Path) -> None:
    env = {"HOPLINE_SIDECAR_MAX_OBJECT_BYTES": "1mb", "HOPLINE_SIDECAR_MAX_SESSION_BYTES": "1mb"}
    with running_daemon(tmp_path, env=env) as daemon:
        async with sdk(daemon) as client:
            sid = await client.create_session(cwd=str(tmp_path))
            _, events = await turn(client, sid, "echo hello")
            assert events[-1].data["lostBytes"] == 0 and events[-1].data["degraded"] is False  # an honest 0
            _, events = await turn(client, sid, f"message {20 * MiB}")
            assert max(e.size for e in events) < EVENT_MAX
            [flagged] = [e for e in events if e.update_kind == "agent_message_chunk" and e.sidecars()]
            [ref] = flagged.sidecars()
            assert ref.truncated and ref.reason == "over_object_quota" and ref.id is None
            assert ref.bytes == 20 * MiB and ref.lost_bytes == 20 * MiB - PREVIEW
            assert flagged.lost_bytes == 20 * MiB - PREVIEW  # the event says it too
            text = flagged.update["content"]["text"]
            assert f"{20 * MiB} bytes, truncated (over_object_quota); {PREVIEW} shown" in text
            end = events[-1]
            assert end.type == "turn_complete" and end.data["stopReason"] == "end_turn"
            assert end.data["lostBytes"] == 20 * MiB - PREVIEW and end.data["degraded"] is True
            status = await client.status()
            assert status["delivery"]["lostBytes"] == 20 * MiB - PREVIEW
            assert status["delivery"]["degradedUpdates"] == 1
            assert status["delivery"]["lostByReason"] == {"over_object_quota": 1}
            [mine] = [s for s in status["sessions"] if s["sessionId"] == sid]
            assert mine["lostBytes"] == 20 * MiB - PREVIEW
            assert status["sidecars"]["fallbacks"]["overObjectQuota"] == 1

            # `hopline run` shows it in red
            from cli.conftest import run_in_pty

            code, output = run_in_pty(["run", f"message {2 * MiB}", "--url", daemon.url],
                                      cwd=tmp_path, env={"HOPLINE_SERVER_TOKEN": daemon.token})
            assert code == 0
            assert re.search(r"\x1b\[1;31m[^\x1b]*content\.text: 2 MiB, truncated \(over_object_quota\): "
                             r"[\d.]+ MiB lost", output)
            assert re.search(r"\x1b\[1;31mdegraded turn: [\d.]+ MiB the agent sent could not be delivered",
                             output)
    log = daemon.log_text()
    lost = [orjson.loads(line) for line in log.splitlines() if "payload not delivered whole" in line]
    assert lost and lost[0]["lostBytes"] == 20 * MiB - PREVIEW and lost[0]["level"] == "warning"
    assert "message 00000000" not in log and sid not in log


async def test_foreign_and_malformed_updates_are_counted_not_relayed(tmp_path: Path) -> None:
    with running_daemon(tmp_path) as daemon:
        async with sdk(daemon) as client:
            sid = await client.create_session(cwd=str(tmp_path))
            stream = client.events(sid, last_event_id=0)
            async for event in stream:  # subscribed: frame_dropped is live-only
                if event.type == "replay_complete":
                    break
            prompt_id = await client.prompt(sid, "foreign")
            events: list[Event] = []
            async for event in stream:
                events.append(event)
                if event.is_turn_end and event.prompt_id == prompt_id:
                    break
            await stream.aclose()
            texts = [e.message_text() for e in events if e.update_kind == "agent_message_chunk"]
            assert texts == ["foreign done"]  # the other session's update was not relayed
            dropped = [e.data for e in events if e.type == "frame_dropped"]
            assert [d["reason"] for d in dropped] == ["foreign_session", "invalid_update", "invalid_update"]
            assert all(d["hop"] == "acp.pipe" and d["bytes"] > 0 and d["promptId"] == prompt_id
                       for d in dropped)
            malformed = sum(d["bytes"] for d in dropped if d["reason"] == "invalid_update")
            end = events[-1]
            # malformed updates were the session's own bytes: lost, and said; the foreign one was not ours
            assert end.data["lostBytes"] == malformed and end.data["degraded"] is True
            status = await client.status()
            assert status["delivery"]["droppedFrames"] == {"foreign_session": 1, "invalid_update": 2}
            inbound = status["runtime"]["perf"]["pipe"]["inbound"]
            assert inbound["dropped"] == 3 and inbound["droppedBytes"] == sum(d["bytes"] for d in dropped)
            assert inbound["maxDroppedBytes"] == max(d["bytes"] for d in dropped)
    assert "FOREIGN-CANARY" not in daemon.log_text()


async def test_updates_before_session_new_are_held_within_the_ring_bounds(tmp_path: Path) -> None:
    """Updates sent before session/new answers wait for its sessionId; more than the ring holds
    are dropped and counted, not kept without bound."""
    with running_daemon(tmp_path, env={"HOPLINE_RING_MAX_EVENTS": "64"}) as daemon:
        async with sdk(daemon) as client:
            sid = await client.create_session(cwd=str(tmp_path), scripted={"early": 70})
            _, events = await turn(client, sid, "echo after")
            early = [e.message_text() for e in events if e.update_kind == "agent_message_chunk"
                     and e.prompt_id is None]
            assert early == [f"early {i}" for i in range(64)]  # in order, the first 64
            status = await client.status()
            assert status["delivery"]["droppedFrames"] == {"held_updates_full": 7}  # 6 + "session ready"
            [mine] = [s for s in status["sessions"] if s["sessionId"] == sid]
            assert mine["framesDropped"] == 7 and mine["lostBytes"] > 0


async def test_the_write_token_travels_in_the_request_never_in_the_env(tmp_path: Path) -> None:
    canaries = tmp_path / "canaries"
    canaries.mkdir()
    # the agent claims hopline's credentials in its initialize answer, as hopline's own does (T-8)
    env = {"BIG_AGENT_CANARY_DIR": str(canaries), "BIG_AGENT_TAKES_CREDENTIALS": "1"}
    with running_daemon(tmp_path, env=env,
                        args=("--agent-env", "BIG_AGENT_CANARY_DIR,BIG_AGENT_TAKES_CREDENTIALS")) as daemon:
        async with sdk(daemon) as client:
            sid = await client.create_session(cwd=str(tmp_path))
            _, events = await turn(client, sid, "creds")
            [said] = [e.message_text() for e in events if e.message_text().startswith("creds:")]
            assert said.startswith("creds: env=absent meta=present sha256=")
            digest = said.rsplit("=", 1)[1]
            # a real token, minted for this session only
            import sqlite3

            with sqlite3.connect(daemon.data_dir / "sidecars" / "sidecars.sqlite3") as db:
                rows = db.execute("SELECT session_id FROM write_tokens WHERE token_sha256 = ?",
                                  (digest,)).fetchall()
            assert rows == [(sid,)]
            [canary] = list(canaries.iterdir())
            token = canary.read_text()
            # the canary never reaches the daemon's log or its journal
            journal = (daemon.data_dir / "journal.sqlite3").read_bytes()
            assert token.encode() not in journal
            await client.delete_session(sid)
    assert token not in daemon.log_text()


async def _status_until(client: DaemonClient, check: Any, what: str) -> dict[str, Any]:
    for _ in range(400):
        status = await client.status()
        if check(status):
            return status
        await asyncio.sleep(0.05)
    raise AssertionError(f"the daemon never reached: {what}")


async def test_warm_pool_hands_out_its_child_and_replaces_a_killed_one(tmp_path: Path) -> None:
    with running_daemon(tmp_path, env={"HOPLINE_WARM_CHILDREN": "1"}) as daemon:
        async with sdk(daemon) as client:
            status = await _status_until(client, lambda s: s["warmChildren"]["ready"] == 1, "one warm child")
            [warm] = status["warmChildren"]["pids"]
            assert status["warmChildren"]["started"] == 1
            sid = await client.create_session(cwd=str(tmp_path))
            status = await client.status()
            [mine] = [s for s in status["sessions"] if s["sessionId"] == sid]
            assert mine["childPid"] == warm  # the session got the warm child: nothing was spawned for it
            assert status["warmChildren"]["taken"] == 1
            status = await _status_until(client, lambda s: s["warmChildren"]["ready"] == 1, "refilled")
            [refill] = status["warmChildren"]["pids"]
            assert refill != warm and status["warmChildren"]["started"] == 2
            # the session's child works and is its own
            _, events = await turn(client, sid, "echo pooled")
            assert [e.message_text() for e in events if e.update_kind == "agent_message_chunk"][-1] == \
                "echo: echo pooled"
            # a warm child that dies is replaced
            os.kill(refill, signal.SIGKILL)
            status = await _status_until(client, lambda s: s["warmChildren"]["replaced"] == 1
                                         and s["warmChildren"]["ready"] == 1, "a replacement")
            [replacement] = status["warmChildren"]["pids"]
            assert replacement not in (warm, refill)
            # children are never shared: the next session takes the replacement, not the first child
            other = await client.create_session(cwd=str(tmp_path))
            status = await client.status()
            pids = {s["sessionId"]: s["childPid"] for s in status["sessions"]}
            assert pids[other] == replacement and pids[sid] == warm
    with running_daemon(tmp_path, env={"HOPLINE_WARM_CHILDREN": "0"}, log_name="off.log") as off:
        async with sdk(off) as client:
            assert (await client.status())["warmChildren"] is None
            sid = await client.create_session(cwd=str(tmp_path))
            _, events = await turn(client, sid, "echo fresh")
            assert events[-1].type == "turn_complete"


async def test_daemon_killed_mid_turn_ends_the_prompt_after_restart(tmp_path: Path) -> None:
    data_dir, port = tmp_path / "data", free_port()
    daemon = start_daemon(tmp_path, data_dir=data_dir, port=port)
    children: list[int] = []
    try:
        async with sdk(daemon, reconnect_attempts=20, reconnect_backoff_seconds=0.1) as client:
            sid = await client.create_session(cwd=str(tmp_path))
            prompt_id = await client.prompt(sid, "sleep 120")
            seen: list[Event] = []
            turn_events = client.turn_events(sid, prompt_id, last_event_id=0)
            async for event in turn_events:
                seen.append(event)
                if event.message_text() == "sleeping":
                    break
            status = await client.status()
            children = [s["childPid"] for s in status["sessions"] if s["childPid"]]
            children += status["warmChildren"]["pids"]
            daemon.proc.send_signal(signal.SIGKILL)  # mid-turn: no shutdown at all
            daemon.proc.wait(10)
            again = start_daemon(tmp_path, data_dir=data_dir, port=port, log_name="daemon2.log")
            try:
                # the same stream reconnects (Last-Event-ID) and ends: the prompt does not wait forever
                async for event in turn_events:
                    seen.append(event)
                end = seen[-1]
                assert end.type == "turn_error" and end.prompt_id == prompt_id
                assert end.data["reason"] == "daemon_restarted" and end.data["origin"] == "daemon"
                assert client.reconnects >= 1
                # no acknowledged event is missing: everything seen before the kill is still there
                every = [e async for e in client.turn_events(sid, prompt_id, last_event_id=0)]
                journaled = {e.id: e.data for e in every if e.id is not None}
                assert [e.id for e in every if e.id is not None] == list(range(1, len(journaled) + 1))
                assert all(journaled[e.id] == e.data for e in seen if e.id is not None)
                # /load restores the session as before, and it takes prompts again
                assert (await client.load(sid))["source"] == "child"
                after, events = await turn(client, sid, "echo after the crash")
                assert events[-1].type == "turn_complete"
                history = [e async for e in client.turn_events(sid, after, last_event_id=0)]
                ended = [e for e in history if e.type == "turn_error" and e.prompt_id == prompt_id]
                assert len(ended) == 1  # ended once, not again at this restart
            finally:
                stop_daemon_proc(again.proc)
    finally:
        stop_daemon_proc(daemon.proc)
        for pid in children:  # the killed daemon's children, left orphaned by the SIGKILL
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


async def test_eight_back_to_back_creates_are_all_served_from_a_pool_of_two(tmp_path: Path) -> None:
    """HOPLINE_WARM_CHILDREN=2, 8 creates back to back, never waiting for a refill in between: the
    pool refills as each child is taken (2 starting at once) and every create gets a pool child (a
    create that finds none ready waits for a starting one): no miss, no child spawned for a create.
    The time each takes is measured in bench/warm_pool.py (no timing here)."""
    with running_daemon(tmp_path, env={"HOPLINE_WARM_CHILDREN": "2"}) as daemon:
        async with sdk(daemon) as client:
            await _status_until(client, lambda s: s["warmChildren"]["ready"] == 2, "two warm children")
            sids = [await client.create_session(cwd=str(tmp_path)) for _ in range(8)]
            status = await client.status()
            pool = status["warmChildren"]
            assert pool["taken"] == 8 and pool["misses"] == 0 and pool["failures"] == 0
            pids = {s["sessionId"]: s["childPid"] for s in status["sessions"]}
            assert len({pids[sid] for sid in sids}) == 8  # eight children, none shared
            # every child the daemon started was a pool child: 8 taken, the rest are the refill
            assert pool["started"] == 8 + pool["ready"]
            status = await _status_until(client, lambda s: s["warmChildren"]["ready"] == 2, "refilled to two")
            assert status["warmChildren"]["started"] == 10
