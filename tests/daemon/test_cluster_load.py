"""Twenty sessions saturating one daemon, every one read at the other daemon (issue #27 item 6,
SPEC T-6): a non-owner's readers are fed from the journal at the pace they read, so none that keeps
reading is evicted. Two real `hopline serve` processes on the session's PostgreSQL; each agent floods
its session with tiny updates as fast as it can write them (the hostile agent's ``flood N``), and
each reader, on the daemon that does not own the session, uses the default queue."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from .test_cluster import CLUSTER_TOKEN, Stream, ends, two_daemons
from .test_hostile_child import HOSTILE_CMD

pytestmark = pytest.mark.e2e

SESSIONS = 20
UPDATES = 2000  # per session: the load (20 x 2,000)


async def test_twenty_saturating_sessions_read_at_the_non_owner_evict_no_reader(
        tmp_path: Path, pg_url: str) -> None:
    env = {"HOPLINE_STORE_URL": pg_url, "HOPLINE_CLUSTER_TOKEN": CLUSTER_TOKEN, "HOPLINE_WARM_CHILDREN": "0"}
    with two_daemons(tmp_path, env, agent_cmd=HOSTILE_CMD) as (owner, other):
        async with owner.client(timeout=60) as writer:
            sessions = [(await writer.post("/session", json={"cwd": str(tmp_path)})).json()["sessionId"]
                        for _ in range(SESSIONS)]
            streams = [Stream(other, session_id) for session_id in sessions]
            try:
                await asyncio.gather(*(s.wait_for(lambda e: e.type == "replay_complete") for s in streams))
                prompts = []
                for session_id in sessions:  # every flood at once
                    accepted = await writer.post(f"/session/{session_id}/prompt",
                                                 json={"text": f"flood {UPDATES}"})
                    assert accepted.status_code == 202, accepted.text
                    prompts.append(accepted.json()["promptId"])
                await asyncio.gather(*(s.wait_for(ends(p), timeout=300) for s, p in zip(streams, prompts,
                                                                                        strict=True)))
                for stream, prompt_id in zip(streams, prompts, strict=True):
                    kinds = [e.type for e in stream.events]
                    assert "client_evicted" not in kinds and "frame_dropped" not in kinds
                    updates = [e for e in stream.events
                               if e.type == "session_update" and e.data.get("promptId") == prompt_id]
                    assert len(updates) == UPDATES
                    assert stream.ids == list(range(stream.ids[0], stream.ids[-1] + 1))  # once each, no gap
            finally:
                for stream in streams:
                    await stream.close()
        async with other.client() as reader:
            status = (await reader.get("/daemon/status")).json()
            assert status["sse"]["evictions"] == 0
            assert [row["childPid"] for row in status["sessions"]] == [None] * SESSIONS  # all read remotely
