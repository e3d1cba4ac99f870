"""`hopline serve` as a subprocess on 127.0.0.1 relaying a third-party ACP agent written with the SDK
(tests/daemon/agents/big_update_agent.py). One daemon for the module; each test makes its sessions.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from .support import Daemon, SseEvent, read_events, running_daemon

pytestmark = pytest.mark.e2e  # every test here starts real processes

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("serve")
    with running_daemon(tmp) as d:
        yield d


def turns_done(count: int) -> Callable[[SseEvent], bool]:
    seen = [0]

    def until(event: SseEvent) -> bool:
        if event.type in ("turn_complete", "turn_error"):
            seen[0] += 1
        return seen[0] >= count

    return until


async def new_session(client: httpx.AsyncClient, cwd: Path, **extra: object) -> str:
    response = await client.post("/session", json={"cwd": str(cwd), **extra})
    assert response.status_code == 200, response.text
    return str(response.json()["sessionId"])


async def prompt(client: httpx.AsyncClient, session_id: str, text: str) -> str:
    response = await client.post(f"/session/{session_id}/prompt", json={"text": text})
    assert response.status_code == 202, response.text
    return str(response.json()["promptId"])


def texts(events: list[SseEvent]) -> list[str]:
    return [e.data["update"]["content"]["text"] for e in events
            if e.type == "session_update" and e.data["update"].get("sessionUpdate") == "agent_message_chunk"]


async def session_status(client: httpx.AsyncClient, session_id: str) -> dict[str, object]:
    status = (await client.get("/daemon/status")).json()
    return next(s for s in status["sessions"] if s["sessionId"] == session_id)


async def kill_child_until_detached(client: httpx.AsyncClient, session_id: str) -> None:
    """SIGKILL the session's agent child and wait (bounded) until the daemon marks it detached."""
    child_pid = (await session_status(client, session_id))["childPid"]
    assert isinstance(child_pid, int)
    os.kill(child_pid, signal.SIGKILL)
    for _ in range(200):
        if (await session_status(client, session_id))["state"] == "detached":
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the daemon did not mark the session detached after its child was killed")


async def test_five_mib_tool_call_update_passes_and_is_measured(daemon: Daemon, tmp_path: Path) -> None:
    async with daemon.client() as client:
        sid = await new_session(client, tmp_path)
        pid = await prompt(client, sid, f"big {5 * MiB}")
        events = await read_events(client, sid, turns_done(1))
        ids = [e.id for e in events if e.id is not None]
        assert ids == list(range(1, len(ids) + 1))  # monotonic from 1, no gap
        # the update sent before the session/new answer is kept (promptId null)
        assert events[0].data == {"promptId": None, "update": {
            "content": {"text": "session ready", "type": "text"}, "sessionUpdate": "agent_message_chunk"}}
        kinds = [e.data["update"]["sessionUpdate"] for e in events if e.type == "session_update"]
        assert kinds == ["agent_message_chunk", "tool_call", "tool_call_update", "agent_message_chunk"]
        big = next(e for e in events if e.type == "session_update"
                   and e.data["update"]["sessionUpdate"] == "tool_call_update")
        assert big.data["promptId"] == pid
        # the 5 MiB text crossed the pipe whole; on SSE it is a preview plus a sidecar reference (S-1)
        preview = big.data["update"]["content"][0]["content"]["text"]
        assert len(preview) < 16 * 1024
        (sidecar,) = big.data["update"]["_meta"]["hopline.sidecar"]
        assert sidecar["bytes"] == 5 * MiB and sidecar["field"] == "content[0].content.text"
        body = await client.get(f"/session/{sid}/sidecars/{sidecar['id']}")
        assert body.status_code == 200 and body.content == b"x" * (5 * MiB)
        assert hashlib.sha256(body.content).hexdigest() == sidecar["sha256"]
        # readable only through its own session (D-7)
        other = await new_session(client, tmp_path)
        assert (await client.get(f"/session/{other}/sidecars/{sidecar['id']}")).status_code == 404
        assert (await client.get(f"/session/nope/sidecars/{sidecar['id']}")).status_code == 404
        assert events[-1].type == "turn_complete"
        assert events[-1].data == {"promptId": pid, "stopReason": "end_turn", "turn": None,
                                   "lostBytes": 0, "degraded": False}

        status = (await client.get("/daemon/status")).json()
        assert status["runtime"]["perf"]["pipe"]["inbound"]["maxBytes"] >= 5 * MiB
        assert status["runtime"]["perf"]["pipe"]["outbound"]["count"] >= 3
        assert status["largeFrames"]["logged"] >= 1
        assert status["budget"]["errors"] == []
        metrics = (await client.get("/metrics")).text
        assert 'hopline_daemon_pipe_message_bytes_bucket{direction="inbound",le="4194304.0"}' in metrics
        big_bucket = next(line for line in metrics.splitlines() if line.startswith(
            'hopline_daemon_pipe_message_bytes_bucket{direction="inbound",le="16777216.0"}'))
        small_bucket = next(line for line in metrics.splitlines() if line.startswith(
            'hopline_daemon_pipe_message_bytes_bucket{direction="inbound",le="4194304.0"}'))
        assert float(big_bucket.split()[-1]) > float(small_bucket.split()[-1])  # the 5 MiB frame
        assert "hopline_gateway_body_limit_bytes" in metrics
    records = [line for line in daemon.log_text().splitlines() if "hopline.daemon.pipe.large_frame" in line]
    assert any('"sourceClass":"session_update_notification"' in line for line in records)


