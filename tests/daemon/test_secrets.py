"""No secret reaches a child (SPEC D-2, D-11, O-5), proved with canaries.

The daemon runs in this process (real uvicorn on 127.0.0.1, so the test can see the per-session
gateway tokens it mints) with `hopline agent` as a real child, the embedded gateway and the
OpenAI-compatible provider against a fake model server that asks the agent to run ``env``. Every
secret the operator holds is a canary; none may appear in the child's ``/proc/<pid>/environ``, in
the tool output (which goes to the model and the journal), in any file of the data directory or in
the daemon's log. A variable the operator names with ``agent_env`` does reach the agent.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway._server import bound_socket, serve
from hopline.budget import Budget
from hopline.daemon.app import create_daemon_app
from hopline.gateway.providers import OpenAIProvider
from hopline.http.auth import SessionTokens
from hopline.logs import JsonLineFormatter

from .support import read_events, running_daemon
from .test_serve import new_session, prompt, session_status, texts, turns_done

pytestmark = pytest.mark.e2e  # every test here starts real processes

CANARIES = {
    "OPENAI_API_KEY": "canary-openai-5d1e8a",
    "HOPLINE_INTERNAL_TOKEN": "canary-internal-77aa31",
    "HOPLINE_SERVER_TOKEN": "canary-server-c0de42",
    "HOPLINE_SIDECAR_WRITE_TOKEN": "canary-sidecar-0b0b17",
    "AWS_SECRET_ACCESS_KEY": "canary-aws-1234ff",
    "MY_DEPLOY_SECRET": "canary-other-9f9f00",
}
NAMED = ("CANARY_NAMED", "named-value-is-passed")


class RecordingTokens(SessionTokens):
    """The daemon's real token registry, remembering what it minted so the test can look for it."""

    def __init__(self) -> None:
        super().__init__()
        self.minted: list[str] = []

    def mint(self, owner: str, route_session: str | None = None) -> str:
        token = super().mint(owner, route_session)
        self.minted.append(token)
        return token


class EnvRunningModel:
    """An OpenAI-compatible chat-completions server: first `run_command env`, then a final answer."""

    def __init__(self) -> None:
        self.requests: list[bytes] = []
        self.authorizations: list[str | None] = []
        self.app = Starlette(routes=[Route("/v1/chat/completions", self.complete, methods=["POST"])])

    async def complete(self, request: Request) -> Response:
        raw = await request.body()
        self.requests.append(raw)
        self.authorizations.append(request.headers.get("authorization"))
        messages = orjson.loads(raw)["messages"]
        if any(m["role"] == "tool" for m in messages):
            message: dict[str, Any] = {"role": "assistant", "content": "I have seen the environment."}
        else:
            message = {"role": "assistant", "content": None, "tool_calls": [{
                "id": "call_env", "type": "function",
                "function": {"name": "run_command", "arguments": '{"command": "env"}'}}]}
        return JSONResponse({"choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                             "usage": {"prompt_tokens": 10, "completion_tokens": 5}})


@pytest.fixture
def log_lines() -> Iterator[list[str]]:
    """The daemon's log, formatted as `hopline serve` writes it."""
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    handler = Collect(logging.INFO)
    handler.setFormatter(JsonLineFormatter())
    root = logging.getLogger()
    root.addHandler(handler)
    previous = root.level
    root.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        root.removeHandler(handler)
        root.setLevel(previous)


async def test_no_secret_reaches_the_child_its_tools_the_journal_or_the_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, log_lines: list[str]) -> None:
    for name, value in CANARIES.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(*NAMED)
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "README.md").write_text("hello\n")
    budget = Budget.defaults()
    model = EnvRunningModel()
    tokens = RecordingTokens()
    with serve(model.app) as model_server:
        provider = OpenAIProvider(budget, base_url=f"{model_server.url}/v1",
                                  api_key=CANARIES["OPENAI_API_KEY"], model="fake-model")
        sock = bound_socket()
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        agent_cmd = [sys.executable, "-m", "hopline", "agent"]
        app = create_daemon_app(budget, data_dir=tmp_path / "data", agent_cmd=agent_cmd,
                                server_token=CANARIES["HOPLINE_SERVER_TOKEN"],
                                internal_token=CANARIES["HOPLINE_INTERNAL_TOKEN"], gateway_url=url,
                                provider=provider, agent_env=(NAMED[0],), gateway_tokens=tokens)
        with serve(app, sock=sock, log_config=None):
            headers = {"Authorization": f"Bearer {CANARIES['HOPLINE_SERVER_TOKEN']}"}
            async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as client:
                body = {"cwd": str(workspace), "permissionMode": "auto"}
                created = await client.post("/session", json=body)
                assert created.status_code == 200, created.text
                sid = created.json()["sessionId"]
                accepted = await client.post(f"/session/{sid}/prompt", json={"text": "show the environment"})
                assert accepted.status_code == 202
                events = await read_events(client, sid, lambda e: e.type in ("turn_complete", "turn_error"))
                assert events[-1].type == "turn_complete", events[-1].data
                status = (await client.get("/daemon/status")).json()
                child_pid = next(s for s in status["sessions"] if s["sessionId"] == sid)["childPid"]
                environ = Path(f"/proc/{child_pid}/environ").read_bytes().decode().split("\0")
                transcript = (await client.get(f"/session/{sid}/transcript")).text
                # the session's gateway token opens no other session's route, and dies with its session
                minted = {"Authorization": f"Bearer {tokens.minted[-1]}"}
                other = await client.post("/internal/sessions/another/llm-turn", json={}, headers=minted)
                assert other.status_code == 403
                assert (await client.delete(f"/session/{sid}")).status_code == 200
                assert tokens.active == 0
                revoked = await client.post("/internal/sessions/another/llm-turn", json={}, headers=minted)
                assert revoked.status_code == 401
    secrets = [*CANARIES.values(), *tokens.minted]
    assert len(tokens.minted) == 1  # one gateway token, minted for this session
    # the provider key reached the provider, through the gateway only
    assert model.authorizations == [f"Bearer {CANARIES['OPENAI_API_KEY']}"] * 2
    # what the model ran: `env` printed the tool's environment, without one secret or credential name
    outputs = [str(e.data) for e in events if e.type == "session_update"
               and e.data["update"].get("sessionUpdate") == "tool_call_update"]
    env_output = "\n".join(outputs)
    assert f"{NAMED[0]}={NAMED[1]}" in env_output and "PATH=" in env_output
    for name in (*CANARIES, "HOPLINE_GATEWAY_TOKEN", "gatewayToken"):
        assert f"{name}=" not in env_output
    # ...nor one of hopline's own settings: where the agent's stores are is nothing a tool needs
    stores = {"HOPLINE_DATA_DIR": str(tmp_path / "data" / "agent"),
              "HOPLINE_SIDECAR_DIR": str(tmp_path / "data" / "sidecars")}
    for name, value in stores.items():
        assert f"{name}={value}" in environ  # the agent itself has them...
        assert f"{name}=" not in env_output and value not in env_output  # ...its tools do not
    assert "HOPLINE_" not in env_output
    # the child's own environment: the named variable and the safe base, nothing secret
    assert f"{NAMED[0]}={NAMED[1]}" in environ
    # (per-session credentials travel in the ACP request, never in a child's environment)
    assert not [entry for entry in environ if entry.split("=", 1)[0] in CANARIES]
    assert "HOPLINE_GATEWAY_URL=" + url in environ
    haystacks = {"child environ": "\n".join(environ), "tool output": env_output, "transcript": transcript,
                 "model requests": b"".join(model.requests).decode(), "log": "\n".join(log_lines)}
    for path in (tmp_path / "data").rglob("*"):
        if path.is_file():
            haystacks[f"file {path.name}"] = path.read_bytes().decode("utf-8", "replace")
    assert any(name.startswith("file journal") for name in haystacks), list(haystacks)
    for where, text in haystacks.items():
        for secret in secrets:
            assert secret not in text, f"a secret appears in the {where}"
    assert log_lines  # the daemon did log, and none of it carried a secret


