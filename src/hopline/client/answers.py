"""What the daemon's API answers, as the SDK returns it (SPEC C-1, A-1): one ``TypedDict`` per answer
(and a transcript's page, read a page at a time).

The keys are the daemon's own (camelCase JSON), so an answer is the parsed body as it came, typed:
no copy, no renaming. ``tests/client/test_answers.py`` holds each one to a real daemon's answers,
validated by pydantic.
A part whose shape belongs to another requirement (a status's budget, its cluster, a gate agent's
report) stays a JSON object here.
"""

# No ``from __future__ import annotations``: a TypedDict reads NotRequired from its annotations.
from typing import Any, Literal, NotRequired

# typing_extensions' TypedDict, which pydantic can validate on Python 3.11 (TypeAdapter(Loaded)).
from typing_extensions import TypedDict

JsonObject = dict[str, Any]


class Health(TypedDict):
    """``GET /health``."""

    status: Literal["ok"]


class Cancelled(TypedDict):
    """``POST /session/{id}/cancel``: whether a turn was running (and is being cancelled)."""

    cancelled: bool


class Loaded(TypedDict):
    """``POST /session/{id}/load`` (SPEC D-6): where the session's state came from (``journal``: the
    agent was ready, nothing replayed; ``child``: the agent replayed it; ``new``: the agent could not
    load it and a new agent session was bound), and the last event id after it."""

    sessionId: str
    source: Literal["journal", "child", "new"]
    replayedUpdates: int
    publishedUpdates: NotRequired[int]
    lastEventId: int | None


class PermissionOutcome(TypedDict):
    """The ACP outcome sent to the agent: an option chosen, or the request cancelled."""

    outcome: Literal["selected", "cancelled"]
    optionId: NotRequired[str]


class PermissionAnswered(TypedDict):
    """``POST /session/{id}/permission/{requestId}``."""

    requestId: str
    outcome: PermissionOutcome


class TranscriptEvent(TypedDict):
    """One event of a transcript page: its ``data``, or, for one over the page's bytes, what was
    ``omitted`` (and where to resume), or the ``corrupt`` record of bytes that failed their check."""

    id: int
    type: str
    data: NotRequired[Any]
    omitted: NotRequired[JsonObject]
    corrupt: NotRequired[JsonObject]


class TranscriptPage:
    """One page of ``GET /session/{id}/transcript``: its events, and the cursor of the next page
    while the journal holds more."""

    def __init__(self, events: list[TranscriptEvent], next_cursor: str | None) -> None:
        self.events = events
        self.next_cursor = next_cursor


class SessionSummary(TypedDict):
    """One session of ``GET /session``: what it is doing here (``detached``: no agent here), and
    from its record when it was made, for which workspace and profile."""

    sessionId: str
    state: str
    activity: str
    pendingPrompts: int
    pendingPermissions: int
    subscribers: int
    created: float | None
    cwd: str | None
    profile: str | None
    permissionMode: str | None


class SessionShown(SessionSummary):
    """``GET /session/{id}``: its summary and its last event id."""

    lastEventId: int | None


class SessionRow(TypedDict):
    """One session of ``GET /daemon/status``."""

    sessionId: str
    state: str
    activity: str
    childPid: int | None
    exitCode: int | None
    pendingPrompts: int
    pendingPermissions: int
    pendingPermissionBytes: int
    refusedRequests: int
    agentNotReading: bool
    subscribers: int
    lastEventId: int | None
    framesDropped: int
    lostBytes: int
    lostEvents: int  # events the store lost that no daemon held to write back (T-10)
    stderr: JsonObject | None
    owned: NotRequired[bool]  # in a cluster: whether this daemon holds the session's lease
    devState: NotRequired[str]  # a dev session attached to a gate run


class GateSummary(TypedDict):
    """One gate run of ``GET /gate`` and of ``GET /daemon/status``'s ``gates``."""

    gateId: str
    state: str
    exitCode: int | None
    round: int
    devSessionId: str | None
    devState: str | None
    items: dict[str, str]
    verdicts: dict[str, str | None]


class DaemonStatus(TypedDict):
    """``GET /daemon/status``."""

    sessions: list[SessionRow]
    gates: list[GateSummary]
    eventLoop: str
    compiled: JsonObject
    journal: JsonObject
    runtime: JsonObject
    largeFrames: JsonObject
    framesDropped: int
    sse: JsonObject
    delivery: JsonObject
    warmChildren: JsonObject | None
    sidecars: JsonObject | None
    budget: JsonObject
    cluster: JsonObject | None


class GateRun(TypedDict):
    """``GET /gate/{id}`` (SPEC K-1): the run's state, each agent's report, and the dev agent's part
    when the run fixes."""

    gateId: str
    state: str
    error: str | None
    exitCode: int | None
    base: str
    baseFrom: str
    head: str
    finalHead: str
    fix: bool
    rounds: int
    roundsRun: int
    agents: list[JsonObject]
    history: list[JsonObject]
    pending: list[str]
    createdAt: float
    endedAt: float | None
    nothingToReview: str | None
    sandbox: JsonObject | None
    testCommand: JsonObject | None
    python: JsonObject
    devSessionId: NotRequired[str | None]
    devState: NotRequired[str]
    devStates: NotRequired[list[JsonObject]]
    devTurns: NotRequired[list[JsonObject]]
