"""The cluster under faults (SPEC X, issue 27), on the real PostgreSQL and moto the scale-out tests
start: one frozen daemon never freezes a healthy one.

The owner is frozen (SIGSTOP) inside its commit transaction, deterministically: the test holds
``LOCK TABLE events`` so the owner's commit waits inside its transaction (its fencing read of the
lease row taken), freezes the owner there, then lets the lock go. The owner's transaction is now
idle, holding the lease row. The healthy daemon keeps its own session, heartbeat and status; a
write to the frozen owner's session is answered with JSON 503 and ``Retry-After`` (never a hang,
never a 500) until PostgreSQL ends the idle transaction, then adopted; the frozen owner's half-done
commit is never written; woken, it stops its child."""

from __future__ import annotations

import asyncio
import hashlib
import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg
import pytest

from services import PostgresCluster, S3Server

from .test_cluster import CLUSTER_TOKEN, LEASE_SECONDS, Stream, ends, two_daemons

pytestmark = pytest.mark.e2e

IDLE_TRANSACTION_SECONDS = 6  # past the lease (2 s): a window where the lease expired, the row is held


@pytest.fixture
def fault_env(pg_url: str, s3_server: S3Server, s3_bucket: str) -> dict[str, str]:
    return {"HOPLINE_STORE_URL": pg_url, "HOPLINE_SIDECAR_URL": f"s3://{s3_bucket}/hopline",
            "HOPLINE_CLUSTER_TOKEN": CLUSTER_TOKEN, "HOPLINE_OWNER_LEASE_SECONDS": str(LEASE_SECONDS),
            "HOPLINE_STORE_IDLE_TRANSACTION_SECONDS": str(IDLE_TRANSACTION_SECONDS),
            "HOPLINE_WARM_CHILDREN": "0", **s3_server.env()}


async def until(condition: Callable[[], bool], timeout: float = 30, what: str = "condition") -> None:
    """Wait for a state the test observes (the store's, a process's), within a deadline."""
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.05)

    try:
        await asyncio.wait_for(poll(), timeout)
    except TimeoutError:
        raise AssertionError(f"never: {what}") from None


