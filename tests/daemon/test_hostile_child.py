"""`hopline serve` against a hostile ACP child and a hostile client (issue #26, SPEC D-2, D-10, T-4):
one test per row of the issue's table, each with a real daemon relaying the hostile child of
``agents/hostile_agent.py`` on real pipes, asserting the bound (a count, RSS, a deadline's event)
and the named error. The time figures are the bench's (``bench/scaling.py``), not asserted here."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import shlex
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from hopline.client import DaemonClient

from .support import Daemon, SseEvent, read_events, running_daemon
from .test_serve import new_session, prompt, session_status, texts, turns_done

pytestmark = pytest.mark.e2e  # every test here starts real processes

MiB = 1024 * 1024
HOSTILE_AGENT = Path(__file__).parent / "agents" / "hostile_agent.py"
HOSTILE_CMD = f"{shlex.quote(sys.executable)} {shlex.quote(str(HOSTILE_AGENT))}"
WRITE_TIMEOUT = 3.0


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    env = {"HOPLINE_PIPE_WRITE_TIMEOUT": str(WRITE_TIMEOUT), "HOPLINE_WARM_CHILDREN": "0"}
    with running_daemon(tmp_path_factory.mktemp("hostile-child"), agent_cmd=HOSTILE_CMD, env=env) as d:
        yield d


@pytest.fixture(scope="module")
def few_bytes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    env = {"HOPLINE_MAX_PENDING_PERMISSION_BYTES": "64kb", "HOPLINE_WARM_CHILDREN": "0"}
    with running_daemon(tmp_path_factory.mktemp("few-bytes"), agent_cmd=HOSTILE_CMD, env=env) as d:
        yield d


async def wait_status(client: httpx.AsyncClient, sid: str, ready: Any, what: str) -> dict[str, Any]:
    """Poll the session's status row until ``ready(row)`` (a bounded number of times)."""
    for _ in range(1200):
        row = await session_status(client, sid)
        if ready(row):
            return row
        await asyncio.sleep(0.05)
    raise AssertionError(f"never {what}: {row}")


def errors_of(events: list[SseEvent], reason: str) -> list[SseEvent]:
    return [e for e in events if e.type == "turn_error" and e.data.get("reason") == reason]


async def test_a_child_that_never_reads_ends_its_prompts_at_the_write_deadline(hostile: Daemon,
                                                                                tmp_path: Path) -> None:
    async with hostile.client() as client:
        sid = await new_session(client, tmp_path)
        await prompt(client, sid, "stopread")
        await read_events(client, sid, turns_done(1))
        big = "echo " + "x" * 900_000
        accepted = [await prompt(client, sid, big) for _ in range(3)]
        cancel = await client.post(f"/session/{sid}/cancel")
        assert cancel.status_code == 200 and cancel.json() == {"cancelled": True}
        # answered before the deadline: no prompt had ended yet, nor was the child called not reading
        row = await session_status(client, sid)
        assert row["pendingPrompts"] == 3 and row["agentNotReading"] is False
        events = await asyncio.wait_for(read_events(client, sid, lambda e: e.type in (
            "turn_complete", "turn_error") and e.data["promptId"] == accepted[-1]), 60)
        # the one in flight ends at the write deadline (before the cancel's grace of 5 s); the two
        # queued behind it end cancelled, never sent
        [ended] = errors_of(events, "agent_not_reading")
        assert ended.data["promptId"] == accepted[0]
        assert ended.data["origin"] == "daemon" and ended.data["setting"] == "HOPLINE_PIPE_WRITE_TIMEOUT"
        assert ended.data["timeoutSeconds"] == WRITE_TIMEOUT and ended.data["hop"] == "acp.pipe"
        queued = [e for e in events if e.type == "turn_complete" and e.data["promptId"] in accepted[1:]]
        assert [e.data["promptId"] for e in queued] == accepted[1:]
        assert all(e.data["stopReason"] == "cancelled" and e.data["agentStopped"] is False for e in queued)
        row = await wait_status(client, sid, lambda r: r["state"] == "detached", "detached")
        assert row["agentNotReading"] is True and row["pendingPrompts"] == 0 and row["childPid"] is None
        again = await client.post(f"/session/{sid}/cancel")  # no child: a 409 at once, no wait
        assert again.status_code == 409
        assert (await client.delete(f"/session/{sid}")).status_code == 200


