"""One daemon session: what it holds and its state machine (SPEC D-1, D-6).

A session is ``starting`` while its child is spawned and answers ``session/new``, ``ready`` while a
live child serves it, ``loading`` while ``POST /session/{id}/load`` gives it a new child, and
``detached`` with no child (its child exited, or the daemon restarted). :data:`TRANSITIONS` is the
whole table; :meth:`DaemonSession.move` refuses any other move with :class:`IllegalTransition`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hopline.daemon.child import AgentExited, AgentNotReading
from hopline.errors import InternalError

if TYPE_CHECKING:
    from hopline.daemon.child import AcpChild


class SessionState(enum.StrEnum):
    STARTING = "starting"
    READY = "ready"
    LOADING = "loading"
    DETACHED = "detached"


TRANSITIONS: Mapping[SessionState, frozenset[SessionState]] = {
    # session/new answered; a failed setup deletes the session (no state after it)
    SessionState.STARTING: frozenset({SessionState.READY}),
    # the child exited; a load may start before its exit was handled
    SessionState.READY: frozenset({SessionState.DETACHED, SessionState.LOADING}),
    # the load succeeded, or it failed or its child exited
    SessionState.LOADING: frozenset({SessionState.READY, SessionState.DETACHED}),
    SessionState.DETACHED: frozenset({SessionState.LOADING}),
}
LIVE_STATES = frozenset({SessionState.STARTING, SessionState.READY, SessionState.LOADING})  # with a child


class Activity(enum.StrEnum):
    """What a session is doing, as a person asks it (the console's badge, ``hopline sessions``)."""

    RUNNING = "running"  # a prompt runs or waits its turn
    AWAITING_PERMISSION = "awaiting_permission"  # the agent waits for a client's answer
    IDLE = "idle"


class IllegalTransition(InternalError):
    """A move the transition table does not allow: a bug in the daemon, never client input."""

    def __init__(self, current: SessionState, target: SessionState) -> None:
        super().__init__(f"a session cannot go from {current} to {target}")
        self.current = current
        self.target = target


@dataclasses.dataclass
class PendingPermission:
    child_request_id: Any
    options: list[dict[str, Any]]
    child: AcpChild
    bytes: int = 0  # what it holds (its event's toolCall and options), toward the byte ceiling
    prompt_id: str | None = None


@dataclasses.dataclass
class LoadState:
    suppress: bool  # the journal already holds the history: replayed updates are counted, not published
    streamed: int = 0
    streamed_bytes: int = 0
    frame_error: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    frame_error_size: int = 0


class DaemonSession:
    def __init__(self, session_id: str, options: dict[str, Any], agent_session_id: str | None, *,
                 state: SessionState = SessionState.DETACHED) -> None:
        self.id = session_id
        self.options = options
        self.agent_session_id = agent_session_id
        self.child: AcpChild | None = None
        self._state = state
        self.exit_code: int | None = None
        self.turn_lock = asyncio.Lock()
        self.load_lock = asyncio.Lock()
        self.adopt_lock = asyncio.Lock()  # several daemons: one adoption at a time
        self.current_prompt: str | None = None
        self.prompts: dict[str, asyncio.Task[None]] = {}
        # Prompts whose turn has ended but whose task is still storing the end: no longer pending
        # (a client that saw the end may queue the next prompt at once).
        self.ended_prompts: set[str] = set()
        self.permissions: dict[str, PendingPermission] = {}
        self.permission_bytes = 0  # held by the pending permissions (HOPLINE_MAX_PENDING_PERMISSION_BYTES)
        self.refused_requests = 0  # agent-initiated requests refused by a ceiling
        # Why the daemon gave up on its last child while it ran (a write deadline passed, a silence
        # deadline passed): its turns end saying so. None for a child that exited by itself.
        self.child_failure: AgentExited | None = None
        # The last child's initialize answer (its promptCapabilities check a prompt queued for the
        # next child).
        self.agent_init: dict[str, Any] = {}
        # Prompts a cancel (or a storage fault) cut: each ends within HOPLINE_CANCEL_GRACE_SECONDS,
        # a queued one without being sent; ``turn_stop`` ends the wait of the turn in flight.
        self.cancelled_prompts: set[str] = set()
        self.turn_stop: asyncio.Future[None] | None = None
        # Why its child was stopped by the daemon ("cancel_ignored", "owner_stepped_down"): the next
        # prompt starts a new one (session/load where the agent supports it); "" otherwise.
        self.restart_on_prompt = ""
        self.loading: LoadState | None = None
        self.frames_dropped = 0
        # Updates received before session/new answered: (their sessionId, projected update), held
        # until the agent's session id is known (bounded by the ring's bounds).
        self.early: list[tuple[Any, dict[str, Any]]] | None = None
        self.early_bytes = 0
        self.last_active = time.monotonic()  # a client's last request on it, or its last busy moment
        self.turn_lost: dict[str, int] = {}  # bytes lost per prompt in flight (D-8)
        self.storage_faults: dict[str, int] = {}  # events of a prompt in flight the journal refused (T-1)
        self.lost_bytes = 0
        # Events of the session a store lost that no daemon held to write back (T-10): counted, and
        # the prompts in flight then end degraded (the lost events' sizes are nobody's to know).
        self.lost_events = 0
        self.turn_degraded: set[str] = set()

    @property
    def pending_prompts(self) -> int:
        """Prompts running or queued (HOPLINE_MAX_PENDING_PROMPTS counts these)."""
        return len(self.prompts) - len(self.ended_prompts)

    @property
    def not_reading(self) -> bool:
        """Its last child passed a write deadline (HOPLINE_PIPE_WRITE_TIMEOUT)."""
        return isinstance(self.child_failure, AgentNotReading)

    @property
    def state(self) -> SessionState:
        return self._state

    @property
    def activity(self) -> Activity:
        if self.permissions:
            return Activity.AWAITING_PERMISSION
        if self.pending_prompts:
            return Activity.RUNNING
        return Activity.IDLE

    def move(self, target: SessionState) -> None:
        """Go to ``target``, or raise :class:`IllegalTransition` when the table forbids it."""
        if target not in TRANSITIONS[self._state]:
            raise IllegalTransition(self._state, target)
        self._state = target
        self.last_active = time.monotonic()  # a session just made ready is not idle yet

    def forget_prompt(self, prompt_id: str) -> None:
        """Its task finished (its end stored, or it was cancelled): the idle clock starts now."""
        self.prompts.pop(prompt_id, None)
        self.ended_prompts.discard(prompt_id)
        self.last_active = time.monotonic()
        self.cancelled_prompts.discard(prompt_id)

    def clear_permissions(self) -> None:
        self.permissions.clear()
        self.permission_bytes = 0

    @property
    def cwd(self) -> str:
        return str(self.options.get("cwd") or "")
