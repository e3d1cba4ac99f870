"""Storage faults on a real `hopline serve` (issue #25, SPEC T-1, T-3): the data dir on a small
tmpfs filled to the last byte, segment files flipped, truncated and deleted between runs, the
journal's header cut, a permissive umask. What the client sees, what the agent got, what the
record says after a restart."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from hopline.store.segments import segment_path
from hopline.store.sqlite_journal import JOURNAL_FILE, SEGMENTS_DIR

from .support import Daemon, read_events, start_daemon, stop_daemon_proc

pytestmark = pytest.mark.e2e

TMPFS_BYTES = 20 * 1024 * 1024


@contextlib.contextmanager
def small_disk(path: Path) -> Iterator[Path]:
    """A 20 MiB tmpfs mounted at ``path`` (the tests run as root), unmounted after."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(path: Path) -> Path:
    """Write zeros until the disk refuses one more byte."""
    filler = path / "filler"
    with open(filler, "wb", buffering=0) as handle:
        chunk = b"\0" * (1 << 20)
        while True:
            try:
                handle.write(chunk)
            except OSError:
                break
        for size in (65536, 4096, 512, 1):
            while True:
                try:
                    handle.write(b"\0" * size)
                except OSError:
                    break
    return filler


def _env(tmp_path: Path) -> dict[str, str]:
    return {"HOPLINE_AGENT_ENV": "BIG_AGENT_PROMPT_LOG",
            "BIG_AGENT_PROMPT_LOG": str(tmp_path / "prompts.log")}


def _prompts(tmp_path: Path) -> list[str]:
    log = tmp_path / "prompts.log"
    return log.read_text().splitlines() if log.exists() else []


async def _prompt_and_end(client: httpx.AsyncClient, session_id: str, text: str) -> list[Any]:
    response = await client.post(f"/session/{session_id}/prompt", json={"text": text})
    assert response.status_code == 202, response.text
    prompt_id = response.json()["promptId"]
    events = await read_events(client, session_id, lambda e: e.type in ("turn_complete", "turn_error")
                               and e.data.get("promptId") == prompt_id)
    return events


def _refused_full(response: httpx.Response) -> None:
    assert response.status_code == 507, response.text
    error = response.json()["error"]
    assert error["type"] == "storage_full" and error["hop"] == "daemon.journal"


async def test_a_full_disk_refuses_prompt_session_cancel_and_permission_before_acting(
        tmp_path: Path) -> None:
    with small_disk(tmp_path / "data") as data:
        daemon = start_daemon(tmp_path, data_dir=data, env=_env(tmp_path))
        try:
            async with daemon.client() as client:
                created = await client.post("/session", json={"permissionMode": "ask"})
                session_id = created.json()["sessionId"]
                await _prompt_and_end(client, session_id, "before")
                asked = await client.post(f"/session/{session_id}/prompt", json={"text": "permission"})
                assert asked.status_code == 202
                [*_, request] = await read_events(client, session_id,
                                                  lambda e: e.type == "permission_request")
                request_id = request.data["requestId"]
                filler = fill(data)
                _refused_full(await client.post(f"/session/{session_id}/prompt",
                                                json={"text": "refused-canary"}))
                _refused_full(await client.post("/session", json={}))
                _refused_full(await client.post(f"/session/{session_id}/permission/{request_id}",
                                                json={"outcome": "reject"}))
                _refused_full(await client.post(f"/session/{session_id}/cancel"))
                assert (await client.get("/health")).status_code == 200
                status = (await client.get("/daemon/status")).json()
                assert status["sessions"][0]["pendingPermissions"] == 1  # not answered: still pending
                filler.unlink()  # space again: the same requests go through
                answered = await client.post(f"/session/{session_id}/permission/{request_id}",
                                             json={"outcome": "reject"})
                assert answered.status_code == 200, answered.text
                await _prompt_and_end(client, session_id, "after")
            # the agent got the prompts that were accepted, never the refused one
            assert _prompts(tmp_path) == ["before", "permission", "after"]
        finally:
            stop_daemon_proc(daemon.proc)
    assert "Traceback" not in daemon.log_text()


