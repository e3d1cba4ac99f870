"""`hopline agent` as a real child process, driven by the ACP SDK's client connection."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest
from acp import RequestError, text_block
from acp.schema import SessionNotification

from agent.acp_peer import RecordingClient, spawn_agent

TIMEOUT = 60.0
MiB = 1024 * 1024


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "logs").mkdir(parents=True)
    (ws / "README.md").write_text("# sample\nTODO: more tests\n")
    (ws / "app.py").write_text("def main():\n    return 1  # retry on timeout\n")
    (ws / "logs" / "run.log").write_text("".join(f"line {i} ERROR timeout\n" for i in range(4000)))
    return ws


def scripted(iterations: int, tools: int = 3, **extra: Any) -> dict[str, Any]:
    return {"hopline.scripted": {"iterations": iterations, "toolsPerIteration": tools, **extra}}


def check_tool_order(updates: list[dict[str, Any]]) -> list[str]:
    """Each tool_call precedes its tool_call_updates; every call ends completed or failed."""
    started: list[str] = []
    finished: set[str] = set()
    for update in updates:
        kind = update["sessionUpdate"]
        if kind == "tool_call":
            assert update["toolCallId"] not in started
            started.append(update["toolCallId"])
        elif kind == "tool_call_update":
            assert update["toolCallId"] in started, "tool_call_update before its tool_call"
            if update.get("status") in ("completed", "failed"):
                assert update["toolCallId"] not in finished
                finished.add(update["toolCallId"])
    assert finished == set(started)
    return started


def persisted_conversation(data_dir: Path, session_id: str) -> list[dict[str, Any]]:
    with sqlite3.connect(data_dir / "sessions.sqlite3") as db:
        row = db.execute("SELECT conversation FROM sessions WHERE id = ?", (session_id,)).fetchone()
    return list(orjson.loads(row[0]))


def assert_no_orphans(conversation: list[dict[str, Any]]) -> None:
    calls = [c["id"] for m in conversation if m.get("role") == "assistant" for c in m.get("tool_calls") or []]
    answers = [m["tool_call_id"] for m in conversation if m.get("role") == "tool"]
    assert sorted(calls) == sorted(answers)


@pytest.mark.e2e
async def test_prompt_streams_chunks_tool_calls_in_order_and_ends_turn(
        tmp_path: Path, workspace: Path) -> None:
    async with spawn_agent(tmp_path / "data") as (conn, client, _):
        session = await conn.new_session(cwd=str(workspace), mcp_servers=[],
                                         **{"hopline.permissionMode": "auto", **scripted(2)})
        answer = await asyncio.wait_for(
            conn.prompt(session_id=session.session_id, prompt=[text_block("review the workspace")]), TIMEOUT)
    assert answer.stop_reason == "end_turn"
    turn = (answer.field_meta or {})["hopline.turn"]
    assert turn["stopReason"] == "end_turn" and turn["iterations"] >= 2
    assert 0 < turn["maxBodyBytes"] <= turn["ceilingBytes"] == 8 * MiB
    kinds = [u["sessionUpdate"] for u in client.updates]
    assert kinds[0] == "user_message_chunk"
    assert "agent_message_chunk" in kinds
    started = check_tool_order(client.updates)
    assert len(started) >= 2
    first_call = next(u for u in client.updates if u["sessionUpdate"] == "tool_call")
    assert first_call["status"] == "in_progress" and first_call["kind"] and first_call["title"]
    assert isinstance(first_call["rawInput"], dict)
    results = [u for u in client.updates if u["sessionUpdate"] == "tool_call_update"
               and u.get("status") == "completed"]
    assert all(r["content"][0]["content"]["text"] for r in results)
    progress = [p for m, p in client.ext if m == "hopline/progress" and "progress" in p]
    assert len(progress) == turn["iterations"]
    assert all(p["sessionId"] == session.session_id for p in progress)
    assert progress[0]["progress"]["iteration"] == 1


@pytest.mark.e2e
async def test_rejected_permission_fails_that_tool_and_the_turn_goes_on(
        tmp_path: Path, workspace: Path) -> None:
    client = RecordingClient(permission=lambda _req: "reject_once")
    async with spawn_agent(tmp_path / "data", client) as (conn, _, _):
        session = await conn.new_session(cwd=str(workspace), mcp_servers=[], **scripted(2))
        answer = await asyncio.wait_for(
            conn.prompt(session_id=session.session_id, prompt=[text_block("check")]), TIMEOUT)
    assert answer.stop_reason == "end_turn"
    asked = [r["toolCall"]["toolCallId"] for r in client.permission_requests]
    assert asked, "run_command must ask for permission"
    assert all(r["options"] == ["allow_once", "reject_once"] for r in client.permission_requests)
    check_tool_order(client.updates)
    for call_id in asked:
        mine = [u for u in client.updates if u.get("toolCallId") == call_id]
        assert mine[0]["sessionUpdate"] == "tool_call" and mine[0]["status"] == "pending"
        assert [u["status"] for u in mine[1:]] == ["failed"]
    others = [u for u in client.updates if u["sessionUpdate"] == "tool_call_update"
              and u["toolCallId"] not in asked]
    assert others and all(u["status"] == "completed" for u in others)


@pytest.mark.e2e
async def test_cancel_mid_turn_then_next_turn_is_valid(tmp_path: Path, workspace: Path) -> None:
    data = tmp_path / "data"
    client = RecordingClient()
    async with spawn_agent(data, client) as (conn, _, _):
        session = await conn.new_session(cwd=str(workspace), mcp_servers=[],
                                         **{"hopline.permissionMode": "auto", **scripted(40)})
        first_result = asyncio.Event()

        def on_update(update: dict[str, Any]) -> None:
            if update["sessionUpdate"] == "tool_call_update" and not first_result.is_set():
                first_result.set()

        client.on_update = on_update
        turn = asyncio.ensure_future(conn.prompt(session_id=session.session_id, prompt=[text_block("go")]))
        await asyncio.wait_for(first_result.wait(), TIMEOUT)
        await conn.cancel(session_id=session.session_id)
        answer = await asyncio.wait_for(turn, TIMEOUT)
        assert answer.stop_reason == "cancelled"
        assert (answer.field_meta or {})["hopline.turn"]["stopReason"] == "cancelled"
        check_tool_order(client.updates)
        assert_no_orphans(persisted_conversation(data, session.session_id))

        client.updates.clear()
        again = await asyncio.wait_for(
            conn.prompt(session_id=session.session_id, prompt=[text_block("again")]), TIMEOUT)
        assert again.stop_reason in ("end_turn", "max_turn_requests")
        assert (again.field_meta or {})["hopline.turn"]["repairs"] == {
            "orphanResultsRemoved": 0, "interruptedResultsAdded": 0}
    assert_no_orphans(persisted_conversation(data, session.session_id))


@pytest.mark.e2e
async def test_five_mib_tool_output_reaches_the_client_whole(tmp_path: Path, workspace: Path) -> None:
    big = ("0123456789abcdef" * 64 + "\n") * (5 * MiB // 1025)
    (workspace / "logs" / "run.log").unlink()
    (workspace / "big.log").write_text(big)
    async with spawn_agent(tmp_path / "data", HOPLINE_COMMAND_OUTPUT_MAX_BYTES="8mb") as (conn, client, _):
        session = await conn.new_session(cwd=str(workspace), mcp_servers=[],
                                         **{"hopline.permissionMode": "auto", **scripted(2)})
        answer = await asyncio.wait_for(
            conn.prompt(session_id=session.session_id, prompt=[text_block("read the log")]), TIMEOUT)
    assert answer.stop_reason == "end_turn"
    texts = [u["content"][0]["content"]["text"] for u in client.updates
             if u["sessionUpdate"] == "tool_call_update" and u.get("content")]
    assert big in texts  # read_file's whole output, 5 MiB, in one frame
    turn = (answer.field_meta or {})["hopline.turn"]
    assert turn["maxBodyBytes"] < 1 * MiB  # the model saw capped results


async def _prompt_once(data: Path, workspace: Path) -> tuple[str, list[dict[str, Any]]]:
    async with spawn_agent(data) as (conn, client, _):
        session = await conn.new_session(cwd=str(workspace), mcp_servers=[],
                                         **{"hopline.permissionMode": "auto", **scripted(3)})
        answer = await asyncio.wait_for(
            conn.prompt(session_id=session.session_id, prompt=[text_block("first")]), TIMEOUT)
        assert answer.stop_reason == "end_turn"
    return session.session_id, list(client.updates)


def _validated(raw: list[dict[str, Any]], session_id: str) -> list[dict[str, Any]]:
    """Raw update dicts as the SDK client sees them (same model, same dump)."""
    return [SessionNotification.model_validate({"sessionId": session_id, "update": u})
            .update.model_dump(mode="json", by_alias=True, exclude_none=True) for u in raw]


@pytest.mark.e2e
async def test_restart_then_load_replays_the_same_updates(tmp_path: Path, workspace: Path) -> None:
    data = tmp_path / "data"
    session_id, original = await _prompt_once(data, workspace)
    assert len(original) > 5
    async with spawn_agent(data) as (conn, client, _):
        await asyncio.wait_for(conn.load_session(cwd=str(workspace), session_id=session_id, mcp_servers=[]),
                               TIMEOUT)
        assert client.updates == original
        # the restored session takes the next turn
        answer = await asyncio.wait_for(
            conn.prompt(session_id=session_id, prompt=[text_block("second")]), TIMEOUT)
        assert answer.stop_reason == "end_turn"


@pytest.mark.e2e
@pytest.mark.parametrize("limits", [{"HOPLINE_BULK_REPLAY_MAX_UPDATES": "5"},
                                    {"HOPLINE_BULK_REPLAY_MAX_BYTES": "2048"}])
async def test_bulk_load_and_load_updates_page_within_both_limits(
        tmp_path: Path, workspace: Path, limits: dict[str, str]) -> None:
    data = tmp_path / "data"
    session_id, original = await _prompt_once(data, workspace)
    max_updates = int(limits.get("HOPLINE_BULK_REPLAY_MAX_UPDATES", "10000"))
    max_bytes = int(limits.get("HOPLINE_BULK_REPLAY_MAX_BYTES", str(32 * MiB)))
    async with spawn_agent(data, **limits) as (conn, client, _):
        loaded = await asyncio.wait_for(conn.load_session(
            cwd=str(workspace), session_id=session_id, mcp_servers=[],
            **{"hopline.session.loadReplayMode": "bulk"}), TIMEOUT)
        assert client.updates == []  # bulk: nothing streamed
        page = (loaded.field_meta or {})["hopline.session.loadReplay"]
        assert page["v"] == 1 and page["partial"] is True and page["hasMore"] is True
        bulk: list[dict[str, Any]] = []
        pages = [page]
        while True:
            assert len(page["updates"]) <= max_updates
            size = len(orjson.dumps(page))
            assert size <= max_bytes or len(page["updates"]) == 1  # an oversized update goes alone
            bulk.extend(page["updates"])
            if not page.get("hasMore"):
                break
            params = {"sessionId": session_id, "cursor": page["nextCursor"]}
            page = await asyncio.wait_for(conn.ext_method("hopline/session/loadUpdates", params), TIMEOUT)
            pages.append(page)
            assert page["startTime"] <= page["lastUpdated"]
        assert len(pages) > 1
        assert _validated(bulk, session_id) == original

        # loadUpdates from the start covers the whole history exactly once
        paged: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            params = {"sessionId": session_id} | ({"cursor": cursor} if cursor else {})
            answer = await asyncio.wait_for(conn.ext_method("hopline/session/loadUpdates", params), TIMEOUT)
            assert len(answer["updates"]) <= max_updates
            assert len(orjson.dumps(answer)) <= max_bytes or len(answer["updates"]) == 1
            paged.extend(answer["updates"])
            cursor = answer.get("nextCursor")
            if cursor is None:
                assert "partial" not in answer
                break
            assert answer["partial"] is True
        assert paged == bulk


@pytest.mark.e2e
async def test_unknown_session_load_is_a_clear_error(tmp_path: Path, workspace: Path) -> None:
    async with spawn_agent(tmp_path / "data") as (conn, _, _):
        with pytest.raises(RequestError) as err:
            await conn.load_session(cwd=str(workspace), session_id="nope", mcp_servers=[])
    assert err.value.code == -32602 and err.value.data["reason"] == "unknown session"


@pytest.mark.e2e
async def test_failed_turn_answers_a_json_rpc_error_with_its_origin(tmp_path: Path, workspace: Path) -> None:
    import socket

    with socket.socket() as sock:  # a loopback port with nothing listening: the gateway is down
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {"HOPLINE_GATEWAY_URL": f"http://127.0.0.1:{port}", "HOPLINE_INTERNAL_TOKEN": "t",
           "HOPLINE_MODEL_RETRY_ATTEMPTS": "0"}
    async with spawn_agent(tmp_path / "data", **env) as (conn, _client, _):
        session = await conn.new_session(cwd=str(workspace), mcp_servers=[])
        with pytest.raises(RequestError) as err:
            await asyncio.wait_for(conn.prompt(session_id=session.session_id, prompt=[text_block("x")]),
                                   TIMEOUT)
        assert err.value.code == -32603
        data = err.value.data
        assert data["origin"] == "model" and data["message"]
        assert set(data) <= {"origin", "message", "status", "hop", "setting", "limit", "observed", "unit",
                             "retryable"}
        assert data["retryable"] is True  # a transient failure, retried as the budget allows (here: 0)
        # the session stays usable: the failure did not leave a turn running
        with pytest.raises(RequestError) as again:
            await asyncio.wait_for(conn.prompt(session_id=session.session_id, prompt=[text_block("y")]),
                                   TIMEOUT)
        assert again.value.data["origin"] == "model"


@pytest.mark.e2e
async def test_hints_past_their_ceilings_and_bad_cursors_are_invalid_params(tmp_path: Path,
                                                                            workspace: Path) -> None:
    async with spawn_agent(tmp_path / "data") as (conn, _, _):
        at_bound = await conn.new_session(cwd=str(workspace), mcp_servers=[], **scripted(1000, 64))
        over = (({"toolsPerIteration": 65}, "toolsPerIteration"), ({"iterations": 1001}, "iterations"),
                ({"writeBytes": 256 * 1024 + 1}, "writeBytes"), ({"nope": 1}, "nope"))
        for hints, field in over:
            with pytest.raises(RequestError) as err:
                await conn.new_session(cwd=str(workspace), mcp_servers=[], **{"hopline.scripted": hints})
            assert err.value.code == -32602 and err.value.data["field"] == f"_meta.hopline.scripted.{field}"
        for cursor in ("99999999999999999999", "²", "-1", [1]):
            params = {"sessionId": at_bound.session_id, "cursor": cursor}
            with pytest.raises(RequestError) as err:
                await conn.ext_method("hopline/session/loadUpdates", params)
            assert err.value.code == -32602 and err.value.data["field"] == "cursor"


@pytest.mark.e2e
async def test_session_credentials_stay_in_memory(tmp_path: Path, workspace: Path) -> None:
    data = tmp_path / "data"
    canary = "gateway-token-canary-3c9e"
    async with spawn_agent(data) as (conn, _, _):
        meta = {"hopline.credentials": {"gatewayToken": canary}, **scripted(1, 1)}
        session = await conn.new_session(cwd=str(workspace), mcp_servers=[], **meta)
        await asyncio.wait_for(conn.prompt(session_id=session.session_id, prompt=[text_block("go")]), TIMEOUT)
        with pytest.raises(RequestError) as err:
            await conn.new_session(cwd=str(workspace), mcp_servers=[], **{"hopline.credentials": "token"})
        assert err.value.data["field"] == "_meta.hopline.credentials"
    for path in data.rglob("*"):
        if path.is_file():
            assert canary.encode() not in path.read_bytes(), path.name


def test_credentials_of_reads_both_tokens_and_refuses_bad_shapes() -> None:
    from hopline.harness.acp.requests import SessionCredentials, credentials_of
    from hopline.vocabulary import CREDENTIAL_GATEWAY_TOKEN as GATEWAY
    from hopline.vocabulary import CREDENTIAL_SIDECAR_WRITE_TOKEN as WRITE
    from hopline.vocabulary import META_CREDENTIALS

    assert credentials_of({}) is None
    both = credentials_of({META_CREDENTIALS: {GATEWAY: "canary-gw-71", WRITE: "canary-wr-72"}})
    assert both == SessionCredentials(gateway_token="canary-gw-71", sidecar_write_token="canary-wr-72")
    assert "canary" not in repr(both)  # repr hides the secrets
    assert credentials_of({META_CREDENTIALS: {WRITE: ""}}) == SessionCredentials()
    for bad in ("not a dict", {GATEWAY: 7}, {WRITE: ["w"]}):
        with pytest.raises(RequestError):
            credentials_of({META_CREDENTIALS: bad})
