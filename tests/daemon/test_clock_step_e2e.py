"""No clock step deletes live data (issue 49, SPEC T-10): a real `hopline serve` under libfaketime
(Debian's ``faketime``; ``.ci/run`` installs it), its wall clock stepped 25 hours forward or back
while its monotonic clock runs on, the sidecar reaper running every 2 s with the default 24 h time to
live. Every sidecar of a live session, and of a session whose agent ended seconds before, is still
served whole after the step and two more rounds of the reaper; the round that saw the step removed
nothing and said so in the log."""

from __future__ import annotations

import asyncio
import glob
import hashlib
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from .support import read_events, running_daemon
from .test_serve import kill_child_until_detached, new_session, prompt

pytestmark = pytest.mark.e2e

LIBFAKETIME = next(iter(sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))), None)


def _faketime_env(step_file: Path) -> dict[str, str]:
    """The daemon's wall clock read from ``step_file`` (an offset, re-read on every call); its
    monotonic clock left alone."""
    if LIBFAKETIME is None:
        if os.environ.get("CI"):
            pytest.fail("libfaketime is missing: .ci/run installs Debian's faketime")
        pytest.skip("libfaketime is not installed (apt-get install faketime)")
    return {"LD_PRELOAD": LIBFAKETIME, "FAKETIME_TIMESTAMP_FILE": str(step_file),
            "FAKETIME_NO_CACHE": "1", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


async def _sidecars_of(client: httpx.AsyncClient, session_id: str, fill: str) -> list[dict[str, Any]]:
    """A turn whose tool output (100,000 bytes of ``fill``) goes to a sidecar; its entries."""
    prompt_id = await prompt(client, session_id, f"big 100000 {fill}")
    events = await read_events(client, session_id, lambda e: e.type in ("turn_complete", "turn_error")
                               and e.data.get("promptId") == prompt_id)
    entries = [entry for e in events if e.type == "session_update" and e.data.get("promptId") == prompt_id
               for entry in (e.data["update"].get("_meta") or {}).get("hopline.sidecar", [])]
    assert entries and events[-1].type == "turn_complete"
    return entries


async def _reaper(client: httpx.AsyncClient) -> dict[str, Any]:
    status: dict[str, Any] = (await client.get("/daemon/status")).json()["sidecars"]["reaper"]
    return status


@pytest.mark.parametrize("step", ["+25h", "-25h"])
async def test_a_wall_clock_step_deletes_no_sidecar_of_a_live_or_just_ended_session(tmp_path: Path,
                                                                                    step: str) -> None:
    clock = tmp_path / "faketime"
    clock.write_text("+0\n")
    env = {**_faketime_env(clock), "HOPLINE_SIDECAR_REAP_INTERVAL_SECONDS": "2"}
    with running_daemon(tmp_path, env=env) as daemon:
        async with daemon.client() as client:
            live = await new_session(client, tmp_path)
            kept = {live: [entry for fill in "abcd" for entry in await _sidecars_of(client, live, fill)]}
            ended = await new_session(client, tmp_path)
            kept[ended] = await _sidecars_of(client, ended, "e")
            await kill_child_until_detached(client, ended)  # no longer live: its time counts from now
            assert len(kept[live]) == 4
            clock.write_text(f"{step}\n")  # the wall clock jumps; the monotonic one does not
            before = await _reaper(client)
            for _ in range(300):  # bounded: the refused round, then two more (2 s apart)
                now = await _reaper(client)
                if now["refusedRounds"] >= 1 and now["rounds"] >= before["rounds"] + 3:
                    break
                await asyncio.sleep(0.2)
            assert now["refusedRounds"] == 1 and now["rounds"] >= before["rounds"] + 3, now
            for session_id, entries in kept.items():
                for entry in entries:
                    body = await client.get(f"/session/{session_id}/sidecars/{entry['id']}")
                    assert body.status_code == 200, body.text
                    assert hashlib.sha256(body.content).hexdigest() == entry["sha256"]
            assert (await client.get("/daemon/status")).json()["sidecars"]["count"] == 5
    assert "a clock stepped between two rounds of the sidecar reaper" in daemon.log_text()
    assert len(list((daemon.data_dir / "sidecars" / "blobs").iterdir())) == 5
