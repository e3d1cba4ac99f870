"""`hopline agent` on raw pipes: only JSON-RPC lines on stdout, the exact max frame, budget refusal."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from agent.acp_peer import AGENT_CMD, agent_env

TIMEOUT = 30.0


class RawAgent:
    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.lines: list[bytes] = []

    async def send_line(self, data: bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(data + b"\n")
        await self.process.stdin.drain()

    async def send(self, message: dict[str, Any]) -> None:
        await self.send_line(orjson.dumps(message))

    async def read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), TIMEOUT)
        assert line.endswith(b"\n"), "agent closed stdout"
        self.lines.append(line)
        message = orjson.loads(line)
        assert isinstance(message, dict) and message.get("jsonrpc") == "2.0"
        return message

    async def response(self, request_id: int) -> dict[str, Any]:
        while True:
            message = await self.read()
            if message.get("id") == request_id and "method" not in message:
                return message


@contextlib.asynccontextmanager
async def raw_agent(data_dir: Path, **env: str) -> AsyncIterator[RawAgent]:
    process = await asyncio.create_subprocess_exec(
        *AGENT_CMD, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=agent_env(data_dir, **env), limit=128 * 1024 * 1024)
    agent = RawAgent(process)
    try:
        yield agent
    finally:
        if process.stdin is not None and not process.stdin.is_closing():
            process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), 10)
        except TimeoutError:
            process.kill()
            await process.wait()


def validate_stdout(lines: list[bytes]) -> None:
    """Every stdout line is one JSON-RPC 2.0 object: a request, notification or response."""
    for line in lines:
        message = orjson.loads(line)
        assert message["jsonrpc"] == "2.0"
        assert ("method" in message) or ("id" in message and ("result" in message or "error" in message))


@pytest.mark.e2e
async def test_exact_max_frame_passes_one_byte_over_is_dropped_and_channel_goes_on(tmp_path: Path) -> None:
    limit = 4096
    env = {"HOPLINE_AGENT_MAX_FRAME_BYTES": str(limit), "HOPLINE_PIPE_MAX_FRAME_BYTES": str(limit)}
    workspace = tmp_path / "ws"
    workspace.mkdir()
    async with raw_agent(tmp_path / "data", **env) as agent:
        await agent.send({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                          "params": {"protocolVersion": 1}})
        assert (await agent.response(0))["result"]["agentCapabilities"]["loadSession"] is True

        def padded(request_id: int, size: int) -> bytes:
            base = orjson.dumps({"jsonrpc": "2.0", "id": request_id, "method": "session/new",
                                 "params": {"cwd": str(workspace), "mcpServers": []}})
            frame = base[:-1] + b" " * (size - len(base)) + b"}"
            assert len(frame) == size
            return frame

        await agent.send_line(padded(1, limit))  # at the limit: accepted
        assert "sessionId" in (await agent.response(1))["result"]
        await agent.send_line(padded(2, limit + 1))  # one byte over: dropped, no answer
        await agent.send({"jsonrpc": "2.0", "id": 3, "method": "session/new",
                          "params": {"cwd": str(workspace), "mcpServers": []}})
        answer = await agent.response(3)
        assert "sessionId" in answer["result"]
        assert all(orjson.loads(line).get("id") != 2 for line in agent.lines)
        assert agent.process.stdin is not None
        agent.process.stdin.close()
        assert agent.process.stdout is not None
        rest = await asyncio.wait_for(agent.process.stdout.read(), TIMEOUT)
        agent.lines.extend(line + b"\n" for line in rest.splitlines())
        assert agent.process.stderr is not None
        stderr = await asyncio.wait_for(agent.process.stderr.read(), TIMEOUT)
    validate_stdout(agent.lines)
    records = [orjson.loads(line) for line in stderr.splitlines()]
    dropped = [r for r in records if r.get("event") == "frame dropped"]
    assert dropped == [dropped[0]] and dropped[0]["bytes"] == limit + 1 and dropped[0]["limit"] == limit
    assert str(workspace).encode() not in stderr  # no paths in logs


@pytest.mark.e2e
async def test_incoherent_budget_refuses_to_start_with_findings_on_stderr(tmp_path: Path) -> None:
    async with raw_agent(tmp_path / "data", HOPLINE_AGENT_MAX_FRAME_BYTES="1mb") as agent:
        assert agent.process.stdout is not None and agent.process.stderr is not None
        out = await asyncio.wait_for(agent.process.stdout.read(), TIMEOUT)
        err = await asyncio.wait_for(agent.process.stderr.read(), TIMEOUT)
        code = await asyncio.wait_for(agent.process.wait(), TIMEOUT)
    assert code == 2
    assert out == b""
    assert b"pipe_ends_agree" in err and b"HOPLINE_AGENT_MAX_FRAME_BYTES" in err


@pytest.mark.e2e
@pytest.mark.parametrize("method", ["_hopline/nope", "session/nope"])
async def test_unknown_methods_answer_method_not_found(tmp_path: Path, method: str) -> None:
    async with raw_agent(tmp_path / "data") as agent:
        await agent.send({"jsonrpc": "2.0", "id": 7, "method": method, "params": {}})
        answer = await agent.response(7)
    assert answer["error"]["code"] == -32601


@pytest.mark.e2e
async def test_stdout_carries_only_json_rpc_over_a_whole_run(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("ERROR one\nTODO two\n")
    async with raw_agent(tmp_path / "data") as agent:
        await agent.send({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                          "params": {"protocolVersion": 1}})
        await agent.response(0)
        await agent.send({"jsonrpc": "2.0", "id": 1, "method": "session/new", "params": {
            "cwd": str(workspace), "mcpServers": [],
            "_meta": {"hopline.scripted": {"iterations": 2, "toolsPerIteration": 3}}}})
        session_id = (await agent.response(1))["result"]["sessionId"]
        await agent.send({"jsonrpc": "2.0", "id": 2, "method": "session/prompt", "params": {
            "sessionId": session_id, "prompt": [{"type": "text", "text": "look at notes"}]}})
        methods: list[str] = []
        while True:  # answer the agent's permission requests ourselves (allow)
            message = await agent.read()
            if message.get("method") == "session/request_permission":
                await agent.send({"jsonrpc": "2.0", "id": message["id"], "result": {
                    "outcome": {"outcome": "selected", "optionId": "allow_once"}}})
            if "method" in message:
                methods.append(message["method"])
            elif message.get("id") == 2:
                assert message["result"]["stopReason"] == "end_turn"
                break
        assert "session/request_permission" in methods and "_hopline/progress" in methods
        assert methods.count("session/update") >= 4
        assert agent.process.stdin is not None and agent.process.stderr is not None
        agent.process.stdin.close()
        stderr = await asyncio.wait_for(agent.process.stderr.read(), TIMEOUT)
    validate_stdout(agent.lines)
    # logs are JSON lines without session ids, paths, prompts or tool output
    assert all(orjson.loads(line) for line in stderr.splitlines())
    secrets = (session_id.encode(), str(workspace).encode(), b"ERROR one", b"notes.txt", b"look at notes")
    for secret in secrets:
        assert secret not in stderr


class _Sink:
    def __init__(self) -> None:
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data

    async def drain(self) -> None:
        return None

    def close(self) -> None:
        return None


def _frame_of(request_id: int, size: int) -> bytes:
    base = orjson.dumps({"jsonrpc": "2.0", "id": request_id, "method": "m", "params": {"p": ""}})
    frame = base[:-3] + b"x" * (size - len(base)) + b'"}}'
    assert len(frame) == size
    return frame


@pytest.mark.parametrize("ending", [b"\n", b"\r\n"])
async def test_both_pipe_ends_agree_at_the_max_frame(ending: bytes) -> None:
    """B-4: the agent's reader and the daemon's decoder accept the same frames, ``\\r\\n`` included."""
    from hopline.harness.acp.pipe import PipeTransport
    from hopline.wire.ndjson import Frame, FrameTooLarge, NdjsonDecoder

    limit = 4096
    stream = _frame_of(1, limit) + ending + _frame_of(2, limit + 1) + ending + _frame_of(3, 64) + ending
    reader = asyncio.StreamReader()
    reader.feed_data(stream)
    reader.feed_eof()
    agent_end = PipeTransport(reader, _Sink(), limit)
    received = []
    while (message := await agent_end.receive()) is not None:
        received.append(message["id"])
    daemon_end = NdjsonDecoder(limit).feed(stream)
    assert received == [1, 3] and agent_end.frames_dropped == 1
    assert [item.message["id"] for item in daemon_end if isinstance(item, Frame)] == [1, 3]
    assert [item.size for item in daemon_end if isinstance(item, FrameTooLarge)] == [limit + 1]


async def test_the_agent_refuses_to_write_a_frame_over_the_max() -> None:
    from hopline.budget import LimitExceeded
    from hopline.harness.acp.pipe import PipeTransport

    limit = 4096
    sink = _Sink()
    agent_end = PipeTransport(asyncio.StreamReader(), sink, limit)
    at_limit = orjson.loads(_frame_of(1, limit))
    await agent_end.send(at_limit)
    assert sink.data == _frame_of(1, limit) + b"\n"
    with pytest.raises(LimitExceeded) as refused:
        await agent_end.send(orjson.loads(_frame_of(2, limit + 1)))
    assert (refused.value.limit, refused.value.observed) == (limit, limit + 1)
    assert refused.value.setting == "HOPLINE_AGENT_MAX_FRAME_BYTES" and sink.data.count(b"\n") == 1
