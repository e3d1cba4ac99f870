"""Several daemons on one PostgreSQL store and one S3 bucket (SPEC X): real `hopline serve` processes,
the session's throwaway PostgreSQL cluster (a fresh database per test) and moto's S3 server.

Reads on any daemon, writes forwarded to the owner, large tool output from the other daemon's
sidecar route (sha256 checked), the owner killed mid-turn and the session adopted (the old turn
ends ``owner_lost``, a resuming client sees every event once, ids gap-free), an agent without
``loadSession`` adopted with ``session/new``, a paused owner that finds its lease taken stopping its
child, and the lease's compare-and-set with exactly one winner."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from hopline.budget import Budget
from hopline.daemon.cluster import Cluster
from hopline.store.postgres import migrate
from services import PG_PASSWORD, S3_SECRET_KEY, S3Server

from .support import Daemon, SseEvent, iter_sse, start_daemon, stop_daemon_proc

pytestmark = pytest.mark.e2e

CLUSTER_TOKEN = "cluster-test-token-5d21"
LEASE_SECONDS = 2


@pytest.fixture
def cluster_env(pg_url: str, s3_server: S3Server, s3_bucket: str) -> dict[str, str]:
    return {"HOPLINE_STORE_URL": pg_url, "HOPLINE_SIDECAR_URL": f"s3://{s3_bucket}/hopline",
            "HOPLINE_CLUSTER_TOKEN": CLUSTER_TOKEN, "HOPLINE_OWNER_LEASE_SECONDS": str(LEASE_SECONDS),
            "HOPLINE_WARM_CHILDREN": "0", **s3_server.env()}


@contextlib.contextmanager
def two_daemons(tmp_path: Path, env: dict[str, str], **kwargs: Any) -> Iterator[tuple[Daemon, Daemon]]:
    started: list[Daemon] = []
    try:
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            started.append(start_daemon(tmp_path / name, data_dir=tmp_path / name / "data", env=env,
                                        log_name="daemon.log", **kwargs))
        yield started[0], started[1]
    finally:
        for daemon in started:
            if daemon.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(daemon.proc.pid, signal.SIGCONT)
            stop_daemon_proc(daemon.proc)


class Stream:
    """One SSE reader in the background, collecting every event."""

    def __init__(self, daemon: Daemon, session_id: str, last_event_id: int | None = None) -> None:
        self.events: list[SseEvent] = []
        self._changed = asyncio.Event()
        self._client = daemon.client(timeout=60)
        headers = {} if last_event_id is None else {"Last-Event-ID": str(last_event_id)}
        self._task = asyncio.ensure_future(self._run(session_id, headers))

    async def _run(self, session_id: str, headers: dict[str, str]) -> None:
        async with self._client.stream("GET", f"/session/{session_id}/events", headers=headers) as response:
            assert response.status_code == 200
            async for event in iter_sse(response):
                self.events.append(event)
                self._changed.set()

    async def wait_for(self, predicate: Any, timeout: float = 30) -> SseEvent:
        async def scan() -> SseEvent:
            while True:
                for event in self.events:
                    if predicate(event):
                        return event
                self._changed.clear()
                if self._task.done():
                    self._task.result()
                    raise AssertionError("the stream ended")
                await self._changed.wait()

        return await asyncio.wait_for(scan(), timeout)

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(BaseException):
            await self._task
        await self._client.aclose()

    @property
    def ids(self) -> list[int]:
        return [e.id for e in self.events if e.id is not None]


def ends(prompt_id: str, kind: str = "turn_complete") -> Any:
    return lambda e: e.type == kind and e.data.get("promptId") == prompt_id


async def prompt_until_accepted(client: httpx.AsyncClient, session_id: str,
                                text: str) -> tuple[str, list[int]]:
    """Post a prompt, retrying while the dead owner's lease has not expired (503 and Retry-After):
    the prompt id and the statuses seen."""
    statuses: list[int] = []
    for _ in range(60):
        answer = await client.post(f"/session/{session_id}/prompt", json={"text": text})
        statuses.append(answer.status_code)
        if answer.status_code == 202:
            return str(answer.json()["promptId"]), statuses
        assert answer.status_code == 503, answer.text
        error = answer.json()["error"]
        assert error["type"] == "owner_unreachable" and error["hop"] == "daemon.cluster"
        assert int(answer.headers["retry-after"]) >= 1
        await asyncio.sleep(0.25)
    raise AssertionError(f"never accepted: {statuses}")


async def test_two_daemons_share_sessions_and_adopt_a_killed_owner(
        tmp_path: Path, cluster_env: dict[str, str], s3_server: S3Server, s3_bucket: str) -> None:
    with two_daemons(tmp_path, cluster_env) as (a, b):
        async with a.client() as client_a, b.client() as client_b:
            created = await client_a.post("/session", json={"cwd": str(tmp_path)})
            assert created.status_code == 200, created.text
            session_id = created.json()["sessionId"]
            stream = Stream(b, session_id)  # read on B, owned by A
            try:
                # A write posted to B reaches the owner A, whose answer B relays.
                accepted = await client_b.post(f"/session/{session_id}/prompt", json={"text": "big 300000 q"})
                assert accepted.status_code == 202, accepted.text
                first = accepted.json()["promptId"]
                await stream.wait_for(ends(first))
                # The large tool output went to the bucket; B serves it from its sidecar route.
                update = next(e.data["update"] for e in stream.events if e.type == "session_update"
                              and (e.data["update"].get("_meta") or {}).get("hopline.sidecar"))
                entry = update["_meta"]["hopline.sidecar"][0]
                body = await client_b.get(f"/session/{session_id}/sidecars/{entry['id']}")
                assert body.status_code == 200 and len(body.content) == entry["bytes"] >= 300000
                assert hashlib.sha256(body.content).hexdigest() == entry["sha256"]
                assert any(key.startswith("hopline/blobs/") for key in s3_server.keys(s3_bucket))
                status = (await client_b.get("/daemon/status")).json()
                daemons = status["cluster"]["daemons"]
                assert len(daemons) == 2 and all(d["live"] for d in daemons)
                owner = next(d for d in daemons if d["leases"] == 1)
                assert owner["sessions"] == [session_id] and not owner["self"]  # A holds it, seen from B

                # A is killed mid-turn.
                running = (await client_b.post(f"/session/{session_id}/prompt", json={"text": "sleep 60"}))
                assert running.status_code == 202, running.text
                cut = running.json()["promptId"]
                await stream.wait_for(lambda e: e.type == "session_update" and e.data.get("promptId") == cut)
                seen_before_kill = stream.ids[-1]
                a.proc.send_signal(signal.SIGKILL)
                a.proc.wait(10)

                # The next prompt to B: refused while A's lease lives (503, Retry-After), then adopted.
                after, statuses = await prompt_until_accepted(client_b, session_id, "after adoption")
                assert statuses[-1] == 202
                lost = await stream.wait_for(ends(cut, "turn_error"))
                assert lost.data["reason"] == "owner_lost" and lost.data["origin"] == "daemon"
                adopted = await stream.wait_for(lambda e: e.type == "session_adopted")
                assert adopted.data["restoredWith"] == "session/load" and adopted.data["agentMemoryRestored"]
                assert adopted.data["endedPrompts"] == 1
                await stream.wait_for(ends(after))
                assert lost.id is not None and adopted.id is not None and lost.id < adopted.id
            finally:
                await stream.close()

            # A client on B that resumes with Last-Event-ID sees every later event once, in order.
            resumed = Stream(b, session_id, last_event_id=seen_before_kill)
            try:
                await resumed.wait_for(ends(after))
                assert resumed.ids == list(range(seen_before_kill + 1, resumed.ids[-1] + 1))
            finally:
                await resumed.close()
            everything = Stream(b, session_id, last_event_id=0)
            try:
                await everything.wait_for(ends(after))
                assert everything.ids == list(range(1, everything.ids[-1] + 1))  # gap-free from 1
                assert everything.ids[-1] == stream.ids[-1]  # and the live reader saw them all
                assert [e.id for e in stream.events if e.id is not None] == everything.ids
            finally:
                await everything.close()
            status = (await client_b.get("/daemon/status")).json()["cluster"]
            assert status["adoptedSessions"] == 1 and status["forwardedWrites"] >= 2
            # The forwarding header without the cluster credential is refused (the client token is not it).
            posing = await client_b.post(f"/session/{session_id}/cancel",
                                         headers={"x-hopline-forwarded-by": "d_fake"})
            assert posing.status_code == 401 and posing.json()["error"]["hop"] == "daemon.cluster"
            metrics = (await client_b.get("/metrics")).text
            assert f'daemon="{status["daemon"]}"' in metrics and "hopline_cluster_daemons" in metrics
    for daemon in (a, b):  # no secret in the daemons' logs
        log = daemon.log_text()
        for secret in (PG_PASSWORD, S3_SECRET_KEY, CLUSTER_TOKEN, session_id):
            assert secret not in log


async def test_an_agent_without_load_is_adopted_with_new_and_a_paused_owner_stops_its_child(
        tmp_path: Path, cluster_env: dict[str, str]) -> None:
    env = {**cluster_env, "BIG_AGENT_NO_LOAD": "1"}
    with two_daemons(tmp_path, env, args=("--agent-env", "BIG_AGENT_NO_LOAD")) as (a, b):
        async with a.client() as client_a, b.client() as client_b:
            created = await client_a.post("/session", json={"cwd": str(tmp_path)})
            assert created.status_code == 200, created.text
            session_id = created.json()["sessionId"]
            sessions = (await client_a.get("/daemon/status")).json()["sessions"]
            child_pid = next(s["childPid"] for s in sessions if s["sessionId"] == session_id)
            assert psutil.pid_exists(child_pid)
            environ = Path(f"/proc/{child_pid}/environ").read_bytes().decode(errors="replace")
            for secret in (PG_PASSWORD, S3_SECRET_KEY, CLUSTER_TOKEN):  # no store credential in a child
                assert secret not in environ
            assert "HOPLINE_STORE_URL" not in environ and "AWS_" not in environ
            a.proc.send_signal(signal.SIGSTOP)  # partitioned away: alive, silent
            stream = Stream(b, session_id)
            try:
                prompt_id, _ = await prompt_until_accepted(client_b, session_id, "hello")
                adopted = await stream.wait_for(lambda e: e.type == "session_adopted")
                assert adopted.data["restoredWith"] == "session/new"
                assert adopted.data["agentMemoryRestored"] is False
                assert "not restored" in adopted.data["message"]
                await stream.wait_for(ends(prompt_id))
            finally:
                await stream.close()
            a.proc.send_signal(signal.SIGCONT)  # back: its heartbeat finds the lease taken

            async def child_gone() -> None:
                while psutil.pid_exists(child_pid) and psutil.Process(child_pid).status() != "zombie":
                    await asyncio.sleep(0.1)

            await asyncio.wait_for(child_gone(), 30)
            status = (await client_a.get("/daemon/status")).json()
            assert status["cluster"]["leasesLost"] == 1
            mine = next(s for s in status["sessions"] if s["sessionId"] == session_id)
            assert mine["childPid"] is None and mine["owned"] is False
            # A write to A now goes to B, the owner.
            again = await client_a.post(f"/session/{session_id}/prompt", json={"text": "via a"})
            assert again.status_code == 202, again.text


async def test_two_daemons_racing_to_adopt_exactly_one_wins(pg_url: str) -> None:
    migrate(pg_url)
    budget = Budget.defaults().replace(owner_lease_seconds=1)
    clusters = [Cluster(pg_url, budget, daemon_id=f"d_{i}", advertise_url=f"http://127.0.0.1:{i}",
                        token="t") for i in range(2)]
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        for i in range(20):  # twenty sessions whose owner died: leases expired
            conn.execute("INSERT INTO leases VALUES (%s, 'dead', 1, now() - interval '1 s')", (f"s{i}",))
    from hopline.errors import StoreBusy

    async def attempt(cluster: Cluster, session_id: str) -> bool:
        try:
            return await cluster.try_adopt(session_id)
        except StoreBusy:  # the other's compare-and-set held the row: skipped, not waited on
            return False

    try:
        for i in range(20):
            results = await asyncio.gather(*(attempt(c, f"s{i}") for c in clusters))
            assert sorted(results) == [False, True], results
            owner = await clusters[0].owner_of(f"s{i}")
            winner = clusters[results.index(True)].daemon_id
            assert owner is not None and owner.daemon_id == winner and owner.live
            assert not await clusters[1 - results.index(True)].try_adopt(f"s{i}")  # live: not taken
    finally:
        for cluster in clusters:
            await cluster.close_connections()


@pytest.mark.parametrize(("store", "extra", "code", "needle"), [
    ("mysql://u:pw-canary@h/db", {}, 2, b"HOPLINE_STORE_URL='mysql://u:***@h/db'"),
    ("postgresql://u:pw-canary@127.0.0.1:1/db", {}, 2, b"HOPLINE_CLUSTER_TOKEN must be set"),
    ("postgresql://u:pw-canary@127.0.0.1:1/db",
     {"HOPLINE_CLUSTER_TOKEN": "t", "HOPLINE_ADVERTISE_URL": "http://0.0.0.0:8765"},
     2, b"HOPLINE_ADVERTISE_URL must name where"),
    ("postgresql://u:pw-canary@127.0.0.1:1/db", {"HOPLINE_CLUSTER_TOKEN": "t"}, 1, b"could not be reached"),
])
def test_serve_refuses_a_store_it_cannot_use_naming_the_setting_never_the_password(
        tmp_path: Path, store: str, extra: dict[str, str], code: int, needle: bytes) -> None:
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "HOPLINE_CLUSTER_TOKEN"} | extra
    result = subprocess.run([sys.executable, "-m", "hopline", "serve", "--port", "0", "--data-dir",
                             str(tmp_path), "--store", store], env=env, capture_output=True, timeout=60)
    assert result.returncode == code, result.stderr
    assert needle in result.stderr and b"pw-canary" not in result.stderr + result.stdout
    assert b"listening" not in result.stdout
