"""Every object-store call has a deadline (issue #27 item 4, SPEC T-4): against moto behind a proxy
that hangs (accepts, reads, never answers), each S3 call raises :class:`ObjectStoreUnavailable`
naming ``HOPLINE_OBJECT_STORE_TIMEOUT`` instead of waiting; an endpoint that refuses connections is
the same refusal, ``object_store_unavailable`` (never ``disk_error``); forwarding again, it works."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hopline.budget import Budget
from hopline.errors import ObjectStoreUnavailable
from hopline.sidecars.entry import SidecarRefused
from hopline.sidecars.store import open_sidecar_store
from hopline.store.blobs import S3Blobs
from hopline.store.locations import sidecar_location, store_location
from services import HangingProxy, S3Server, free_port

DEADLINE_SECONDS = 0.5



def blobs_at(endpoint: str, s3_server: S3Server, bucket: str, tmp_path: Path) -> S3Blobs:
    env = {**s3_server.env(), "AWS_ENDPOINT_URL": endpoint}
    location = sidecar_location(f"s3://{bucket}/deadline", tmp_path, env)
    assert location.s3 is not None
    return S3Blobs(location.s3, timeout_seconds=DEADLINE_SECONDS)


def test_every_call_on_a_hung_store_ends_at_its_deadline(
        tmp_path: Path, s3_server: S3Server, s3_bucket: str, s3_proxy: HangingProxy) -> None:
    blobs = blobs_at(s3_proxy.endpoint, s3_server, s3_bucket, tmp_path)
    blobs.stage("kept", b"k" * 1000)
    handle = blobs.open("kept")
    assert handle is not None and handle.size == 1000

    s3_proxy.hang()
    calls = {"stage": lambda: blobs.stage("new", b"n" * 100_000), "open": lambda: blobs.open("kept"),
             "read": lambda: b"".join(blobs.iter_range(handle, 0, 1000)),
             "delete": lambda: blobs.delete("kept"), "list": lambda: list(blobs.listing())}
    for name, call in calls.items():
        with pytest.raises(ObjectStoreUnavailable) as info:
            call()
        assert "HOPLINE_OBJECT_STORE_TIMEOUT" in str(info.value), name
        assert isinstance(info.value, OSError) and info.value.hop == "daemon.sidecars"

    s3_proxy.forward()
    time.sleep(DEADLINE_SECONDS)  # the store counts as down for one deadline after it passed one
    assert b"".join(blobs.iter_range(handle, 0, 1000)) == b"k" * 1000
    assert {item.name for item in blobs.listing()} == {"kept"}


def test_past_a_deadline_calls_fail_at_once_for_one_deadline_then_try_again(
        tmp_path: Path, s3_server: S3Server, s3_bucket: str, s3_proxy: HangingProxy) -> None:
    blobs = blobs_at(s3_proxy.endpoint, s3_server, s3_bucket, tmp_path)
    blobs.stage("kept", b"k" * 1000)
    s3_proxy.hang()
    with pytest.raises(ObjectStoreUnavailable, match="did not answer"):
        blobs.stage("a", b"a" * 1000)
    reached = s3_proxy.client_bytes
    s3_proxy.forward()  # back already, but the store is taken as down for one deadline
    for call in (lambda: blobs.stage("b", b"b" * 1000), lambda: blobs.open("kept")):
        with pytest.raises(ObjectStoreUnavailable, match="fail at once") as info:
            call()
        assert "HOPLINE_OBJECT_STORE_TIMEOUT" in str(info.value)
        assert 0 < info.value.retry_after <= DEADLINE_SECONDS
    assert s3_proxy.client_bytes == reached  # no request left this process
    time.sleep(DEADLINE_SECONDS)
    blobs.stage("c", b"c" * 1000)  # tried again, and it answers
    assert s3_proxy.client_bytes > reached
    assert {item.name for item in blobs.listing()} == {"kept", "c"}


def test_a_refused_connection_is_an_object_store_refusal(tmp_path: Path, s3_server: S3Server) -> None:
    env = {**s3_server.env(), "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}  # nobody listens
    budget = Budget.defaults().replace(object_store_timeout_seconds=DEADLINE_SECONDS)
    bodies = sidecar_location("s3://nowhere/p", tmp_path, env)
    store = open_sidecar_store(store_location("", tmp_path), bodies, budget, index_dir=tmp_path / "sidecars")
    try:
        with pytest.raises(SidecarRefused) as info:
            store.put("s1", b"x" * 10, "text/plain")
        refused = info.value
        assert (refused.reason, refused.limit, refused.observed) == ("object_store_unavailable", None, 10)
        fallbacks = store.stats()["fallbacks"]
        assert (fallbacks["objectStoreUnavailable"], fallbacks["diskError"]) == (1, 0)
    finally:
        store.close()
