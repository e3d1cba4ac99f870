"""The ACP contract through `hopline serve`, with a third-party agent (the SDK-only big agent behind a
tee that records every byte the daemon writes to it), SPEC T-8 / issue 28:

- content blocks reach the agent exactly as posted; blocks its promptCapabilities disallow get a 422
  naming block and capability; each block is bounded (at the limit passes, one byte over is 413);
- the agent's error.data reaches turn_error (sidecar when large, restored exactly), its response
  _meta reaches turn_complete;
- permission_resolved is journaled, seen by two subscribers and by a replay, naming who resolved it;
- no hopline credential reaches a third-party child, in any message or its environment; a child that
  claims them in its initialize _meta gets them (the control that shows the test can fail).
"""

from __future__ import annotations

import asyncio
import base64
import shlex
import sys
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from hopline.sidecars.projection import restore_update

from .support import AGENT, SseEvent, iter_sse, read_events, running_daemon
from .test_serve import kill_child_until_detached, new_session, prompt, texts, turns_done

pytestmark = pytest.mark.e2e  # every test here starts real processes

TEE = Path(__file__).parent / "agents" / "wire_tee.py"
SERVER_TOKEN = "canary-server-token-5d1f"
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4).decode()


def tee_cmd(log: Path) -> str:
    argv = (sys.executable, str(TEE), str(log), "--", sys.executable, str(AGENT))
    return " ".join(shlex.quote(p) for p in argv)


# The big agent's own knobs, passed by name (the child's environment is an allow-list).
AGENT_ENV_ARGS = ("--agent-env", "BIG_AGENT_PROMPT_CAPS,BIG_AGENT_TAKES_CREDENTIALS,BIG_AGENT_CANARY_DIR")


def wire(log: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in log.read_bytes().splitlines() if line.strip()]


async def post_prompt(client: httpx.AsyncClient, sid: str, blocks: list[dict[str, Any]]) -> httpx.Response:
    return await client.post(f"/session/{sid}/prompt", json={"prompt": blocks})


async def test_blocks_reach_a_third_party_agent_exactly_as_posted(tmp_path: Path) -> None:
    log = tmp_path / "wire.ndjson"
    env = {"BIG_AGENT_PROMPT_CAPS": "image", "HOPLINE_PROMPT_BLOCK_MAX_BYTES": "8192"}
    blocks = [{"type": "text", "text": "look at"},
              {"type": "resource_link", "uri": "file:///work/calc.py", "name": "calc.py",
               "mimeType": "text/x-python", "size": 120, "_meta": {"client.tag": 1}},
              {"type": "image", "mimeType": "image/png", "data": PNG}]
    with running_daemon(tmp_path, agent_cmd=tee_cmd(log), env=env, args=AGENT_ENV_ARGS) as daemon:
        async with daemon.client() as client:
            sid = await new_session(client, tmp_path)
            accepted = await post_prompt(client, sid, blocks)
            assert accepted.status_code == 202, accepted.text
            await read_events(client, sid, turns_done(1))
            # a block of exactly the limit passes, one byte more is the ceiling error
            base = len(orjson.dumps({"type": "text", "text": ""}))
            at_limit = {"type": "text", "text": "a" * (8192 - base)}
            assert len(orjson.dumps(at_limit)) == 8192
            assert (await post_prompt(client, sid, [at_limit])).status_code == 202
            over = await post_prompt(client, sid, [{"type": "image", "mimeType": "image/png",
                                                    "data": "A" * 8192}])
            assert over.status_code == 413, over.text
            error = over.json()["error"]
            assert error["type"] == "prompt_block_too_large" and error["unit"] == "bytes"
            assert error["setting"] == "HOPLINE_PROMPT_BLOCK_MAX_BYTES" and error["limit"] == 8192
            assert error["observed"] > 8192 and error["block"] == 0 and error["hop"] == "daemon.api"
            # not ACP: named, and never relayed
            bad = await post_prompt(client, sid, [{"type": "resource_link", "uri": "file:///x"}])
            assert bad.status_code == 422 and bad.json()["error"]["type"] == "invalid_prompt"
            assert bad.json()["error"]["errors"][0]["block"] == 0
            audio = await post_prompt(client, sid, [{"type": "audio", "mimeType": "audio/wav",
                                                     "data": "AAAA"}])
            assert audio.status_code == 422, audio.text
            assert audio.json()["error"] | {"message": ""} == {
                "type": "prompt_capability_missing", "message": "", "block": 0, "blockType": "audio",
                "capability": "audio", "hop": "daemon.api"}
            both = await client.post(f"/session/{sid}/prompt", json={"text": "x", "prompt": blocks})
            assert both.status_code == 422
            await read_events(client, sid, turns_done(2))
    prompts = [m["params"]["prompt"] for m in wire(log) if m.get("method") == "session/prompt"]
    assert prompts == [blocks, [at_limit]]


