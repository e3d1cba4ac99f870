"""What a gate run needs of a daemon (:class:`SessionDriver`: its sessions, their events, a place
to publish), and following one prompt of a session to its turn's end over it.

The daemon implements the protocol over its session manager and event bus
(:class:`hopline.daemon.gates.ManagerDriver`), so the gate never imports the daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from hopline.budget import Budget, HoplineError
from hopline.client.events import Event
from hopline.client.turn import TurnTracker
from hopline.errors import AgentError

log = logging.getLogger("hopline.gate")


class SessionDriver(Protocol):
    """What a gate run needs of a daemon: its sessions, their events, and a place to publish."""

    async def create_session(self, *, cwd: str, profile: str, scripted: dict[str, Any] | None,
                             review: dict[str, Any] | None) -> str:
        """A new session (tools auto-approved); ``review`` = ``{base, head}`` makes it a gate session."""
        ...

    async def prompt(self, session_id: str, text: str) -> str:
        """Queue a prompt; its id."""
        ...

    def events(self, session_id: str, *, after: int) -> AsyncIterator[Event]:
        """The session's events with an id above ``after``, then live ones, in order (never ending)."""
        ...

    async def cancel(self, session_id: str) -> None: ...

    async def delete(self, session_id: str) -> None: ...

    def has_session(self, session_id: str) -> bool: ...

    async def resolve_update(self, session_id: str, update: dict[str, Any]) -> dict[str, Any]:
        """The original of a projected update: its fields moved to sidecars set back (size and
        sha256 checked); a :class:`~hopline.budget.HoplineError` when one cannot be."""
        ...

    def publish(self, stream: str, event_type: str, data: dict[str, Any]) -> None:
        """Journal and deliver one event on a stream (a gate run's id, or a session's)."""
        ...


class Stalled(AgentError):
    """No event of a session for ``HOPLINE_GATE_STALL_SECONDS``."""


async def follow_turn(driver: SessionDriver, session_id: str, text: str, budget: Budget, cursors: dict[str,
                                                                                                       int],
                      on_event: Callable[[Event], None]) -> TurnTracker:
    """Prompt the session and fold its events until that turn ends; :class:`Stalled` after
    ``HOPLINE_GATE_STALL_SECONDS`` without an event. ``on_event`` sees each event of the turn;
    ``cursors`` keeps the last event id seen per session (a second prompt reads on from there)."""
    prompt_id = await driver.prompt(session_id, text)
    tracker = TurnTracker(prompt_id)
    stream = driver.events(session_id, after=cursors.get(session_id, 0))
    events = stream.__aiter__()
    try:
        while True:
            try:
                event = await asyncio.wait_for(events.__anext__(), budget.gate_stall_seconds)
            except TimeoutError:
                raise Stalled() from None
            except StopAsyncIteration:  # the session went away under the turn
                tracker.error = {"origin": "agent", "reason": "session_closed",
                                 "message": "the session ended before its turn did"}
                return tracker
            if event.id is not None:
                cursors[session_id] = event.id
            if not event.synthetic and not tracker.mine(event):
                continue
            tracker.apply(await _whole(driver, session_id, event))
            on_event(event)
            if event.is_turn_end and event.prompt_id == prompt_id:
                return tracker
    finally:
        with contextlib.suppress(Exception):
            await stream.aclose()  # type: ignore[attr-defined]


async def _whole(driver: SessionDriver, session_id: str, event: Event) -> Event:
    """An agent message whose text went to a sidecar (a long answer in one chunk), restored: the
    verdict is read from the whole answer, never from its preview. Other events as they are."""
    if event.update_kind != "agent_message_chunk" or not any(not r.truncated for r in event.sidecars()):
        return event
    try:
        update = await driver.resolve_update(session_id, event.update)
    except HoplineError as exc:  # gone or lost: the preview is all there is (said, sizes only)
        log.warning("a moved agent message could not be restored", extra={
            "exception": type(exc).__name__, "bytes": sum(r.bytes for r in event.sidecars())})
        return event
    return Event(event.id, event.type, {**event.data, "update": update}, event.size)
