"""The store's failures as a client sees them (SPEC X): hopline's JSON 503 with ``Retry-After``,
never a 500.

A lease row held by a frozen daemon's transaction, a statement past its timeout, a connection the
store dropped (a restart), a pool with no connection to give: each is the store being away for a
while, not a bug, so each route answers 503 naming the hop (``daemon.cluster``) and when to retry.
An object store (S3) that fails or passes its deadline is answered the same way (``daemon.sidecars``).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse

from hopline.budget import HOP_CLUSTER
from hopline.daemon.storage_faults import RETRY_SECONDS, STORAGE_UNAVAILABLE
from hopline.errors import ObjectStoreUnavailable, StoreBusy, StoreUnavailable
from hopline.http.errors import error_response
from hopline.store.bounded import retry_after_of


def store_unavailable_response(exc: BaseException) -> JSONResponse:
    """503 naming the hop of the store that failed (the PostgreSQL store's, ``daemon.cluster``, or
    the object store's, ``daemon.sidecars``) and when to retry."""
    retry = retry_after_of(exc, RETRY_SECONDS)
    hop = getattr(exc, "hop", HOP_CLUSTER)
    if isinstance(exc, StoreBusy):
        kind, message = "store_busy", str(exc)
    elif isinstance(exc, StoreUnavailable):
        kind, message = STORAGE_UNAVAILABLE, str(exc)
    else:  # psycopg's or its pool's own error: its type only (its message may name the server)
        kind, message = STORAGE_UNAVAILABLE, f"the PostgreSQL store could not be used ({type(exc).__name__})"
    return error_response(503, hop, kind, f"{message}; retry in {retry} s",
                          headers={"retry-after": str(retry)}, retryAfterSeconds=retry)


def install_object_store_error_handler(app: FastAPI) -> None:
    """503 + Retry-After for an object store (S3) that failed or passed its deadline
    (``HOPLINE_OBJECT_STORE_TIMEOUT``): a sidecar download, never a 500 or a hang."""

    async def answer(_: Request, exc: Exception) -> JSONResponse:
        return store_unavailable_response(exc)

    app.add_exception_handler(ObjectStoreUnavailable, answer)


def install_store_error_handlers(app: FastAPI) -> None:
    """503 + Retry-After for hopline's :class:`StoreUnavailable` and for psycopg's connection-level
    failures (``OperationalError``: the server went away or timed out; the pool's ``PoolTimeout``)."""
    import psycopg
    from psycopg_pool import PoolTimeout

    async def answer(_: Request, exc: Exception) -> JSONResponse:
        return store_unavailable_response(exc)

    for kind in (StoreUnavailable, psycopg.OperationalError, PoolTimeout):
        app.add_exception_handler(kind, answer)


async def cluster_status_or_unavailable(cluster: Any) -> dict[str, Any]:
    """``/daemon/status``'s cluster part; while the store cannot answer, what this daemon knows
    (its id, its counters) and that the store is away: the status itself still answers."""
    try:
        status: dict[str, Any] = await cluster.status()
    except StoreUnavailable as exc:
        return {"daemon": cluster.daemon_id, "advertiseUrl": cluster.advertise_url,
                "leaseSeconds": cluster.lease_seconds, "forwardedWrites": cluster.forwarded,
                "adoptedSessions": cluster.adopted, "leasesLost": cluster.leases_lost,
                "store": "unavailable", "storeError": str(exc), "daemons": [], **cluster.lease_status()}
    return {**status, "store": "ok"}
