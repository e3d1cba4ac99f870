"""Idempotent writes on several daemons (SPEC T-12, X): two real `hopline serve` processes on one
PostgreSQL store (the session's throwaway cluster, a fresh database) and moto's S3.

A keyed write holds across the daemons: a prompt posted to the daemon that does not own its session
(forwarded, with its key, to the owner) and retried on either daemon runs once and answers the same
prompt id; another body with the key gets 422 on both; a create retried on the other daemon answers
the first's session; and the keys hold across a restart of the owner. The agent writes each prompt
it runs, with its process id, to a file: one line per execution."""

from __future__ import annotations

from pathlib import Path

import pytest

from .support import start_daemon, stop_daemon_proc
from .test_cluster import Stream, cluster_env, ends, two_daemons

pytestmark = pytest.mark.e2e

__all__ = ["cluster_env"]  # the fixture, used by name

KEY = "Idempotency-Key"


async def test_a_keyed_write_runs_once_across_daemons_and_a_restart(
        tmp_path: Path, cluster_env: dict[str, str]) -> None:
    actions = tmp_path / "actions.log"
    env = {**cluster_env, "BIG_AGENT_ACTION_LOG": str(actions)}
    args = ("--agent-env", "BIG_AGENT_ACTION_LOG")
    with two_daemons(tmp_path, env, args=args) as (a, b):
        async with a.client() as client_a, b.client(timeout=60) as client_b:
            create = {KEY: "create-across"}
            created = await client_a.post("/session", json={"cwd": str(tmp_path)}, headers=create)
            assert created.status_code == 200, created.text
            session_id = created.json()["sessionId"]
            again = await client_b.post("/session", json={"cwd": str(tmp_path)}, headers=create)
            assert again.status_code == 200 and again.json() == created.json()
            assert again.headers["idempotent-replayed"] == "true"

            prompt = {KEY: "prompt-across"}
            route = f"/session/{session_id}/prompt"
            stream = Stream(b, session_id)
            try:
                # posted to B, which forwards it (and its key) to the owner A
                first = await client_b.post(route, json={"text": "across 1"}, headers=prompt)
                assert first.status_code == 202, first.text
                for client in (client_b, client_a, client_b):
                    retried = await client.post(route, json={"text": "across 1"}, headers=prompt)
                    assert retried.status_code == 202 and retried.json() == first.json()
                    assert retried.headers["idempotent-replayed"] == "true"
                for client in (client_a, client_b):
                    other = await client.post(route, json={"text": "across 2"}, headers=prompt)
                    assert other.status_code == 422, other.text
                    assert other.json()["error"]["type"] == "idempotency_key_reused"
                await stream.wait_for(ends(first.json()["promptId"]))
            finally:
                await stream.close()
        stop_daemon_proc(a.proc)  # the owner stops; its keys are in the store
        restarted = start_daemon(tmp_path / "a", data_dir=tmp_path / "a" / "data", env=env,
                                 log_name="restarted.log", args=args)
        try:
            async with restarted.client(timeout=60) as client:
                retried = await client.post(route, json={"text": "across 1"}, headers=prompt)
                assert retried.status_code == 202 and retried.json() == first.json()
                recreated = await client.post("/session", json={"cwd": str(tmp_path)}, headers=create)
                assert recreated.json() == created.json()
        finally:
            stop_daemon_proc(restarted.proc)
    runs = [line for line in actions.read_text().splitlines() if line.endswith(" across 1")]
    assert len(runs) == 1, runs  # one execution, whichever daemon took which retry
    assert not [line for line in actions.read_text().splitlines() if line.endswith(" across 2")]