async def test_log_never_carries_session_ids_paths_prompts_or_payloads(daemon: Daemon,
                                                                       tmp_path: Path) -> None:
    workspace = tmp_path / "canary-dir-7f3a"
    workspace.mkdir()
    async with daemon.client() as client:
        sid = await new_session(client, workspace)
        await prompt(client, sid, "echo canary-prompt-91c2")
        await prompt(client, sid, f"big {300 * 1024} canary-payload-55d1")
        events = await read_events(client, sid, turns_done(2))
        assert "echo: echo canary-prompt-91c2" in texts(events)
        assert any("canary-payload-55d1" in str(e.data) for e in events)  # it did cross the daemon
    log = daemon.log_text()
    assert "large_frame" in log  # the big frame was attributed, so the canary was in a logged frame
    for canary in (sid, str(workspace), "canary-dir-7f3a", "canary-prompt-91c2", "canary-payload-55d1",
                   str(daemon.data_dir), daemon.token):
        assert canary not in log


async def test_child_killed_mid_turn_fails_its_prompt_and_not_the_others(daemon: Daemon,
                                                                        tmp_path: Path) -> None:
    async with daemon.client() as client:
        doomed = await new_session(client, tmp_path)
        other = await new_session(client, tmp_path)
        pid = await prompt(client, doomed, "sleep 60")
        events = await read_events(client, doomed, lambda e: "sleeping" in texts([e]))
        child_pid = (await session_status(client, doomed))["childPid"]
        assert isinstance(child_pid, int)
        os.kill(child_pid, signal.SIGKILL)
        after = await read_events(client, doomed, turns_done(1), last_event_id=events[-1].id)
        error = after[-1]
        assert error.type == "turn_error"
        assert error.data["promptId"] == pid and error.data["reason"] == "agent_exited"
        assert error.data["exitCode"] == -signal.SIGKILL and error.data["origin"] == "agent"
        # the other session is untouched
        await prompt(client, other, "echo still here")
        other_events = await read_events(client, other, turns_done(1))
        assert texts(other_events)[-1] == "echo: echo still here"
        # the dead session refuses prompts with a clear 409 until it is loaded again
        refused = await client.post(f"/session/{doomed}/prompt", json={"text": "echo x"})
        assert refused.status_code == 409 and "load" in refused.json()["error"]["message"]
        loaded = await client.post(f"/session/{doomed}/load")
        assert loaded.status_code == 200, loaded.text
        assert loaded.json()["source"] == "child"
        await prompt(client, doomed, "echo back")
        tail = await read_events(client, doomed, turns_done(1), last_event_id=error.id)
        assert texts(tail) == ["echo: echo back"] and tail[-1].type == "turn_complete"


