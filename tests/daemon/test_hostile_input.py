"""`hopline serve` against a hostile client (SPEC B-5, D-7, D-10): every probe of issue #14's table.

A real daemon subprocess on 127.0.0.1 relaying the SDK test agent; raw sockets where an HTTP client
would hide what the server does (a stalled upload, a chunked body sent whole before reading).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from .support import Daemon, iter_sse, read_events, running_daemon
from .test_serve import kill_child_until_detached, new_session, prompt, texts, turns_done

pytestmark = pytest.mark.e2e  # every test here starts real processes

MiB = 1024 * 1024
MAX_ID = 2**63 - 1
DEPTH_LIMIT = 64  # HOPLINE_JSON_MAX_DEPTH's default


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with running_daemon(tmp_path_factory.mktemp("hostile")) as d:
        yield d


@pytest.fixture(scope="module")
def tight(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon with small load ceilings, so their boundaries are cheap to reach."""
    env = {"HOPLINE_MAX_LIVE_SESSIONS": "2", "HOPLINE_BODY_READ_TIMEOUT": "1",
           "HOPLINE_KEEP_ALIVE_TIMEOUT": "1"}
    with running_daemon(tmp_path_factory.mktemp("tight"), env=env) as d:
        yield d


@pytest.fixture(scope="module")
def small_body(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon with a 16 KiB body limit and the default body-read deadline (30 s)."""
    env = {"HOPLINE_DAEMON_JSON_BODY_LIMIT": "16kb"}
    with running_daemon(tmp_path_factory.mktemp("small"), env=env) as d:
        yield d


def assert_hopline_error(response: httpx.Response, status: int, kind: str, hop: str = "daemon.api") -> Any:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert error["type"] == kind and error["hop"] == hop and isinstance(error["message"], str), error
    return error


def nested(depth: int) -> Any:
    value: Any = 1
    for level in range(depth):
        value = {"k": value} if level % 2 else [value]
    return value


async def test_a_lone_surrogate_or_invalid_utf8_in_any_body_is_a_400(daemon: Daemon, tmp_path: Path) -> None:
    json_type = {"content-type": "application/json"}
    async with daemon.client() as client:
        sid = await new_session(client, tmp_path)
        probes = [("/session", b'{"cwd": "/tmp/\\ud800"}'),
                  ("/session", b'{"cwd": "%s", "profile": "\\udfff"}' % str(tmp_path).encode()),
                  (f"/session/{sid}/prompt", b'{"text": "\\ud800"}'),
                  (f"/session/{sid}/prompt", b'{"text": "ok", "\\ud800": 1}'),
                  (f"/session/{sid}/prompt", b'{"text": "\xff\xfe"}'),
                  (f"/session/{sid}/permission/perm_1", b'{"optionId": "\\ud800"}')]
        for path, raw in probes:
            response = await client.post(path, content=raw, headers=json_type)
            error = assert_hopline_error(response, 400, "invalid_json")
            assert error["field"] == "(body)"
        # without a JSON content-type the body is not parsed at all (FastAPI's strict content type)
        bare = await client.post(f"/session/{sid}/prompt", content=b'{"text": "\\ud800"}')
        assert_hopline_error(bare, 422, "invalid_request")
        # a surrogate pair is a character, not an error
        fine = await client.post(f"/session/{sid}/prompt", content=b'{"text": "\\ud83d\\ude00"}',
                                 headers=json_type)
        assert fine.status_code == 202
        events = await read_events(client, sid, turns_done(1))
        assert texts(events)[-1] == "echo: \U0001f600"


async def test_cursors_and_last_event_ids_are_ascii_digits_in_range(daemon: Daemon, tmp_path: Path) -> None:
    async with daemon.client() as client:
        sid = await new_session(client, tmp_path)
        for cursor in ("99999999999999999999", str(MAX_ID + 1), "²", "١", "-1", "0x1"):
            response = await client.get(f"/session/{sid}/transcript", params={"cursor": cursor})
            error = assert_hopline_error(response, 400, "invalid_cursor")
            assert error["limit"] == MAX_ID
        raw_superscript = await client.get(f"/session/{sid}/transcript?cursor=%C2%B2")
        assert_hopline_error(raw_superscript, 400, "invalid_cursor")
        at_max = await client.get(f"/session/{sid}/transcript", params={"cursor": str(MAX_ID)})
        assert at_max.status_code == 200 and at_max.json()["events"] == []
        for header in (b"\xb2", str(MAX_ID + 1).encode(), b"99999999999999999999", b"-3", b"1.5"):
            response = await client.get(f"/session/{sid}/events", headers={"Last-Event-ID": header})
            assert_hopline_error(response, 400, "invalid_last_event_id")
        # the largest id is accepted (it is ahead of the journal: the stream says to reload)
        async with client.stream("GET", f"/session/{sid}/events",
                                 headers={"Last-Event-ID": str(MAX_ID)}) as stream:
            assert stream.status_code == 200
            first = await anext(stream.aiter_lines())
            assert first == "event: state_resync_required"


async def test_nesting_at_the_ceiling_passes_and_one_level_more_is_a_400(daemon: Daemon,
                                                                         tmp_path: Path) -> None:
    async with daemon.client() as client:
        # {"cwd", "scripted": {"deep": <d levels>}} is d + 2 levels deep
        at_limit = await client.post("/session", json={"cwd": str(tmp_path),
                                                       "scripted": {"deep": nested(DEPTH_LIMIT - 2)}})
        assert at_limit.status_code == 200, at_limit.text
        assert (await client.delete(f"/session/{at_limit.json()['sessionId']}")).status_code == 200
        # one level more, and the depths of the issue (252..999 were a 500, 1000 a 400 of FastAPI's)
        for depth, observed in ((DEPTH_LIMIT - 1, DEPTH_LIMIT + 1), (252, DEPTH_LIMIT + 1),
                                (999, DEPTH_LIMIT + 1), (5000, 1025)):
            body = b'{"cwd": "/tmp", "scripted": {"deep": ' + b"[" * depth + b"]" * depth + b"}}"
            response = await client.post("/session", content=body,
                                         headers={"content-type": "application/json"})
            error = assert_hopline_error(response, 400, "json_too_deep")
            assert error["limit"] == DEPTH_LIMIT and error["observed"] == observed
            assert error["setting"] == "HOPLINE_JSON_MAX_DEPTH"


@pytest.mark.parametrize(("hint", "bound", "setting"), [
    ("toolsPerIteration", 64, "HOPLINE_SCRIPTED_MAX_TOOLS_PER_ITERATION"),
    ("iterations", 1000, "HOPLINE_SCRIPTED_MAX_ITERATIONS"),
    ("writeBytes", 256 * 1024, "HOPLINE_SCRIPTED_MAX_WRITE_BYTES"),
    ("seed", MAX_ID, None),
])
async def test_scripted_hints_are_bounded_by_the_budget(daemon: Daemon, tmp_path: Path, hint: str, bound: int,
                                                        setting: str | None) -> None:
    async with daemon.client() as client:
        accepted = await client.post("/session", json={"cwd": str(tmp_path), "scripted": {hint: bound}})
        assert accepted.status_code == 200, accepted.text
        await client.delete(f"/session/{accepted.json()['sessionId']}")
        for value in (bound + 1, 1_000_000_000 if bound < 1_000_000_000 else 2**64 - 1, -1):
            response = await client.post("/session", json={"cwd": str(tmp_path), "scripted": {hint: value}})
            error = assert_hopline_error(response, 400, "invalid_hint")
            assert error["field"] == f"scripted.{hint}" and error["limit"] == bound
            assert error["observed"] == value and error.get("setting") == setting
            assert hint in error["message"] and str(bound) in error["message"]
        for value in (True, "3", 2.5, None, [1]):
            response = await client.post("/session", json={"cwd": str(tmp_path), "scripted": {hint: value}})
            assert assert_hopline_error(response, 400, "invalid_hint")["field"] == f"scripted.{hint}"


async def test_the_daemons_401_names_its_own_token(daemon: Daemon) -> None:
    async with httpx.AsyncClient(base_url=daemon.url, timeout=10) as anonymous:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            error = assert_hopline_error(await anonymous.get("/daemon/status", headers=headers), 401,
                                         "unauthorized")
            assert "HOPLINE_SERVER_TOKEN" in error["message"]
            assert "HOPLINE_INTERNAL_TOKEN" not in error["message"]
        gateway = await anonymous.post("/internal/sessions/x/llm-turn", json={})
        assert "HOPLINE_INTERNAL_TOKEN" in assert_hopline_error(gateway, 401, "unauthorized",
                                                                "gateway.llm_turn")["message"]


async def test_frameworks_own_errors_have_hoplines_shape(daemon: Daemon, tmp_path: Path) -> None:
    async with daemon.client() as client:
        sid = await new_session(client, tmp_path)
        empty = assert_hopline_error(await client.post(f"/session/{sid}/prompt", json={"text": ""}), 422,
                                     "invalid_request")
        assert empty["field"] == "body.text" and empty["errors"][0]["field"] == "body.text"
        knob = await client.post(f"/session/{sid}/prompt", json={"text": "x", "maxFrame": 1})
        knob = assert_hopline_error(knob, 422, "invalid_request")
        assert knob["field"] == "body.maxFrame"
        queued = await client.get(f"/session/{sid}/events", params={"maxQueued": 15})
        queued = assert_hopline_error(queued, 422, "invalid_request")
        assert queued["field"] == "query.maxQueued"
        not_json = await client.post(f"/session/{sid}/prompt", content=b"text=hi",
                                     headers={"content-type": "text/plain"})
        assert_hopline_error(not_json, 422, "invalid_request")
        assert_hopline_error(await client.get("/nowhere"), 404, "not_found")
        assert_hopline_error(await client.put("/daemon/status"), 405, "method_not_allowed")
        assert_hopline_error(await client.post("/session", json=[1, 2]), 422, "invalid_request")
        # the input is never echoed back
        secret = await client.post(f"/session/{sid}/prompt", json={"text": 5, "canary": "echo-canary-41"})
        assert secret.status_code == 422 and "echo-canary-41" not in secret.text


async def test_pending_prompts_per_session_are_bounded(daemon: Daemon, tmp_path: Path) -> None:
    big = "echo " + "p" * (64 * 1024)
    async with daemon.client() as client:
        sid = await new_session(client, tmp_path)
        await prompt(client, sid, "sleep 60")  # holds the turn: every later prompt queues
        for _ in range(15):
            await prompt(client, sid, big)
        status = (await client.get("/daemon/status")).json()
        assert next(s for s in status["sessions"] if s["sessionId"] == sid)["pendingPrompts"] == 16
        over = await client.post(f"/session/{sid}/prompt", json={"text": big})
        error = assert_hopline_error(over, 429, "too_many_pending_prompts")
        assert error["limit"] == 16 and error["observed"] == 17
        assert error["setting"] == "HOPLINE_MAX_PENDING_PROMPTS"
        await client.post(f"/session/{sid}/cancel")
        events = await read_events(client, sid, turns_done(1))
        assert events[-1].type == "turn_complete"
        again = await client.post(f"/session/{sid}/prompt", json={"text": "echo again"})
        assert again.status_code == 202  # room again once a turn ended
        assert (await client.delete(f"/session/{sid}")).status_code == 200


async def test_a_turn_seen_ended_frees_its_slot_at_once(tmp_path: Path) -> None:
    """With one pending prompt allowed, a client that posts its next prompt the moment it reads a
    turn's end is accepted every time: the slot is free before the end is visible (it was freed
    only when the turn's task finished, a race the client lost now and then)."""
    with running_daemon(tmp_path, env={"HOPLINE_MAX_PENDING_PROMPTS": "1"}) as one:
        async with one.client() as client:
            sid = await new_session(client, tmp_path)
            await prompt(client, sid, "echo 0")
            ends = 0
            async with client.stream("GET", f"/session/{sid}/events") as response:
                async for event in iter_sse(response):
                    if event.type not in ("turn_complete", "turn_error"):
                        continue
                    assert event.type == "turn_complete", event.data
                    ends += 1
                    if ends == 40:
                        break
                    await prompt(client, sid, f"echo {ends}")  # asserts the 202
            over = [await client.post(f"/session/{sid}/prompt", json={"text": "sleep 60"}),
                    await client.post(f"/session/{sid}/prompt", json={"text": "echo over"})]
            assert over[0].status_code == 202
            error = assert_hopline_error(over[1], 429, "too_many_pending_prompts")
            assert error["limit"] == 1 and error["observed"] == 2


async def test_sse_subscribers_per_session_are_bounded(daemon: Daemon, tmp_path: Path) -> None:
    limits = httpx.Limits(max_connections=40, max_keepalive_connections=0)
    async with daemon.client() as client, httpx.AsyncClient(base_url=daemon.url, headers=daemon.headers,
                                                             timeout=30, limits=limits) as streams:
        sid = await new_session(client, tmp_path)
        async with contextlib.AsyncExitStack() as stack:
            opened = []
            for _ in range(32):
                stream = await stack.enter_async_context(streams.stream("GET", f"/session/{sid}/events"))
                assert stream.status_code == 200
                opened.append(stream)
            status = (await client.get("/daemon/status")).json()  # a stream answers once subscribed
            assert next(s for s in status["sessions"] if s["sessionId"] == sid)["subscribers"] == 32
            async with client.stream("GET", f"/session/{sid}/events") as over:  # a stream if not refused
                assert over.status_code == 429
                await over.aread()
            error = assert_hopline_error(over, 429, "too_many_subscribers", "daemon.sse")
            assert error["limit"] == 32 and error["observed"] == 33
            assert error["setting"] == "HOPLINE_MAX_SUBSCRIBERS_PER_SESSION"
        for _ in range(200):  # the daemon sees the 32 disconnects on its own time
            status = (await client.get("/daemon/status")).json()
            if next(s for s in status["sessions"] if s["sessionId"] == sid)["subscribers"] < 32:
                break
            await asyncio.sleep(0.05)
        events = await read_events(client, sid, lambda e: e.type == "replay_complete")  # room again
        assert events[-1].type == "replay_complete"
        await client.delete(f"/session/{sid}")


async def test_live_sessions_per_daemon_are_bounded(tight: Daemon, tmp_path: Path) -> None:
    async with tight.client() as client:
        first = await new_session(client, tmp_path)
        second = await new_session(client, tmp_path)
        over = await client.post("/session", json={"cwd": str(tmp_path)})
        error = assert_hopline_error(over, 503, "too_many_sessions")
        assert error["limit"] == 2 and error["observed"] == 3
        assert error["setting"] == "HOPLINE_MAX_LIVE_SESSIONS"
        # a detached session frees its place; loading it back needs one again
        await kill_child_until_detached(client, first)
        third = await new_session(client, tmp_path)
        assert_hopline_error(await client.post(f"/session/{first}/load"), 503, "too_many_sessions")
        await client.delete(f"/session/{third}")
        assert (await client.post(f"/session/{first}/load")).status_code == 200
        for sid in (first, second):
            assert (await client.delete(f"/session/{sid}")).status_code == 200


def raw_exchange(daemon: Daemon, head: str, body_parts: list[bytes], *, timeout: float = 20.0) -> bytes:
    """Send the request head and every body part (whole, before reading), then read until the server
    closes the connection; a reset or a timeout fails the test."""
    host, port = daemon.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(head.encode())
        for part in body_parts:
            sock.sendall(part)
        raw = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return raw
            raw += chunk


def split_response(raw: bytes) -> tuple[bytes, dict[str, str], Any]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    fields = (line.decode().partition(":") for line in lines[1:])
    headers = {name.strip().lower(): value.strip() for name, _, value in fields}
    return lines[0], headers, orjson.loads(body)


def test_a_stalled_upload_gets_a_408_and_its_connection_closed(tight: Daemon) -> None:
    head = (f"POST /session/x/prompt HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {tight.token}\r\n"
            "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
    status, headers, body = split_response(raw_exchange(tight, head, [b'{"text": ']))
    assert status.startswith(b"HTTP/1.1 408")
    assert headers["connection"] == "close"
    error = body["error"]
    assert error["type"] == "request_timeout" and error["hop"] == "daemon.api"
    assert error["receivedBytes"] == 9 and error["declaredBytes"] == 1000
    assert error["timeoutSeconds"] == 1.0 and error["setting"] == "HOPLINE_BODY_READ_TIMEOUT"


def test_an_idle_keep_alive_connection_is_closed(tight: Daemon) -> None:
    head = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    raw = raw_exchange(tight, head, [])  # returns once the server closed the idle connection
    assert raw.startswith(b"HTTP/1.1 200") and raw.endswith(b'{"status":"ok"}')


def chunked(body: bytes, size: int) -> list[bytes]:
    parts = [b"%x\r\n%s\r\n" % (len(body[i:i + size]), body[i:i + size]) for i in range(0, len(body), size)]
    return [*parts, b"0\r\n\r\n"]


async def test_an_over_limit_chunked_upload_still_reads_the_413_json(daemon: Daemon, tmp_path: Path) -> None:
    async with daemon.client() as client:
        sid = await new_session(client, tmp_path)
    head = (f"POST /session/{sid}/prompt HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {daemon.token}\r\n"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    body = b'{"text": "' + b"a" * (MiB + MiB // 2) + b'"}'  # 1.5 times the daemon's 1 MiB limit
    raw = await asyncio.to_thread(raw_exchange, daemon, head, chunked(body, 64 * 1024))
    status, _, payload = split_response(raw)
    assert status.startswith(b"HTTP/1.1 413")
    error = payload["error"]
    assert error["type"] == "request_entity_too_large" and error["hop"] == "daemon.api"
    assert error["limit"] == MiB and error["receivedBytes"] > MiB


def test_a_body_that_ends_in_the_message_passing_the_limit_is_answered_at_once(small_body: Daemon) -> None:
    # one send: the whole body arrives in one message that also ends it; nothing is left to drain,
    # and waiting for more would hold the 413 until the 30 s deadline (past this socket's timeout)
    body = b'{"text": "' + b"a" * 16 * 1024 + b'"}'
    head = (f"POST /session/x/prompt HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {small_body.token}\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n")
    whole = head.encode() + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    status, _, payload = split_response(raw_exchange(small_body, "", [whole]))
    assert status.startswith(b"HTTP/1.1 413")
    assert payload["error"]["limit"] == 16 * 1024 and payload["error"]["receivedBytes"] == len(body)


# --- connections: the request head's deadline and the connection ceiling (slowloris) -----------

HEAD_TIMEOUT = 1.0
MAX_CONNECTIONS = 4


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon with a 1 s request-head deadline; connections otherwise at their defaults."""
    with running_daemon(tmp_path_factory.mktemp("guarded"),
                        env={"HOPLINE_REQUEST_HEAD_TIMEOUT": str(HEAD_TIMEOUT)}) as d:
        yield d


@pytest.fixture(scope="module")
def few_connections(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon that keeps at most 4 connections open at once (idle ones kept for 60 s)."""
    env = {"HOPLINE_MAX_CONNECTIONS": str(MAX_CONNECTIONS), "HOPLINE_KEEP_ALIVE_TIMEOUT": "60",
           "HOPLINE_REQUEST_HEAD_TIMEOUT": "60"}
    with running_daemon(tmp_path_factory.mktemp("few"), env=env) as d:
        yield d


def test_a_connection_that_sends_nothing_is_closed_at_the_head_deadline(guarded: Daemon) -> None:
    assert raw_exchange(guarded, "", []) == b""  # closed by the server: no answer to no request


def test_a_request_head_still_incomplete_at_its_deadline_gets_a_408(guarded: Daemon) -> None:
    head = f"GET /daemon/status HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {guarded.token}\r\n"
    status, headers, body = split_response(raw_exchange(guarded, head, []))  # no blank line: never ends
    assert status.startswith(b"HTTP/1.1 408") and headers["connection"] == "close"
    error = body["error"]
    assert error["type"] == "request_timeout" and error["hop"] == "daemon.api"
    assert error["setting"] == "HOPLINE_REQUEST_HEAD_TIMEOUT" and error["timeoutSeconds"] == HEAD_TIMEOUT
    assert error["receivedBytes"] == len(head)
    assert guarded.token not in guarded.log_text()


def test_each_request_on_a_kept_alive_connection_gets_its_own_head_deadline(guarded: Daemon) -> None:
    host, port = guarded.url.removeprefix("http://").split(":")
    request = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        for _ in range(2):  # two whole requests, one after the other's answer: both served
            sock.sendall(request)
            answer = b""
            while not answer.endswith(b'{"status":"ok"}'):
                chunk = sock.recv(65536)
                assert chunk, answer
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 200")
        third = b"GET /health HTTP/1.1\r\n"
        sock.sendall(third)  # the third never ends its head
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    status, _, body = split_response(raw)
    assert status.startswith(b"HTTP/1.1 408") and body["error"]["receivedBytes"] == len(third)


def test_connections_past_the_ceiling_get_a_503_naming_it(few_connections: Daemon) -> None:
    host, port = few_connections.url.removeprefix("http://").split(":")
    request = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"

    def served(sock: socket.socket) -> bytes:
        sock.sendall(request)
        answer = b""
        while not answer.endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                return answer
            answer += chunk
        return answer

    with contextlib.ExitStack() as stack:
        open_ = [stack.enter_context(socket.create_connection((host, int(port)), timeout=30))
                 for _ in range(MAX_CONNECTIONS)]
        for sock in open_:  # at the limit: every one served, and kept open
            assert served(sock).startswith(b"HTTP/1.1 200")
        with socket.create_connection((host, int(port)), timeout=30) as extra:  # one over
            raw = b""
            while chunk := extra.recv(65536):
                raw += chunk
        status, headers, body = split_response(raw)
        assert status.startswith(b"HTTP/1.1 503") and headers["connection"] == "close"
        error = body["error"]
        assert error["type"] == "too_many_connections" and error["hop"] == "daemon.api"
        assert error["limit"] == MAX_CONNECTIONS and error["observed"] == MAX_CONNECTIONS + 1
        assert error["setting"] == "HOPLINE_MAX_CONNECTIONS"
        open_[0].close()
        deadline = 50
        while True:  # once one closes (the server sees it shortly after), a new one is served
            with socket.create_connection((host, int(port)), timeout=30) as again:
                answer = served(again)
            if answer.startswith(b"HTTP/1.1 200") or deadline == 0:
                break
            deadline -= 1
            time.sleep(0.1)
        assert answer.startswith(b"HTTP/1.1 200")
