"""The SQLite sidecar index checked at startup and by `hopline store check` (SPEC T-3, issue #25):
a damaged index, or one missing while bodies remain beside it, is refused in one line naming the
file and the next step; ``--repair`` quarantines it (nothing deleted), keeps every row that reads
and moves the bodies no row names aside, and the daemon starts again. Real SQLite files, real
`hopline serve` and `hopline store check` processes."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from daemon.support import start_daemon, stop_daemon_proc
from hopline.budget import Budget
from hopline.errors import StoreDamaged
from hopline.sidecars.index import INDEX_FILE, INDEX_SCHEMA
from hopline.sidecars.store import SidecarStore
from hopline.store.index_check import QUARANTINE_DIR, index_problem, repair_index, require_usable_index
from hopline.store.locations import SIDECARS_DIR


def _store_with_sidecars(root: Path, count: int) -> list[str]:
    store = SidecarStore(root, Budget.defaults())
    try:
        return [store.put(f"session-{n % 3}", os.urandom(65), "text/plain").id
                for n in range(count)]
    finally:
        store.close()


def _damage_a_page(index: Path) -> None:
    """A leaf page of the sidecars table zeroed, in the middle of it (``dbstat`` finds it): some rows
    are lost, the rest of the table and the file's header stay whole."""
    db = sqlite3.connect(index)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    leaves = [row[0] for row in db.execute(
        "SELECT pageno FROM dbstat WHERE name = 'sidecars' AND pagetype = 'leaf' ORDER BY pageno")]
    page_size = db.execute("PRAGMA page_size").fetchone()[0]
    db.close()
    assert len(leaves) >= 3
    with open(index, "r+b") as handle:
        handle.seek((leaves[len(leaves) // 2] - 1) * page_size)
        handle.write(b"\xff" * page_size)


def _ids(index: Path) -> set[str]:
    db = sqlite3.connect(index)
    try:
        return {row[0] for row in db.execute("SELECT id FROM sidecars")}
    finally:
        db.close()


def test_a_damaged_index_is_refused_in_one_line_and_repaired_keeping_what_reads(tmp_path: Path) -> None:
    ids = _store_with_sidecars(tmp_path, 400)
    index = tmp_path / INDEX_FILE
    require_usable_index(index)  # whole: usable
    _damage_a_page(index)
    with pytest.raises(StoreDamaged) as refused:
        require_usable_index(index)
    line = str(refused.value)
    assert "\n" not in line and str(index) in line and "hopline store check --repair" in line
    done = repair_index(index, INDEX_SCHEMA)
    assert index_problem(index) is None
    kept = _ids(index)
    assert 0 < len(kept) < len(ids) and kept <= set(ids)  # what read is kept; the damaged page is not
    quarantine = next((tmp_path / QUARANTINE_DIR).iterdir())
    assert (quarantine / INDEX_FILE).exists()  # the damaged file itself, kept
    moved = {p.name for p in (quarantine / "blobs").iterdir()}
    assert moved == set(ids) - kept  # bodies no row names: aside, not deleted, not left to be reaped
    assert {p.name for p in (tmp_path / "blobs").iterdir()} == kept
    assert any("readable row(s)" in line for line in done)
    store = SidecarStore(tmp_path, Budget.defaults())  # opens and serves what was kept
    try:
        some = next(iter(kept))
        entry = store.get(f"session-{ids.index(some) % 3}", some)
        assert entry is not None and entry.size == 65
    finally:
        store.close()


@pytest.mark.parametrize("fault", ["missing", "empty"])
def test_an_index_gone_from_under_its_bodies_is_refused_and_its_bodies_kept(tmp_path: Path,
                                                                            fault: str) -> None:
    ids = _store_with_sidecars(tmp_path, 5)
    index = tmp_path / INDEX_FILE
    for suffix in ("-wal", "-shm"):
        Path(str(index) + suffix).unlink(missing_ok=True)
    if fault == "missing":
        index.unlink()
    else:
        os.truncate(index, 0)
    with pytest.raises(StoreDamaged, match="sidecar bodies remain"):
        require_usable_index(index)
    repair_index(index, INDEX_SCHEMA)
    require_usable_index(index)
    quarantine = next((tmp_path / QUARANTINE_DIR).iterdir())
    assert {p.name for p in (quarantine / "blobs").iterdir()} == set(ids)


def test_a_new_data_dir_and_a_whole_index_are_usable(tmp_path: Path) -> None:
    require_usable_index(tmp_path / INDEX_FILE)  # nothing yet: a new store
    _store_with_sidecars(tmp_path, 3)
    require_usable_index(tmp_path / INDEX_FILE)
    assert repair_index(tmp_path / INDEX_FILE, INDEX_SCHEMA) == []  # nothing to do, nothing moved
    assert not (tmp_path / QUARANTINE_DIR).exists()


def _hopline(*args: str, data: Path) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "HOPLINE_SERVER_TOKEN": "t"}
    return subprocess.run([sys.executable, "-m", "hopline", *args, "--data-dir", str(data)],
                          capture_output=True, timeout=60, env=env)


@pytest.mark.e2e
def test_serve_refuses_a_damaged_index_in_one_line_and_starts_after_store_check_repair(
        tmp_path: Path) -> None:
    data = tmp_path / "data"
    _store_with_sidecars(data / SIDECARS_DIR, 400)
    index = data / SIDECARS_DIR / INDEX_FILE
    _damage_a_page(index)
    refused = _hopline("serve", "--port", "0", data=data)
    assert refused.returncode == 1
    lines = refused.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in refused.stderr.decode(), refused.stderr.decode()[-2000:]
    assert str(index) in lines[0] and "hopline store check --repair" in lines[0]
    checked = _hopline("store", "check", data=data)
    assert checked.returncode == 1 and "PROBLEM: the sidecar index" in checked.stdout.decode()
    repaired = _hopline("store", "check", "--repair", data=data)
    assert repaired.returncode == 0, repaired.stdout.decode() + repaired.stderr.decode()
    assert "readable row(s)" in repaired.stdout.decode()
    assert _hopline("store", "check", data=data).returncode == 0
    back = start_daemon(tmp_path, data_dir=data)  # starts again on the repaired index
    stop_daemon_proc(back.proc)
    assert "Traceback" not in back.log_text()