async def test_a_flood_of_permission_requests_stays_at_the_ceiling(hostile: Daemon, tmp_path: Path) -> None:
    async with hostile.client() as client:
        sid = await new_session(client, tmp_path)
        before = rss_bytes(hostile.proc.pid)
        await prompt(client, sid, "perms 20000 8192")
        row = await wait_status(client, sid, lambda r: r["refusedRequests"] == 20000 - 32, "refused the rest")
        assert row["pendingPermissions"] == 32
        grown = rss_bytes(hostile.proc.pid) - before
        status = (await client.get("/daemon/status")).json()
        assert status["delivery"]["lostByReason"]["max_pending_permissions"] >= 20000 - 32
        assert status["delivery"]["droppedFrames"]["max_pending_permissions"] >= 20000 - 32
        assert (await client.post(f"/session/{sid}/cancel")).status_code == 200
        events = await read_events(client, sid, turns_done(1))
        assert texts(events)[-1] == ("perms: cancelled=32 "
                                      "error-32000/HOPLINE_MAX_PENDING_PERMISSIONS/count=19968")
        assert len([e for e in events if e.type == "permission_request"]) == 32
        assert grown < 64 * MiB, f"RSS grew {grown / MiB:.1f} MiB"
        assert (await client.delete(f"/session/{sid}")).status_code == 200


async def test_pending_permission_bytes_are_bounded(few_bytes: Daemon, tmp_path: Path) -> None:
    async with few_bytes.client() as client:
        sid = await new_session(client, tmp_path)
        await prompt(client, sid, "perms 20 8192")
        row = await wait_status(client, sid, lambda r: r["pendingPermissions"] + r["refusedRequests"] == 20,
                                "answered all")
        held, pending = row["pendingPermissionBytes"], row["pendingPermissions"]
        assert held <= 64 * 1024 and held + held // pending > 64 * 1024  # one more would pass it
        assert row["refusedRequests"] == 20 - pending > 0
        status = (await client.get("/daemon/status")).json()
        assert status["delivery"]["lostByReason"]["max_pending_permission_bytes"] == 20 - pending
        await client.post(f"/session/{sid}/cancel")
        events = await read_events(client, sid, turns_done(1))
        refused = f"error-32000/HOPLINE_MAX_PENDING_PERMISSION_BYTES/bytes={20 - pending}"
        assert texts(events)[-1] == f"perms: cancelled={pending} {refused}"
        await client.delete(f"/session/{sid}")


async def test_permission_requests_too_large_for_an_event_are_projected_and_seen(hostile: Daemon,
                                                                                 tmp_path: Path) -> None:
    async with hostile.client() as client:
        sid = await new_session(client, tmp_path)
        before = rss_bytes(hostile.proc.pid)
        await prompt(client, sid, f"perms 8 {30 * 1000 * 1000}")  # under the 32 MiB max frame
        row = await wait_status(client, sid, lambda r: r["pendingPermissions"] == 8, "pending 8")
        grown = rss_bytes(hostile.proc.pid) - before
        seen: list[SseEvent] = []

        def eighth(event: SseEvent) -> bool:
            if event.type == "permission_request":
                seen.append(event)
            return len(seen) == 8

        events = await read_events(client, sid, eighth)
        asked = [e for e in events if e.type == "permission_request"]
        assert len(asked) == 8 == row["pendingPermissions"]  # every pending one is seen by a client
        stored = lost = 0
        for event in asked:
            assert len(orjson.dumps(event.data)) < 64 * 1024  # a preview and a sidecar, or a stub
            tool_call = event.data["toolCall"]
            assert tool_call["toolCallId"].startswith("call-") and tool_call["kind"] == "execute"
            entries = tool_call["_meta"]["hopline.sidecar"]
            stored += sum(1 for entry in entries if not entry.get("truncated"))
            lost += sum(entry.get("lostBytes", 0) for entry in entries if entry.get("truncated"))
        print("projected permission", orjson.dumps(asked[-1].data)[:600])
        # each body went to a sidecar, or (past a quota) its loss is counted on the session
        assert stored + sum(1 for e in asked for x in e.data["toolCall"]["_meta"]["hopline.sidecar"]
                            if x.get("truncated")) == 8
        assert row["lostBytes"] == lost
        answered = await client.post(f"/session/{sid}/permission/{asked[0].data['requestId']}",
                                     json={"optionId": "allow"})
        assert answered.status_code == 200
        assert (await client.delete(f"/session/{sid}")).status_code == 200
        assert "Task exception was never retrieved" not in hostile.log_text()
        print(f"RSS growth for 8 x 30 MB permission requests: {grown / MiB:.1f} MiB")
        assert grown < 256 * MiB


