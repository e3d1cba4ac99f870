"""The sidecar store (S-2): real SQLite and files in a tmp dir, exact quotas, lifecycle, orphans."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from hopline.budget import SIDECAR_DIR_ENV, Budget
from hopline.errors import SidecarWriterError
from hopline.sidecars.entry import (
    SidecarEntry,
    SidecarRefused,
    is_valid_sidecar_id,
    new_sidecar_id,
    safe_media_type,
)
from hopline.sidecars.store import SidecarStore
from hopline.sidecars.writer import SidecarWriter, open_store

from .conftest import CountingStore, FakeClock

StoreFactory = Callable[..., CountingStore]


def _rows(store: SidecarStore) -> list[tuple[str, str, int]]:
    with sqlite3.connect(store.db_path) as db:
        return db.execute("SELECT id, session_id, size FROM sidecars ORDER BY created_at, id").fetchall()


def test_put_get_roundtrip_and_index_row(make_store: StoreFactory, clock: FakeClock) -> None:
    store = make_store()
    data = b"x" * 1000 + "é".encode()
    entry = store.put("s1", data, "text/plain; charset=utf-8")
    assert is_valid_sidecar_id(entry.id)
    assert entry.size == len(data)
    assert entry.sha256 == hashlib.sha256(data).hexdigest()
    assert entry.media_type == "text/plain; charset=utf-8"
    assert entry.created_at == clock.now
    assert entry.expires_at == clock.now + store.budget.sidecar_ttl_seconds
    assert (store.blobs_dir / entry.id).read_bytes() == data
    assert list(store.tmp_dir.iterdir()) == []
    assert store.get("s1", entry.id) == entry
    assert store.read_bytes(entry) == data
    assert _rows(store) == [(entry.id, "s1", len(data))]
    with sqlite3.connect(store.db_path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_another_session_and_unknown_ids_get_none(make_store: StoreFactory) -> None:
    store = make_store()
    entry = store.put("s1", b"secret", "text/plain")
    assert store.get("s2", entry.id) is None
    assert store.get("s1", new_sidecar_id()) is None


def test_ids_are_unguessable_and_validated() -> None:
    ids = {new_sidecar_id() for _ in range(200)}
    assert len(ids) == 200
    assert all(is_valid_sidecar_id(i) for i in ids)
    good = new_sidecar_id()
    for bad in ["", "../x", "..%2Fetc", good + "\n", good[:-1], good + "a", "a" * 5000, good[:-1] + "/",
                good[:-1] + ".", None, 42, "ä" * 32]:
        assert not is_valid_sidecar_id(bad), bad


def test_malformed_ids_touch_neither_database_nor_filesystem(make_store: StoreFactory) -> None:
    store = make_store()
    store.put("s1", b"data", "text/plain")
    before = store.touches()
    for bad in ["", "../x", "../../etc/passwd", "..%2Fetc", "a" * 5000, "sidecars.sqlite3", "."]:
        assert store.get("s1", bad) is None
    assert store.touches() == before
    forged = SidecarEntry("../x", "s1", 4, "0" * 64, "text/plain", 0.0, 0.0)
    with pytest.raises(ValueError):  # defence in depth: not even a forged entry reaches the disk
        store.open_blob(forged)


def test_media_types_are_sanitised() -> None:
    assert safe_media_type("application/json") == "application/json"
    assert safe_media_type("text/plain; charset=utf-8") == "text/plain; charset=utf-8"
    for bad in ["text/plain\r\nX-Evil: 1", "", "nonsense", "a/" + "b" * 300, None]:
        assert safe_media_type(bad) == "application/octet-stream"


def test_object_quota_exact(make_store: StoreFactory) -> None:
    store = make_store(Budget.defaults().replace(sidecar_max_object_bytes=100))
    assert store.put("s1", b"a" * 100, "text/plain").size == 100
    with pytest.raises(SidecarRefused) as info:
        store.put("s1", b"b" * 101, "text/plain")
    assert (info.value.reason, info.value.limit, info.value.observed) == ("over_object_quota", 100, 101)
    assert "daemon.sidecars" in str(info.value) and "100" in str(info.value) and "101" in str(info.value)
    assert store.stats()["fallbacks"]["overObjectQuota"] == 1
    assert len(_rows(store)) == 1


def test_session_quota_exact(make_store: StoreFactory) -> None:
    store = make_store(Budget.defaults().replace(sidecar_max_session_bytes=250))
    store.put("s1", b"a" * 150, "text/plain")
    store.put("s1", b"b" * 100, "text/plain")  # exactly 250
    with pytest.raises(SidecarRefused) as info:
        store.put("s1", b"c", "text/plain")
    assert (info.value.reason, info.value.limit, info.value.observed) == ("over_session_quota", 250, 251)
    store.put("s2", b"c" * 250, "text/plain")  # another session has its own quota
    assert store.stats()["fallbacks"]["overSessionQuota"] == 1
    assert list(store.tmp_dir.iterdir()) == []  # the refused write left nothing behind


def test_store_quota_exact(make_store: StoreFactory) -> None:
    store = make_store(Budget.defaults().replace(sidecar_max_store_bytes=300))
    store.put("s1", b"a" * 200, "text/plain")
    store.put("s2", b"b" * 100, "text/plain")  # exactly 300 across sessions
    with pytest.raises(SidecarRefused) as info:
        store.put("s3", b"c", "text/plain")
    assert (info.value.reason, info.value.limit, info.value.observed) == ("over_store_quota", 300, 301)
    stats = store.stats()
    assert stats["fallbacks"] == {"overObjectQuota": 0, "overSessionQuota": 0, "overStoreQuota": 1,
                                  "diskError": 0, "objectStoreUnavailable": 0,
                                  "writeTokenRevoked": 0}
    assert (stats["count"], stats["bytes"]) == (2, 300)


def test_disk_error_is_a_refusal(make_store: StoreFactory) -> None:
    store = make_store()
    store.tmp_dir.rmdir()
    store.tmp_dir.write_bytes(b"not a directory")  # every temp write now fails with an OSError
    with pytest.raises(SidecarRefused) as info:
        store.put("s1", b"x" * 10, "text/plain")
    assert (info.value.reason, info.value.limit, info.value.observed) == ("disk_error", None, 10)
    assert store.stats()["fallbacks"]["diskError"] == 1
    assert _rows(store) == []


def test_same_bytes_in_a_session_are_stored_once(make_store: StoreFactory) -> None:
    store = make_store(Budget.defaults().replace(sidecar_max_session_bytes=100))
    first = store.put("s1", b"a" * 100, "text/plain")
    assert store.put("s1", b"a" * 100, "text/plain") == first  # a replay costs no quota
    other = store.put("s2", b"a" * 100, "text/plain")
    assert other.id != first.id
    assert len(_rows(store)) == 2


def test_concurrent_puts_respect_the_session_quota(make_store: StoreFactory) -> None:
    store = make_store(Budget.defaults().replace(sidecar_max_session_bytes=500))
    results: list[str] = []
    lock = threading.Lock()

    def put(i: int) -> None:
        try:
            store.put("s1", bytes([i]) * 100, "text/plain")
            outcome = "stored"
        except SidecarRefused as refused:
            outcome = refused.reason
        with lock:
            results.append(outcome)

    threads = [threading.Thread(target=put, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert results.count("stored") == 5
    assert results.count("over_session_quota") == 7
    assert store.stats()["bytes"] == 500


def test_delete_session_removes_its_files_rows_and_tokens(make_store: StoreFactory) -> None:
    store = make_store()
    mine = [store.put("s1", bytes([i]) * 10, "text/plain") for i in range(3)]
    other = store.put("s2", b"keep", "text/plain")
    token = store.mint_write_token("s1")
    assert store.delete_session("s1") == 3
    for entry in mine:
        assert not (store.blobs_dir / entry.id).exists()
    assert [r[0] for r in _rows(store)] == [other.id]
    assert store.session_for_write_token(token) is None
    assert store.read_bytes(other) == b"keep"


def test_restart_keeps_entries_and_collects_orphans(make_store: StoreFactory, tmp_path: Path) -> None:
    store = make_store()
    kept = store.put("s1", b"kept", "text/plain")
    lost_file = store.put("s1", b"row without file", "text/plain")
    torn = store.put("s1", b"a file cut short", "text/plain")
    store.close()
    (store.blobs_dir / lost_file.id).unlink()
    (store.blobs_dir / torn.id).write_bytes(b"a file")
    (store.blobs_dir / new_sidecar_id()).write_bytes(b"stray with an id-shaped name")
    (store.blobs_dir / "stray.txt").write_bytes(b"stray")
    (store.tmp_dir / "put-123.part").write_bytes(b"half written")

    restarted = make_store(root=store.root)
    assert restarted.get("s1", kept.id) == kept  # served after a restart
    # files: torn, two strays; rows: lost_file, torn; temp: one
    assert restarted.collect_orphans() == 6
    assert sorted(p.name for p in restarted.blobs_dir.iterdir()) == [kept.id]
    assert [r[0] for r in _rows(restarted)] == [kept.id]
    assert list(restarted.tmp_dir.iterdir()) == []
    assert restarted.read_bytes(kept) == b"kept"
    assert restarted.collect_orphans() == 0


def test_stats_shape_and_counters_survive_restart(make_store: StoreFactory) -> None:
    store = make_store(Budget.defaults().replace(sidecar_max_object_bytes=10))
    store.put("s1", b"12345", "text/plain")
    with pytest.raises(SidecarRefused):
        store.put("s1", b"x" * 11, "text/plain")
    store.count_kept_off_wire(1234)
    expected = {"count": 1, "bytes": 5, "bytesKeptOffWire": 1234,
                "fallbacks": {"overObjectQuota": 1, "overSessionQuota": 0, "overStoreQuota": 0,
                              "diskError": 0, "objectStoreUnavailable": 0, "writeTokenRevoked": 0}}
    assert store.stats() == expected
    store.close()
    assert make_store(root=store.root).stats() == expected


# --- S-3: our agent's direct writes -----------------------------------------------------------


def test_writer_binds_to_the_token_session(make_store: StoreFactory) -> None:
    store = make_store()
    token = store.mint_write_token("daemon-session-1")
    opened = open_store(store.budget, {SIDECAR_DIR_ENV: str(store.root)})
    assert opened is not None
    writer = SidecarWriter(opened, token)
    try:
        entry = writer.put(b"tool output", "text/plain; charset=utf-8")
        assert entry.size == 11 and entry.session_id == "daemon-session-1"
        assert entry.sha256 == hashlib.sha256(b"tool output").hexdigest()
        found = store.get("daemon-session-1", entry.id)
        assert found is not None and store.read_bytes(found) == b"tool output"
        assert store.get("other", entry.id) is None
        store.delete_session("daemon-session-1")  # revokes the token
        with pytest.raises(SidecarRefused) as refused:
            writer.put(b"more", "text/plain")
        assert refused.value.reason == "write_token_revoked"
        assert store.stats()["fallbacks"]["writeTokenRevoked"] == 1
    finally:
        writer.close()


def test_store_from_env_absent_or_bad(make_store: StoreFactory, tmp_path: Path) -> None:
    store = make_store()
    assert open_store(store.budget, {}) is None
    with pytest.raises(SidecarWriterError, match="HOPLINE_SIDECAR_DIR"):
        open_store(store.budget, {SIDECAR_DIR_ENV: str(tmp_path / "missing")})
    with pytest.raises(SidecarWriterError, match="write token"):
        SidecarWriter(store, "nope")


_AGENT_SCRIPT = """
import json, sys
from hopline.budget import Budget
from hopline.sidecars.projection import project_fields
from hopline.sidecars.writer import SidecarWriter, open_store
writer = SidecarWriter(open_store(Budget.from_env()), sys.stdin.read().strip())
def chunk(text):
    return {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}
