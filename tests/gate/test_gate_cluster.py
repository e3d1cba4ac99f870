"""A gate run on a shared store (PostgreSQL journal, S3 sidecars): its stream is written under a
lease of its own while it runs, the lease is given up when it ends, and another daemon reads the
run's result from the store."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import psycopg
import pytest

from daemon.test_cluster import cluster_env, two_daemons  # noqa: F401 - the fixture, by name

from .conftest import make_repo, run_gate

pytestmark = pytest.mark.e2e  # daemons, agents, PostgreSQL and moto's S3


def gate_leases(pg_url: str) -> list[str]:
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute("SELECT session_id FROM leases WHERE session_id LIKE 'g\\_%'").fetchall()
    return [row[0] for row in rows]


def test_a_gate_run_on_a_shared_store_gives_its_lease_up_and_any_daemon_reads_it(
        tmp_path: Path, pg_url: str, cluster_env: dict[str, str]) -> None:  # noqa: F811
    add = "def add(a: int, b: int) -> int:\n    return a + b\n"
    repo, base, head = make_repo(tmp_path / "repo", {"src/calc.py": add},
                                 {"src/calc.py": add + "\n\ndef one() -> int:\n    return 1\n"})
    with two_daemons(tmp_path, cluster_env, agent_cmd=None) as (a, b):
        result, events = run_gate(a, repo, base=base, head=head)
        assert result["exitCode"] in (0, 1) and len(result["agents"]) == 4, result
        assert any(e.type == "gate_complete" for e in events)
        for _ in range(100):  # given up once its last event is committed
            if not gate_leases(pg_url):
                break
            time.sleep(0.1)
        assert gate_leases(pg_url) == []
        # the other daemon never ran it: it reads the result from the shared journal
        other = httpx.get(f"{b.url}/gate/{result['gateId']}", headers=b.headers, timeout=30)
        assert other.status_code == 200, other.text
        assert [x["verdict"] for x in other.json()["agents"]] == [x["verdict"] for x in result["agents"]]
        status = httpx.get(f"{a.url}/daemon/status", headers=a.headers, timeout=30).json()
        assert result["gateId"] not in str(status["cluster"])  # no lease left listed as a session
