"""S-3: `hopline agent` under the daemon writes large tool output straight to the sidecar store.

Real child processes on real pipes (every stdout frame counted as it crosses the pipe), a real
SQLite sidecar store in a tmp dir, the ACP SDK as the client. The in-process tests at the end
drive the offload function against the same real store for the exact boundaries and fallbacks.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from acp import PROTOCOL_VERSION, text_block
from acp.client.connection import ClientSideConnection
from acp.schema import ClientCapabilities, SessionNotification
from acp.transports import spawn_stdio_transport

from agent.acp_peer import AGENT_CMD, SPAWN_TIMEOUT, RecordingClient, agent_env
from hopline.budget import SIDECAR_DIR_ENV, Budget
from hopline.harness.acp.messages import tool_result_update_of
from hopline.harness.acp.sidecars import needs_offload, offload_update, store_from_env, writer_for
from hopline.harness.loop_events import ToolCallFinished
from hopline.sidecars.projection import preview_text
from hopline.sidecars.store import SidecarStore
from hopline.sidecars.writer import SidecarWriter
from hopline.vocabulary import CREDENTIAL_SIDECAR_WRITE_TOKEN, META_CREDENTIALS, META_SIDECAR, META_TOOL

TIMEOUT = 60.0
KiB = 1024
DAEMON_SESSION = "daemon-session-7"  # the daemon's own id for the session; the agent never sees it
# Room for the JSON-RPC notification around a stubbed update (ids, keys, previews' JSON escaping).
ENVELOPE_BYTES = 4 * KiB
BUDGET = Budget.defaults()


def big_text(tag: str, size: int) -> str:
    """``size`` bytes of UTF-8 text with multi-byte characters, distinct per ``tag``."""
    lines: list[str] = []
    used = 0
    index = 0
    while used < size:
        line = f"{tag} {index:06d} ERROR timeout é→ retry ✓ {'x' * 40}\n"
        lines.append(line)
        used += len(line.encode("utf-8"))
        index += 1
    return "".join(lines)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "README.md").write_text("# sample\nTODO: more tests\n")
    for tag in ("alpha", "beta"):
        (ws / f"{tag}.log").write_text(big_text(tag, 200 * KiB), encoding="utf-8")
    return ws


@pytest.fixture
def sidecar_store(tmp_path: Path) -> Iterator[SidecarStore]:
    store = SidecarStore(tmp_path / "sidecars", Budget.defaults())
    yield store
    store.close()


@contextlib.asynccontextmanager
async def counting_agent(data_dir: Path, **env: str) -> AsyncIterator[
        tuple[ClientSideConnection, RecordingClient, list[int]]]:
    """Spawn `hopline agent`; every stdout frame's size is recorded before the SDK client reads it."""
    client = RecordingClient()
    environ = agent_env(data_dir, **env)
    limit = Budget.from_env(environ).pipe_max_frame_bytes
    sizes: list[int] = []
    async with spawn_stdio_transport(*AGENT_CMD, env=environ, limit=limit, stderr=None,
                                     shutdown_timeout=5.0) as (reader, writer, process):
        relay = asyncio.StreamReader(limit=limit)

        async def pump() -> None:
            try:
                while True:
                    try:
                        line = await reader.readuntil(b"\n")
                    except asyncio.IncompleteReadError:
                        return
                    sizes.append(len(line))
                    relay.feed_data(line)
            finally:
                relay.feed_eof()

        relay_task = asyncio.ensure_future(pump())
        conn = ClientSideConnection(client, writer, relay)
        try:
            await asyncio.wait_for(conn.initialize(protocol_version=PROTOCOL_VERSION,
                                                   client_capabilities=ClientCapabilities()), SPAWN_TIMEOUT)
            yield conn, client, sizes
        finally:
            await conn.close()
            relay_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await relay_task
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()


