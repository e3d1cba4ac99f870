"""Restoring a session from a new child: ``session/load`` with bulk replay (SPEC D-6).

The load asks for ``_meta["hopline.session.loadReplayMode"] = "bulk"``; the child answers its
history in pages (``_meta["hopline.session.loadReplay"]``, or qwen-code's spelling), more pages with
``_hopline/session/loadUpdates``, or as ``session/update`` notifications before its answer. Each
page is bounded by ``HOPLINE_BULK_REPLAY_MAX_UPDATES`` / ``_BYTES``, a page over the pipe's max frame
ends the load at once (422), and when the journal already holds the session's updates the replayed
ones are only counted, never published twice.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hopline.budget import CEILINGS_BY_KEY, HOP_REPLAY, Budget
from hopline.daemon.bus import EventBus
from hopline.daemon.errors import SessionError, agent_failure, agent_timeout
from hopline.daemon.sessions.agents import AgentChildren
from hopline.daemon.sessions.relay import Relay
from hopline.daemon.sessions.state import DaemonSession, LoadState, SessionState
from hopline.store.journal import EventJournal
from hopline.vocabulary import (
    LOAD_REPLAY_META_KEYS,
    LOAD_UPDATES_METHOD,
    META_LOAD_REPLAY_MODE,
    SESSION_UPDATE,
)

if TYPE_CHECKING:
    from hopline.daemon.child import AcpChild

log = logging.getLogger("hopline.daemon.load")


class SessionLoader:
    """The load of one daemon's sessions: ``agents`` spawns the child, ``relay`` publishes the
    updates; ``check_capacity`` refuses a load over the live-sessions limit."""

    def __init__(self, budget: Budget, *, journal: EventJournal, bus: EventBus, agents: AgentChildren,
                 relay: Relay, check_capacity: Callable[[], None]) -> None:
        self.budget = budget
        self.journal = journal
        self.bus = bus
        self.agents = agents
        self.relay = relay
        self.check_capacity = check_capacity

    async def load(self, session: DaemonSession, *, new_if_unloadable: bool = False) -> dict[str, Any]:
        """Restore ``session`` on a new child. ``new_if_unloadable`` (an adoption): an agent without
        ``loadSession`` gets a ``session/new`` instead (``source: "new"``; its memory is not
        restored, the journal still holds the history)."""
        async with session.load_lock:
            child = session.child
            if child is not None and child.alive and session.state is SessionState.READY:
                return {"sessionId": session.id, "source": "journal", "replayedUpdates": 0,
                        "lastEventId": await self.journal.last_id(session.id)}
            if session.agent_session_id is None:
                raise SessionError(409, "session_not_loadable", "the session never got an agent session id")
            self.check_capacity()
            session.move(SessionState.LOADING)
            try:
                loaded = await self._from_child(session, new_if_unloadable)
                session.restart_on_prompt = ""
                return loaded
            except BaseException:
                session.move(SessionState.DETACHED)
                session.loading = None
                if session.child is not None:
                    await self.agents.discard_child(session, session.child)
                raise

    async def _from_child(self, session: DaemonSession, new_if_unloadable: bool) -> dict[str, Any]:
        child, init = await self.agents.spawn(session)
        caps = _dict(init.get("agentCapabilities"))
        if not caps.get("loadSession"):
            if not new_if_unloadable:
                raise SessionError(409, "agent_cannot_load", "the agent does not support session/load")
            await self.agents.bind(session, await self.agents.new_agent_session(session, child))
            session.move(SessionState.READY)
            return {"sessionId": session.id, "source": "new", "replayedUpdates": 0, "publishedUpdates": 0,
                    "lastEventId": await self.journal.last_id(session.id)}
        await self.bus.flushed()  # what was published is counted
        loading = LoadState(suppress=await self.journal.count(session.id, SESSION_UPDATE) > 0)
        session.loading = loading
        meta = {META_LOAD_REPLAY_MODE: "bulk", **self.agents.credentials_meta(session, child)}
        params: dict[str, Any] = {"sessionId": session.agent_session_id,
                                  "cwd": session.cwd or str(self.agents.data_dir), "mcpServers": [],
                                  "_meta": meta}
        result, size = await self._request(child, loading, "session/load", params)
        updates: list[Any] = []
        replay = replay_of(result)
        pages = 0
        while replay is not None:
            page_updates = _list(replay.get("updates"))
            self._check_page(len(page_updates), size)
            updates.extend(page_updates)
            pages += 1
            cursor = replay.get("nextCursor")
            if not replay.get("hasMore") or cursor is None:
                break
            result, size = await self._request(child, loading, LOAD_UPDATES_METHOD,
                                               {"sessionId": session.agent_session_id, "cursor": cursor})
            replay = result if isinstance(result, dict) else None
        self._check_page(loading.streamed, 0)
        published = 0
        if not loading.suppress:
            # Projected off the loop (sidecar writes), then published in order; a replay's losses
            # were counted when the updates were live.
            mine = [u for u in updates if isinstance(u, dict)]
            projected = await asyncio.to_thread(lambda: [self.relay.projector(session.id, u) for u in mine])
            for update in projected:
                self.relay.publish_update(session, None, update, count=False)
                published += 1
        session.loading = None
        session.move(SessionState.READY)
        await self.bus.flushed()  # the answer's lastEventId covers what the load published
        log.info("session loaded", extra={"updates": len(updates) + loading.streamed, "pages": pages,
                                          "published": published})
        return {"sessionId": session.id, "source": "child",
                "replayedUpdates": len(updates) + loading.streamed,
                "publishedUpdates": published + (0 if loading.suppress else loading.streamed),
                "lastEventId": await self.journal.last_id(session.id)}

    async def _request(self, child: AcpChild, loading: LoadState, method: str,
                       params: dict[str, Any]) -> tuple[Any, int]:
        """The child's answer to ``method`` and its frame size, unless a frame over the pipe's max
        (the answer itself, most likely) ends the wait first."""
        timeout = self.agents.handshake_timeout
        request = asyncio.ensure_future(child.request(method, params))
        dropped = asyncio.ensure_future(loading.frame_error.wait())
        try:
            done, _ = await asyncio.wait({request, dropped}, timeout=timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            dropped.cancel()
        if request in done:
            try:
                return request.result()
            except Exception as exc:
                failure = agent_failure(exc, method, self.budget)
                if failure is None:
                    raise
                raise failure from None
        request.cancel()
        if dropped in done:
            limit, observed = self.budget.pipe_max_frame_bytes, loading.frame_error_size
            ceiling = CEILINGS_BY_KEY["pipe_max_frame_bytes"]
            raise SessionError.from_limit(422, ceiling.exceeded(
                limit, observed, f"bulk replay response of {observed} bytes exceeds the pipe max frame of "
                f"{limit} bytes ({ceiling.name})"), "bulk_replay_too_large")
        raise agent_timeout(method, timeout)

    def _check_page(self, count: int, size: int) -> None:
        max_updates = self.budget.bulk_replay_max_updates
        max_bytes = self.budget.bulk_replay_max_bytes
        if count > max_updates:
            setting = CEILINGS_BY_KEY["bulk_replay_max_updates"].name
            raise SessionError.over_limit(
                422, "bulk_replay_too_large", "bulk_replay_max_updates", max_updates, count,
                f"bulk replay of {count} updates exceeds the limit of {max_updates} updates ({setting})",
                hop=HOP_REPLAY)
        if size > max_bytes:
            ceiling = CEILINGS_BY_KEY["bulk_replay_max_bytes"]
            raise SessionError.from_limit(422, ceiling.exceeded(
                max_bytes, size, f"bulk replay of {size} bytes exceeds the limit of {max_bytes} bytes "
                f"({ceiling.name})"), "bulk_replay_too_large")


def replay_of(result: Any) -> dict[str, Any] | None:
    """The bulk replay envelope of a ``session/load`` answer, if it has one."""
    if not isinstance(result, dict):
        return None
    meta = result.get("_meta")
    if not isinstance(meta, dict):
        return None
    for key in LOAD_REPLAY_META_KEYS:
        value = meta.get(key)
        if isinstance(value, dict):
            return value
    return None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
