"""The sidecar route over real HTTP (uvicorn on 127.0.0.1): owner-only, 404s, ETag, Range, restart."""

from __future__ import annotations

import hashlib
import http.client
from collections.abc import Callable

import httpx
import orjson
import pytest
from fastapi import FastAPI, HTTPException, Request

from hopline.sidecars.entry import SidecarEntry, new_sidecar_id
from hopline.sidecars.routes import RangeNotSatisfiable, parse_range, sidecar_router
from hopline.sidecars.store import SidecarStore
from hopline.sidecars.store_projection import project_update

from .conftest import CountingStore, ServerThread

StoreFactory = Callable[..., CountingStore]
Serve = Callable[[FastAPI], ServerThread]
TOKEN = "test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MiB = 1024 * 1024


async def require_token(request: Request) -> None:
    if request.headers.get("authorization") != f"Bearer {TOKEN}":
        raise HTTPException(status_code=401, detail="missing or bad token")


def app_for(store: SidecarStore) -> FastAPI:
    app = FastAPI()
    app.include_router(sidecar_router(store, require_token))
    return app


def url(server: ServerThread, session_id: str, sidecar_id: str) -> str:
    return f"{server.url}/session/{session_id}/sidecars/{sidecar_id}"


def raw_get(server: ServerThread, path: str) -> int:
    """GET a path exactly as written (httpx would normalise ``..`` away)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("GET", path, headers=AUTH)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def test_five_mib_output_round_trips_and_survives_restart(make_store: StoreFactory, serve: Serve) -> None:
    store = make_store()
    text = "".join(f"line {i:07d} of the tool output\n" for i in range(5 * MiB // 30))
    original = text.encode()
    update = {"sessionUpdate": "tool_call_update", "toolCallId": "c1", "status": "completed",
              "content": [{"type": "content", "content": {"type": "text", "text": text}}]}
    projected = project_update(update, "s1", store, store.budget)
    wire = orjson.dumps(projected)
    assert len(wire) < 64 * 1024
    entry = projected["_meta"]["hopline.sidecar"][0]
    preview = projected["content"][0]["content"]["text"]
    assert preview.startswith("line 0000000") and f"{len(original)} bytes in sidecar {entry['id']}" in preview

    server = serve(app_for(store))
    response = httpx.get(url(server, "s1", entry["id"]), headers=AUTH, timeout=30)
    assert response.status_code == 200
    assert response.content == original
    digest = hashlib.sha256(response.content).hexdigest()
    assert digest == entry["sha256"]
    assert response.headers["etag"] == f'"{digest}"'
    assert response.headers["content-length"] == str(len(original))
    assert response.headers["content-type"] == "text/plain; charset=utf-8"
    server.stop()

    restarted = make_store(root=store.root)  # a new daemon on the same root
    server = serve(app_for(restarted))
    again = httpx.get(url(server, "s1", entry["id"]), headers=AUTH, timeout=30)
    assert again.status_code == 200 and again.content == original


def test_token_is_checked_by_the_daemon_dependency(make_store: StoreFactory, serve: Serve) -> None:
    store = make_store()
    entry = store.put("s1", b"payload", "text/plain")
    server = serve(app_for(store))
    assert httpx.get(url(server, "s1", entry.id), timeout=10).status_code == 401
    assert httpx.get(url(server, "s1", entry.id), headers={"Authorization": "Bearer no"},
                     timeout=10).status_code == 401
    assert httpx.get(url(server, "s1", entry.id), headers=AUTH, timeout=10).content == b"payload"


def test_only_the_owning_session_reads_it(make_store: StoreFactory, serve: Serve) -> None:
    store = make_store()
    entry = store.put("s1", b"payload", "text/plain")
    server = serve(app_for(store))
    other = httpx.get(url(server, "s2", entry.id), headers=AUTH, timeout=10)
    unknown = httpx.get(url(server, "s1", new_sidecar_id()), headers=AUTH, timeout=10)
    for response in (other, unknown):
        assert response.status_code == 404
        assert response.json() == {"error": {"type": "not_found", "hop": "daemon.sidecars",
                                             "message": "sidecar not found"}}


def test_malformed_ids_are_404_without_touching_db_or_files(make_store: StoreFactory, serve: Serve) -> None:
    store = make_store()
    entry = store.put("s1", b"payload", "text/plain")
    server = serve(app_for(store))
    before = store.touches()
    paths = [
        "/session/s1/sidecars/../x",
        "/session/s1/sidecars/..%2Fetc",
        "/session/s1/sidecars/..%2F..%2Fsidecars.sqlite3",
        "/session/s1/sidecars/" + "a" * 5000,
        "/session/s1/sidecars/",
        "/session/s1/sidecars/%00",
        "/session/s1/sidecars/" + entry.id + "%0A",
        "/session/s1/sidecars/" + entry.id[:-1] + ".",
        "/session/s1/sidecars/sidecars.sqlite3",
        "/session/s1/sidecars/" + entry.id + "/..",
    ]
    for path in paths:
        assert raw_get(server, path) == 404, path
    assert store.touches() == before  # no query, no blob path, no open
    assert raw_get(server, f"/session/s1/sidecars/{entry.id}") == 200  # the counters do count
    assert store.touches() != before


@pytest.fixture
def served(make_store: StoreFactory, serve: Serve) -> tuple[ServerThread, SidecarEntry, bytes]:
    store = make_store()
    data = bytes(range(256)) * 40  # 10,240 bytes, every offset recognisable
    entry = store.put("s1", data, "application/octet-stream")
    return serve(app_for(store)), entry, data


@pytest.mark.parametrize(("header", "start", "stop"), [
    ("bytes=0-99", 0, 100),
    ("bytes=5000-5099", 5000, 5100),
    ("bytes=-100", 10_140, 10_240),
    ("bytes=10000-", 10_000, 10_240),
    ("bytes=10200-99999", 10_200, 10_240),
    ("bytes=-999999", 0, 10_240),
    ("bytes=10239-10239", 10_239, 10_240),
])
def test_range_requests(served: tuple[ServerThread, SidecarEntry, bytes], header: str, start: int,
                        stop: int) -> None:
    server, entry, data = served
    response = httpx.get(url(server, "s1", entry.id), headers={**AUTH, "Range": header}, timeout=10)
    assert response.status_code == 206
    assert response.content == data[start:stop]
    assert response.headers["content-range"] == f"bytes {start}-{stop - 1}/{len(data)}"
    assert response.headers["content-length"] == str(stop - start)
    assert response.headers["etag"] == entry.etag


@pytest.mark.parametrize("header", ["bytes=10240-", "bytes=99999-100000", "bytes=-0"])
def test_unsatisfiable_ranges_are_416(served: tuple[ServerThread, SidecarEntry, bytes], header: str) -> None:
    server, entry, data = served
    response = httpx.get(url(server, "s1", entry.id), headers={**AUTH, "Range": header}, timeout=10)
    assert response.status_code == 416
    assert response.headers["content-range"] == f"bytes */{len(data)}"


@pytest.mark.parametrize("header", ["bytes=0-1,5-6", "items=0-5", "bytes=9-3", "bytes=abc", "bytes=-"])
def test_unsupported_or_invalid_ranges_serve_the_whole_body(
        served: tuple[ServerThread, SidecarEntry, bytes], header: str) -> None:
    server, entry, data = served
    response = httpx.get(url(server, "s1", entry.id), headers={**AUTH, "Range": header}, timeout=10)
    assert response.status_code == 200 and response.content == data


def test_if_none_match_answers_304(served: tuple[ServerThread, SidecarEntry, bytes]) -> None:
    server, entry, data = served
    hit = httpx.get(url(server, "s1", entry.id), headers={**AUTH, "If-None-Match": entry.etag}, timeout=10)
    assert hit.status_code == 304 and hit.content == b"" and hit.headers["etag"] == entry.etag
    listed = httpx.get(url(server, "s1", entry.id), headers={**AUTH, "If-None-Match": f'"x", W/{entry.etag}'},
                       timeout=10)
    assert listed.status_code == 304
    miss = httpx.get(url(server, "s1", entry.id), headers={**AUTH, "If-None-Match": '"other"'}, timeout=10)
    assert miss.status_code == 200 and miss.content == data


def test_a_reaped_sidecar_is_404(make_store: StoreFactory, serve: Serve) -> None:
    store = make_store()
    entry = store.put("s1", b"payload", "text/plain")
    server = serve(app_for(store))
    store.delete_session("s1")
    assert httpx.get(url(server, "s1", entry.id), headers=AUTH, timeout=10).status_code == 404


def test_parse_range_edges() -> None:
    assert parse_range(None, 10) is None
    assert parse_range("bytes=0-0", 10) == (0, 1)
    assert parse_range("bytes=" + "1" * 300, 10) is None  # overlong header ignored
    with pytest.raises(RangeNotSatisfiable):
        parse_range("bytes=0-", 0)
    with pytest.raises(RangeNotSatisfiable):
        parse_range("bytes=-5", 0)