async def test_other_agent_requests_are_answered_method_not_found(hostile: Daemon, tmp_path: Path) -> None:
    async with hostile.client() as client:
        sid = await new_session(client, tmp_path)
        await prompt(client, sid, "asks 5000")
        events = await read_events(client, sid, turns_done(1))
        assert texts(events)[-1] == "asks: error-32601=5000"
        assert not Path("/tmp/never").exists()
        await client.delete(f"/session/{sid}")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except FileNotFoundError:
        return False
    return stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3] != b"Z"  # a zombie has ended


async def test_a_sessions_setsid_grandchildren_end_with_it(hostile: Daemon, tmp_path: Path) -> None:
    async with hostile.client() as client:
        sid = await new_session(client, tmp_path)
        await prompt(client, sid, f"grandchild {tmp_path}")
        events = await read_events(client, sid, turns_done(1))
        assert texts(events)[-1] == "grandchildren started"
        pids = [int((tmp_path / name).read_text()) for name in ("setsid.pid", "orphan.pid")]
        for pid in pids:
            assert _alive(pid) and os.getsid(pid) == pid  # each left the agent's session
        assert (await client.delete(f"/session/{sid}")).status_code == 200
        deadline = time.monotonic() + 5.0  # the acceptance's bound: gone within 5 s of DELETE
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert not [pid for pid in pids if _alive(pid)]


async def test_a_flood_reaches_a_resuming_reader_whole_and_another_session_still_ends(
        hostile: Daemon, tmp_path: Path) -> None:
    """100,000 updates as fast as the child can write: a reader too slow for them is evicted (D-4)
    and resumes with Last-Event-ID (the client does), so it gets every update once, in order, gap-free;
    a second session's turn meanwhile ends. How fast each is, is bench/fair_share.py's figure."""
    updates = 100_000
    client = DaemonClient(hostile.url, hostile.token)
    try:
        flooder = await client.create_session(str(tmp_path))
        other = await client.create_session(str(tmp_path))
        flood = await client.prompt(flooder, f"flood {updates}")
        ping = await client.prompt(other, "echo ping")
        other_events = [e async for e in client.turn_events(other, ping, last_event_id=0)]
        assert other_events[-1].type == "turn_complete"
        events = [e async for e in client.turn_events(flooder, flood, last_event_id=0)]
        ids = [e.id for e in events if e.id is not None]
        assert ids == list(range(ids[0], ids[-1] + 1))  # once each, in order, no gap across resumes
        assert events[-1].type == "turn_complete" and not events[-1].data["degraded"]
        assert len([e for e in events if e.type == "session_update" and e.prompt_id == flood]) == updates
        assert not [e for e in events if e.type in ("frame_dropped", "data_corrupt")]
        for sid in (flooder, other):
            await client.delete_session(sid)
    finally:
        await client.aclose()


def _send_huge_head(url: str, size: int) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        chunk = b"x" * MiB
        try:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ")
            for _ in range(size // MiB):
                sock.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        raw = b""
        try:
            while data := sock.recv(65536):
                raw += data
        except ConnectionResetError:
            pass
        return raw


def test_huge_and_numerous_headers_before_authentication_get_a_431(hostile: Daemon) -> None:
    before = rss_bytes(hostile.proc.pid)
    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        answers = list(pool.map(lambda _: _send_huge_head(hostile.url, 40 * MiB), range(10)))
    grown = rss_bytes(hostile.proc.pid) - before
    for raw in answers:
        assert raw.startswith(b"HTTP/1.1 431"), raw[:100]
        error = orjson.loads(raw.partition(b"\r\n\r\n")[2])["error"]
        assert error["setting"] == "HOPLINE_REQUEST_HEAD_MAX_BYTES" and error["limit"] == 64 * 1024
    assert grown < 32 * MiB, f"RSS grew {grown / MiB:.1f} MiB"
    host, port = hostile.url.removeprefix("http://").split(":")
    fields = b"".join(b"a%d: b\r\n" % i for i in range(10_000))
    many = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + fields
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(many + b"\r\n")
        raw = b""
        while data := sock.recv(65536):
            raw += data
    assert raw.startswith(b"HTTP/1.1 431")
    error = orjson.loads(raw.partition(b"\r\n\r\n")[2])["error"]
    assert error["setting"] == "HOPLINE_REQUEST_HEAD_MAX_HEADERS" and error["limit"] == 100
    assert error["observed"] == 101
