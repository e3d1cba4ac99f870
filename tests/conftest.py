"""Shared test fixtures. Servers started here listen on 127.0.0.1 only and are stopped by the test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from hopline.embedded import EmbeddedStack, start_embedded
from hopline.scripted.sample_workspace import make_sample_workspace
from services import HOW_TO_GET_POSTGRESQL, HangingProxy, PostgresCluster, S3Server, postgres_bin_dir


@pytest.fixture(scope="module")
def daemon() -> Iterator[EmbeddedStack]:
    """A real `hopline serve` (daemon, gateway, scripted model) on 127.0.0.1, stopped afterwards.

    Test folders with their own daemon fixture (tests/daemon) override this one."""
    stack = start_embedded()
    try:
        yield stack
    finally:
        stack.stop()


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample project whose logs make 100-300 KiB tool outputs."""
    return make_sample_workspace(tmp_path_factory.mktemp("workspace"))


# --- real services for the scale-out tests (SPEC X): tests/services.py ----------------------------


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[PostgresCluster]:
    """One throwaway PostgreSQL cluster for the test session (a temp dir, 127.0.0.1), dropped at the
    end. Skipped, saying how to get PostgreSQL, where it is not installed; in CI (CI=true) that is a
    failure: .ci/run installs it."""
    bin_dir = postgres_bin_dir()
    if bin_dir is None:
        if os.environ.get("CI") == "true":
            pytest.fail(HOW_TO_GET_POSTGRESQL)
        pytest.skip(HOW_TO_GET_POSTGRESQL)
    cluster = PostgresCluster(bin_dir).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def pg_url(postgres_cluster: PostgresCluster) -> Iterator[str]:
    """A fresh, empty database of the session's cluster, as a postgresql:// URL; dropped after."""
    name = postgres_cluster.fresh_database()
    try:
        yield postgres_cluster.url(name)
    finally:
        postgres_cluster.drop_database(name)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """moto's S3-compatible server on 127.0.0.1 (a free port), for the test session."""
    server = S3Server().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> str:
    """A fresh bucket of the session's S3 server."""
    return s3_server.fresh_bucket()


@pytest.fixture
def s3_proxy(s3_server: S3Server) -> Iterator[HangingProxy]:
    """A proxy in front of the session's S3 server that a test can switch to hang (accept and read,
    never answer) and back; at ``.endpoint``."""
    port = urlsplit(s3_server.endpoint).port
    assert port is not None
    with HangingProxy(port) as running:
        yield running
