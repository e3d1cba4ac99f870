"""A third-party ACP agent for the gate tests, on the `agent-client-protocol` SDK only (no hopline
harness): it plays a gate agent badly, as the command line says.

  ``--hang P,...``     a session of these profiles (``_meta["hopline.profile"]``) says one line and
                      then never answers its prompt (until cancelled)
  ``--garbage P,...``  their prompts are answered with text that holds no verdict
  ``--invalid P,...``  their prompts are answered with JSON that breaks the verdict schema
  the other profiles  answer a pass verdict

Each prompt it gets is counted in ``$GATE_AGENT_LOG`` (one line per prompt: profile and first line).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import uuid
from typing import Any

from acp import (
    PROTOCOL_VERSION,
    Agent,
    InitializeResponse,
    NewSessionResponse,
    PromptResponse,
    run_agent,
    update_agent_message_text,
)
from acp.interfaces import Client
from acp.schema import AgentCapabilities

PASS = json.dumps({"verdict": "pass", "summary": "looks fine", "findings": []})
INVALID = json.dumps({"verdict": "pass", "findings": "none at all"})


class GateAgent(Agent):
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.conn: Client | None = None
        self.profiles: dict[str, str] = {}
        self.cancelled: dict[str, asyncio.Event] = {}

    def on_connect(self, conn: Client) -> None:
        self.conn = conn

    async def initialize(self, protocol_version: int, client_capabilities: Any = None,
                         client_info: Any = None, **kwargs: Any) -> InitializeResponse:
        return InitializeResponse(protocol_version=PROTOCOL_VERSION, agent_capabilities=AgentCapabilities())

    async def new_session(self, cwd: str, additional_directories: Any = None, mcp_servers: Any = None,
                          **kwargs: Any) -> NewSessionResponse:
        session_id = f"gate-{uuid.uuid4().hex}"
        self.profiles[session_id] = str(kwargs.get("hopline.profile") or "")
        return NewSessionResponse(session_id=session_id)

    async def prompt(self, session_id: str, prompt: list[Any], **kwargs: Any) -> PromptResponse:
        assert self.conn is not None
        text = "".join(getattr(block, "text", "") for block in prompt)
        profile = self.profiles.get(session_id, "")
        log = os.environ.get("GATE_AGENT_LOG")
        if log:
            with open(log, "a") as fh:
                fh.write(f"{profile}\t{text.splitlines()[0] if text else ''}\n")
        if profile in self.args.hang.split(","):
            await self.conn.session_update(session_id, update_agent_message_text("looking…"))
            event = self.cancelled.setdefault(session_id, asyncio.Event())
            await event.wait()  # a hung gate: nothing more until cancelled
            return PromptResponse(stop_reason="cancelled")
        if profile in self.args.garbage.split(","):
            answer = "I had a look and I think it is probably fine, more or less."
        elif profile in self.args.invalid.split(","):
            answer = f"```json\n{INVALID}\n```"
        else:
            answer = f"All good.\n```json\n{PASS}\n```"
        await self.conn.session_update(session_id, update_agent_message_text(answer))
        return PromptResponse(stop_reason="end_turn")

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        self.cancelled.setdefault(session_id, asyncio.Event()).set()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hang", default="")
    parser.add_argument("--garbage", default="")
    parser.add_argument("--invalid", default="")
    asyncio.run(run_agent(GateAgent(parser.parse_args())))


if __name__ == "__main__":
    main()
