"""An ACP *client* for tests: spawns `hopline agent` as a real child process and talks to it with
the SDK's ClientSideConnection, recording everything the agent sends."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from acp import PROTOCOL_VERSION
from acp.client.connection import ClientSideConnection
from acp.schema import (
    AllowedOutcome,
    ClientCapabilities,
    DeniedOutcome,
    RequestPermissionResponse,
)
from acp.transports import spawn_stdio_transport

from hopline.budget import Budget

AGENT_CMD = (sys.executable, "-m", "hopline", "agent")
SPAWN_TIMEOUT = 30.0


class RecordingClient:
    """Collects session updates (as wire dicts), ext notifications and permission requests."""

    def __init__(self, permission: Callable[[dict[str, Any]], str] | None = None) -> None:
        self.updates: list[dict[str, Any]] = []
        self.ext: list[tuple[str, dict[str, Any]]] = []
        self.permission_requests: list[dict[str, Any]] = []
        self._permission = permission or (lambda _req: "allow_once")
        self.on_update: Callable[[dict[str, Any]], None] | None = None

    async def request_permission(self, session_id: str, tool_call: Any, options: Any,
                                 **kwargs: Any) -> RequestPermissionResponse:
        request = {"toolCall": tool_call.model_dump(mode="json", by_alias=True, exclude_none=True),
                   "options": [o.option_id for o in options]}
        self.permission_requests.append(request)
        choice = self._permission(request)
        if choice == "cancelled":
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=choice))

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        data = update.model_dump(mode="json", by_alias=True, exclude_none=True)
        self.updates.append(data)
        if self.on_update is not None:
            self.on_update(data)

    async def ext_method(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        return {}

    async def ext_notification(self, method: str, params: dict[str, Any]) -> None:
        self.ext.append((method, params))

    def on_connect(self, conn: Any) -> None:
        pass


def agent_env(data_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOPLINE_")}
    env["HOPLINE_DATA_DIR"] = str(data_dir)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env.update(extra)
    return env


@contextlib.asynccontextmanager
async def spawn_agent(
    data_dir: Path, client: RecordingClient | None = None, **env: str,
) -> AsyncIterator[tuple[ClientSideConnection, RecordingClient, asyncio.subprocess.Process]]:
    """Spawn `hopline agent`, initialize, yield (connection, client, process); always cleaned up."""
    client = client or RecordingClient()
    budget = Budget.from_env(agent_env(data_dir, **env))
    async with spawn_stdio_transport(*AGENT_CMD, env=agent_env(data_dir, **env),
                                     limit=budget.pipe_max_frame_bytes, stderr=None,
                                     shutdown_timeout=5.0) as (reader, writer, process):
        conn = ClientSideConnection(client, writer, reader)
        try:
            init = await asyncio.wait_for(
                conn.initialize(protocol_version=PROTOCOL_VERSION, client_capabilities=ClientCapabilities()),
                SPAWN_TIMEOUT)
            assert init.agent_capabilities is not None and init.agent_capabilities.load_session
            yield conn, client, process
        finally:
            await conn.close()
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