async def test_bulk_replay_refused_over_the_count_limit_and_accepted_at_it(daemon: Daemon,
                                                                          tmp_path: Path) -> None:
    async with daemon.client() as client:
        for count, ok in ((10_001, False), (10_000, True)):
            sid = await new_session(client, tmp_path, scripted={"replayUpdates": count})
            await kill_child_until_detached(client, sid)
            response = await client.post(f"/session/{sid}/load")
            if ok:
                assert response.status_code == 200, response.text
                assert response.json()["replayedUpdates"] == 10_000
            else:
                assert response.status_code == 422
                message = response.json()["error"]["message"]
                assert "10001" in message and "10000" in message, message
                assert message.startswith("bulk replay of 10001 updates exceeds the limit of 10000")
                assert (await session_status(client, sid))["state"] == "detached"


async def test_permission_request_round_trip_and_fs_refused(daemon: Daemon, tmp_path: Path) -> None:
    async with daemon.client() as client:
        sid = await new_session(client, tmp_path)
        await prompt(client, sid, "permission")
        events = await read_events(client, sid, lambda e: e.type == "permission_request")
        request = events[-1].data
        assert [o["optionId"] for o in request["options"]] == ["allow", "deny"]
        assert request["toolCall"]["toolCallId"] == "call-perm"
        rid = request["requestId"]
        bad = await client.post(f"/session/{sid}/permission/{rid}", json={"optionId": "nope"})
        assert bad.status_code == 422
        unknown = await client.post(f"/session/{sid}/permission/perm_x", json={"optionId": "allow"})
        assert unknown.status_code == 404
        both = await client.post(f"/session/{sid}/permission/{rid}", json={"optionId": "allow",
                                                                           "outcome": "reject"})
        assert both.status_code == 422
        answer = await client.post(f"/session/{sid}/permission/{rid}", json={"outcome": "reject"})
        assert answer.status_code == 200 and answer.json()["outcome"] == {"outcome": "selected",
                                                                           "optionId": "deny"}
        done = await read_events(client, sid, turns_done(1), last_event_id=events[-1].id)
        assert texts(done) == ["permission: deny"]
        await prompt(client, sid, "fs")
        fs = await read_events(client, sid, turns_done(1), last_event_id=done[-1].id)
        assert texts(fs) == ["fs: refused -32601"]


async def test_transcript_pages_and_delete(daemon: Daemon, tmp_path: Path) -> None:
    async with daemon.client() as client:
        sid = await new_session(client, tmp_path)
        await prompt(client, sid, "chunks 30 2000")
        events = await read_events(client, sid, turns_done(1))
        live = [(e.id, e.type, e.data) for e in events if e.id is not None]
        first = await client.get(f"/session/{sid}/transcript")
        assert first.status_code == 200
        collected = first.json()["events"]
        cursor = first.json()["nextCursor"]
        while cursor is not None:
            page = await client.get(f"/session/{sid}/transcript", params={"cursor": cursor})
            collected += page.json()["events"]
            cursor = page.json()["nextCursor"]
        assert [(e["id"], e["type"], e["data"]) for e in collected] == live
        assert (await client.get(f"/session/{sid}/transcript", params={"cursor": "x1"})).status_code == 400
        assert (await client.delete(f"/session/{sid}")).status_code == 200
        assert (await client.get(f"/session/{sid}/transcript")).status_code == 404
        assert (await client.post(f"/session/{sid}/prompt", json={"text": "x"})).status_code == 404


