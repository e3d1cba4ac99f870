"""Idempotent writes on one daemon (SPEC T-12): a real `hopline serve` on its SQLite journal and the
tests' ACP agent, which writes every prompt it gets to a file.

The same Idempotency-Key and request get the first answer (``Idempotent-Replayed: true``) and run
nothing, also after a restart; another request with the key gets 422 naming the header; the key's
length is bounded (at the limit and one over), the keys stored too (then 503, the expired ones
purged first), and expired keys are purged from the store."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from .support import Daemon, read_events, running_daemon, start_daemon, stop_daemon_proc

pytestmark = pytest.mark.e2e  # every test here starts real processes

KEY = "Idempotency-Key"


def agent_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"HOPLINE_AGENT_ENV": "BIG_AGENT_PROMPT_LOG", "HOPLINE_WARM_CHILDREN": "0",
            "BIG_AGENT_PROMPT_LOG": str(tmp_path / "prompts.log"), **extra}


def prompts_seen(tmp_path: Path) -> list[str]:
    log = tmp_path / "prompts.log"
    return log.read_text().splitlines() if log.exists() else []


def stored_keys(daemon: Daemon) -> int:
    with sqlite3.connect(f"file:{daemon.data_dir / 'journal.sqlite3'}?mode=ro", uri=True) as db:
        return int(db.execute("SELECT count(*) FROM idempotency_keys").fetchone()[0])


async def turn_done(client: httpx.AsyncClient, session_id: str, prompt_id: str) -> None:
    await asyncio.wait_for(read_events(client, session_id, lambda e: e.type in ("turn_complete", "turn_error")
                                       and e.data.get("promptId") == prompt_id), 30)


def error_of(response: httpx.Response, status: int, kind: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["type"] == kind and error["hop"] == "daemon.api", error
    return error


async def test_a_retried_write_runs_once_and_another_request_with_its_key_is_refused(tmp_path: Path) -> None:
    with running_daemon(tmp_path, env=agent_env(tmp_path)) as daemon:
        async with daemon.client() as client:
            create = {KEY: "create-1"}
            first = await client.post("/session", json={"cwd": str(tmp_path)}, headers=create)
            again = await client.post("/session", json={"cwd": str(tmp_path)}, headers=create)
            assert first.status_code == again.status_code == 200 and first.json() == again.json()
            assert "idempotent-replayed" not in first.headers
            assert again.headers["idempotent-replayed"] == "true"
            session_id = first.json()["sessionId"]
            assert len((await client.get("/daemon/status")).json()["sessions"]) == 1
            other = await client.post("/session", json={"cwd": "/"}, headers=create)
            assert error_of(other, 422, "idempotency_key_reused")["header"] == KEY
            assert KEY in other.json()["error"]["message"]

            prompt = {KEY: "prompt-1"}
            route = f"/session/{session_id}/prompt"
            answers = [await client.post(route, json={"text": "once"}, headers=prompt) for _ in range(3)]
            assert {a.status_code for a in answers} == {202}
            assert len({a.json()["promptId"] for a in answers}) == 1
            # the same body spaced otherwise is the same request
            respaced = await client.post(route, content=b'{ "text" : "once" }',
                                         headers={**prompt, "content-type": "application/json"})
            assert respaced.json() == answers[0].json()
            for body, target in (({"text": "other"}, route), (None, f"/session/{session_id}/cancel")):
                error_of(await client.post(target, json=body, headers=prompt), 422, "idempotency_key_reused")
            await turn_done(client, session_id, answers[0].json()["promptId"])

            cancel = {KEY: "cancel-1"}
            cancels = [await client.post(f"/session/{session_id}/cancel", headers=cancel) for _ in range(2)]
            assert [c.json() for c in cancels] == [{"cancelled": False}] * 2
            page = (await client.get(f"/session/{session_id}/transcript")).json()["events"]
            assert [e["type"] for e in page].count("cancel_requested") == 1
            assert [e["type"] for e in page].count("turn_complete") == 1
        assert prompts_seen(tmp_path) == ["once"]


async def test_a_permission_answer_retried_gets_the_first_outcome(tmp_path: Path) -> None:
    with running_daemon(tmp_path, env=agent_env(tmp_path)) as daemon:
        async with daemon.client() as client:
            session_id = (await client.post("/session", json={"cwd": str(tmp_path)})).json()["sessionId"]
            asking = await client.post(f"/session/{session_id}/prompt", json={"text": "permission"})
            prompt_id = asking.json()["promptId"]
            asked = await asyncio.wait_for(read_events(client, session_id,
                                                       lambda e: e.type == "permission_request"), 30)
            request = asked[-1].data
            route = f"/session/{session_id}/permission/{request['requestId']}"
            option = request["options"][0]["optionId"]
            key = {KEY: "permission-1"}
            answers = [await client.post(route, json={"optionId": option}, headers=key) for _ in range(2)]
            assert [a.status_code for a in answers] == [200, 200] and answers[0].json() == answers[1].json()
            assert answers[1].headers["idempotent-replayed"] == "true"
            unkeyed = await client.post(route, json={"optionId": option})  # without the key: no replay
            assert unkeyed.status_code == 404
            await turn_done(client, session_id, prompt_id)
            page = (await client.get(f"/session/{session_id}/transcript")).json()["events"]
            assert [e["type"] for e in page].count("permission_resolved") == 1


async def test_a_key_holds_across_a_restart(tmp_path: Path) -> None:
    env = agent_env(tmp_path)
    daemon = start_daemon(tmp_path, env=env)
    try:
        async with daemon.client() as client:
            session_id = (await client.post("/session", json={"cwd": str(tmp_path)})).json()["sessionId"]
            first = await client.post(f"/session/{session_id}/prompt", json={"text": "before"},
                                      headers={KEY: "survives"})
            await turn_done(client, session_id, first.json()["promptId"])
    finally:
        stop_daemon_proc(daemon.proc)
    daemon = start_daemon(tmp_path, env=env, data_dir=daemon.data_dir)
    try:
        async with daemon.client() as client:
            again = await client.post(f"/session/{session_id}/prompt", json={"text": "before"},
                                      headers={KEY: "survives"})
            assert again.status_code == 202 and again.json() == first.json()
            assert again.headers["idempotent-replayed"] == "true"
            refused = await client.post(f"/session/{session_id}/prompt", json={"text": "after"},
                                        headers={KEY: "survives"})
            error_of(refused, 422, "idempotency_key_reused")
    finally:
        stop_daemon_proc(daemon.proc)
    assert prompts_seen(tmp_path) == ["before"]


async def test_the_keys_length_and_the_keys_stored_are_bounded(tmp_path: Path) -> None:
    with running_daemon(tmp_path, env=agent_env(tmp_path, HOPLINE_IDEMPOTENCY_MAX_KEYS="2")) as daemon:
        async with daemon.client() as client:
            session_id = (await client.post("/session", json={"cwd": str(tmp_path)})).json()["sessionId"]
            route = f"/session/{session_id}/cancel"
            at_limit = await client.post(route, headers={KEY: "k" * 255})
            assert at_limit.status_code == 200, at_limit.text
            over = error_of(await client.post(route, headers={KEY: "k" * 256}), 400,
                            "idempotency_key_too_long")
            assert (over["limit"], over["observed"], over["unit"], over["header"]) == (255, 256, "count", KEY)
            for bad in (b"a key", "été".encode("latin-1"), b"a\tb", b""):
                error_of(await client.post(route, headers={KEY: bad}), 400, "invalid_idempotency_key")

            assert (await client.post(route, headers={KEY: "second"})).status_code == 200  # at the limit
            full = error_of(await client.post(route, headers={KEY: "third"}), 503, "idempotency_keys_full")
            assert (full["setting"], full["limit"], full["observed"]) == (
                "HOPLINE_IDEMPOTENCY_MAX_KEYS", 2, 3)
            assert (await client.post(route)).status_code == 200  # a write without a key is not refused
            replayed = await client.post(route, headers={KEY: "second"})  # a stored key still answers
            assert replayed.status_code == 200 and replayed.headers["idempotent-replayed"] == "true"
            page = (await client.get(f"/session/{session_id}/transcript")).json()["events"]
            assert [e["type"] for e in page].count("cancel_requested") == 3  # 255 chars, second, unkeyed
            assert stored_keys(daemon) == 2


async def test_expired_keys_are_purged_and_a_write_with_one_runs_again(tmp_path: Path) -> None:
    ttl = 1.0
    env = agent_env(tmp_path, HOPLINE_IDEMPOTENCY_TTL_SECONDS=str(ttl))
    with running_daemon(tmp_path, env=env) as daemon:
        async with daemon.client() as client:
            session_id = (await client.post("/session", json={"cwd": str(tmp_path)})).json()["sessionId"]
            prompts = f"/session/{session_id}/prompt"
            first = await client.post(prompts, json={"text": "a"}, headers={KEY: "p"})
            assert first.status_code == 202, first.text
            await turn_done(client, session_id, first.json()["promptId"])
            # expired after the TTL; the purger (every half TTL) deletes it from the store
            deadline = time.monotonic() + 3 * ttl * 1.5
            while stored_keys(daemon) and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert stored_keys(daemon) == 0
            second = await client.post(prompts, json={"text": "a"}, headers={KEY: "p"})  # a new key now
            assert second.status_code == 202 and second.json() != first.json()
            assert "idempotent-replayed" not in second.headers
            await turn_done(client, session_id, second.json()["promptId"])
    assert prompts_seen(tmp_path) == ["a", "a"]


async def test_a_failed_create_leaves_no_key(tmp_path: Path) -> None:
    """A create refused after its row was stored (the agent did not start) takes its key with the
    row: its retry runs again (and is refused again), never answered from the key."""
    broken = tmp_path / "agent.sh"
    broken.write_text("#!/bin/sh\nexit 3\n")
    broken.chmod(0o755)
    with running_daemon(tmp_path, env=agent_env(tmp_path), agent_cmd=str(broken)) as daemon:
        async with daemon.client() as client:
            failed = await client.post("/session", json={"cwd": str(tmp_path)}, headers={KEY: "create"})
            assert failed.status_code == 502, failed.text
            assert stored_keys(daemon) == 0
            again = await client.post("/session", json={"cwd": str(tmp_path)}, headers={KEY: "create"})
            assert again.status_code == 502 and "idempotent-replayed" not in again.headers
