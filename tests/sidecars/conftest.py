"""Sidecar fixtures: real SQLite stores in tmp dirs, a real uvicorn server on 127.0.0.1
(the gateway tests' :class:`~gateway._server.ServerThread`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI

from gateway._server import ServerThread
from hopline.budget import Budget
from hopline.sidecars.index import SidecarIndex
from hopline.sidecars.store import SidecarStore
from hopline.store.blobs import FileBlobs


class FakeClock:
    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


class CountingIndex(SidecarIndex):
    """The index, counting its queries."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.calls = 0
        super().__init__(*args, **kwargs)

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        self.calls += 1
        return super().execute(sql, params)


class CountingBlobs:
    """File bodies, counting every operation on them."""

    def __init__(self, blobs: FileBlobs) -> None:
        self.blobs = blobs
        self.shared = blobs.shared
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        operation = getattr(self.blobs, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return operation(*args, **kwargs)

        return counted


class CountingStore(SidecarStore):
    """A store on files and SQLite that counts every index query, body operation and blob open,
    through the store's own seams (its ``index`` and ``blobs``), without patching."""

    def __init__(self, root: Path, budget: Budget, *, clock: Callable[[], float]) -> None:
        self.counted_index = CountingIndex(root, dsn=None,
                                           statement_timeout_seconds=budget.store_statement_timeout_seconds)
        self.counted_blobs = CountingBlobs(FileBlobs(root))
        self.opens = 0
        super().__init__(root, budget, clock=clock, blobs=self.counted_blobs,  # type: ignore[arg-type]
                         index=self.counted_index)

    def open_blob(self, entry: Any) -> Any:
        self.opens += 1
        return super().open_blob(entry)

    def touches(self) -> tuple[int, int, int]:
        return self.counted_index.calls, self.counted_blobs.calls, self.opens


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def budget() -> Budget:
    return Budget.defaults()


@pytest.fixture
def make_store(tmp_path: Path, clock: FakeClock) -> Iterator[Callable[..., CountingStore]]:
    stores: list[SidecarStore] = []

    def make(budget: Budget | None = None, root: Path | None = None) -> CountingStore:
        store = CountingStore(root or tmp_path / "sidecars", budget or Budget.defaults(), clock=clock)
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()


@pytest.fixture
def serve() -> Iterator[Callable[[FastAPI], ServerThread]]:
    servers: list[ServerThread] = []

    def start(app: FastAPI) -> ServerThread:
        server = ServerThread(app, lifespan="off").start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()
