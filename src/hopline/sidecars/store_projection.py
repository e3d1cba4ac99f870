"""The daemon's side of the projection (SPEC S-1, S-2): one session's sidecar store as the sink of
:func:`~hopline.sidecars.projection.project_fields`, over every JSON-RPC message a child sends that
carries updates (a ``session/update``, a load's bulk replay, a page of load-updates)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from hopline.budget import Budget
from hopline.sidecars.entry import SidecarEntry
from hopline.sidecars.projection import project_fields
from hopline.sidecars.store import SidecarStore
from hopline.vocabulary import LOAD_REPLAY_META_KEYS


class StoreSink:
    """:class:`~.projection.SidecarSink` over the daemon's store, for one daemon session."""

    def __init__(self, store: SidecarStore, session_id: str) -> None:
        self.store = store
        self.session_id = session_id

    def put(self, data: bytes, media_type: str) -> SidecarEntry:
        return self.store.put(self.session_id, data, media_type)

    def count_fallback(self, reason: str) -> None:
        self.store.count_fallback(reason)

    def count_kept_off_wire(self, nbytes: int) -> None:
        self.store.count_kept_off_wire(nbytes)


def project_update(update: Any, session_id: str, store: SidecarStore, budget: Budget) -> Any:
    """The update projected into the daemon's store for ``session_id``; the same object when nothing
    moves."""
    return project_fields(update, StoreSink(store, session_id), budget).update


def _project_entries(entries: list[Any], project: Callable[[Any], Any]) -> list[Any] | None:
    """A replayed entry is an update or a ``session/update`` params object around one."""
    out: list[Any] | None = None
    for index, entry in enumerate(entries):
        if isinstance(entry, dict) and "sessionUpdate" not in entry and isinstance(entry.get("update"), dict):
            inner = project(entry["update"])
            new = entry if inner is entry["update"] else {**entry, "update": inner}
        else:
            new = project(entry)
        if new is not entry:
            if out is None:
                out = list(entries)
            out[index] = new
    return out


def project_message(message: Any, session_id: str, store: SidecarStore, budget: Budget) -> Any:
    """Project one inbound JSON-RPC message (child -> daemon); the same object when nothing moves.

    Covers ``session/update`` notifications (``params.update``), bulk replay responses
    (``result._meta["hopline.session.loadReplay"].updates``, also ``qwen.``) and load-updates
    pages (``result.updates``). ``session_id`` is the daemon's session (the sidecars' owner).
    """
    if not isinstance(message, dict):
        return message

    def project(update: Any) -> Any:
        return project_update(update, session_id, store, budget)

    params = message.get("params")
    if message.get("method") == "session/update" and isinstance(params, dict):
        update = params.get("update")
        new_update = project(update)
        if new_update is update:
            return message
        return {**message, "params": {**params, "update": new_update}}

    result = message.get("result")
    if not isinstance(result, dict):
        return message
    new_result: dict[str, Any] | None = None
    meta = result.get("_meta")
    if isinstance(meta, dict):
        for key in LOAD_REPLAY_META_KEYS:
            replay = meta.get(key)
            if isinstance(replay, dict) and isinstance(replay.get("updates"), list):
                updates = _project_entries(replay["updates"], project)
                if updates is not None:
                    new_meta = dict((new_result or result)["_meta"])
                    new_meta[key] = {**replay, "updates": updates}
                    new_result = {**(new_result or result), "_meta": new_meta}
    if isinstance(result.get("updates"), list):
        updates = _project_entries(result["updates"], project)
        if updates is not None:
            new_result = {**(new_result or result), "updates": updates}
    if new_result is None:
        return message
    return {**message, "result": new_result}


def needs_projection(message: Any) -> bool:
    """Cheap pre-check: could this message carry an update to project? (Skips the thread hop.)"""
    if not isinstance(message, dict):
        return False
    if message.get("method") == "session/update":
        params = message.get("params")
        return isinstance(params, dict) and isinstance(params.get("update"), dict)
    result = message.get("result")
    if not isinstance(result, dict):
        return False
    meta = result.get("_meta")
    return isinstance(result.get("updates"), list) or (
        isinstance(meta, dict) and any(key in meta for key in LOAD_REPLAY_META_KEYS))


async def aproject_message(message: Any, session_id: str, store: SidecarStore, budget: Budget) -> Any:
    """:func:`project_message` off the event loop (the store writes and fsyncs files)."""
    if not needs_projection(message):
        return message
    return await asyncio.to_thread(project_message, message, session_id, store, budget)


def sidecar_projector(store: SidecarStore, budget: Budget,
                      then: Callable[[str, dict[str, Any]], dict[str, Any]] | None = None,
                      ) -> Callable[[str, dict[str, Any]], dict[str, Any]]:
    """The daemon's ``InboundProjector`` ``(session id, update) -> update`` backed by the store.

    ``then`` runs on the projected update (e.g. the daemon's ``oversize_replacement(budget)``, which
    still guards the SSE event limit for anything a sidecar does not cover).
    """

    def project(session_id: str, update: dict[str, Any]) -> dict[str, Any]:
        projected: dict[str, Any] = project_update(update, session_id, store, budget)
        return then(session_id, projected) if then is not None else projected

    return project
