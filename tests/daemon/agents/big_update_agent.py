"""A third-party ACP agent for the daemon's tests, written with the `agent-client-protocol` SDK only
(no hopline harness): it emits what the prompt text asks for.

Prompt commands (one per prompt):
  ``big N [FILL]``     a tool_call, then a tool_call_update whose content text is N bytes (of FILL)
  ``chunks N SIZE``    N agent_message_chunk updates of SIZE bytes each (numbered)
  ``sleep S``          one chunk, then sleeps S seconds (to be killed or cancelled mid-turn)
  ``permission``       asks session/request_permission and reports the outcome
  ``env [NAME...]``    reports which of these variables it can see (default: the daemon's secrets and
                       the gateway URL)
  ``stderr N SIZE``    writes N stderr lines of SIZE bytes
  ``fs``               calls fs/read_text_file on the client and reports the error it gets
  anything else        echoed back as one chunk

session/new sends one update before answering. ``_meta["hopline.scripted"] = {"replayUpdates": N}``
makes a later session/load (bulk mode) answer N updates in one response (default 3).
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from typing import Any

from acp import (
    PROTOCOL_VERSION,
    Agent,
    InitializeResponse,
    LoadSessionResponse,
    NewSessionResponse,
    PromptResponse,
    run_agent,
    start_tool_call,
    text_block,
    tool_content,
    update_agent_message_text,
    update_tool_call,
)
from acp.interfaces import Client
from acp.schema import AgentCapabilities, PermissionOption, ToolCallUpdate

from hopline.budget import Budget


class BigUpdateAgent(Agent):
    def __init__(self) -> None:
        self.conn: Client | None = None
        self.cancelled: dict[str, asyncio.Event] = {}

    def on_connect(self, conn: Client) -> None:
        self.conn = conn

    async def _say(self, session_id: str, text: str) -> None:
        assert self.conn is not None
        await self.conn.session_update(session_id, update_agent_message_text(text))

    async def initialize(self, protocol_version: int, client_capabilities: Any = None,
                         client_info: Any = None, **kwargs: Any) -> InitializeResponse:
        return InitializeResponse(protocol_version=PROTOCOL_VERSION,
                                  agent_capabilities=AgentCapabilities(load_session=True))

    async def new_session(self, cwd: str, additional_directories: Any = None, mcp_servers: Any = None,
                          **kwargs: Any) -> NewSessionResponse:
        scripted = kwargs.get("hopline.scripted") or {}
        replay = int(scripted.get("replayUpdates", 3))
        session_id = f"s-{uuid.uuid4().hex}-r{replay}"
        await self._say(session_id, "session ready")  # before the answer: the daemon must keep it
        return NewSessionResponse(session_id=session_id)

    async def load_session(self, cwd: str, session_id: str, mcp_servers: Any = None,
                           additional_directories: Any = None, **kwargs: Any) -> LoadSessionResponse:
        count = int(session_id.rsplit("-r", 1)[1])
        updates = [{"sessionUpdate": "agent_message_chunk",
                    "content": {"type": "text", "text": f"replayed {i}"}} for i in range(count)]
        if kwargs.get("hopline.session.loadReplayMode") == "bulk":
            replay = {"v": 1, "updates": updates}
            return LoadSessionResponse(field_meta={"hopline.session.loadReplay": replay})
        for i in range(count):
            await self._say(session_id, f"replayed {i}")
        return LoadSessionResponse()

    async def prompt(self, session_id: str, prompt: list[Any], **kwargs: Any) -> PromptResponse:
        assert self.conn is not None
        text = "".join(getattr(block, "text", "") for block in prompt).strip()
        words = text.split()
        command = words[0] if words else ""
        if command == "big":
            size = int(words[1])
            fill = words[2] if len(words) > 2 else "x"
            body = (fill * (size // len(fill) + 1))[:size]
            await self.conn.session_update(session_id, start_tool_call(
                "call-big", "emit a large output", kind="execute", status="in_progress"))
            await self.conn.session_update(session_id, update_tool_call(
                "call-big", status="completed", content=[tool_content(text_block(body))]))
            await self._say(session_id, "big done")
        elif command == "chunks":
            count, size = int(words[1]), int(words[2])
            for i in range(count):
                head = f"chunk {i} "
                await self._say(session_id, head + "y" * max(0, size - len(head)))
        elif command == "sleep":
            cancelled = self.cancelled[session_id] = asyncio.Event()
            await self._say(session_id, "sleeping")
            try:
                await asyncio.wait_for(cancelled.wait(), float(words[1]))
                return PromptResponse(stop_reason="cancelled")
            except TimeoutError:
                await self._say(session_id, "woke")
        elif command == "permission":
            answer = await self.conn.request_permission(
                session_id,
                ToolCallUpdate(tool_call_id="call-perm", title="run something", kind="execute",
                               status="pending"),
                [PermissionOption(option_id="allow", name="Allow", kind="allow_once"),
                 PermissionOption(option_id="deny", name="Deny", kind="reject_once")],
            )
            outcome = answer.outcome
            chosen = getattr(outcome, "option_id", None) or getattr(outcome, "outcome", "?")
            await self._say(session_id, f"permission: {chosen}")
        elif command == "env":
            names = tuple(words[1:]) or ("HOPLINE_SERVER_TOKEN", "HOPLINE_INTERNAL_TOKEN",
                                         "HOPLINE_GATEWAY_URL")
            await self._say(session_id, "env: " + " ".join(
                f"{name}={'present' if os.environ.get(name) else 'absent'}" for name in names))
        elif command == "stderr":
            count, size = int(words[1]), int(words[2])
            for i in range(count):
                sys.stderr.write(f"stderr-canary-{i} " + "e" * size + "\n")
            sys.stderr.flush()
            await self._say(session_id, "stderr written")
        elif command == "fs":
            try:
                await self.conn.read_text_file(session_id=session_id, path="/etc/hostname")
                await self._say(session_id, "fs: ok")
            except Exception as exc:  # the daemon answers method-not-found
                await self._say(session_id, f"fs: refused {getattr(exc, 'code', '?')}")
        else:
            await self._say(session_id, f"echo: {text}")
        return PromptResponse(stop_reason="end_turn")

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        event = self.cancelled.get(session_id)
        if event is not None:
            event.set()


def main() -> None:
    limit = Budget.from_env().agent_max_frame_bytes
    asyncio.run(run_agent(BigUpdateAgent(), stdio_buffer_limit_bytes=limit))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
