"""What a storage fault tells a client (SPEC T-1, X): the one mapping of the stores' failures to
hopline's JSON errors, never a 500 and never a request acted on.

* **A write the journal refused** is answered, never acted on. A request whose row could not be
  committed gets 507 ``storage_full`` when the disk is full (``ENOSPC`` anywhere in the exception's
  chain, SQLite's ``SQLITE_FULL``, PostgreSQL's ``disk_full``), 503 ``storage_unavailable`` for any
  other storage failure (an I/O error, a store that stopped answering, a connection killed). Both
  name the hop (``daemon.journal``) and the exception's type, never a path or a value.
  :func:`refusal` is that mapping; the routes and the session manager call it wherever a commit
  stands between a request and its 2xx (:func:`commit_first` for a request that is one event).
* **A store that is away for a while** (a lease row held by a frozen daemon's transaction, a
  statement past its timeout, a connection the store dropped, a pool with no connection to give, an
  object store that fails or passes its deadline) is not a bug: any route answers 503 naming the
  hop (``daemon.cluster`` or ``daemon.sidecars``) and when to retry
  (:func:`store_unavailable_response`, installed by :func:`install_store_error_handlers`).
"""

from __future__ import annotations

import errno
import sqlite3
from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse

from hopline.budget import HOP_CLUSTER, HOP_JOURNAL
from hopline.daemon.bus import EventBus
from hopline.daemon.errors import SessionError
from hopline.errors import ObjectStoreUnavailable, StoreBusy, StoreUnavailable
from hopline.http.errors import error_response
from hopline.store.bounded import retry_after_of
from hopline.store.idempotency import KeyRecord

STORAGE_FULL = "storage_full"
STORAGE_UNAVAILABLE = "storage_unavailable"
REASON_STORAGE = "storage"  # turn_error reason of a turn whose record a storage fault cut

RETRY_SECONDS = 1  # a store reconnects at once; a client's retry a second later (Retry-After)
_PG_DISK_FULL = "53100"  # SQLSTATE disk_full
_PG_INSUFFICIENT_RESOURCES = "53000"


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen and len(seen) < 16:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def is_disk_full(exc: BaseException) -> bool:
    for link in _chain(exc):
        if isinstance(link, OSError) and link.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if isinstance(link, sqlite3.Error) and getattr(link, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
            return True
        if getattr(link, "sqlstate", None) in (_PG_DISK_FULL, _PG_INSUFFICIENT_RESOURCES):
            return True
    return False


def is_storage_fault(exc: BaseException) -> bool:
    """A failure of the store itself (not a bug of ours, not client input)."""
    for link in _chain(exc):
        if isinstance(link, OSError | sqlite3.Error | StoreUnavailable):
            return True
        if type(link).__module__.startswith("psycopg"):
            return True
    return False


def refusal(exc: BaseException, what: str) -> SessionError:
    """The error answering a request whose ``what`` (e.g. "the prompt") could not be stored."""
    name = type(exc).__name__
    if is_disk_full(exc):
        return SessionError(507, STORAGE_FULL, f"{what} was not accepted: the daemon's store is full "
                            "(nothing was sent to the agent); free space and retry",
                            hop=HOP_JOURNAL, reason="disk_full", exception=name)
    return SessionError(503, STORAGE_UNAVAILABLE, f"{what} was not accepted: the daemon's store failed "
                        f"({name}; nothing was sent to the agent); retry in {RETRY_SECONDS} s",
                        hop=HOP_JOURNAL, reason="store_failed", exception=name,
                        retryAfterSeconds=RETRY_SECONDS)


async def commit_first(bus: EventBus, session_id: str, event_type: str, data: dict[str, Any],
                       what: str, key: KeyRecord | None = None) -> None:
    """Write-ahead (T-1): the request's row is committed before the agent hears of it, else the
    client gets 507/503 (:func:`refusal`) and the agent nothing. ``key``: the request's idempotency
    key, committed with it."""
    try:
        await bus.publish_committed(session_id, event_type, data, key)
    except Exception as exc:
        if not is_storage_fault(exc):
            raise
        raise refusal(exc, what) from None


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
