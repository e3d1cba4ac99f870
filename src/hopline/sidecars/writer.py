"""Direct sidecar writes from our own agent (SPEC S-3), so its pipe frames stay small.

Environment contract (the daemon sets both on the child it spawns for one session; the agent
reads them with :meth:`SidecarWriter.from_env`):

``HOPLINE_SIDECAR_DIR``
    The daemon's sidecar store root (the directory holding ``sidecars.sqlite3`` and ``blobs/``).
    Same machine only: the agent opens the same SQLite file and writes files beside the daemon's.
``HOPLINE_SIDECAR_WRITE_TOKEN``
    A per-session write token from :meth:`SidecarStore.mint_write_token` (daemon side). Only its
    SHA-256 is in the store; it binds every write to that one daemon session, and it stops
    working when the daemon deletes the session. The agent never names a session itself.

Quotas and the TTL come from the agent's own :class:`~hopline.budget.Budget` (the daemon hands
its overrides to the child through ``Budget.to_env()``); the store re-checks the quotas under
SQLite's write lock, so daemon and agent writes share them exactly.

Either variable missing: :meth:`from_env` returns ``None`` and the agent sends output inline
(the daemon-side projection still moves it). A set but unknown token raises
:class:`SidecarWriterError` (a misconfigured spawn should be loud, not silently inline).

Agent usage::

    writer = SidecarWriter.from_env()
    if writer is not None and len(data) > budget.sidecar_threshold_bytes:
        preview, entry = writer.offload_text(text, "rawOutput")
        update["rawOutput"] = preview
        update.setdefault("_meta", {}).setdefault("hopline.sidecar", []).append(entry)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hopline.budget import HOP_SIDECARS, Budget
from hopline.sidecars.projection import TEXT_MEDIA_TYPE, preview_text
from hopline.sidecars.store import SidecarRefused, SidecarStore

ENV_SIDECAR_DIR = "HOPLINE_SIDECAR_DIR"
ENV_SIDECAR_WRITE_TOKEN = "HOPLINE_SIDECAR_WRITE_TOKEN"


class SidecarWriterError(RuntimeError):
    pass


class SidecarWriter:
    """Writes sidecars for the one session its token is bound to."""

    def __init__(self, store: SidecarStore, token: str) -> None:
        if store.session_for_write_token(token) is None:
            raise SidecarWriterError(f"{HOP_SIDECARS}: {ENV_SIDECAR_WRITE_TOKEN} is not a valid write token "
                                     "for this sidecar store")
        self.store = store
        self._token = token

    @classmethod
    def from_env(cls, budget: Budget | None = None,
                 environ: Mapping[str, str] | None = None) -> SidecarWriter | None:
        env = os.environ if environ is None else environ
        root = env.get(ENV_SIDECAR_DIR, "").strip()
        token = env.get(ENV_SIDECAR_WRITE_TOKEN, "").strip()
        if not root or not token:
            return None
        path = Path(root)
        if not (path / "sidecars.sqlite3").is_file():
            raise SidecarWriterError(f"{HOP_SIDECARS}: {ENV_SIDECAR_DIR} does not hold a sidecar store")
        store = SidecarStore(path, budget if budget is not None else Budget.from_env(env))
        try:
            return cls(store, token)
        except SidecarWriterError:
            store.close()
            raise

    def close(self) -> None:
        self.store.close()

    def write(self, data: bytes, media_type: str, *, field: str = "rawOutput") -> dict[str, Any]:
        """Store ``data``; returns the ``_meta["hopline.sidecar"]`` entry for ``field``.

        On refusal (quota, disk, token revoked) the entry is the S-2 fallback:
        ``{"field", "truncated": true, "reason", "bytes", "mediaType"}`` with no id; the caller
        keeps the preview inline.
        """
        session_id = self.store.session_for_write_token(self._token)
        if session_id is None:
            return {"field": field, "truncated": True, "reason": "write_token_revoked", "bytes": len(data),
                    "mediaType": media_type}
        try:
            entry = self.store.put(session_id, data, media_type)
        except SidecarRefused as refused:
            return {"field": field, "truncated": True, "reason": refused.reason, "bytes": len(data),
                    "mediaType": media_type}
        self.store.count_kept_off_wire(len(data))
        return entry.meta(field)

    def offload_text(self, text: str, field: str) -> tuple[str, dict[str, Any]]:
        """Store a large text; returns (the preview to send in its place, the ``_meta`` entry)."""
        data = text.encode("utf-8", "replace")
        entry = self.write(data, TEXT_MEDIA_TYPE, field=field)
        preview = preview_text(data, self.store.budget.sidecar_preview_bytes, entry.get("id"),
                               entry.get("reason"))
        return preview, entry