async def test_serve_gives_children_the_safe_base_and_the_named_variables_only(tmp_path: Path) -> None:
    env = {**CANARIES, "CANARY_NAMED": "named-1", "OTHER_NAMED": "named-2",
           "HOPLINE_AGENT_ENV": "OTHER_NAMED"}
    env.pop("HOPLINE_SERVER_TOKEN")  # the daemon's token is the test's canary below
    with running_daemon(tmp_path, env=env, token=CANARIES["HOPLINE_SERVER_TOKEN"],
                        args=("--agent-env", "CANARY_NAMED")) as daemon:
        async with daemon.client() as client:
            sid = await new_session(client, tmp_path)
            names = ("CANARY_NAMED", "OTHER_NAMED", "PATH", *CANARIES)
            await prompt(client, sid, "env " + " ".join(names))
            events = await read_events(client, sid, turns_done(1))
            child_pid = (await session_status(client, sid))["childPid"]
            environ = Path(f"/proc/{child_pid}/environ").read_bytes().decode()
            await client.delete(f"/session/{sid}")
    seen = dict(item.split("=") for item in texts(events)[-1].removeprefix("env: ").split())
    assert seen == {"CANARY_NAMED": "present", "OTHER_NAMED": "present", "PATH": "present",
                    **{name: "absent" for name in CANARIES}}  # per-session tokens travel in the request
    for secret in CANARIES.values():
        assert secret not in environ
        assert secret not in daemon.log_text()


@pytest.mark.parametrize(("value", "message"), [
    ("HOPLINE_SERVER_TOKEN", "credential of hopline itself"),
    ("HOPLINE_INTERNAL_TOKEN", "credential of hopline itself"),
    ("BAD-NAME", "is not an environment variable name"),
])
def test_serve_refuses_to_pass_its_own_credentials_or_a_bad_name(tmp_path: Path, value: str,
                                                                 message: str) -> None:
    env = {**os.environ, "HOPLINE_AGENT_ENV": value}
    argv = [sys.executable, "-m", "hopline", "serve", "--port", "0", "--data-dir", str(tmp_path)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and message in done.stderr and "HOPLINE_AGENT_ENV" in done.stderr


def test_the_operator_may_name_a_provider_key_for_an_agent_that_calls_its_provider() -> None:
    """qwen --acp talks to its provider itself: the operator passes the key by name (D-11), and
    only then does it reach the child; hopline's own tokens never do, named or not."""
    from hopline.daemon.child import agent_env_names, child_environment

    base = {"PATH": "/bin", "OPENAI_API_KEY": CANARIES["OPENAI_API_KEY"],
            "HOPLINE_SERVER_TOKEN": CANARIES["HOPLINE_SERVER_TOKEN"]}
    assert "OPENAI_API_KEY" not in child_environment(base, {})
    named = agent_env_names(["OPENAI_API_KEY"])
    assert child_environment(base, {}, named) == {"PATH": "/bin",
                                                  "OPENAI_API_KEY": CANARIES["OPENAI_API_KEY"]}
    with pytest.raises(ValueError, match="credential of hopline itself"):
        agent_env_names(["OPENAI_API_KEY,HOPLINE_SIDECAR_WRITE_TOKEN"])