async def test_an_agent_without_image_capability_gets_no_image(tmp_path: Path) -> None:
    with running_daemon(tmp_path) as daemon:
        async with daemon.client() as client:
            sid = await new_session(client, tmp_path)
            image = {"type": "image", "mimeType": "image/png", "data": PNG}
            refused = await post_prompt(client, sid, [{"type": "text", "text": "see"}, image])
            assert refused.status_code == 422
            assert refused.json()["error"]["block"] == 1
            assert refused.json()["error"]["capability"] == "image"
            embedded = await post_prompt(client, sid, [{"type": "resource", "resource": {
                "uri": "file:///a.txt", "text": "hello"}}])
            assert embedded.json()["error"]["capability"] == "embeddedContext"


async def test_error_data_and_response_meta_reach_the_client(tmp_path: Path) -> None:
    with running_daemon(tmp_path) as daemon:
        async with daemon.client() as client:
            sid = await new_session(client, tmp_path)
            small = await prompt(client, sid, "fail 200")
            large = await prompt(client, sid, "fail 100000")
            meta = await prompt(client, sid, "meta")
            events = await read_events(client, sid, turns_done(3))
            ends = {e.data["promptId"]: e for e in events if e.type in ("turn_complete", "turn_error")}
            first = ends[small]
            assert first.type == "turn_error" and first.data["message"] == "Internal error"
            assert first.data["code"] == -32603 and first.data["data"]["code"] == 7
            assert "Estimated prompt tokens: 369621; hard limit: 177000" in first.data["data"]["details"]
            assert len(first.data["data"]["details"]) == 200
            # over HOPLINE_ERROR_DATA_ECHO_MAX_BYTES: the data's large field in a sidecar, exactly restored
            second = ends[large].data
            assert len(orjson.dumps(second)) < 16 * 1024 and second["data"]["code"] == 7
            [entry] = second["_meta"]["hopline.sidecar"]
            assert entry["path"] == ["data", "details"]
            bodies: dict[str, bytes] = {}
            got = await client.get(f"/session/{sid}/sidecars/{entry['id']}")
            assert got.status_code == 200
            bodies[entry["id"]] = got.content
            restored = restore_update(second, lambda e: bodies[e["id"]])
            assert restored["data"]["details"].startswith("Context is too large")
            assert len(restored["data"]["details"]) == 100000 and second["lostBytes"] == 0
            done = ends[meta]
            assert done.type == "turn_complete" and done.data["stopReason"] == "end_turn"
            assert done.data["_meta"] == {"big.branchPoint": {"turn": 3, "id": "bp-42"}}


class Watcher:
    """One SSE subscriber of a session until its turn ends; ``ready`` once its replay is done,
    ``asked`` once a permission_request arrived."""

    def __init__(self) -> None:
        self.seen: list[SseEvent] = []
        self.ready = asyncio.Event()
        self.asked = asyncio.Event()
        self.asked_id = ""

    async def run(self, client: httpx.AsyncClient, sid: str) -> None:
        async with client.stream("GET", f"/session/{sid}/events") as response:
            async for event in iter_sse(response):
                self.seen.append(event)
                if event.type == "replay_complete":
                    self.ready.set()
                if event.type == "permission_request" and self.ready.is_set():
                    self.asked.set()
                    self.asked_id = str(event.data["requestId"])
                if event.type in ("turn_complete", "turn_error") and self.ready.is_set():
                    return  # a live turn's end (the replay may hold earlier ones)

    def request_id(self) -> str:
        return self.asked_id


async def _two_watchers(client: httpx.AsyncClient, sid: str) -> tuple[Watcher, Watcher, Any]:
    a, b = Watcher(), Watcher()
    tasks = asyncio.gather(a.run(client, sid), b.run(client, sid))
    await asyncio.wait_for(asyncio.gather(a.ready.wait(), b.ready.wait()), 30)
    return a, b, tasks


