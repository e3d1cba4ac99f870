"""A torn WAL on a real `hopline serve` (issue 49, SPEC T-10, T-1): the daemon is killed with SIGKILL
mid-turn, then its journal's WAL is torn at half, at a quarter, to zero, or its -shm deleted (what
a power loss can leave). At the next start every event a client was given is served again under
its id, byte for byte (restored from the segment files' records), the cut turn ends with an id no
client has seen, and `hopline store check` exits 0; where a segment's last record is torn too, the
check exits 1 naming the gap, a client resuming inside it gets ``frame_dropped`` naming the missing
ids, and no id of it is given again. A WAL emptied under a session created after the last
checkpoint still stops the start in one line (nothing knows that session any more)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from hopline.store import records
from hopline.store.segments import segment_path
from hopline.store.sqlite_journal import JOURNAL_FILE, SEGMENTS_DIR

from .support import SseEvent, read_events, start_daemon, stop_daemon_proc
from .test_serve import new_session, prompt, turns_done

pytestmark = pytest.mark.e2e


def _check(data: Path) -> tuple[int, dict[str, Any]]:
    argv = [sys.executable, "-m", "hopline", "store", "check", "--data-dir", str(data), "--json"]
    done = subprocess.run(argv, capture_output=True, timeout=120)
    return done.returncode, orjson.loads(done.stdout)


def _seen(events: list[SseEvent], into: dict[int, tuple[str, bytes]]) -> None:
    for event in events:
        if event.id is not None:
            assert into.setdefault(event.id, (event.type, event.raw)) == (event.type, event.raw)


async def _run_and_kill(tmp_path: Path, data: Path) -> tuple[str, str, dict[int, tuple[str, bytes]]]:
    """A session made in a first run (stopped cleanly: its rows checkpointed into the journal), then
    a second run that loads it, runs two turns (events over and under the inline size), starts a
    third and is killed with SIGKILL once the client has its first event. Returns the session, the
    cut prompt and every event the client was given."""
    seen: dict[int, tuple[str, bytes]] = {}
    first = start_daemon(tmp_path, data_dir=data)
    try:
        async with first.client() as client:
            session_id = await new_session(client, tmp_path)
            await prompt(client, session_id, "chunks 20 700")
            _seen(await read_events(client, session_id, turns_done(1)), seen)
    finally:
        stop_daemon_proc(first.proc)
    second = start_daemon(tmp_path, data_dir=data, log_name="daemon2.log")
    try:
        async with second.client() as client:
            loaded = await client.post(f"/session/{session_id}/load")
            assert loaded.status_code == 200, loaded.text
            last = max(seen)
            await prompt(client, session_id, "chunks 150 700")
            await prompt(client, session_id, "chunks 60 20")
            _seen(await read_events(client, session_id, turns_done(2), last_event_id=last), seen)
            cut = await prompt(client, session_id, "sleep 60")
            _seen(await read_events(client, session_id, lambda e: e.type == "session_update",
                                    last_event_id=max(seen)), seen)
    finally:
        second.proc.kill()  # SIGKILL: no checkpoint, no close
        second.proc.wait(10)
    return session_id, cut, seen


def _tear(data: Path, tear: str) -> None:
    wal, shm = Path(f"{data / JOURNAL_FILE}-wal"), Path(f"{data / JOURNAL_FILE}-shm")
    size = wal.stat().st_size
    assert size > 0  # the second run's commits are in it
    if tear == "shm":
        shm.unlink()
    else:
        os.truncate(wal, {"half": size // 2, "quarter": size // 4, "zero": 0}[tear])


def _last_record(path: Path) -> records.Record:
    fd = os.open(path, os.O_RDONLY)
    try:
        at, size, last = 0, path.stat().st_size, None
        while at < size:
            found = records.read_record(fd, at, size)
            assert isinstance(found, records.Record)
            last, at = found, found.end
    finally:
        os.close(fd)
    assert last is not None
    return last


async def _replayed(client: httpx.AsyncClient, session_id: str, after: int | None) -> list[SseEvent]:
    return await read_events(client, session_id, lambda e: e.type == "replay_complete", last_event_id=after)


@pytest.mark.parametrize("tear", ["half", "quarter", "zero", "shm"])
async def test_a_torn_wal_is_restored_from_the_segments_and_no_id_is_reused(tmp_path: Path,
                                                                            tear: str) -> None:
    data = tmp_path / "data"
    session_id, cut, seen = await _run_and_kill(tmp_path, data)
    _tear(data, tear)
    code, report = _check(data)
    assert code == 0 and report["gaps"] == [], report  # nothing past the commit point is lost
    if tear != "shm":  # the WAL's lost commits verify in the segment file
        assert report["pastCommitPoint"]["restorableEvents"] > 0
    third = start_daemon(tmp_path, data_dir=data, log_name="daemon3.log")
    try:
        async with third.client() as client:
            replayed = await _replayed(client, session_id, None)
            given = {e.id: (e.type, e.raw) for e in replayed if e.id is not None}
            assert {n: given.get(n) for n in seen} == seen  # every id names the bytes it named
            assert not [e for e in replayed if e.type in ("data_corrupt", "frame_dropped")]
            top = max(seen)
            [end] = await read_events(client, session_id, turns_done(1), last_event_id=top)
            assert end.id == top + 1 and end.type == "turn_error"  # the cut turn ends, under a new id
            assert (end.data["promptId"], end.data["reason"]) == (cut, "daemon_restarted")
    finally:
        stop_daemon_proc(third.proc)
    if tear != "shm":
        assert "restored from the segment files" in third.log_text()
    code, report = _check(data)
    assert code == 0 and report["pastCommitPoint"]["sessions"] == 0, report


async def test_a_torn_wal_and_a_torn_segment_record_leave_a_gap_said_and_never_refilled(
        tmp_path: Path) -> None:
    data = tmp_path / "data"
    session_id, cut, seen = await _run_and_kill(tmp_path, data)
    _tear(data, "half")
    segment = segment_path(data / SEGMENTS_DIR, session_id)
    last = _last_record(segment)
    assert last.ids is not None and last.ids[1] == max(seen)  # the cut turn's first event: the client has it
    os.truncate(segment, last.end - 3)  # its bytes never all reached the disk
    missing = {"first": last.ids[0], "last": last.ids[1]}
    code, report = _check(data)
    assert code == 1, report
    assert [(g["sessionId"], g["firstId"], g["lastId"]) for g in report["gaps"]] == [
        (session_id, missing["first"], missing["last"])]
    third = start_daemon(tmp_path, data_dir=data, log_name="daemon3.log")
    try:
        async with third.client() as client:
            inside = await _replayed(client, session_id, missing["first"] - 1)  # resuming just before it
            dropped = [e.data for e in inside if e.type == "frame_dropped"]
            assert [(d["missingIds"], d["eventId"], d["reason"]) for d in dropped] == [
                (missing, missing["first"], "lost_past_commit_point")]
            assert inside[-1].data["missing"] == missing["last"] - missing["first"] + 1
            replayed = await _replayed(client, session_id, None)
            given = {e.id: (e.type, e.raw) for e in replayed if e.id is not None}
            assert {n: given.get(n) for n in seen if n < missing["first"]} == {
                n: kept for n, kept in seen.items() if n < missing["first"]}
            [end] = await read_events(client, session_id, turns_done(1), last_event_id=max(seen))
            assert end.id is not None and end.id > missing["last"]  # never an id of the gap
            assert (end.data["promptId"], end.type) == (cut, "turn_error")
    finally:
        stop_daemon_proc(third.proc)
    assert "lost past the journal's commit point" in third.log_text()
    code, report = _check(data)  # the gap stays named
    assert code == 1 and [g["firstId"] for g in report["gaps"]] == [missing["first"]]
    assert list((data / "journal.quarantine").rglob("*.torn"))  # its bytes kept aside


async def test_a_wal_emptied_under_a_session_made_since_the_last_checkpoint_stops_the_start(
        tmp_path: Path) -> None:
    data = tmp_path / "data"
    daemon = start_daemon(tmp_path, data_dir=data)
    try:
        async with daemon.client() as client:
            session_id = await new_session(client, tmp_path)
            await prompt(client, session_id, "chunks 5 700")
            await read_events(client, session_id, turns_done(1))
    finally:
        daemon.proc.kill()
        daemon.proc.wait(10)
    _tear(data, "zero")
    argv = [sys.executable, "-m", "hopline", "serve", "--port", "0", "--data-dir", str(data)]
    env = {**os.environ, "HOPLINE_SERVER_TOKEN": "t"}
    result = subprocess.run(argv, capture_output=True, timeout=60, env=env)
    lines = result.stderr.decode().strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1 and "hopline store check" in lines[0], lines
    code, report = _check(data)
    assert code == 1 and report["problem"], report
