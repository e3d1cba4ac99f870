"""No 500 by chance (SPEC T-5): every read route answers 200 while a gate run with ``--fix`` creates
and deletes its sessions. ``/daemon/status`` once iterated the live session dict across an await and
answered 500 in about half of the demo's runs."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from daemon.support import running_daemon
from hopline.client import DaemonClient
from hopline.scripted.sample_pull_request import make_sample_pull_request

from .conftest import follow

# Few iterations per gate: the point is the sessions coming and going, not the compactions.
HINTS = {"seed": 0, "iterations": 3, "toolsPerIteration": 1}


@pytest.mark.e2e
def test_read_routes_answer_200_while_a_fixing_gate_run_creates_and_deletes_sessions(tmp_path: Path) -> None:
    repo, base, head = make_sample_pull_request(tmp_path / "sample-pr")
    with running_daemon(tmp_path, agent_cmd=None) as daemon:
        async def go() -> tuple[dict[str, object], list[tuple[str, int]]]:
            headers = {"Authorization": f"Bearer {daemon.token}"}
            async with httpx.AsyncClient(base_url=daemon.url, headers=headers, timeout=60) as http, \
                    DaemonClient(daemon.url, daemon.token) as client:
                created = await http.post("/session", json={})
                assert created.status_code == 200, created.text
                own = created.json()["sessionId"]
                gate_id = await client.start_gate(str(repo), base=base, head=head, fix=True, scripted=HINTS)
                seen: list[tuple[str, int]] = []
                done = asyncio.Event()

                async def poll() -> None:
                    paths = ["/daemon/status", "/metrics", "/gate", f"/gate/{gate_id}",
                             f"/session/{own}/transcript"]
                    while not done.is_set():
                        for path in paths:
                            response = await http.get(path)
                            seen.append((path, response.status_code))

                pollers = [asyncio.create_task(poll()) for _ in range(3)]
                try:
                    result, _ = await follow(daemon, gate_id)
                finally:
                    done.set()
                    await asyncio.gather(*pollers)
                return result, seen

        result, seen = asyncio.run(go())
        log = daemon.log_path.read_text()
    assert result["state"] == "done", result
    assert len(seen) >= 50  # the polls overlapped the run
    failures = [(path, code) for path, code in seen if code != 200]
    assert failures == []
    assert "Exception in ASGI application" not in log
    assert '"incidentId"' not in log
