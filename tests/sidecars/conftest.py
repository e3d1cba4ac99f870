"""Sidecar fixtures: real SQLite stores in tmp dirs, a real uvicorn server on 127.0.0.1
(the gateway tests' :class:`~gateway._server.ServerThread`)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI

from gateway._server import ServerThread
from hopline.budget import Budget
from hopline.sidecars.store import SidecarStore


class FakeClock:
    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


class CountingStore(SidecarStore):
    """A store that counts every database query, blob path and blob open (no patching)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.db_calls = 0
        self.path_calls = 0
        self.opens = 0
        super().__init__(*args, **kwargs)

    def _execute(self, sql: str, params: tuple[Any, ...] = ()) -> sqlite3.Cursor:
        self.db_calls += 1
        return super()._execute(sql, params)

    def _blob_path(self, sidecar_id: str) -> Path:
        self.path_calls += 1
        return super()._blob_path(sidecar_id)

    def open_blob(self, entry: Any) -> Any:
        self.opens += 1
        return super().open_blob(entry)

    def touches(self) -> tuple[int, int, int]:
        return self.db_calls, self.path_calls, self.opens


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