async def test_a_turn_cut_by_a_full_disk_ends_with_a_storage_error_that_survives_a_restart(
        tmp_path: Path) -> None:
    with small_disk(tmp_path / "data") as data:
        daemon = start_daemon(tmp_path, data_dir=data, env=_env(tmp_path))
        try:
            async with daemon.client() as client:
                session_id = (await client.post("/session", json={})).json()["sessionId"]
                accepted = await client.post(f"/session/{session_id}/prompt", json={"text": "sleep 2"})
                assert accepted.status_code == 202
                prompt_id = accepted.json()["promptId"]
                async with client.stream("GET", f"/session/{session_id}/events") as stream:
                    from .support import iter_sse

                    filler: Path | None = None
                    ended: dict[str, Any] = {}
                    async for event in iter_sse(stream):
                        data_of = event.data
                        if event.type == "session_update" and filler is None:
                            filler = fill(data)  # the agent is mid-turn; its end will be refused
                        elif event.type == "frame_dropped" and data_of["reason"] == "journal_write_failed":
                            assert filler is not None
                            filler.unlink(missing_ok=True)  # writes taken again (a 2nd refusal: freed)
                        elif event.type in ("turn_complete", "turn_error"):
                            ended = data_of
                            break
                assert ended["promptId"] == prompt_id
                assert (ended["origin"], ended["reason"]) == ("daemon", "storage")
        finally:
            stop_daemon_proc(daemon.proc)
        again = start_daemon(tmp_path, data_dir=data, env=_env(tmp_path), log_name="daemon2.log")
        try:
            async with again.client() as client:
                page = (await client.get(f"/session/{session_id}/transcript")).json()
            ends = [e for e in page["events"] if e["type"] in ("turn_complete", "turn_error")]
            assert [(e["data"]["promptId"], e["data"]["reason"]) for e in ends] == [(prompt_id, "storage")]
        finally:
            stop_daemon_proc(again.proc)


async def _session_with_events(daemon: Daemon) -> str:
    async with daemon.client() as client:
        session_id = (await client.post("/session", json={})).json()["sessionId"]
        await _prompt_and_end(client, session_id, "chunks 10 600")  # 600-byte chunks: segment file
    return str(session_id)


def _external_ids(data: Path, session_id: str) -> dict[int, tuple[int, int]]:
    import sqlite3

    from hopline.store.event_groups import expand, is_group

    db = sqlite3.connect(data / JOURNAL_FILE)
    rows = db.execute("SELECT seq, type, data, ext_offset, ext_bytes, crc FROM events WHERE session_id = ? "
                      "AND ext_offset IS NOT NULL ORDER BY seq", (session_id,)).fetchall()
    db.close()
    places: dict[int, tuple[int, int]] = {}
    for seq, event_type, index, offset, size, crc in rows:
        if is_group(index, offset):  # a run of small events in one row: each one's place
            members = expand(seq, event_type, bytes(index), offset, crc)
            assert members is not None
            places.update((member[0], (member[2], member[3])) for member in members)
        else:
            places[int(seq)] = (int(offset), int(size))
    return places


@pytest.mark.parametrize("fault", ["flip", "truncate", "delete"])
async def test_damaged_segments_are_said_by_exact_id_and_every_good_event_delivered(
        tmp_path: Path, fault: str) -> None:
    data = tmp_path / "data"
    daemon = start_daemon(tmp_path, data_dir=data)
    try:
        session_id = await _session_with_events(daemon)
    finally:
        stop_daemon_proc(daemon.proc)
    external = _external_ids(data, session_id)
    seqs = sorted(external)
    assert len(seqs) >= 10
    path = segment_path(data / SEGMENTS_DIR, session_id)
    if fault == "flip":
        damaged = {seqs[3]}
        with open(path, "r+b") as handle:
            handle.seek(external[seqs[3]][0] + 30)
            byte = handle.read(1)
            handle.seek(external[seqs[3]][0] + 30)
            handle.write(bytes([byte[0] ^ 0x20]))
    elif fault == "truncate":
        damaged = set(seqs[6:])
        os.truncate(path, external[seqs[6]][0] + 5)
    else:
        damaged = set(seqs)
        path.unlink()
    again = start_daemon(tmp_path, data_dir=data, log_name="daemon2.log")
    try:
        async with again.client() as client:
            events = await read_events(client, session_id, lambda e: e.type == "replay_complete")
            corrupt = [e.data for e in events if e.type == "data_corrupt"]
            good = [int(e.id) for e in events if e.id is not None]
            last = events[-1].data
            assert sorted(c["eventId"] for c in corrupt) == sorted(damaged)
            assert good == [n for n in range(1, last["lastEventId"] + 1) if n not in damaged]
            assert last["corrupt"] == len(damaged) and last["replayed"] == len(good)
            page = (await client.get(f"/session/{session_id}/transcript")).json()
            assert sorted(e["id"] for e in page["events"] if "corrupt" in e) == sorted(damaged)
            assert page["corrupt"] == len(damaged)
            journal = (await client.get("/daemon/status")).json()["journal"]
            assert journal["corruptEvents"] == len(damaged)
    finally:
        stop_daemon_proc(again.proc)
    checked = subprocess.run([sys.executable, "-m", "hopline", "store", "check", "--data-dir", str(data),
                              "--json"], capture_output=True, timeout=120)
    assert checked.returncode == 1
    report = orjson.loads(checked.stdout)
    assert sorted(d["eventId"] for d in report["damagedEvents"]) == sorted(damaged)
    assert {d["sessionId"] for d in report["damagedEvents"]} == {session_id}


