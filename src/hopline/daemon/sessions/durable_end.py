"""A turn's end, stored (SPEC D-8, T-1): the record says what happened, also when the store failed.

The end event (``turn_complete`` or ``turn_error``) is committed after everything the turn
published (so every refused event of the turn is known), then the prompt's row is closed. A turn
any of whose events the journal refused does not end as the agent said: it ends with
``turn_error`` (``origin: daemon``, ``reason: storage``, how many events were not stored), because
the record of it is incomplete. A commit of the end itself that fails is tried again (the store
may take it once space is freed) until it is stored or the task is cancelled (a daemon stopping:
the prompt stays open, and the next start ends it); the retries are spaced out, never a busy loop.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from hopline.daemon.bus import EventBus
from hopline.daemon.sessions.state import DaemonSession
from hopline.daemon.storage_faults import REASON_STORAGE, is_storage_fault
from hopline.store.journal import EventJournal
from hopline.vocabulary import TURN_ERROR

log = logging.getLogger("hopline.daemon.sessions")

# Pacing, not a limit: the first retry of a refused turn end, doubled up to the last.
RETRY_FIRST_SECONDS = 0.05
RETRY_MAX_SECONDS = 2.0


def storage_error(prompt_id: str, refused: int) -> dict[str, Any]:
    return {"promptId": prompt_id, "origin": "daemon", "reason": REASON_STORAGE, "refusedEvents": refused,
            "message": f"the daemon's store refused {refused} event(s) of this turn (disk full or failing), "
                       "so its record is incomplete; the agent was told to stop. Retry the prompt once "
                       "the store is fixed"}


async def end_turn_durably(bus: EventBus, journal: EventJournal, session: DaemonSession, prompt_id: str,
                           end: tuple[str, dict[str, Any]]) -> None:
    """Store the turn's end (``end``, or the storage error), then close the prompt's row."""
    await bus.flushed()  # every event of the turn committed or refused: the refusals are counted
    event_type, data = end
    delay = RETRY_FIRST_SECONDS
    stored = False
    while True:
        refused = session.storage_faults.get(prompt_id, 0)
        if refused and not stored:
            event_type, data = TURN_ERROR, {**storage_error(prompt_id, refused),
                                            "lostBytes": data.get("lostBytes", 0), "degraded": True}
        try:
            if not stored:
                await bus.publish_committed(session.id, event_type, data)
                stored = True
            await journal.close_prompt(session.id, prompt_id)  # after the end event, in write order
        except Exception as exc:
            if not is_storage_fault(exc):
                raise
            session.storage_faults.setdefault(prompt_id, 1)  # the end itself was refused
            log.error("a turn's end could not be stored; retrying", extra={"exception": type(exc).__name__,
                                                                            "retryInSeconds": delay})
            await asyncio.sleep(delay)
            delay = min(2 * delay, RETRY_MAX_SECONDS)
            continue
        session.storage_faults.pop(prompt_id, None)
        return