async def test_two_subscribers_and_a_replay_see_permission_resolved(tmp_path: Path) -> None:
    with running_daemon(tmp_path) as daemon:
        async with daemon.client(timeout=60) as client:
            sid = await new_session(client, tmp_path)
            a, b, tasks = await _two_watchers(client, sid)
            pid = await prompt(client, sid, "permission")
            await asyncio.wait_for(a.asked.wait(), 30)
            request_id = a.request_id()
            answer = await client.post(f"/session/{sid}/permission/{request_id}", json={"optionId": "deny"})
            assert answer.status_code == 200, answer.text
            await asyncio.wait_for(tasks, 30)
            again = await client.post(f"/session/{sid}/permission/{request_id}", json={"optionId": "deny"})
            assert again.status_code == 404
            # cancel resolves an open request too
            c, d, tasks = await _two_watchers(client, sid)
            await prompt(client, sid, "permission")
            await asyncio.wait_for(c.asked.wait(), 30)
            cancelled_id = c.request_id()
            assert (await client.post(f"/session/{sid}/cancel")).status_code == 200
            await asyncio.wait_for(tasks, 30)
            replay = await read_events(client, sid, lambda e: e.type == "replay_complete")
    expected = {"requestId": request_id, "promptId": pid, "resolvedBy": "client",
                "outcome": {"outcome": "selected", "optionId": "deny"}}
    for watcher in (a, b):
        [resolved] = [e for e in watcher.seen if e.type == "permission_resolved"]
        assert resolved.data == expected and resolved.id is not None
        assert "permission: deny" in texts(watcher.seen)
    for watcher in (c, d):  # the first resolution replayed, then this one live
        first, resolved = [e for e in watcher.seen if e.type == "permission_resolved"]
        assert first.data == expected
        assert resolved.data["requestId"] == cancelled_id and resolved.data["resolvedBy"] == "cancel"
        assert resolved.data["outcome"] == {"outcome": "cancelled"}
    replayed = [e.data for e in replay if e.type == "permission_resolved"]
    assert [r["resolvedBy"] for r in replayed] == ["client", "cancel"] and replayed[0] == expected


async def test_no_hopline_credential_reaches_a_third_party_agent(tmp_path: Path) -> None:
    """Canary: the third-party child's whole stdin and environment hold no hopline token; the same
    agent claiming the credentials gets them (so the search would have found them)."""
    secrets_env = {"BIG_AGENT_CANARY_DIR": str(tmp_path)}
    for claims, name in ((False, "third"), (True, "claims")):
        log = tmp_path / f"{name}.ndjson"
        (tmp_path / name).mkdir()
        env = {**secrets_env, **({"BIG_AGENT_TAKES_CREDENTIALS": "1"} if claims else {})}
        with running_daemon(tmp_path / name, agent_cmd=tee_cmd(log), env=env, token=SERVER_TOKEN,
                            args=AGENT_ENV_ARGS) as daemon:
            async with daemon.client() as client:
                sid = await new_session(client, tmp_path)
                await prompt(client, sid, "envdump")
                await read_events(client, sid, turns_done(1))
                await kill_child_until_detached(client, sid)  # the load starts a new child
                loaded = await client.post(f"/session/{sid}/load")
                assert loaded.status_code == 200, loaded.text
        sent = log.read_bytes()
        envs = [p for p in tmp_path.glob("env-*.json")]
        assert len(envs) == 1
        child_env = envs[0].read_text()
        envs[0].unlink()
        assert SERVER_TOKEN.encode() not in sent and SERVER_TOKEN not in child_env
        loads = [m for m in wire(log) if m.get("method") in ("session/new", "session/load")]
        assert [m["method"] for m in loads] == ["session/new", "session/load"]
        if claims:  # the control: the claim is what gates them
            for message in loads:
                creds = message["params"]["_meta"]["hopline.credentials"]
                assert creds["gatewayToken"] and creds["gatewayToken"].encode() in sent
        else:
            assert b"hopline.credentials" not in sent and b"gatewayToken" not in sent
            assert b"sidecarWriteToken" not in sent
            assert "HOPLINE_SERVER_TOKEN" not in child_env and "HOPLINE_INTERNAL_TOKEN" not in child_env
