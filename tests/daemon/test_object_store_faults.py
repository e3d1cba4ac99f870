"""An object store that hangs (issue #27 item 4, SPEC T-4): S3 accepts TCP and never answers.

A real `hopline serve` keeps its sidecars in moto's bucket behind a proxy the test switches to
"hang". With ``HOPLINE_OBJECT_STORE_TIMEOUT`` short, a large update's sidecar write passes its
deadline: the turn still ends, the update goes out as a preview flagged ``truncated`` with the
reason ``object_store_unavailable`` (not ``disk_error``) and its ``lostBytes``, ``turn_complete``
says ``degraded``; a sidecar download meanwhile answers hopline's JSON 503 with ``Retry-After``
(never a 500, never a hang). Forwarding again, the next large update has its sidecar, served whole.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from services import HangingProxy, S3Server

from .support import Daemon, SseEvent, start_daemon, stop_daemon_proc
from .test_cluster import Stream, ends

pytestmark = pytest.mark.e2e

DEADLINE_SECONDS = 1
TURN_END_SECONDS = 30  # the bound: a turn must end, not freeze for minutes
BIG = 300_000  # over the sidecar threshold (64 KiB)



@pytest.fixture
def daemon(tmp_path: Path, s3_server: S3Server, s3_bucket: str, s3_proxy: HangingProxy) -> Iterator[Daemon]:
    env = {**s3_server.env(), "AWS_ENDPOINT_URL": s3_proxy.endpoint,
           "HOPLINE_SIDECAR_URL": f"s3://{s3_bucket}/hopline",
           "HOPLINE_OBJECT_STORE_TIMEOUT": str(DEADLINE_SECONDS), "HOPLINE_WARM_CHILDREN": "0"}
    started = start_daemon(tmp_path, env=env)
    try:
        yield started
    finally:
        stop_daemon_proc(started.proc)


def update_of(stream: Stream, prompt_id: str) -> SseEvent:
    """The prompt's update that moved (or tried to move) a field: the one with sidecar entries."""
    return next(e for e in stream.events if e.type == "session_update" and e.data.get("promptId") == prompt_id
                and (e.data["update"].get("_meta") or {}).get("hopline.sidecar"))


async def prompt(client: httpx.AsyncClient, stream: Stream, session_id: str,
                 text: str) -> tuple[str, SseEvent]:
    accepted = await client.post(f"/session/{session_id}/prompt", json={"text": text})
    assert accepted.status_code == 202, accepted.text
    prompt_id = str(accepted.json()["promptId"])
    end = await stream.wait_for(ends(prompt_id), timeout=TURN_END_SECONDS)  # no freeze
    return prompt_id, end


async def assert_served(client: httpx.AsyncClient, session_id: str, entry: dict[str, Any],
                        body: bytes) -> None:
    answer = await client.get(f"/session/{session_id}/sidecars/{entry['id']}")
    assert answer.status_code == 200, answer.text
    assert answer.content == body
    assert entry["sha256"] == hashlib.sha256(body).hexdigest() == hashlib.sha256(answer.content).hexdigest()


async def test_a_hung_object_store_degrades_the_update_and_recovers(
        tmp_path: Path, daemon: Daemon, s3_proxy: HangingProxy) -> None:
    async with daemon.client() as client:
        session_id = (await client.post("/session", json={"cwd": str(tmp_path)})).json()["sessionId"]
        stream = Stream(daemon, session_id)
        try:
            # Forwarding: a large update's field goes to a sidecar (and the client's pool is warm).
            first_id, _ = await prompt(client, stream, session_id, f"big {BIG} a")
            first = update_of(stream, first_id).data["update"]["_meta"]["hopline.sidecar"][0]
            await assert_served(client, session_id, first, b"a" * BIG)

            s3_proxy.hang()
            hung_id, end = await prompt(client, stream, session_id, f"big {BIG} b")
            event = update_of(stream, hung_id)
            # the quiet wait was said first: a sidecar_delayed notice, before the degraded update
            notices = [e for e in stream.events
                       if e.type == "sidecar_delayed" and e.data["promptId"] == hung_id]
            assert len(notices) == 1 and stream.events.index(notices[0]) < stream.events.index(event)
            notice = notices[0].data
            assert notice["hop"] == "daemon.sidecars" and notice["setting"] == "HOPLINE_OBJECT_STORE_TIMEOUT"
            assert notice["timeoutSeconds"] == DEADLINE_SECONDS and notice["bytes"] > BIG
            assert notices[0].id is None  # a notice to live readers, not journaled
            entry = event.data["update"]["_meta"]["hopline.sidecar"][0]
            assert entry["truncated"] is True and entry["reason"] == "object_store_unavailable", entry
            assert "id" not in entry and entry["bytes"] == BIG and 0 < entry["lostBytes"] < BIG
            assert event.data["lostBytes"] == entry["lostBytes"]
            text = event.data["update"]["content"][0]["content"]["text"]
            assert "truncated (object_store_unavailable)" in text
            assert end.data["degraded"] is True and end.data["lostBytes"] >= entry["lostBytes"] > 0

            # A download while the store hangs: hopline's JSON 503 naming the object store.
            answer = await client.get(f"/session/{session_id}/sidecars/{first['id']}")
            assert answer.status_code == 503, answer.text
            assert answer.headers["content-type"].startswith("application/json")
            assert int(answer.headers["retry-after"]) >= 1
            error = answer.json()["error"]
            assert error["hop"] == "daemon.sidecars" and error["type"] == "storage_unavailable", error
            assert "HOPLINE_OBJECT_STORE_TIMEOUT" in error["message"]

            status = (await client.get("/daemon/status")).json()
            fallbacks = status["sidecars"]["fallbacks"]
            assert fallbacks["objectStoreUnavailable"] >= 1 and fallbacks["diskError"] == 0
            assert status["delivery"]["sidecarDelayedUpdates"] == 1

            s3_proxy.forward()
            await asyncio.sleep(DEADLINE_SECONDS)  # the store counts as down one deadline after one passed
            after_id, end = await prompt(client, stream, session_id, f"big {BIG} c")
            after = update_of(stream, after_id).data["update"]["_meta"]["hopline.sidecar"][0]
            assert "truncated" not in after and end.data["degraded"] is False
            await assert_served(client, session_id, after, b"c" * BIG)
            await assert_served(client, session_id, first, b"a" * BIG)
        finally:
            await stream.close()