@pytest.mark.parametrize("fault", ["header", "emptied"])
def test_an_unusable_journal_stops_serve_with_one_line_and_no_traceback(tmp_path: Path, fault: str) -> None:
    from hopline.store.sqlite_journal import SqliteJournal  # noqa: F401 - the journal's own layout

    data = tmp_path / "data"
    daemon = start_daemon(tmp_path, data_dir=data)
    try:
        import asyncio

        asyncio.run(_session_with_events(daemon))
    finally:
        stop_daemon_proc(daemon.proc)
    journal = data / JOURNAL_FILE
    if fault == "header":
        os.truncate(journal, 50)
    else:
        os.truncate(journal, 0)
        for suffix in ("-wal", "-shm"):
            Path(str(journal) + suffix).unlink(missing_ok=True)
    argv = [sys.executable, "-m", "hopline", "serve", "--port", "0", "--data-dir", str(data)]
    result = subprocess.run(argv, capture_output=True, timeout=60,
                            env={**os.environ, "HOPLINE_SERVER_TOKEN": "t"})
    assert result.returncode == 1
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr.decode(), result.stderr.decode()[-2000:]
    assert str(journal) in lines[0] and "hopline store check" in lines[0]
    repaired = subprocess.run([sys.executable, "-m", "hopline", "store", "check", "--repair", "--data-dir",
                               str(data)], capture_output=True, timeout=60)
    assert repaired.returncode == 0, repaired.stdout.decode() + repaired.stderr.decode()
    assert list((data / "journal.quarantine").iterdir())  # moved aside, not deleted
    back = start_daemon(tmp_path, data_dir=data, log_name="daemon3.log")  # starts again
    stop_daemon_proc(back.proc)


def _modes(data: Path) -> list[str]:
    """Every file's name under ``data``; asserts each directory is 0700 and each file 0600 or less."""
    seen: list[str] = []
    for root, dirs, files in os.walk(data):
        for name in dirs:
            mode = os.stat(os.path.join(root, name)).st_mode & 0o777
            assert mode == 0o700, (os.path.join(root, name), oct(mode))
        for name in files:
            mode = os.stat(os.path.join(root, name)).st_mode & 0o777
            assert mode & 0o077 == 0, (os.path.join(root, name), oct(mode))
            seen.append(name)
    assert os.stat(data).st_mode & 0o777 == 0o700
    return seen


async def test_every_file_the_daemon_writes_is_private_whatever_the_umask(tmp_path: Path) -> None:
    data = tmp_path / "data"
    old = os.umask(0)
    own = None
    try:  # the test agent (its events over 256 bytes go to a segment), then hopline's own (its store)
        daemon = start_daemon(tmp_path, data_dir=data)
        async with daemon.client() as client:
            session_id = (await client.post("/session", json={})).json()["sessionId"]
            await _prompt_and_end(client, session_id, "chunks 2 600")
            running = _modes(data)  # while it runs: the WAL and SHM files too
        stop_daemon_proc(daemon.proc)
        own = start_daemon(tmp_path, data_dir=data, agent_cmd=None, log_name="daemon2.log")
        async with own.client(timeout=60) as client:
            created = await client.post("/session", json={})
            assert created.status_code == 200, created.text
            with_agent = _modes(data)
    finally:
        os.umask(old)
        stop_daemon_proc(daemon.proc)
        if own is not None:
            stop_daemon_proc(own.proc)
    assert {JOURNAL_FILE, f"{JOURNAL_FILE}-wal", f"{JOURNAL_FILE}-shm", "sidecars.sqlite3"} <= set(running)
    assert any(name.endswith(".seg") for name in running)
    assert "sessions.sqlite3" in with_agent  # the agent's own store
    _modes(data)
