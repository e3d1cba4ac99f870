"""Direct sidecar writes from our own agent (SPEC S-3), so its pipe frames stay small.

Contract (the daemon sets both; the agent reads them):

``HOPLINE_SIDECAR_DIR`` (child environment, not a secret)
    The daemon's sidecar store root (the directory holding ``sidecars.sqlite3`` and ``blobs/``).
    Same machine only: the agent opens the same SQLite file and writes files beside the daemon's.
``_meta["hopline.credentials"]["sidecarWriteToken"]`` (in ``session/new`` and ``session/load``)
    A per-session write token from :meth:`SidecarStore.mint_write_token`. Only its SHA-256 is in the
    store; it binds every write to that one daemon session and stops working when the daemon deletes
    the session. It travels in the ACP request, never in the environment: a warm child is started
    before its session exists, and the tools an agent runs inherit its environment. The agent keeps
    it in memory only (never logged, never in its session log).

Quotas and the TTL come from the agent's own :class:`~hopline.budget.Budget` (the daemon hands its
overrides to the child through ``Budget.to_env()``); the store re-checks the quotas under SQLite's
write lock, so daemon and agent writes share them exactly.

No store dir or no token: the agent sends updates inline (the daemon-side projection moves them).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from hopline.budget import HOP_SIDECARS, SIDECAR_DIR_ENV, Budget
from hopline.errors import SidecarWriterError
from hopline.sidecars.entry import REASON_TOKEN_REVOKED, SidecarEntry, SidecarRefused
from hopline.sidecars.index import INDEX_FILE
from hopline.sidecars.store import SidecarStore


def open_store(budget: Budget, environ: Mapping[str, str] | None = None) -> SidecarStore | None:
    """The daemon's store named by ``HOPLINE_SIDECAR_DIR``; ``None`` when the variable is unset.

    A set directory that holds no store raises :class:`SidecarWriterError` (a misconfigured spawn
    should be loud, not silently inline).
    """
    env = os.environ if environ is None else environ
    root = env.get(SIDECAR_DIR_ENV, "").strip()
    if not root:
        return None
    path = Path(root)
    if not (path / INDEX_FILE).is_file():
        raise SidecarWriterError(f"{HOP_SIDECARS}: {SIDECAR_DIR_ENV} does not hold a sidecar store")
    return SidecarStore(path, budget)


class SidecarWriter:
    """Writes sidecars for the one session its token is bound to (a :class:`SidecarSink`)."""

    def __init__(self, store: SidecarStore, token: str) -> None:
        if store.session_for_write_token(token) is None:
            raise SidecarWriterError(f"{HOP_SIDECARS}: the sidecar write token is not valid for this store")
        self.store = store
        self._token = token

    def close(self) -> None:
        self.store.close()

    def put(self, data: bytes, media_type: str) -> SidecarEntry:
        """Store ``data`` for the token's session; raises :class:`SidecarRefused` on refusal
        (quota, disk, or ``write_token_revoked`` once the daemon deleted the session)."""
        session_id = self.store.session_for_write_token(self._token)
        if session_id is None:
            self.store.count_fallback(REASON_TOKEN_REVOKED)  # the store never saw this write
            raise SidecarRefused(REASON_TOKEN_REVOKED, None, len(data))
        return self.store.put(session_id, data, media_type)

    def count_fallback(self, reason: str) -> None:
        self.store.count_fallback(reason)

    def count_kept_off_wire(self, nbytes: int) -> None:
        self.store.count_kept_off_wire(nbytes)