async def test_every_route_but_health_needs_the_token(daemon: Daemon, tmp_path: Path) -> None:
    async with daemon.client() as client:
        sid = await new_session(client, tmp_path)
    routes = [("GET", "/daemon/status"), ("GET", "/metrics"), ("GET", "/openapi.json"), ("POST", "/session"),
              ("POST", f"/session/{sid}/prompt"), ("POST", f"/session/{sid}/cancel"),
              ("GET", f"/session/{sid}/events"), ("POST", f"/session/{sid}/load"),
              ("GET", f"/session/{sid}/transcript"), ("POST", f"/session/{sid}/permission/perm_1"),
              ("DELETE", f"/session/{sid}"), ("GET", "/session/unknown/events"),
              ("POST", "/internal/sessions/x/llm-turn"), ("GET", "/nowhere")]
    async with httpx.AsyncClient(base_url=daemon.url, timeout=10) as anonymous:
        assert (await anonymous.get("/health")).status_code == 200
        for method, path in routes:
            for headers in ({}, {"Authorization": "Bearer wrong"}):
                response = await anonymous.request(method, path, headers=headers, json={"text": "x"})
                assert response.status_code == 401, (method, path, response.status_code)
                assert response.json()["error"]["type"] == "unauthorized"
        # the server token is not the gateway's token: /internal keeps its own
        llm = await anonymous.post("/internal/sessions/x/llm-turn", headers=daemon.headers, json={})
        assert llm.status_code == 401
    async with daemon.client() as client:
        assert (await client.get(f"/session/{sid}/transcript")).status_code == 200


