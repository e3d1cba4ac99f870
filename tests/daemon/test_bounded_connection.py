"""The lease connection across a PostgreSQL restart (SPEC X, T-3): a connection kept from before the
restart is replaced on its first use, as a pool's check would; a store that is really away still
fails as StoreUnavailable. Real PostgreSQL (`pg_ctl restart`), no mocks."""

from __future__ import annotations

import pytest

from hopline.errors import StoreUnavailable
from hopline.store.bounded import BoundedConnection
from services import PostgresCluster

pytestmark = pytest.mark.e2e


def connection(url: str) -> BoundedConnection:
    return BoundedConnection(url, name="hopline test", lock_timeout=1.0, statement_timeout=5.0)


async def backend_pid(conn: BoundedConnection) -> int:
    rows = await conn.fetch("SELECT pg_backend_pid()")
    return int(rows[0][0])


async def test_a_connection_the_restart_dropped_is_replaced_on_first_use(
        postgres_cluster: PostgresCluster, pg_url: str) -> None:
    conn = connection(pg_url)
    try:
        before = await backend_pid(conn)
        postgres_cluster.restart()  # the kept connection is dead, and nobody has noticed yet
        after = await backend_pid(conn)  # answered, on a new connection
        assert after != before
        assert await conn.fetch("SELECT 1") == [(1,)]
    finally:
        await conn.close()


async def test_a_store_that_is_away_still_fails_as_unavailable(
        postgres_cluster: PostgresCluster, pg_url: str) -> None:
    conn = connection(pg_url)
    try:
        await backend_pid(conn)
        postgres_cluster.stop_server()
        try:
            with pytest.raises(StoreUnavailable):
                await conn.fetch("SELECT 1")  # the kept one is dropped, and a new one cannot connect
        finally:
            postgres_cluster.start_server()
        assert await conn.fetch("SELECT 1") == [(1,)]
    finally:
        await conn.close()
