"""Write-ahead acceptance on PostgreSQL (SPEC T-1, issue #25 row 5): the faults of
test_storage_faults_e2e.py's full disk, on a real PostgreSQL that is stopped, or whose connections
are killed, under a real `hopline serve`. A refused request is answered JSON 503
``storage_unavailable`` with Retry-After and the agent never hears of it; an accepted one reaches the
agent exactly once."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from services import PostgresCluster

from .support import read_events, start_daemon, stop_daemon_proc
from .test_cluster_faults import post_until_accepted
from .test_storage_faults_e2e import _env, _prompt_and_end, _prompts

pytestmark = pytest.mark.e2e


def _pg_env(tmp_path: Path, pg_url: str) -> dict[str, str]:
    # A commit on a lost connection is retried for the outage window before it is refused; the
    # window is short here so a refusal comes well within the client's timeout.
    return {**_env(tmp_path), "HOPLINE_STORE_URL": pg_url, "HOPLINE_CLUSTER_TOKEN": "pg-faults-cluster",
            "HOPLINE_WARM_CHILDREN": "0", "HOPLINE_STORE_OUTAGE_RETRY_SECONDS": "2",
            # the outages here are shorter than the lease: the daemon keeps its agents (T-11)
            "HOPLINE_OWNER_LEASE_SECONDS": "60"}


def _refused_unavailable(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert int(response.headers["retry-after"]) >= 1
    error = response.json()["error"]
    assert error["type"] == "storage_unavailable" and error["hop"] in ("daemon.journal", "daemon.cluster")


async def _until_accepted(client: httpx.AsyncClient, path: str,
                          body: dict[str, Any] | None) -> httpx.Response:
    """The same request again while the store comes back (503 + Retry-After meanwhile)."""
    return await post_until_accepted(client, path, body, tries=100, check=_refused_unavailable)


async def test_a_stopped_postgresql_refuses_prompt_session_cancel_and_permission_before_acting(
        tmp_path: Path, postgres_cluster: PostgresCluster, pg_url: str) -> None:
    daemon = start_daemon(tmp_path, env=_pg_env(tmp_path, pg_url))
    try:
        async with daemon.client() as client:
            session_id = (await client.post("/session", json={"permissionMode": "ask"})).json()["sessionId"]
            await _prompt_and_end(client, session_id, "before")
            asked = await client.post(f"/session/{session_id}/prompt", json={"text": "permission"})
            assert asked.status_code == 202
            [*_, request] = await read_events(client, session_id, lambda e: e.type == "permission_request")
            request_id = request.data["requestId"]
            await asyncio.to_thread(postgres_cluster.stop_server)
            try:
                _refused_unavailable(await client.post(f"/session/{session_id}/prompt",
                                                       json={"text": "refused-canary"}))
                _refused_unavailable(await client.post("/session", json={}))
                _refused_unavailable(await client.post(f"/session/{session_id}/permission/{request_id}",
                                                       json={"outcome": "reject"}))
                _refused_unavailable(await client.post(f"/session/{session_id}/cancel"))
                assert (await client.get("/health")).status_code == 200
            finally:
                await asyncio.to_thread(postgres_cluster.start_server)
            answered = await _until_accepted(client, f"/session/{session_id}/permission/{request_id}",
                                             {"outcome": "reject"})
            assert answered.status_code == 200, answered.text  # still pending: the refusal kept it
            after = await _until_accepted(client, f"/session/{session_id}/prompt", {"text": "after"})
            assert after.status_code == 202, after.text
            prompt_id = after.json()["promptId"]
            await read_events(client, session_id, lambda e: e.type in ("turn_complete", "turn_error")
                              and e.data.get("promptId") == prompt_id)
        # the agent got the prompts that were accepted, once each, never the refused one
        assert _prompts(tmp_path) == ["before", "permission", "after"]
    finally:
        stop_daemon_proc(daemon.proc)
    assert "Traceback" not in daemon.log_text()


def _kill_connections(pg_url: str) -> int:
    """Every connection of the daemon to its database killed (pg_terminate_backend), as a failover
    or an operator would; how many."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        rows = conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE datname = current_database() AND pid <> pg_backend_pid()").fetchall()
    return len(rows)


