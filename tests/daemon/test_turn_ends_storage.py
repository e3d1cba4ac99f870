"""Every turn ends when the store cannot take its events (SPEC T-9, T-1): the data directory on a
tmpfs whose inodes run out while its bytes are plentiful. A session with a segment file goes on;
one without cannot get one, its events are refused and its turn's end is stored inline, so every
accepted prompt ends now (``turn_error`` ``storage``) instead of its end being retried for as long
as the fault lasts. Mounting needs root: skipped elsewhere with the reason, never in CI."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .support import read_events, running_daemon
from .test_serve import new_session, prompt, session_status
from .test_turn_ends import GRACE, WAIT, ends, until_ended

pytestmark = pytest.mark.e2e

INODES = 400  # the tmpfs's; the daemon's files take a few dozen
TMPFS_BYTES = 64 * 1024 * 1024  # plenty: only inodes run out


@contextlib.contextmanager
def few_inodes(path: Path) -> Iterator[Path]:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        if os.environ.get("CI"):
            pytest.fail("CI runs as root: the tiny-inode tmpfs test must run there")
        pytest.skip("mounting a tmpfs with few inodes needs root")
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES},nr_inodes={INODES}", "tmpfs",
                    str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def exhaust_inodes(directory: Path) -> int:
    """Empty files until the file system refuses one more (its bytes stay free); how many."""
    directory.mkdir()
    count = 0
    while True:
        try:
            os.close(os.open(directory / f"f{count}", os.O_CREAT | os.O_WRONLY, 0o600))
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
            return count
        count += 1


async def test_every_accepted_turn_ends_when_the_inodes_run_out(tmp_path: Path) -> None:
    env = {"HOPLINE_CANCEL_GRACE_SECONDS": str(GRACE), "HOPLINE_WARM_CHILDREN": "0"}
    with few_inodes(tmp_path / "disk") as disk, \
            running_daemon(tmp_path, data_dir=disk / "data", env=env) as daemon:
        async with daemon.client() as client:
            before = [await new_session(client, tmp_path) for _ in range(3)]
            for sid in before:  # each gets its segment file now (an update over the inline size)
                await until_ended(client, sid, [await prompt(client, sid, "big 2000")])
            filler = disk / "filler"
            assert exhaust_inodes(filler) > 0
            after = [await new_session(client, tmp_path) for _ in range(3)]  # no file of their own yet
            accepted_at = time.monotonic()
            accepted = {sid: await prompt(client, sid, "big 2000") for sid in before + after}
            for sid, prompt_id in accepted.items():
                events = await until_ended(client, sid, [prompt_id])
                [end] = ends(events, prompt_id)
                if sid in before:
                    assert end.type == "turn_complete" and not end.data["degraded"], end.data
                else:
                    assert end.type == "turn_error" and end.data["reason"] == "storage", end.data
                    assert end.data["origin"] == "daemon" and end.data["refusedEvents"] >= 1
                    row = await session_status(client, sid)
                    assert row["pendingPrompts"] == 0
            ended_after = time.monotonic() - accepted_at
            assert ended_after < 3 * GRACE + WAIT / 2, f"the six turns ended {ended_after:.1f} s after"
            # what ended is stored: a reader that comes later sees every end, from the journal
            for sid, prompt_id in accepted.items():
                replayed = await asyncio.wait_for(read_events(
                    client, sid, lambda e, p=prompt_id: e.type in ("turn_complete", "turn_error")
                    and e.data.get("promptId") == p, last_event_id=0), WAIT)
                assert ends(replayed, prompt_id)
            shutil.rmtree(filler)  # the fault heals: the same sessions go on whole
            for sid in after:
                healed = await prompt(client, sid, "big 2000")
                [end] = ends(await until_ended(client, sid, [healed]), healed)
                assert end.type == "turn_complete" and not end.data["degraded"], end.data
        assert "Task exception was never retrieved" not in daemon.log_text()
