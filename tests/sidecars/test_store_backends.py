"""The sidecar store's contract on every backend (SPEC S-2, X): the index in SQLite or in PostgreSQL,
the bodies in files or in an S3-compatible bucket (moto on 127.0.0.1). Real servers, started by the
session's fixtures; quotas exact at the limit and one byte over; bodies streamed back by range."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hopline.budget import Budget
from hopline.sidecars.entry import SidecarRefused, new_sidecar_id
from hopline.sidecars.store import SidecarStore, open_sidecar_store
from hopline.store.blobs import S3_PART_BYTES
from hopline.store.locations import sidecar_location, store_location
from hopline.store.postgres import migrate
from services import S3Server

from .conftest import FakeClock

BACKENDS = [
    pytest.param(("sqlite", "file"), id="sqlite-file"),
    pytest.param(("sqlite", "s3"), id="sqlite-s3"),
    pytest.param(("postgresql", "file"), id="postgresql-file", marks=pytest.mark.e2e),
    pytest.param(("postgresql", "s3"), id="postgresql-s3", marks=pytest.mark.e2e),
]

Factory = Callable[..., SidecarStore]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    index, bodies = request.param
    urls = {"store": "", "sidecars": "", "kind": f"{index}-{bodies}"}
    env: dict[str, str] = {}
    if index == "postgresql":
        urls["store"] = request.getfixturevalue("pg_url")
        migrate(urls["store"])
    if bodies == "s3":
        server: S3Server = request.getfixturevalue("s3_server")
        bucket = server.fresh_bucket()
        urls["sidecars"] = f"s3://{bucket}/some/prefix"
        urls["bucket"] = bucket
        env = server.env()
    urls["env"] = env  # type: ignore[assignment]
    yield urls


@pytest.fixture
def open_store(backend: dict[str, object], tmp_path: Path, clock: FakeClock) -> Iterator[Factory]:
    stores: list[SidecarStore] = []

    def make(budget: Budget | None = None) -> SidecarStore:
        env = backend["env"]
        assert isinstance(env, dict)
        store = open_sidecar_store(store_location(str(backend["store"]), tmp_path),
                                   sidecar_location(str(backend["sidecars"]), tmp_path, env),
                                   budget or Budget.defaults(), index_dir=tmp_path / "sidecars",
                                   clock=clock)
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()


def _body(store: SidecarStore, session: str, sidecar_id: str, start: int = 0,
          stop: int | None = None) -> bytes:
    entry = store.get(session, sidecar_id)
    assert entry is not None
    handle = store.open_blob(entry)
    assert handle is not None
    return b"".join(store.iter_range(handle, start, entry.size if stop is None else stop))


def test_roundtrip_streams_back_by_range(open_store: Factory) -> None:
    store = open_store()
    data = bytes(range(256)) * (S3_PART_BYTES // 256 + 4096)  # over one S3 part: a multipart upload
    entry = store.put("s1", data, "application/octet-stream")
    assert (entry.size, entry.sha256) == (len(data), hashlib.sha256(data).hexdigest())
    assert hashlib.sha256(_body(store, "s1", entry.id)).hexdigest() == entry.sha256
    assert _body(store, "s1", entry.id, 5, 100) == data[5:100]
    assert _body(store, "s1", entry.id, len(data) - 1) == data[-1:]
    assert store.get("s2", entry.id) is None  # another session's id is unknown here
    assert store.get("s1", new_sidecar_id()) is None


def test_session_quota_exact_at_the_limit_and_one_byte_over(open_store: Factory) -> None:
    store = open_store(Budget.defaults().replace(sidecar_max_object_bytes=200, sidecar_max_session_bytes=250,
                                                 sidecar_max_store_bytes=400))
    store.put("s1", b"a" * 150, "text/plain")
    store.put("s1", b"b" * 100, "text/plain")  # exactly 250
    with pytest.raises(SidecarRefused) as info:
        store.put("s1", b"c", "text/plain")
    assert (info.value.reason, info.value.limit, info.value.observed) == ("over_session_quota", 250, 251)
    with pytest.raises(SidecarRefused) as over:
        store.put("s2", b"d" * 201, "text/plain")
    assert (over.value.reason, over.value.limit, over.value.observed) == ("over_object_quota", 200, 201)
    store.put("s2", b"e" * 150, "text/plain")  # exactly 400 in the store
    with pytest.raises(SidecarRefused) as full:
        store.put("s3", b"f", "text/plain")
    assert (full.value.reason, full.value.limit, full.value.observed) == ("over_store_quota", 400, 401)
    stats = store.stats()
    assert (stats["count"], stats["bytes"]) == (3, 400)
    assert stats["fallbacks"]["overSessionQuota"] == 1 and stats["fallbacks"]["overStoreQuota"] == 1


def test_quota_holds_across_two_stores_writing_at_once(open_store: Factory,
                                                       backend: dict[str, object]) -> None:
    """Two store objects on one PostgreSQL index (two daemons) share the quota exactly: 20
    concurrent writes of 100 bytes under a 1000-byte store quota, 10 stored. (SQLite across
    processes, a daemon and its agent: test_store.py.)"""
    if not str(backend["store"]):
        pytest.skip("several daemons share a PostgreSQL index only")
    budget = Budget.defaults().replace(sidecar_max_session_bytes=1000, sidecar_max_store_bytes=1000)
    stores = [open_store(budget), open_store(budget)]
    stored: list[str] = []
    refused: list[str] = []
    lock = threading.Lock()

    def write(i: int) -> None:
        try:
            entry = stores[i % 2].put(f"s{i % 3}", bytes([i]) * 100, "text/plain")
        except SidecarRefused as exc:
            with lock:
                refused.append(exc.reason)
        else:
            with lock:
                stored.append(entry.id)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(stored) == 10 and refused == ["over_store_quota"] * 10
    assert stores[0].stats()["bytes"] == 1000


def test_same_bytes_stored_once_and_nothing_left_behind(open_store: Factory, backend: dict[str, object],
                                                        s3_server_if_any: S3Server | None) -> None:
    store = open_store()
    first = store.put("s1", b"z" * 100, "text/plain")
    assert store.put("s1", b"z" * 100, "text/plain") == first
    assert store.stats()["count"] == 1
    if s3_server_if_any is not None:  # the duplicate's upload was removed again
        assert s3_server_if_any.keys(str(backend["bucket"])) == [f"some/prefix/blobs/{first.id}"]


def test_delete_session_and_reap_remove_rows_and_bodies(open_store: Factory, clock: FakeClock) -> None:
    store = open_store()
    mine = [store.put("s1", bytes([i]) * 10, "text/plain") for i in range(3)]
    other = store.put("s2", b"keep", "text/plain")
    token = store.mint_write_token("s1")
    assert store.delete_session("s1") == 3
    for entry in mine:
        assert store.get("s1", entry.id) is None and store.open_blob(entry) is None
    assert store.session_for_write_token(token) is None
    assert store.read_bytes(other) == b"keep"
    # (a shared index keeps the store's time, not the fake clock: the moment is given)
    assert store.reap_expired(now=store.clock() + Budget.defaults().sidecar_ttl_seconds + 1) == 1
    assert store.open_blob(other) is None


def test_orphans_collected_but_young_ones_wait_on_a_shared_store(open_store: Factory,
                                                                  backend: dict[str, object]) -> None:
    store = open_store()
    kept = store.put("s1", b"kept", "text/plain")
    lost = store.put("s1", b"row without a body", "text/plain")
    store.blobs.delete(lost.id)
    stray = new_sidecar_id()
    store.blobs.publish(store.blobs.stage(stray, b"a body without a row"), stray)
    removed = store.collect_orphans()
    assert store.get("s1", lost.id) is None and store.read_bytes(kept) == b"kept"
    names = {item.name for item in store.blobs.listing()}
    if store.shared:  # young: perhaps another daemon's write in flight
        assert removed == 1 and names == {kept.id, stray}
        later = open_store(Budget.defaults().replace(sidecar_orphan_grace_seconds=10))
        # bodies' ages are real time (S3's or the disk's, S3's to the second), whatever fake clock
        # the index has
        assert later.collect_orphans(now=time.time() + 5) == 0  # still inside the grace
        assert later.collect_orphans(now=time.time() + 12) == 1  # past it: the stray goes
        assert {item.name for item in later.blobs.listing()} == {kept.id}
    else:
        assert removed == 2 and names == {kept.id}


def test_an_unreachable_bucket_is_an_object_store_refusal(open_store: Factory, backend: dict[str, object],
                                                       s3_server_if_any: S3Server | None) -> None:
    if s3_server_if_any is None:
        pytest.skip("an object store failure: S3 backends only (files: test_store.py's disk error)")
    store = open_store()
    s3_server_if_any.client().delete_bucket(Bucket=str(backend["bucket"]))
    with pytest.raises(SidecarRefused) as info:
        store.put("s1", b"x" * 10, "text/plain")
    # not the local disk's fault: the object store's (issue #27)
    refused = info.value
    assert (refused.reason, refused.limit, refused.observed) == ("object_store_unavailable", None, 10)
    stats = store.stats()
    assert stats["count"] == 0
    assert (stats["fallbacks"]["objectStoreUnavailable"], stats["fallbacks"]["diskError"]) == (1, 0)


@pytest.fixture
def s3_server_if_any(backend: dict[str, object], request: pytest.FixtureRequest) -> S3Server | None:
    return request.getfixturevalue("s3_server") if backend.get("bucket") else None
