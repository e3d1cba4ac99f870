"""Conformance against the official ACP TypeScript SDK (@agentclientprotocol/sdk, pinned in
``.ci/acp/package-lock.json``), both ways, every message checked with the SDK's own zod schemas
(``.ci/acp/validate.mjs``), permission, cancel and load included:

- the SDK's client (``.ci/acp/drive_agent.mjs``) drives ``hopline agent``;
- an SDK agent (``.ci/acp/sdk_agent.mjs``) runs under ``hopline serve``, driven over HTTP.

``.ci/acp/install.sh`` installs Node 22 and the SDK from the npm registry when they are missing. If
that cannot be done (no npm, no registry) the tests skip saying why; with ``CI=true`` they fail
instead: in CI they must run.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from daemon.support import read_events, running_daemon
from daemon.test_serve import kill_child_until_detached, new_session, prompt, texts, turns_done

pytestmark = pytest.mark.e2e  # every test here starts real processes

ROOT = Path(__file__).resolve().parents[2]
KIT = ROOT / ".ci" / "acp"
TAPE = Path(__file__).parent / "acp_tape.py"
INSTALL_TIMEOUT = 600.0
RUN_TIMEOUT = 180.0


@pytest.fixture(scope="module")
def node() -> str:
    """The node binary (>= 22) with the SDK installed beside the kit, or a skip (a failure in CI)."""
    try:
        done = subprocess.run(["bash", str(KIT / "install.sh")], capture_output=True, text=True,
                              timeout=INSTALL_TIMEOUT)
    except subprocess.TimeoutExpired:
        reason = "installing Node 22 and @agentclientprotocol/sdk from the npm registry timed out"
    else:
        if done.returncode == 0:
            return done.stdout.strip().splitlines()[-1]
        reason = ("could not install Node 22 and @agentclientprotocol/sdk from the npm registry: "
                  + (done.stderr.strip().splitlines() or ["(no output)"])[-1][:300])
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI=true: the SDK conformance test must run)")
    pytest.skip(reason)


def validate(node: str, tape: Path) -> dict[str, Any]:
    done = subprocess.run([node, str(KIT / "validate.mjs"), str(tape)], capture_output=True, text=True,
                          timeout=RUN_TIMEOUT, cwd=KIT)
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_the_validator_refuses_an_invalid_message(node: str, tmp_path: Path) -> None:
    """The control: a session/update of no ACP kind, and a prompt answer without stopReason, fail."""
    tape = tmp_path / "bad.ndjson"
    lines = [{"dir": "c2a", "msg": {"jsonrpc": "2.0", "id": 1, "method": "session/prompt",
                                    "params": {"sessionId": "s", "prompt": [{"type": "text", "text": "x"}]}}},
             {"dir": "a2c", "msg": {"jsonrpc": "2.0", "method": "session/update",
                                    "params": {"sessionId": "s", "update": {"sessionUpdate": "bogus"}}}},
             {"dir": "a2c", "msg": {"jsonrpc": "2.0", "id": 1, "result": {"stop": "end_turn"}}}]
    tape.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = validate(node, tape)
    assert [i["where"] for i in result["invalid"]] == ["session/update params", "session/prompt result"]


def test_the_sdk_client_drives_hopline_agent(node: str, tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "calc.py").write_text("print('calc')\n")
    tape = tmp_path / "agent.ndjson"
    agent = [sys.executable, str(TAPE), str(tape), "--", sys.executable, "-m", "hopline", "agent"]
    env = {**os.environ, "HOPLINE_DATA_DIR": str(tmp_path / "data")}
    env.pop("HOPLINE_PERMISSION_MODE", None)  # asks: the permission request is part of the contract
    done = subprocess.run([node, str(KIT / "drive_agent.mjs"), str(workspace), "--", *agent],
                          capture_output=True, text=True, timeout=RUN_TIMEOUT, cwd=KIT, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["stopReasons"] == ["end_turn", "cancelled"] and seen["permissions"] >= 1
    assert seen["loadSession"] is True and seen["loadUpdates"] > 0
    assert seen["promptCapabilities"] == {"image": False, "audio": False, "embeddedContext": True}
    result = validate(node, tape)
    assert result["invalid"] == [] and result["errors"] == 0
    methods = result["methods"]
    for method in ("initialize", "session/new", "session/prompt", "session/cancel", "session/load",
                   "session/request_permission", "session/update"):
        assert methods.get(method), method
    for method in ("initialize", "session/new", "session/prompt", "session/load",
                   "session/request_permission"):
        assert methods.get(f"{method} result"), method


async def test_an_sdk_agent_under_hopline_serve(node: str, tmp_path: Path) -> None:
    tape = tmp_path / "serve-{pid}.ndjson"
    agent_cmd = " ".join(shlex.quote(p) for p in (sys.executable, str(TAPE), str(tape), "--", node,
                                                   str(KIT / "sdk_agent.mjs")))
    blocks = [{"type": "text", "text": "look"},
              {"type": "image", "mimeType": "image/png", "data": "iVBORw0KGgo="},
              {"type": "resource_link", "uri": "file:///w/a.py", "name": "a.py"}]
    with running_daemon(tmp_path, agent_cmd=agent_cmd) as daemon:
        async with daemon.client(timeout=60) as client:
            sid = await new_session(client, tmp_path)
            accepted = await client.post(f"/session/{sid}/prompt", json={"prompt": blocks})
            assert accepted.status_code == 202, accepted.text
            await prompt(client, sid, "permission")
            asked = await read_events(client, sid, lambda e: e.type == "permission_request")
            request_id = asked[-1].data["requestId"]
            answer = await client.post(f"/session/{sid}/permission/{request_id}", json={"optionId": "allow"})
            assert answer.status_code == 200
            await prompt(client, sid, "wait")
            await read_events(client, sid, lambda e: e.type == "session_update" and e.data["update"].get(
                "content", {}).get("text") == "waiting")
            assert (await client.post(f"/session/{sid}/cancel")).json() == {"cancelled": True}
            events = await read_events(client, sid, turns_done(3))
            await kill_child_until_detached(client, sid)
            loaded = await client.post(f"/session/{sid}/load")
            assert loaded.status_code == 200, loaded.text
    ends = [e.data for e in events if e.type in ("turn_complete", "turn_error")]
    assert [e["stopReason"] for e in ends] == ["end_turn", "end_turn", "cancelled"]
    assert ends[0]["_meta"] == {"sdk.turn": {"blocks": 3}}
    said = texts(events)
    assert "echo: look (text,image,resource_link)" in said and "permission: allow" in said
    methods: dict[str, int] = {}
    tapes = sorted(tmp_path.glob("serve-*.ndjson"))
    assert len(tapes) >= 2  # the session's first child and the one its load started
    for one in tapes:
        result = validate(node, one)
        assert result["invalid"] == [] and result["errors"] == 0, one.name
        for method, count in result["methods"].items():
            methods[method] = methods.get(method, 0) + count
    for method in ("initialize", "session/new", "session/prompt", "session/cancel", "session/load",
                   "session/request_permission", "session/update"):
        assert methods.get(method), method
    for method in ("initialize", "session/new", "session/prompt", "session/load",
                   "session/request_permission"):
        assert methods.get(f"{method} result"), method
    sent = [json.loads(line)["msg"] for one in tapes for line in one.read_text().splitlines()]
    prompts = [m["params"]["prompt"] for m in sent if m.get("method") == "session/prompt"]
    assert blocks in prompts  # relayed exactly as posted