update, big = chunk("H" * 100000 + "T" * 100000), chunk("z" * 70000)
print(json.dumps({"first": project_fields(update, writer, Budget.from_env()).update,
                  "second": project_fields(big, writer, Budget.from_env()).update}))
"""


@pytest.mark.e2e
def test_writer_in_a_separate_agent_process_shares_quotas(make_store: StoreFactory) -> None:
    budget = Budget.defaults().replace(sidecar_max_session_bytes=250_000)
    store = make_store(budget)
    token = store.mint_write_token("sess")
    # The token travels like the daemon sends it (in the request, here stdin), never in the env.
    env = {**os.environ, **budget.to_env(), SIDECAR_DIR_ENV: str(store.root)}
    done = subprocess.run([sys.executable, "-c", _AGENT_SCRIPT], env=env, capture_output=True, timeout=60,
                          check=True, input=token.encode())
    import json

    out = json.loads(done.stdout)
    [entry] = out["first"]["_meta"]["hopline.sidecar"]
    stored = store.get("sess", entry["id"])
    assert stored is not None and store.read_bytes(stored) == b"H" * 100000 + b"T" * 100000
    preview = out["first"]["content"]["text"]
    assert preview.startswith("H" * 1024) and preview.endswith("T" * 1024)
    assert f"200000 bytes in sidecar {entry['id']}" in preview
    # 200,000 + 70,000 is over the session quota the agent read from its env
    [refused] = out["second"]["_meta"]["hopline.sidecar"]
    assert refused["truncated"] is True and refused["reason"] == "over_session_quota"
    assert refused["lostBytes"] == 70_000 - 2048
    assert store.stats()["fallbacks"]["overSessionQuota"] == 1
