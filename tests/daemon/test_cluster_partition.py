"""The cluster under a partition (SPEC T-11, X), on the real PostgreSQL the scale-out tests start.

Daemon A reaches the store through a TCP proxy that can black-hole it (it stops forwarding but keeps
every socket open: what a real partition or a hung load balancer looks like; a stopped server
refuses connections instead). B reaches the store directly. The lease is 3 s: A must stop its agent
(freeze, then kill) before the store can hand the session to B, so that no step of A's agent lands
after B adopted it (asserted by process id, from the agent's own log of its steps), and A answers
every write within the request deadline (1 s here: asserted before 3x it). A stopped server is
answered the same way; a daemon with another cluster credential is refused at start."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import psutil
import psycopg
import pytest

from services import PG_PASSWORD, HangingProxy, PostgresCluster

from .support import Daemon, start_daemon, stop_daemon_proc
from .test_cluster import CLUSTER_TOKEN, Stream
from .test_cluster_faults import assert_json_503, until

pytestmark = pytest.mark.e2e

LEASE_SECONDS = 3
DEADLINE = 1.0  # HOPLINE_STORE_REQUEST_DEADLINE_SECONDS: every answer asserted before 3x it


def through(url: str, port: int) -> str:
    """``url`` with its port replaced (the proxy's)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit(":", 1)[0] + f":{port}"))


def env_for(store_url: str, actions: Path) -> dict[str, str]:
    return {"HOPLINE_STORE_URL": store_url, "HOPLINE_CLUSTER_TOKEN": CLUSTER_TOKEN,
            "HOPLINE_OWNER_LEASE_SECONDS": str(LEASE_SECONDS), "HOPLINE_WARM_CHILDREN": "0",
            "HOPLINE_STORE_REQUEST_DEADLINE_SECONDS": str(DEADLINE),
            "HOPLINE_AGENT_ENV": "BIG_AGENT_ACTION_LOG", "BIG_AGENT_ACTION_LOG": str(actions)}


def daemon_in(tmp_path: Path, name: str, env: dict[str, str]) -> Daemon:
    (tmp_path / name).mkdir()
    return start_daemon(tmp_path / name, data_dir=tmp_path / name / "data", env=env)


async def timed(call: Any) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    answer = await call
    return answer, time.monotonic() - started


def actions_of(actions: Path) -> list[tuple[int, str, float]]:
    """(pid, what, unix time) of every step and load the agents logged."""
    out = []
    for line in actions.read_text().splitlines():
        words = line.split()
        if len(words) >= 3 and words[1] in ("step", "load"):
            out.append((int(words[0]), words[1], float(words[-1])))
    return out


def loads_by_others(actions: Path, pid: int) -> list[float]:
    """When agents other than ``pid`` loaded the session (an adoption's restore)."""
    return [t for who, what, t in actions_of(actions) if what == "load" and who != pid]


def gone(pid: int) -> bool:
    return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


@pytest.fixture
def proxy(postgres_cluster: PostgresCluster) -> Iterator[HangingProxy]:
    with HangingProxy(postgres_cluster.port) as running:
        yield running


async def test_a_partitioned_owner_stops_its_agent_before_another_daemon_adopts(
        tmp_path: Path, pg_url: str, proxy: HangingProxy) -> None:
    actions = tmp_path / "actions.log"
    a = daemon_in(tmp_path, "a", env_for(through(pg_url, proxy.port), actions))
    b = daemon_in(tmp_path, "b", env_for(pg_url, actions))
    try:
        async with a.client(timeout=30) as client_a, b.client(timeout=30) as client_b:
            sid = (await client_a.post("/session", json={"cwd": str(tmp_path)})).json()["sessionId"]
            a_child = next(s["childPid"] for s in (await client_a.get("/daemon/status")).json()["sessions"]
                           if s["sessionId"] == sid)
            reader = Stream(b, sid)
            try:
                running = await client_a.post(f"/session/{sid}/prompt", json={"text": "steps 2000 20"})
                assert running.status_code == 202, running.text
                await reader.wait_for(lambda e: e.type == "session_update" and "step 5" in str(e.data))
                proxy.hang()  # A's packets go nowhere; its sockets stay open
                partitioned_at = time.time()

                # A answers every write within the deadline: hopline's JSON 503 with Retry-After.
                answer, took = await timed(client_a.post(f"/session/{sid}/prompt", json={"text": "echo x"}))
                assert_json_503(answer)
                assert answer.json()["error"]["type"] == "storage_unavailable"
                assert took < 3 * DEADLINE, f"answered after {took:.1f} s"
                answer, took = await timed(client_a.get(f"/session/{sid}/transcript"))
                assert_json_503(answer) and took < 3 * DEADLINE

                # A steps down (its renewals go unanswered) and B adopts the expired lease.
                await until(lambda: bool(loads_by_others(actions, a_child)), timeout=6 * LEASE_SECONDS,
                            what="B's agent loaded the session")
                adopted_at = loads_by_others(actions, a_child)[0]
                status_a = (await client_a.get("/daemon/status")).json()["cluster"]
                assert status_a["steppedDown"] and status_a["stepDowns"] >= 1, status_a
                assert gone(a_child)
                more = await client_b.post(f"/session/{sid}/prompt", json={"text": "steps 20 10"})
                assert more.status_code == 202, more.text
                await reader.wait_for(lambda e: e.type == "turn_complete"
                                      and e.data.get("promptId") == more.json()["promptId"], timeout=30)
                await asyncio.sleep(LEASE_SECONDS)  # partitioned a while more, then healed
            finally:
                proxy.forward()
                await reader.close()

            a_steps = [t for pid, what, t in actions_of(actions) if pid == a_child and what == "step"]
            b_steps = [t for pid, what, t in actions_of(actions) if pid != a_child and what == "step"]
            assert a_steps and b_steps
            assert max(a_steps) < adopted_at, "a step of A's agent landed after B adopted the session"
            assert max(a_steps) < partitioned_at + LEASE_SECONDS  # frozen before the lease could pass
            cut = await Stream(b, sid, last_event_id=0).wait_for(
                lambda e: e.type == "turn_error" and e.data.get("promptId") == running.json()["promptId"])
            assert cut.data["reason"] == "owner_lost"

            # Healed: A learns it lost the session and forwards to B; it steps up again.
            async def a_forwards() -> bool:
                answer = await client_a.post(f"/session/{sid}/prompt", json={"text": "echo healed"})
                return answer.status_code == 202

            deadline = time.monotonic() + 10 * LEASE_SECONDS
            while not await a_forwards():
                assert time.monotonic() < deadline, "A never forwarded to B after the partition healed"
                await asyncio.sleep(0.25)
            status_a = (await client_a.get("/daemon/status")).json()["cluster"]
            assert not status_a["steppedDown"]
    finally:
        for daemon in (a, b):
            stop_daemon_proc(daemon.proc)


async def test_a_stopped_server_is_answered_503_within_the_deadline(
        tmp_path: Path, pg_url: str, postgres_cluster: PostgresCluster) -> None:
    a = daemon_in(tmp_path, "a", env_for(pg_url, tmp_path / "actions.log"))
    try:
        async with a.client(timeout=30) as client:
            sid = (await client.post("/session", json={"cwd": str(tmp_path)})).json()["sessionId"]
            await asyncio.to_thread(postgres_cluster.stop_server)
            try:
                for call in (client.post(f"/session/{sid}/prompt", json={"text": "echo x"}),
                             client.post(f"/session/{sid}/cancel"),
                             client.get(f"/session/{sid}/transcript")):
                    answer, took = await timed(call)
                    if answer.status_code == 409:  # the cancel: nothing running, said at once
                        continue
                    assert_json_503(answer)
                    assert took < 3 * DEADLINE, f"{answer.request.url.path} answered after {took:.1f} s"
            finally:
                await asyncio.to_thread(postgres_cluster.start_server)
    finally:
        stop_daemon_proc(a.proc)


def test_a_daemon_with_another_cluster_credential_is_refused_at_start(tmp_path: Path, pg_url: str) -> None:
    first = daemon_in(tmp_path, "a", env_for(pg_url, tmp_path / "actions.log"))
    try:
        wrong = "not-the-cluster-token-9e1f"
        env = {**os.environ, **env_for(pg_url, tmp_path / "actions.log"), "HOPLINE_CLUSTER_TOKEN": wrong}
        result = subprocess.run([sys.executable, "-m", "hopline", "serve", "--port", "0", "--data-dir",
                                 str(tmp_path / "b")], env=env, capture_output=True, timeout=60)
        assert result.returncode == 2, result.stderr
        assert b"HOPLINE_CLUSTER_TOKEN" in result.stderr and b"listening" not in result.stdout
        for secret in (wrong.encode(), CLUSTER_TOKEN.encode(), PG_PASSWORD.encode()):
            assert secret not in result.stderr + result.stdout
        with psycopg.connect(pg_url, autocommit=True) as conn:
            assert conn.execute("SELECT count(*) FROM daemons").fetchone() == (1,)  # it never joined
            stored = conn.execute("SELECT token_sha256 FROM cluster_credential").fetchone()
        assert stored is not None and CLUSTER_TOKEN not in stored[0]  # a digest, never the credential
    finally:
        stop_daemon_proc(first.proc)