async def run_turn(data: Path, workspace: Path, token: str | None = None,
                   **env: str) -> tuple[str, list[dict[str, Any]], list[int]]:
    """Three tool iterations (list, then read_file / run_command cat / search on the 200 KiB files).

    ``token`` travels as the daemon sends it: in session/new ``_meta["hopline.credentials"]``."""
    meta: dict[str, Any] = {"hopline.permissionMode": "auto",
                            "hopline.scripted": {"iterations": 3, "toolsPerIteration": 3}}
    if token is not None:
        meta[META_CREDENTIALS] = {CREDENTIAL_SIDECAR_WRITE_TOKEN: token}
    async with counting_agent(data, **env) as (conn, client, sizes):
        session = await conn.new_session(cwd=str(workspace), mcp_servers=[], **meta)
        answer = await asyncio.wait_for(
            conn.prompt(session_id=session.session_id, prompt=[text_block("review the logs")]), TIMEOUT)
        assert answer.stop_reason == "end_turn"
    return session.session_id, list(client.updates), sizes


def calls_by_id(updates: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {u["toolCallId"]: u for u in updates if u["sessionUpdate"] == "tool_call"}


def results(updates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [u for u in updates if u["sessionUpdate"] == "tool_call_update" and u.get("content")]


def expected_output(call: dict[str, Any], workspace: Path) -> str | None:
    """The tool's full output for the big-file calls the scripted model makes."""
    raw = call["rawInput"]
    if "path" in raw and str(raw["path"]).endswith(".log"):
        return (workspace / raw["path"]).read_text(encoding="utf-8")
    command = str(raw.get("command", ""))
    if command.startswith("cat ") and command.endswith(".log"):
        return (workspace / command[4:]).read_text(encoding="utf-8") + "\n[exit code 0]"
    return None


def persisted_updates(data: Path, session_id: str) -> list[bytes]:
    with sqlite3.connect(data / "sessions.sqlite3") as db:
        rows = db.execute("SELECT body FROM updates WHERE session_id = ? ORDER BY seq",
                          (session_id,)).fetchall()
    return [bytes(r[0]) for r in rows]


def as_client_sees(bodies: list[bytes], session_id: str) -> list[dict[str, Any]]:
    return [SessionNotification.model_validate({"sessionId": session_id, "update": orjson.loads(b)})
            .update.model_dump(mode="json", by_alias=True, exclude_none=True) for b in bodies]


def assert_tool_meta(updates: list[dict[str, Any]]) -> None:
    calls = calls_by_id(updates)
    assert calls
    for update in updates:
        if update["sessionUpdate"] in ("tool_call", "tool_call_update"):
            tool = update["_meta"][META_TOOL]
            assert tool["provenance"] == "builtin"
            assert tool["name"] == calls[update["toolCallId"]]["_meta"][META_TOOL]["name"]
    names = {c["_meta"][META_TOOL]["name"] for c in calls.values()}
    assert {"list_files", "read_file", "run_command"} <= names


@pytest.mark.e2e
async def test_large_outputs_go_to_the_store_and_frames_stay_small(
        tmp_path: Path, workspace: Path, sidecar_store: SidecarStore) -> None:
    token = sidecar_store.mint_write_token(DAEMON_SESSION)
    data = tmp_path / "data"
    session_id, updates, sizes = await run_turn(data, workspace, token,
                                                **{SIDECAR_DIR_ENV: str(sidecar_store.root)})

    # Every frame on the pipe is far under the large-frame threshold: only stubs travelled.
    assert max(sizes) < BUDGET.large_frame_threshold_bytes
    assert max(sizes) <= BUDGET.sidecar_threshold_bytes + ENVELOPE_BYTES

    calls = calls_by_id(updates)
    resolved = 0
    for update in results(updates):
        call = calls[update["toolCallId"]]
        expected = expected_output(call, workspace)
        entries = (update.get("_meta") or {}).get(META_SIDECAR)
        if expected is None:  # small outputs stay inline, no sidecar
            assert entries is None
            assert len(update["content"][0]["content"]["text"].encode()) <= BUDGET.sidecar_threshold_bytes
            continue
        assert entries is not None and len(entries) == 1
        entry = entries[0]
        assert set(entry) == {"field", "path", "id", "bytes", "sha256", "mediaType"}
        assert entry["field"] == "content[0].content.text"
        assert entry["mediaType"] == "text/plain; charset=utf-8"
        stored = sidecar_store.get(DAEMON_SESSION, entry["id"])
        assert stored is not None
        body = sidecar_store.read_bytes(stored)
        assert body is not None
        assert hashlib.sha256(body).hexdigest() == entry["sha256"] == stored.sha256
        assert len(body) == entry["bytes"] > BUDGET.sidecar_threshold_bytes
        assert body.decode("utf-8") == expected
        # The wire text is exactly the daemon projection's preview of the same bytes.
        wire = update["content"][0]["content"]["text"]
        assert wire == preview_text(body, BUDGET.sidecar_preview_bytes, entry["id"])
        resolved += 1
    assert resolved >= 3  # several iterations, each with ~200 KiB outputs
    assert_tool_meta(updates)

    # The session log used for session/load holds exactly what was sent: stubs, never the bodies.
    persisted = persisted_updates(data, session_id)
    assert max(len(b) for b in persisted) <= BUDGET.sidecar_threshold_bytes + ENVELOPE_BYTES
    assert as_client_sees(persisted, session_id) == updates
    assert sidecar_store.stats()["count"] >= 2  # alpha and beta (repeats of the same bytes dedupe)
    # the token came in the request and stayed in memory: nothing the agent wrote holds it
    for path in data.rglob("*"):
        if path.is_file():
            assert token.encode() not in path.read_bytes(), path.name


@pytest.mark.e2e
async def test_without_a_token_output_goes_inline(tmp_path: Path, workspace: Path,
                                                  sidecar_store: SidecarStore) -> None:
    _, updates, sizes = await run_turn(tmp_path / "data", workspace,
                                       **{SIDECAR_DIR_ENV: str(sidecar_store.root)})
    assert max(sizes) > 200 * KiB  # the same run, whole outputs in the frames
    calls = calls_by_id(updates)
    whole = 0
    for update in results(updates):
        assert META_SIDECAR not in (update.get("_meta") or {})
        expected = expected_output(calls[update["toolCallId"]], workspace)
        if expected is not None:
            assert update["content"][0]["content"]["text"] == expected
            whole += 1
    assert whole >= 3
    assert_tool_meta(updates)


@pytest.mark.e2e
async def test_over_quota_sends_flagged_truncated_previews(
        tmp_path: Path, workspace: Path, sidecar_store: SidecarStore) -> None:
    token = sidecar_store.mint_write_token(DAEMON_SESSION)
    limit = 100 * KiB  # one sidecar object: under the 200 KiB outputs
    _, updates, sizes = await run_turn(
        tmp_path / "data", workspace, token, HOPLINE_SIDECAR_MAX_OBJECT_BYTES=str(limit),
        **{SIDECAR_DIR_ENV: str(sidecar_store.root)})
    assert max(sizes) <= BUDGET.sidecar_threshold_bytes + ENVELOPE_BYTES
    calls = calls_by_id(updates)
    flagged = 0
    for update in results(updates):
        expected = expected_output(calls[update["toolCallId"]], workspace)
        if expected is None:
            continue
        data = expected.encode("utf-8")
        [entry] = update["_meta"][META_SIDECAR]
        assert entry == {"field": "content[0].content.text", "path": ["content", 0, "content", "text"],
                         "truncated": True, "reason": "over_object_quota", "bytes": len(data),
                         "mediaType": "text/plain; charset=utf-8",
                         "lostBytes": len(data) - BUDGET.sidecar_preview_bytes}
        wire = update["content"][0]["content"]["text"]
        assert wire == preview_text(data, BUDGET.sidecar_preview_bytes, None, "over_object_quota")
        assert "truncated (over_object_quota)" in wire
        flagged += 1
    assert flagged >= 3  # every large output still produced its update
    stats = sidecar_store.stats()
    assert stats["count"] == 0 and stats["fallbacks"]["overObjectQuota"] == flagged


# --- in process: the offload function against a real store ------------------------------------


@pytest.fixture
def writer(sidecar_store: SidecarStore) -> Iterator[SidecarWriter]:
    token = sidecar_store.mint_write_token(DAEMON_SESSION)
    opened = SidecarWriter(SidecarStore(sidecar_store.root, BUDGET), token)
    yield opened
    opened.close()


def result_update(text: str, raw_output: Any = None) -> dict[str, Any]:
    return tool_result_update_of(ToolCallFinished("call_1_1_0", "completed", text, text[:100], raw_output),
                                 "read_file")


def test_threshold_is_exact_in_utf8_bytes(writer: SidecarWriter, sidecar_store: SidecarStore) -> None:
    """The threshold applies to the update's compact JSON (S-4), counted in UTF-8 bytes."""
    threshold = BUDGET.sidecar_threshold_bytes

    def text_update(text: str) -> dict[str, Any]:
        return {"sessionUpdate": "tool_call_update", "toolCallId": "call_1_1_0", "status": "completed",
                "content": [{"type": "content", "content": {"type": "text", "text": text}}],
                "_meta": {META_TOOL: {"name": "read_file", "provenance": "builtin"}}}

    room = threshold - len(orjson.dumps(text_update("")))
    text = "é" * (room // 2) + "a" * (room % 2)  # "é" is 2 bytes in UTF-8
    at_limit = text_update(text)
    assert len(orjson.dumps(at_limit)) == threshold
    assert not needs_offload(at_limit, BUDGET)
    assert offload_update(at_limit, writer, BUDGET) is at_limit

    over = text_update(text + "a")
    assert len(orjson.dumps(over)) == threshold + 1
    assert needs_offload(over, BUDGET)
    stubbed = offload_update(over, writer, BUDGET)
    [entry] = stubbed["_meta"][META_SIDECAR]
    assert entry["bytes"] == len((text + "a").encode()) and entry["field"] == "content[0].content.text"
    assert stubbed["_meta"][META_TOOL] == {"name": "read_file", "provenance": "builtin"}
    assert over["content"][0]["content"]["text"] == text + "a"  # not mutated
    stored = sidecar_store.get(DAEMON_SESSION, entry["id"])
    assert stored is not None and sidecar_store.read_bytes(stored) == (text + "a").encode()


def test_string_and_structured_raw_output_are_stubbed_like_the_projection(writer: SidecarWriter) -> None:
    threshold = BUDGET.sidecar_threshold_bytes
    text = big_text("gamma", threshold + 10)
    stubbed = offload_update({**result_update("short"), "rawOutput": text}, writer, BUDGET)
    [entry] = stubbed["_meta"][META_SIDECAR]
    assert entry["field"] == "rawOutput" and entry["bytes"] == len(text.encode())
    assert stubbed["rawOutput"] == preview_text(text.encode(), BUDGET.sidecar_preview_bytes, entry["id"])
    assert stubbed["content"][0]["content"]["text"] == "short"

    structured = {"lines": [text[:1000]] * 80}
    encoded = orjson.dumps(structured)
    assert len(encoded) > threshold
    stubbed = offload_update(result_update("short", structured), writer, BUDGET)
    [entry] = stubbed["_meta"][META_SIDECAR]
    # the object stays an object: its one large field (the array) moved, its leading items kept
    lines = orjson.dumps(structured["lines"])
    assert entry["path"] == ["rawOutput", "lines"] and entry["mediaType"] == "application/json"
    assert entry["bytes"] == len(lines) and entry["items"] == 80
    assert set(stubbed["rawOutput"]) == {"lines"}
    assert stubbed["rawOutput"]["lines"] == structured["lines"][:entry["itemsShown"]]


def test_message_and_plan_updates_are_projected_too(writer: SidecarWriter,
                                                    sidecar_store: SidecarStore) -> None:
    """S-4 on the agent side: the same projection as the daemon's, for every kind."""
    text = big_text("msg", 3 * BUDGET.sidecar_threshold_bytes)
    chunk = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}
    stubbed = offload_update(chunk, writer, BUDGET)
    [entry] = stubbed["_meta"][META_SIDECAR]
    assert entry["field"] == "content.text" and entry["path"] == ["content", "text"]
    stored = sidecar_store.get(DAEMON_SESSION, entry["id"])
    assert stored is not None and sidecar_store.read_bytes(stored) == text.encode()
    plan = {"sessionUpdate": "plan", "entries": [{"content": f"step {i} " + "p" * 60, "priority": "medium",
                                                   "status": "pending"} for i in range(2000)]}
    stubbed = offload_update(plan, writer, BUDGET)
    [entry] = stubbed["_meta"][META_SIDECAR]
    assert entry["field"] == "entries" and entry["items"] == 2000
    assert stubbed["entries"] == plan["entries"][:entry["itemsShown"]]


def test_existing_meta_entries_are_kept_and_new_ones_appended(writer: SidecarWriter) -> None:
    earlier = {"field": "rawOutput", "id": "x" * 32, "bytes": 1, "sha256": "0" * 64,
               "mediaType": "text/plain"}
    update = result_update(big_text("delta", BUDGET.sidecar_threshold_bytes + 1))
    update["_meta"][META_SIDECAR] = [earlier]
    stubbed = offload_update(update, writer, BUDGET)
    entries = stubbed["_meta"][META_SIDECAR]
    assert entries[0] == earlier and entries[1]["field"] == "content[0].content.text" and len(entries) == 2
    assert update["_meta"][META_SIDECAR] == [earlier]  # the input is not mutated


def test_revoked_token_falls_back_to_a_flagged_preview(writer: SidecarWriter,
                                                       sidecar_store: SidecarStore) -> None:
    sidecar_store.revoke_write_tokens(DAEMON_SESSION)  # the daemon deleted the session meanwhile
    text = big_text("eps", BUDGET.sidecar_threshold_bytes + 1)
    stubbed = offload_update(result_update(text), writer, BUDGET)
    [entry] = stubbed["_meta"][META_SIDECAR]
    assert entry["truncated"] is True and entry["reason"] == "write_token_revoked" and "id" not in entry
    assert stubbed["content"][0]["content"]["text"] == preview_text(
        text.encode(), BUDGET.sidecar_preview_bytes, None, "write_token_revoked")


def test_a_failing_store_still_sends_the_update(sidecar_store: SidecarStore) -> None:
    token = sidecar_store.mint_write_token(DAEMON_SESSION)
    broken = SidecarWriter(SidecarStore(sidecar_store.root, BUDGET), token)
    broken.close()  # its database is gone: every write raises
    text = big_text("zeta", BUDGET.sidecar_threshold_bytes + 1)
    stubbed = offload_update(result_update(text), broken, BUDGET)
    [entry] = stubbed["_meta"][META_SIDECAR]
    assert entry == {"field": "content[0].content.text", "path": ["content", 0, "content", "text"],
                     "truncated": True, "reason": "disk_error", "bytes": len(text.encode()),
                     "mediaType": "text/plain; charset=utf-8",
                     "lostBytes": len(text.encode()) - BUDGET.sidecar_preview_bytes}
    assert "truncated (disk_error)" in stubbed["content"][0]["content"]["text"]


def test_store_from_env_and_writer_for(sidecar_store: SidecarStore, caplog: pytest.LogCaptureFixture) -> None:
    assert store_from_env(BUDGET, {}) is None
    with caplog.at_level(logging.ERROR, logger="hopline.agent.sidecars"):
        assert store_from_env(BUDGET, {SIDECAR_DIR_ENV: str(sidecar_store.root / "missing")}) is None
        store = store_from_env(BUDGET, {SIDECAR_DIR_ENV: str(sidecar_store.root)})
        assert store is not None
        assert writer_for(store, None) is None
        assert writer_for(None, "token") is None
        assert writer_for(store, "not-a-minted-token") is None
    assert len(caplog.records) == 2 and all("inline" in r.getMessage() for r in caplog.records)
    assert "not-a-minted-token" not in caplog.text and str(sidecar_store.root) not in caplog.text
    good = writer_for(store, sidecar_store.mint_write_token(DAEMON_SESSION))
    assert good is not None
    store.close()