def backend_state(pg_url: str, daemon_id: str) -> tuple[str | None, str | None]:
    """(state, wait_event_type) of the daemon's journal writer in pg_stat_activity."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        row = conn.execute("SELECT state, wait_event_type FROM pg_stat_activity WHERE application_name = %s",
                           (f"hopline_{daemon_id}_journal",)).fetchone()
    return (row[0], row[1]) if row else (None, None)


def lease_of(pg_url: str, session_id: str) -> tuple[str, bool]:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        row = conn.execute("SELECT owner, expires_at > now() FROM leases WHERE session_id = %s",
                           (session_id,)).fetchone()
    assert row is not None
    return str(row[0]), bool(row[1])


def assert_json_503(answer: httpx.Response) -> dict[str, Any]:
    assert answer.status_code == 503, answer.text
    assert "retry-after" in answer.headers, answer.text
    assert answer.headers["content-type"].startswith("application/json")
    assert int(answer.headers["retry-after"]) >= 1
    error: dict[str, Any] = answer.json()["error"]
    # the cluster's store errors, or a write the journal could not commit (the prompt path's own)
    assert error["hop"] in ("daemon.cluster", "daemon.journal"), error
    return error


async def test_an_owner_frozen_mid_commit_freezes_no_other_daemon(
        tmp_path: Path, fault_env: dict[str, str], pg_url: str) -> None:
    with two_daemons(tmp_path, fault_env) as (a, b):
        async with a.client() as client_a, b.client(timeout=5) as client_b:  # B answers within 5 s
            frozen_sid = (await client_a.post("/session", json={"cwd": str(tmp_path)})).json()["sessionId"]
            healthy_sid = (await client_b.post("/session", json={"cwd": str(tmp_path)})).json()["sessionId"]
            status_a = (await client_a.get("/daemon/status")).json()
            a_id = status_a["cluster"]["daemon"]
            b_id = (await client_b.get("/daemon/status")).json()["cluster"]["daemon"]
            old_child = next(s["childPid"] for s in status_a["sessions"] if s["sessionId"] == frozen_sid)

            with psycopg.connect(pg_url) as locker:  # a transaction: the lock is held until commit
                locker.execute("LOCK TABLE events IN SHARE MODE")  # inserts wait; reads do not
                sleeping = await client_a.post(f"/session/{frozen_sid}/prompt", json={"text": "sleep 60"})
                assert sleeping.status_code == 202, sleeping.text
                await until(lambda: backend_state(pg_url, a_id) == ("active", "Lock"),
                            what="A's commit waits")
                a.proc.send_signal(signal.SIGSTOP)  # frozen inside its commit transaction
                locker.commit()
            await until(lambda: backend_state(pg_url, a_id)[0] == "idle in transaction", what="A idle in it")
            await until(lambda: not lease_of(pg_url, frozen_sid)[1], what="A's lease expired")

            # B answers: its status, its own session's prompt, while A's transaction holds the row.
            assert (await client_b.get("/daemon/status")).status_code == 200
            stream_b = Stream(b, healthy_sid)
            try:
                mine = await client_b.post(f"/session/{healthy_sid}/prompt", json={"text": "hello"})
                assert mine.status_code == 202, mine.text
                await stream_b.wait_for(ends(mine.json()["promptId"]))
            finally:
                await stream_b.close()

            # A write to A's session: skipped row, 503 + Retry-After while A's transaction lives.
            first = await client_b.post(f"/session/{frozen_sid}/prompt", json={"text": "after freeze"})
            still_held = backend_state(pg_url, a_id)[0] == "idle in transaction"
            if still_held:  # the row was locked throughout this request: it could not adopt
                assert assert_json_503(first)["type"] == "store_busy"
            answers = [first]
            while answers[-1].status_code != 202:
                assert_json_503(answers[-1])
                await until(lambda: backend_state(pg_url, a_id)[0] != "idle in transaction",
                            timeout=IDLE_TRANSACTION_SECONDS + 30, what="PostgreSQL ends A's transaction")
                async with b.client(timeout=60) as adopting:  # an adoption starts and loads a child
                    answers.append(await adopting.post(f"/session/{frozen_sid}/prompt",
                                                       json={"text": "after freeze"}))
            adopted_prompt = answers[-1].json()["promptId"]
            assert lease_of(pg_url, frozen_sid)[0] == b_id
            everything = Stream(b, frozen_sid, last_event_id=0)
            try:
                await everything.wait_for(ends(adopted_prompt))
                cut = await everything.wait_for(ends(sleeping.json()["promptId"], "turn_error"))
                assert cut.data["reason"] == "owner_lost"
            finally:
                await everything.close()

            # B kept its own session all along: lease live and its, nothing lost.
            assert lease_of(pg_url, healthy_sid) == (b_id, True)
            cluster_b = (await client_b.get("/daemon/status")).json()["cluster"]
            assert cluster_b["leasesLost"] == 0 and cluster_b["store"] == "ok"

            a.proc.send_signal(signal.SIGCONT)  # woken: its heartbeat finds the lease taken
            await until(lambda: not psutil.pid_exists(old_child)
                        or psutil.Process(old_child).status() == psutil.STATUS_ZOMBIE, what="old child gone")
            final = Stream(b, frozen_sid, last_event_id=0)
            try:
                await final.wait_for(ends(adopted_prompt))
                assert final.ids == list(range(1, final.ids[-1] + 1))  # gap-free, once each
                # The frozen commit (the old child's "sleeping") was never written.
                assert not any("sleeping" in json.dumps(e.data) for e in final.events)
            finally:
                await final.close()


async def sidecar_of(stream: Stream, prompt_id: str) -> dict[str, Any]:
    await stream.wait_for(ends(prompt_id))
    update = next(e.data["update"] for e in stream.events if e.type == "session_update"
                  and e.data.get("promptId") == prompt_id
                  and (e.data["update"].get("_meta") or {}).get("hopline.sidecar"))
    entry: dict[str, Any] = update["_meta"]["hopline.sidecar"][0]
    return entry


async def assert_sidecar_served(client: httpx.AsyncClient, session_id: str, entry: dict[str, Any]) -> None:
    body = await client.get(f"/session/{session_id}/sidecars/{entry['id']}")
    assert body.status_code == 200, body.text
    assert len(body.content) == entry["bytes"] and hashlib.sha256(body.content).hexdigest() == entry["sha256"]


async def post_until_accepted(client: httpx.AsyncClient, path: str, body: dict[str, Any] | None, *,
                              tries: int = 20,
                              check: Callable[[httpx.Response], Any] = assert_json_503) -> httpx.Response:
    """A write right after a store restart: JSON 503 + Retry-After (each one ``check``-ed) while a
    connection is replaced."""
    for _ in range(tries):
        answer = await client.post(path, json=body)
        if answer.status_code != 503:
            return answer
        check(answer)
        await asyncio.sleep(0.2)
    raise AssertionError("never accepted")


async def test_the_sidecar_index_survives_a_store_restart_on_both_daemons(
        tmp_path: Path, fault_env: dict[str, str], postgres_cluster: PostgresCluster) -> None:
    with two_daemons(tmp_path, fault_env) as (a, b):
        async with a.client() as client_a, b.client() as client_b:
            session_id = (await client_a.post("/session", json={"cwd": str(tmp_path)})).json()["sessionId"]
            stream = Stream(b, session_id)
            try:
                before = await client_b.post(f"/session/{session_id}/prompt", json={"text": "big 300000 b"})
                assert before.status_code == 202, before.text
                old = await sidecar_of(stream, before.json()["promptId"])
                postgres_cluster.restart()  # every connection of both daemons dropped
                # The index's pool checks a connection before use: the first read after it works.
                for client in (client_a, client_b):
                    await assert_sidecar_served(client, session_id, old)
                after = await post_until_accepted(client_b, f"/session/{session_id}/prompt",
                                                  {"text": "big 300000 c"})
                assert after.status_code == 202, after.text
                new = await sidecar_of(stream, after.json()["promptId"])
                assert new["id"] != old["id"]
                for client in (client_a, client_b):
                    await assert_sidecar_served(client, session_id, new)
                truncated = [e for e in stream.events if e.type == "session_update"
                             and "disk_error" in json.dumps(e.data)]
                assert not truncated  # stored whole, not cut for a "disk error"
            finally:
                await stream.close()


async def test_a_write_forwarded_to_a_frozen_owner_runs_once(
        tmp_path: Path, fault_env: dict[str, str], pg_url: str) -> None:
    actions = tmp_path / "actions.log"
    env = {**fault_env, "BIG_AGENT_ACTION_LOG": str(actions)}
    with two_daemons(tmp_path, env, args=("--agent-env", "BIG_AGENT_ACTION_LOG")) as (a, b):
        async with a.client() as client_a, b.client(timeout=60) as client_b:
            session_id = (await client_a.post("/session", json={"cwd": str(tmp_path)})).json()["sessionId"]
            status_a = (await client_a.get("/daemon/status")).json()
            old_child = next(s["childPid"] for s in status_a["sessions"] if s["sessionId"] == session_id)
            a.proc.send_signal(signal.SIGSTOP)  # frozen: B's forward reaches A's socket, unanswered
            stream = Stream(b, session_id)
            try:
                # B forwards to A, waits out A's lease, adopts and runs the prompt itself.
                accepted = await client_b.post(f"/session/{session_id}/prompt", json={"text": "once-only 1"})
                assert accepted.status_code == 202, accepted.text
                await stream.wait_for(ends(accepted.json()["promptId"]))
            finally:
                await stream.close()
            b_id = (await client_b.get("/daemon/status")).json()["cluster"]["daemon"]
            assert lease_of(pg_url, session_id)[0] == b_id
            a.proc.send_signal(signal.SIGCONT)  # A now reads the stale forwarded write
            await until(lambda: not psutil.pid_exists(old_child)
                        or psutil.Process(old_child).status() == psutil.STATUS_ZOMBIE,
                        timeout=2 * LEASE_SECONDS + 30, what="the old owner's child gone")

            async def refused() -> bool:
                cluster_a = (await client_a.get("/daemon/status")).json()["cluster"]
                return bool(cluster_a["staleWritesRefused"] >= 1)

            for _ in range(600):  # A answered the stale write (refused) before we count executions
                if await refused():
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("A never handled the stale forwarded write")
            runs = [line for line in actions.read_text().splitlines() if line.endswith(" once-only 1")]
            assert len(runs) == 1, runs  # one execution, by one agent process
            assert runs[0].split()[0] != str(old_child)  # the adopter's child ran it, never the old one
            with psycopg.connect(pg_url, autocommit=True) as conn:  # no phantom open prompt left
                assert conn.execute("SELECT COUNT(*) FROM prompts").fetchone() == (0,)
            # A forwards a new write to the owner B; it runs once more, on B.
            again = await client_a.post(f"/session/{session_id}/prompt", json={"text": "once-only 2"})
            assert again.status_code == 202, again.text


def chunk_numbers(stream: Stream, prompt_id: str) -> list[int]:
    numbers = []
    for event in stream.events:
        if event.type != "session_update" or event.data.get("promptId") != prompt_id:
            continue
        text = ((event.data["update"].get("content") or {}).get("text") or "")
        if text.startswith("chunk "):
            numbers.append(int(text.split()[1]))
    return numbers


async def test_a_store_restart_mid_stream_loses_no_chunk_on_any_daemon(
        tmp_path: Path, fault_env: dict[str, str], postgres_cluster: PostgresCluster) -> None:
    count = 300
    # A restart shorter than the lease: the owner keeps acting (past lease x 2/3 since its last
    # renewal it would stop its agent and end the turn, T-11)
    env = {**fault_env, "HOPLINE_OWNER_LEASE_SECONDS": "10"}
    with two_daemons(tmp_path, env) as (a, b):
        async with a.client() as client_a:
            session_id = (await client_a.post("/session", json={"cwd": str(tmp_path)})).json()["sessionId"]
            readers = [Stream(a, session_id), Stream(b, session_id)]  # the owner's and another daemon's
            try:
                accepted = await client_a.post(f"/session/{session_id}/prompt",
                                               json={"text": f"paced {count} 200 10"})
                assert accepted.status_code == 202, accepted.text
                prompt_id = accepted.json()["promptId"]
                for reader in readers:  # mid-stream on both daemons
                    await reader.wait_for(lambda e: e.type == "session_update"
                                          and "chunk 20 " in json.dumps(e.data))
                await asyncio.to_thread(postgres_cluster.restart)  # every connection dropped
                for reader in readers:
                    end = await reader.wait_for(ends(prompt_id), timeout=120)
                    dropped = [e for e in reader.events if e.type == "frame_dropped"]
                    assert not dropped, dropped  # nothing lost, so nothing to report
                    assert end.data["lostBytes"] == 0 and end.data["degraded"] is False
                    assert chunk_numbers(reader, prompt_id) == list(range(count))  # each once, in order
                    assert reader.ids == list(range(reader.ids[0], reader.ids[-1] + 1))  # gap-free
                status = (await client_a.get("/daemon/status")).json()
                assert status["journal"]["failedEvents"] == 0
            finally:
                for reader in readers:
                    await reader.close()


async def test_routes_answer_json_503_while_the_store_is_away(
        tmp_path: Path, fault_env: dict[str, str], postgres_cluster: PostgresCluster) -> None:
    with two_daemons(tmp_path, fault_env) as (a, b):
        async with a.client() as client_a, b.client() as client_b:
            session_id = (await client_a.post("/session", json={"cwd": str(tmp_path)})).json()["sessionId"]
            await asyncio.to_thread(postgres_cluster.stop_server)
            try:
                for client in (client_a, client_b):  # the owner and the other daemon
                    assert_json_503(await client.post(f"/session/{session_id}/prompt", json={"text": "hi"}))
                    status = await client.get("/daemon/status")
                    assert status.status_code == 200 and status.json()["cluster"]["store"] == "unavailable"
                answer = await client_b.get(f"/session/{session_id}/events")
                assert_json_503(answer)
            finally:
                await asyncio.to_thread(postgres_cluster.start_server)
            stream = Stream(b, session_id)
            try:
                accepted = await post_until_accepted(client_b, f"/session/{session_id}/prompt",
                                                     {"text": "back"})
                assert accepted.status_code == 202, accepted.text
                await stream.wait_for(ends(accepted.json()["promptId"]))
            finally:
                await stream.close()


async def test_a_killed_owner_is_adopted_on_lease_expiry_without_a_write(
        tmp_path: Path, fault_env: dict[str, str], pg_url: str) -> None:
    with two_daemons(tmp_path, fault_env) as (a, b):
        async with a.client() as client_a, b.client() as client_b:
            session_id = (await client_a.post("/session", json={"cwd": str(tmp_path)})).json()["sessionId"]
            stream = Stream(b, session_id)  # a reader on B; nobody writes after the kill
            try:
                running = await client_a.post(f"/session/{session_id}/prompt", json={"text": "sleep 60"})
                assert running.status_code == 202, running.text
                prompt_id = running.json()["promptId"]
                await stream.wait_for(lambda e: e.type == "session_update"
                                      and e.data.get("promptId") == prompt_id)
                a.proc.send_signal(signal.SIGKILL)
                a.proc.wait(10)
                cut = await stream.wait_for(ends(prompt_id, "turn_error"))
                assert cut.data["reason"] == "owner_lost"
                adopted = await stream.wait_for(lambda e: e.type == "session_adopted")
                assert adopted.data["endedPrompts"] == 1 and cut.id is not None and adopted.id is not None
                assert cut.id < adopted.id
                b_id = (await client_b.get("/daemon/status")).json()["cluster"]["daemon"]
                assert lease_of(pg_url, session_id) == (b_id, True)
                nxt = await client_b.post(f"/session/{session_id}/prompt", json={"text": "next"})
                assert nxt.status_code == 202, nxt.text  # served by the adopter, not forwarded
                await stream.wait_for(ends(nxt.json()["promptId"]))
                assert stream.ids == list(range(stream.ids[0], stream.ids[-1] + 1))
            finally:
                await stream.close()
            cluster_b = (await client_b.get("/daemon/status")).json()["cluster"]
            assert cluster_b["adoptedSessions"] == 1 and cluster_b["forwardedWrites"] == 0