async def test_killed_connections_lose_no_accepted_prompt_and_run_none_twice(
        tmp_path: Path, postgres_cluster: PostgresCluster, pg_url: str) -> None:
    daemon = start_daemon(tmp_path, env=_pg_env(tmp_path, pg_url))
    accepted: list[str] = []
    try:
        async with daemon.client() as client:
            session_id = (await client.post("/session", json={})).json()["sessionId"]
            await _prompt_and_end(client, session_id, "before")
            accepted.append("before")
            for round_ in range(3):
                assert await asyncio.to_thread(_kill_connections, pg_url) >= 1
                text = f"after-kill-{round_}"
                answer = await client.post(f"/session/{session_id}/prompt", json={"text": text})
                if answer.status_code == 503:  # refused: the agent must never get it
                    _refused_unavailable(answer)
                    continue
                assert answer.status_code == 202, answer.text
                prompt_id = answer.json()["promptId"]
                [*_, end] = await read_events(client, session_id, lambda e, p=prompt_id: e.type in (
                    "turn_complete", "turn_error") and e.data.get("promptId") == p)
                assert end.type == "turn_complete", end.data
                accepted.append(text)
        # every 202 reached the agent exactly once; every 503 never did
        assert _prompts(tmp_path) == accepted
    finally:
        stop_daemon_proc(daemon.proc)
    assert "Traceback" not in daemon.log_text()


def _lease_expiry(pg_url: str, session_id: str) -> float:
    """The lease's expires_at, in the store's epoch seconds."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        row = conn.execute("SELECT extract(epoch FROM expires_at)::float8 FROM leases"
                           " WHERE session_id = %s", (session_id,)).fetchone()
    assert row is not None
    return float(row[0])


def _store_clock(pg_url: str) -> float:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
    assert row is not None
    return float(row[0])


def _store_refuses(pg_url: str) -> bool:
    try:
        psycopg.connect(pg_url, connect_timeout=2).close()
    except psycopg.OperationalError:
        return True
    return False


async def test_an_outage_longer_than_the_lease_keeps_the_daemons_own_session(
        tmp_path: Path, postgres_cluster: PostgresCluster, pg_url: str) -> None:
    """Nobody took the lease while the store was away: the daemon renews its own (same owner, same
    epoch) instead of fencing its session, and the next prompt runs here. Its agent was stopped when
    the lease was at risk (T-11: it could not know nobody would adopt), so that prompt starts a new
    one, restored with session/load."""
    lease = 2.0
    env = {**_pg_env(tmp_path, pg_url), "HOPLINE_OWNER_LEASE_SECONDS": str(lease)}
    daemon = start_daemon(tmp_path, env=env)
    try:
        async with daemon.client() as client:
            session_id = (await client.post("/session", json={})).json()["sessionId"]
            await _prompt_and_end(client, session_id, "before")
            child = (await client.get("/daemon/status")).json()["sessions"][0]["childPid"]
            # A renewal between this read and the stop sets the expiry at most one lease later.
            expiry = await asyncio.to_thread(_lease_expiry, pg_url, session_id) + lease
            await asyncio.to_thread(postgres_cluster.stop_server)
            down = time.monotonic()
            try:
                assert await asyncio.to_thread(_store_refuses, pg_url)  # the fault happened
                while time.monotonic() - down < 2 * lease:  # an outage past the lease
                    await asyncio.sleep(0.2)
            finally:
                await asyncio.to_thread(postgres_cluster.start_server)
            # The lease ran out while the store was away (the daemon may renew it once it is back).
            assert await asyncio.to_thread(_store_clock, pg_url) > expiry
            after = await _until_accepted(client, f"/session/{session_id}/prompt", {"text": "after"})
            assert after.status_code == 202, after.text
            prompt_id = after.json()["promptId"]
            events = await read_events(client, session_id, lambda e: e.type in (
                "turn_complete", "turn_error") and e.data.get("promptId") == prompt_id)
            assert events[-1].type == "turn_complete", events[-1].data
            # restored on its resume (agent_restarted), or by the prompt that came first (it re-adopted
            # its own lease: session_adopted)
            [restored] = [e for e in events if e.type in ("agent_restarted", "session_adopted")]
            assert restored.data["restoredWith"] == "session/load"
            row = (await client.get("/daemon/status")).json()["sessions"][0]
            assert row["childPid"] != child and row["state"] == "ready" and row["owned"]  # never fenced
        assert _prompts(tmp_path) == ["before", "after"]
    finally:
        stop_daemon_proc(daemon.proc)
    assert "Traceback" not in daemon.log_text()
