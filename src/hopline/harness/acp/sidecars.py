"""Large updates written straight to the daemon's sidecar store by `hopline agent` (SPEC S-3, S-4).

Under the daemon on the same machine the agent's environment names the store
(``HOPLINE_SIDECAR_DIR``) and each ``session/new`` / ``session/load`` carries that session's write
token in ``_meta["hopline.credentials"]`` (:mod:`hopline.sidecars.writer`). Every update whose JSON
is over the sidecar threshold then goes through the one projection (:func:`project_fields`) with
the session's writer as its sink, before it is persisted and sent: the same previews and the same
``_meta["hopline.sidecar"]`` entries the daemon would make, so the daemon finds nothing left to move.
A refused write (quota, disk, revoked token) gives the flagged, truncated preview; the update is
never dropped.

Without a store or a token the agent sends updates inline and the daemon projects them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import orjson

from hopline.budget import Budget
from hopline.errors import SidecarWriterError
from hopline.sidecars.projection import project_fields
from hopline.sidecars.store import SidecarStore
from hopline.sidecars.writer import SidecarWriter, open_store

log = logging.getLogger("hopline.agent.sidecars")

PROVENANCE_BUILTIN = "builtin"


def tool_meta(name: str) -> dict[str, str]:
    """``_meta["hopline.tool"]``: the large-frame observer attributes ``toolName`` from it (O-5)."""
    return {"name": name, "provenance": PROVENANCE_BUILTIN}


def store_from_env(budget: Budget, environ: Mapping[str, str]) -> SidecarStore | None:
    """The daemon's store when it named one; ``None`` means send inline.

    A set but unusable store is logged as an error (without the path) and the agent goes on inline:
    the daemon's projection still moves the output.
    """
    try:
        return open_store(budget, environ)
    except (SidecarWriterError, OSError) as exc:
        log.error("sidecar store unavailable; updates go inline", extra={"error": type(exc).__name__})
        return None


def writer_for(store: SidecarStore | None, token: str | None) -> SidecarWriter | None:
    """A session's writer from the token its request carried; ``None`` (inline) without one.

    An unknown token is logged (never the token itself) and the session goes on inline.
    """
    if store is None or token is None:
        return None
    try:
        return SidecarWriter(store, token)
    except SidecarWriterError:
        log.error("sidecar write token refused; updates go inline")
        return None


def needs_offload(update: Mapping[str, Any], budget: Budget) -> bool:
    """Cheap check (no I/O): is this update's JSON over the sidecar threshold?"""
    threshold = budget.sidecar_threshold_bytes
    try:
        return len(orjson.dumps(update)) > threshold
    except (TypeError, orjson.JSONEncodeError):
        return False


def offload_update(update: dict[str, Any], writer: SidecarWriter, budget: Budget) -> dict[str, Any]:
    """The update projected into the store through ``writer`` (:func:`project_fields`).

    Blocking (file write, fsync, SQLite): call it through ``asyncio.to_thread``. Never mutates
    ``update``; returns it unchanged when it is not over the threshold.
    """
    projection = project_fields(update, writer, budget)
    if projection.lost_bytes:
        reasons = sorted({str(e.get("reason")) for e in projection.entries if e.get("truncated")})
        log.warning("sidecar refused; truncated preview sent",
                    extra={"lostBytes": projection.lost_bytes, "reasons": reasons})
    result: dict[str, Any] = projection.update
    return result