def _declare_only(daemon: Daemon, path: str, length: int) -> tuple[bytes, bytes]:
    """POST headers declaring ``length`` body bytes, send none, return the status line and body."""
    host, port = daemon.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall((f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {daemon.token}\r\n"
                      f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n").encode())
        raw = b""
        while b"\r\n\r\n" not in raw or len(raw.split(b"\r\n\r\n", 1)[1]) < _content_length(raw):
            chunk = sock.recv(65536)
            if not chunk:
                break
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    return head.split(b"\r\n", 1)[0], body


def _content_length(raw: bytes) -> int:
    for line in raw.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 1 << 30


async def test_clients_cannot_raise_a_ceiling(daemon: Daemon, tmp_path: Path) -> None:
    async with daemon.client() as client:
        sid = await new_session(client, tmp_path)
        for value in (15, 2049, -1):
            response = await client.get(f"/session/{sid}/events", params={"maxQueued": value})
            assert response.status_code == 422, value
        for knob in ({"maxFrameBytes": 1 << 30}, {"maxQueuedBytes": 1 << 30}, {"sseMaxEventBytes": 1}):
            assert (await client.post("/session", json={"cwd": str(tmp_path), **knob})).status_code == 422
            response = await client.post(f"/session/{sid}/prompt", json={"text": "echo", **knob})
            assert response.status_code == 422
        bad_id = await client.get(f"/session/{sid}/events", headers={"Last-Event-ID": "-3"})
        assert bad_id.status_code == 400
        # the daemon body limit is exact: limit bytes pass, limit + 1 is refused naming the hop
        status = (await client.get("/daemon/status", params={"maxQueuedBytes": 1 << 30})).json()
        limit = next(c["bytes"] for c in status["budget"]["ceilings"]
                     if c["name"] == "HOPLINE_DAEMON_JSON_BODY_LIMIT")
        assert limit == MiB
        prefix, suffix = b'{"text":"echo ', b'"}'
        at_limit = prefix + b"a" * (limit - len(prefix) - len(suffix)) + suffix
        assert len(at_limit) == limit
        accepted = await client.post(f"/session/{sid}/prompt", content=at_limit,
                                     headers={"content-type": "application/json"})
        assert accepted.status_code == 202, accepted.text
        over = at_limit[:-2] + b'a"}'
        # a declared Content-Length over the limit is refused before any body byte is read
        status_line, body = await asyncio.to_thread(_declare_only, daemon, f"/session/{sid}/prompt",
                                                    limit + 1)
        assert status_line.startswith(b"HTTP/1.1 413")
        error = orjson.loads(body)["error"]
        assert error["hop"] == "daemon.api" and error["limit"] == limit
        assert error["observed"] == limit + 1

        async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: cut off while reading
            yield over[: len(over) // 2]
            yield over[len(over) // 2:]

        cut = await client.post(f"/session/{sid}/prompt", content=chunked(),
                                headers={"content-type": "application/json"})
        assert cut.status_code == 413 and cut.json()["error"]["hop"] == "daemon.api"
        assert cut.json()["error"]["receivedBytes"] == limit + 1
        events = await read_events(client, sid, turns_done(1))
        # the 1 MiB echo is over the sidecar threshold: its text is in a sidecar, whole (S-4)
        echo = next(e for e in reversed(events) if e.type == "session_update"
                    and e.data["update"]["sessionUpdate"] == "agent_message_chunk")
        [moved] = echo.data["update"]["_meta"]["hopline.sidecar"]
        body = await client.get(f"/session/{sid}/sidecars/{moved['id']}")
        assert body.text == "echo: echo " + "a" * (limit - len(prefix) - len(suffix))
        # nothing a client sent changed the budget
        again = (await client.get("/daemon/status")).json()["budget"]
        assert again == status["budget"]


async def test_child_env_and_stderr_are_handled_safely(daemon: Daemon, tmp_path: Path) -> None:
    async with daemon.client() as client:
        sid = await new_session(client, tmp_path)
        await prompt(client, sid, "env")
        await prompt(client, sid, "stderr 50 9000")
        events = await read_events(client, sid, turns_done(2))
        assert texts(events)[1] == ("env: HOPLINE_SERVER_TOKEN=absent HOPLINE_INTERNAL_TOKEN=absent "
                                    "HOPLINE_GATEWAY_URL=present")
        assert texts(events)[2] == "stderr written"
        stderr = (await session_status(client, sid))["stderr"]
        assert isinstance(stderr, dict)
        assert stderr["lines"] >= 50 and stderr["long_lines"] == 50  # 9000 > 8 KiB line ceiling
    assert "stderr-canary" not in daemon.log_text()


async def test_cancel_stops_the_running_turn(daemon: Daemon, tmp_path: Path) -> None:
    async with daemon.client() as client:
        sid = await new_session(client, tmp_path)
        idle = await client.post(f"/session/{sid}/cancel")
        assert idle.status_code == 200 and idle.json() == {"cancelled": False}
        pid = await prompt(client, sid, "sleep 60")
        events = await read_events(client, sid, lambda e: "sleeping" in texts([e]))
        response = await client.post(f"/session/{sid}/cancel")
        assert response.status_code == 200 and response.json() == {"cancelled": True}
        done = await read_events(client, sid, turns_done(1), last_event_id=events[-1].id)
        assert done[-1].type == "turn_complete"
        assert done[-1].data == {"promptId": pid, "stopReason": "cancelled", "turn": None,
                                 "lostBytes": 0, "degraded": False}


def test_the_daemon_reaps_expired_sidecars_every_reap_interval(tmp_path: Path) -> None:
    """HOPLINE_SIDECAR_REAP_INTERVAL_SECONDS is the reaper's period: a sidecar whose session is idle
    past HOPLINE_SIDECAR_TTL_SECONDS (here a second) while the daemon runs is deleted within it."""
    import time

    from hopline.budget import Budget
    from hopline.sidecars.store import SidecarStore
    from hopline.store.blobs import FileBlobs

    with running_daemon(tmp_path, env={"HOPLINE_SIDECAR_REAP_INTERVAL_SECONDS": "0.2",
                                       "HOPLINE_SIDECAR_TTL_SECONDS": "1"}) as d:
        # This store writes a sidecar of a session no agent runs into the daemon's store.
        store = SidecarStore(d.data_dir / "sidecars", Budget.defaults())
        try:
            entry = store.put("s1", b"expires in a second", "text/plain")
            assert isinstance(store.blobs, FileBlobs)
            blob = store.blobs.path(entry.id)
            assert blob.exists() and store.stats()["count"] == 1
            deadline = time.monotonic() + 30
            while blob.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not blob.exists()
            assert store.stats()["count"] == 0  # its row went with its body
        finally:
            store.close()
