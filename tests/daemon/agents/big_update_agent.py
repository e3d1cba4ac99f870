"""A third-party ACP agent for the daemon's tests, written with the `agent-client-protocol` SDK only
(no hopline harness): it emits what the prompt text asks for.

Prompt commands (one per prompt):
  ``big N [FILL]``     a tool_call, then a tool_call_update whose content text is N bytes (of FILL)
  ``chunks N SIZE``    N agent_message_chunk updates of SIZE bytes each (numbered)
  ``paced N SIZE MS``  the same, one chunk every MS milliseconds (a stream that lasts)
  ``sleep S``          one chunk, then sleeps S seconds (to be killed or cancelled mid-turn)
  ``steps N MS``       N steps, one every MS milliseconds: each appends ``<pid> step <i> <unix time>`` to
                       ``BIG_AGENT_ACTION_LOG`` (an act on the workspace), then says ``step <i>``
  ``permission``       asks session/request_permission and reports the outcome
  ``env [NAME...]``    reports which of these variables it can see (default: the daemon's secrets and
                       the gateway URL)
  ``stderr N SIZE``    writes N stderr lines of SIZE bytes
  ``fs``               calls fs/read_text_file on the client and reports the error it gets
  ``kinds``            the large updates of every kind (:func:`kind_updates`), one after the other
  ``message N``        one agent_message_chunk of N bytes of distinct text
  ``foreign``          a session/update for another session id and two malformed ones, then a chunk
  ``raw KIND N``       writes one frame of N bytes the SDK never would, straight to its stdout:
                       ``json`` (not JSON), ``utf8`` (not UTF-8), then says "raw done"; ``eof`` (a
                       frame cut by the end of the stream: the agent exits inside it)
  ``creds``            says where this session's sidecar write token came (env or request _meta),
                       its sha256, and leaves the token itself in ``$BIG_AGENT_CANARY_DIR`` (a canary)
  ``fail N``           answers the prompt with a JSON-RPC error whose data holds N bytes of detail
  ``meta``             answers end_turn with a response ``_meta`` of its own (``big.branchPoint``)
  ``envdump``          writes its whole environment as JSON to ``$BIG_AGENT_CANARY_DIR/env-<pid>.json``
  anything else        echoed back as one chunk

session/new sends one update before answering. ``_meta["hopline.scripted"] = {"replayUpdates": N}``
makes a later session/load (bulk mode) answer N updates in one response (default 3);
``"replayKinds": true`` adds the :func:`kind_updates` to that replay, ``"quiet": true`` skips the
update before the answer, ``"early": N`` sends N more before it. ``BIG_AGENT_START_DELAY``
(seconds) delays the start (a slow agent); ``BIG_AGENT_NO_LOAD=1`` leaves out the loadSession
capability (an agent that cannot load); ``BIG_AGENT_PROMPT_CAPS=image,audio,embeddedContext`` the
promptCapabilities it advertises (none by default); ``BIG_AGENT_TAKES_CREDENTIALS=1`` makes it claim
hopline's credentials in its initialize ``_meta`` (as hopline's own agent does); ``BIG_AGENT_ACTION_LOG``
names a file each prompt run is appended to, with the agent's process id (and each session/load, as
``<pid> load <unix time>``); ``BIG_AGENT_PROMPT_LOG``
names a file each prompt's text is appended to when it arrives.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
import time
import uuid
from typing import Any

from acp import (
    PROTOCOL_VERSION,
    Agent,
    InitializeResponse,
    LoadSessionResponse,
    NewSessionResponse,
    PromptResponse,
    RequestError,
    run_agent,
    start_tool_call,
    text_block,
    tool_content,
    update_agent_message_text,
    update_tool_call,
)
from acp.interfaces import Client
from acp.schema import (
    AgentCapabilities,
    AgentThoughtChunk,
    AvailableCommand,
    AvailableCommandInput,
    AvailableCommandsUpdate,
    PermissionOption,
    PromptCapabilities,
    SessionNotification,
    ToolCallUpdate,
    UnstructuredCommandInput,
)
from acp.utils import serialize_params

from hopline.budget import Budget

MiB = 1024 * 1024


def distinct_text(tag: str, size: int) -> str:
    """``size`` bytes of text whose lines never repeat (a real agent's output does not)."""
    lines: list[str] = []
    used = index = 0
    while used < size:
        line = f"{tag} {index:08d} {hashlib.sha256(f'{tag}/{index}'.encode()).hexdigest()}\n"
        lines.append(line)
        used += len(line)
        index += 1
    return "".join(lines)[:size]


def kind_updates() -> list[Any]:
    """A 20 MiB agent_message_chunk, a 600 KB available_commands_update of 5,000 commands, a 1 MiB
    agent_thought_chunk and a 5 MiB tool_call_update (after its tool_call)."""
    commands = [AvailableCommand(name=f"skill-{i:04d}", description=distinct_text(f"d{i}", 50),
                                 input=AvailableCommandInput(UnstructuredCommandInput(hint=f"args of {i}")))
                for i in range(5000)]
    return [
        update_agent_message_text(distinct_text("message", 20 * MiB)),
        AvailableCommandsUpdate(session_update="available_commands_update", available_commands=commands),
        AgentThoughtChunk(session_update="agent_thought_chunk",
                          content=text_block(distinct_text("thought", MiB))),
        start_tool_call("call-kinds", "emit a 5 MiB output", kind="execute", status="in_progress"),
        update_tool_call("call-kinds", status="completed",
                         content=[tool_content(text_block(distinct_text("tool", 5 * MiB)))]),
    ]


def as_sent(session_id: str, update: Any) -> dict[str, Any]:
    """The update's JSON exactly as the SDK puts it on the pipe."""
    notification = SessionNotification(session_id=session_id, update=update)
    sent: dict[str, Any] = serialize_params(notification)["update"]
    return sent


class BigUpdateAgent(Agent):
    def __init__(self) -> None:
        self.conn: Client | None = None
        self.cancelled: dict[str, asyncio.Event] = {}
        self.tokens: dict[str, str | None] = {}  # session -> sidecar write token from session/new

    def on_connect(self, conn: Client) -> None:
        self.conn = conn

    async def _say(self, session_id: str, text: str) -> None:
        assert self.conn is not None
        await self.conn.session_update(session_id, update_agent_message_text(text))

    async def initialize(self, protocol_version: int, client_capabilities: Any = None,
                         client_info: Any = None, **kwargs: Any) -> InitializeResponse:
        caps = set(filter(None, os.environ.get("BIG_AGENT_PROMPT_CAPS", "").split(",")))
        claims = os.environ.get("BIG_AGENT_TAKES_CREDENTIALS") == "1"
        return InitializeResponse(protocol_version=PROTOCOL_VERSION,
                                  agent_capabilities=AgentCapabilities(
                                      load_session=os.environ.get("BIG_AGENT_NO_LOAD") != "1",
                                      prompt_capabilities=PromptCapabilities(
                                          image="image" in caps, audio="audio" in caps,
                                          embedded_context="embeddedContext" in caps)),
                                  field_meta={"hopline.takesCredentials": True} if claims else None)

    async def new_session(self, cwd: str, additional_directories: Any = None, mcp_servers: Any = None,
                          **kwargs: Any) -> NewSessionResponse:
        scripted = kwargs.get("hopline.scripted") or {}
        replay = int(scripted.get("replayUpdates", 3))
        session_id = f"s-{uuid.uuid4().hex}-{'k' if scripted.get('replayKinds') else ''}r{replay}"
        credentials = kwargs.get("hopline.credentials") or {}
        self.tokens[session_id] = credentials.get("sidecarWriteToken")
        for i in range(int(scripted.get("early", 0))):
            await self._say(session_id, f"early {i}")
        if not scripted.get("quiet"):
            await self._say(session_id, "session ready")  # before the answer: the daemon must keep it
        return NewSessionResponse(session_id=session_id)

    async def load_session(self, cwd: str, session_id: str, mcp_servers: Any = None,
                           additional_directories: Any = None, **kwargs: Any) -> LoadSessionResponse:
        action_log = os.environ.get("BIG_AGENT_ACTION_LOG")
        if action_log:
            with open(action_log, "a") as handle:
                handle.write(f"{os.getpid()} load {time.time():.6f}\n")
        tail = session_id.rsplit("-", 1)[1]  # "r3", or "kr3" with the kind updates
        count = int(tail.removeprefix("k")[1:])
        updates = [{"sessionUpdate": "agent_message_chunk",
                    "content": {"type": "text", "text": f"replayed {i}"}} for i in range(count)]
        if tail.startswith("k"):
            updates += [as_sent(session_id, u) for u in kind_updates()]
        if kwargs.get("hopline.session.loadReplayMode") == "bulk":
            replay = {"v": 1, "updates": updates}
            return LoadSessionResponse(field_meta={"hopline.session.loadReplay": replay})
        for i in range(count):
            await self._say(session_id, f"replayed {i}")
        return LoadSessionResponse()

    async def prompt(self, session_id: str, prompt: list[Any], **kwargs: Any) -> PromptResponse:
        assert self.conn is not None
        text = "".join(getattr(block, "text", "") for block in prompt).strip()
        action_log = os.environ.get("BIG_AGENT_ACTION_LOG")
        if action_log:  # every prompt run, with this process's id: a double execution shows
            with open(action_log, "a") as handle:
                handle.write(f"{os.getpid()} {text}\n")
        prompt_log = os.environ.get("BIG_AGENT_PROMPT_LOG")
        if prompt_log:  # what this agent was sent, for tests that assert a prompt never reached it
            with open(prompt_log, "a") as handle:
                handle.write(text + "\n")
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
        elif command == "fail":
            detail = ("Context is too large to send safely. Estimated prompt tokens: 369621; "
                      "hard limit: 177000")
            size = int(words[1])
            raise RequestError(-32603, "Internal error",
                               {"details": (detail + " " + "d" * size)[:max(size, len(detail))], "code": 7})
        elif command == "meta":
            await self._say(session_id, "meta done")
            return PromptResponse(stop_reason="end_turn",
                                  field_meta={"big.branchPoint": {"turn": 3, "id": "bp-42"}})
        elif command == "envdump":
            canary_dir = os.environ["BIG_AGENT_CANARY_DIR"]
            with open(os.path.join(canary_dir, f"env-{os.getpid()}.json"), "w") as handle:
                json.dump(dict(os.environ), handle)
            await self._say(session_id, "envdump done")
        elif command == "kinds":
            for update in kind_updates():
                await self.conn.session_update(session_id, update)
            await self._say(session_id, "kinds done")
        elif command == "message":
            await self._say(session_id, distinct_text("message", int(words[1])))
        elif command == "foreign":
            raw = self.conn._conn  # type: ignore[attr-defined]  # the SDK connection, for raw frames
            canary = as_sent("x", update_agent_message_text("FOREIGN-CANARY"))
            await raw.send_notification("session/update", {"sessionId": "someone-else", "update": canary})
            await raw.send_notification("session/update", {"sessionId": session_id})
            await raw.send_notification("session/update", {"sessionId": session_id, "update": "odd"})
            await self._say(session_id, "foreign done")
        elif command == "raw":
            kind, size = words[1], int(words[2])
            # the SDK's own stdout writer: what it sent before is written, nothing interleaves
            writer = self.conn._conn._transport._sender._writer  # type: ignore[attr-defined]
            start = {"json": b"{", "utf8": b'"\xff', "eof": b'{"jsonrpc": "2.0", '}[kind]
            frame = (start + b"n" * size)[:size - 1] + (b'"' if kind == "utf8" else b"n")
            writer.write(frame if kind == "eof" else frame + b"\n")
            await writer.drain()
            if kind == "eof":
                os._exit(0)
            await self._say(session_id, "raw done")
        elif command == "creds":
            token = self.tokens.get(session_id)
            canary_dir = os.environ.get("BIG_AGENT_CANARY_DIR")
            if token and canary_dir:
                with open(os.path.join(canary_dir, f"{os.getpid()}.token"), "w") as handle:
                    handle.write(token)
            in_env = "present" if os.environ.get("HOPLINE_SIDECAR_WRITE_TOKEN") else "absent"
            in_meta = "present" if token else "absent"
            digest = hashlib.sha256(token.encode()).hexdigest() if token else "-"
            await self._say(session_id, f"creds: env={in_env} meta={in_meta} sha256={digest}")
        elif command == "chunks":
            count, size = int(words[1]), int(words[2])
            for i in range(count):
                head = f"chunk {i} "
                await self._say(session_id, head + "y" * max(0, size - len(head)))
        elif command == "paced":  # chunks N SIZE, one every MS milliseconds
            count, size, pause = int(words[1]), int(words[2]), float(words[3]) / 1000
            for i in range(count):
                head = f"chunk {i} "
                await self._say(session_id, head + "y" * max(0, size - len(head)))
                await asyncio.sleep(pause)
        elif command == "steps":  # steps N MS: acts that leave a trace, by process id and time
            count, pause = int(words[1]), float(words[2]) / 1000
            for i in range(count):
                with open(os.environ["BIG_AGENT_ACTION_LOG"], "a") as handle:
                    handle.write(f"{os.getpid()} step {i} {time.time():.6f}\n")
                await self._say(session_id, f"step {i}")
                await asyncio.sleep(pause)
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
    time.sleep(float(os.environ.get("BIG_AGENT_START_DELAY", "0")))  # a slow-starting agent
    limit = Budget.from_env().agent_max_frame_bytes
    asyncio.run(run_agent(BigUpdateAgent(), stdio_buffer_limit_bytes=limit))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
