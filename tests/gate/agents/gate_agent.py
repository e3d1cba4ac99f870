"""A third-party ACP agent for the gate tests, on the `agent-client-protocol` SDK only (no hopline
harness): it plays a gate agent badly, as the command line says.

  ``--hang P,...``     a session of these profiles (``_meta["hopline.profile"]``) says one line and
                      then never answers its prompt (until cancelled)
  ``--garbage P,...``  their prompts are answered with text that holds no verdict
  ``--invalid P,...``  their prompts are answered with JSON that breaks the verdict schema
  ``--big P,...``     their pass verdict comes in one ``agent_message_chunk`` of ``--big-bytes``
                      (a summary that long), as a third-party agent sends a whole answer
  the other profiles  answer a pass verdict

Each prompt it gets is counted in ``$GATE_AGENT_LOG`` (one line per prompt: profile and first line).
With ``$GATE_AGENT_RUNNING`` (a file) each answering prompt appends ``+`` when it starts and ``-``
when it ends (O_APPEND: the lines of all the children are in the order they happened), waits until
``--hold-until`` prompts are running at once (at most 30 s), then ``--slow`` seconds more.
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
        running = os.environ.get("GATE_AGENT_RUNNING")
        if running:
            await self._hold(running)
        if profile in self.args.garbage.split(","):
            answer = "I had a look and I think it is probably fine, more or less."
        elif profile in self.args.invalid.split(","):
            answer = f"```json\n{INVALID}\n```"
        elif profile in self.args.big.split(","):
            verdict = json.dumps({"verdict": "pass", "summary": "s" * self.args.big_bytes, "findings": []})
            answer = f"All good.\n```json\n{verdict}\n```"
        else:
            answer = f"All good.\n```json\n{PASS}\n```"
        await self.conn.session_update(session_id, update_agent_message_text(answer))
        if running:
            _append(running, "-")
        return PromptResponse(stop_reason="end_turn")

    async def _hold(self, running: str) -> None:
        _append(running, "+")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while _running(running) < self.args.hold_until and loop.time() < deadline:
            await asyncio.sleep(0.02)
        await asyncio.sleep(self.args.slow)

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        self.cancelled.setdefault(session_id, asyncio.Event()).set()


def _append(path: str, mark: str) -> None:
    with open(path, "a") as fh:
        fh.write(mark + "\n")


def _running(path: str) -> int:
    with open(path) as fh:
        return sum(1 if line.strip() == "+" else -1 for line in fh if line.strip())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hang", default="")
    parser.add_argument("--garbage", default="")
    parser.add_argument("--invalid", default="")
    parser.add_argument("--big", default="")
    parser.add_argument("--big-bytes", type=int, default=100_000)
    parser.add_argument("--hold-until", type=int, default=1)
    parser.add_argument("--slow", type=float, default=0.0)
    asyncio.run(run_agent(GateAgent(parser.parse_args())))


if __name__ == "__main__":
    main()
