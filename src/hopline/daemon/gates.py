"""The gate workflow in the daemon (SPEC K): ``POST /gate``, ``GET /gate``, ``GET /gate/{id}``,
``GET /gate/{id}/events`` (SSE, the rules of a session's stream) and ``POST /gate/{id}/cancel``.

:class:`ManagerDriver` is the gate run's :class:`~hopline.gate.run.SessionDriver` over this daemon's
session manager and event bus (in-process: no HTTP between them). :class:`GateRegistry` holds the
runs: at most ``HOPLINE_MAX_GATE_RUNS`` in progress (then 429), their gate sessions sharing
``HOPLINE_GATE_CONCURRENCY`` slots; it says which dev session is ``awaiting_gate`` (its prompts are
refused with 409 until the gate lets it go, K-2), and at startup removes the checkouts of runs a
previous daemon left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import hashlib
import json
import logging
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Header, Query
from pydantic import BaseModel, ConfigDict, Field

from hopline.budget import CEILINGS_BY_KEY, HOP_GATE, MAX_QUEUED_RANGE, Budget
from hopline.client.events import Event
from hopline.daemon.bus import EventBus
from hopline.daemon.errors import SessionError
from hopline.daemon.routes.sse import open_event_stream
from hopline.daemon.sessions.manager import SessionManager
from hopline.daemon.sessions.ownership import Ownership
from hopline.errors import RepoError, StoreError
from hopline.gate.run import CHECKOUT_DIR, DEFAULT_ROUNDS, RUN_FILE, GateRequest, GateRun
from hopline.gate.states import DevState, RunState
from hopline.harness.git import Checkout
from hopline.http.errors import bounded_json_route
from hopline.scripted.hints import scripted_hints
from hopline.sidecars.projection import restore_update
from hopline.store.journal import EventJournal
from hopline.vocabulary import (
    CLIENT_EVICTED,
    GATE_AGENTS,
    GATE_COMPLETE,
    REVIEW_META,
    STREAM_KIND,
    STREAM_KIND_GATE,
    gate_vocabulary,
)

log = logging.getLogger("hopline.daemon.gates")

GATE_ID_RE = re.compile(r"^g_[0-9a-f]{24}$")
WORK_DIR = "gate"  # under the daemon's data directory: one directory per run in progress


class ManagerDriver:
    """A gate run's sessions are this daemon's own (``permissionMode: auto``)."""

    def __init__(self, manager: SessionManager, bus: EventBus, budget: Budget) -> None:
        self.manager = manager
        self.bus = bus
        self.budget = budget

    async def create_session(self, *, cwd: str, profile: str, scripted: dict[str, Any] | None,
                             review: dict[str, Any] | None) -> str:
        session = await self.manager.create(cwd=cwd, profile=profile, permission_mode="auto",
                                            scripted=scripted,
                                            extra_meta={REVIEW_META: review} if review else None)
        return session.id

    async def prompt(self, session_id: str, text: str) -> str:
        blocks = [{"type": "text", "text": text}]
        return await self.manager.prompt(await self.manager.get(session_id), blocks)

    async def events(self, session_id: str, *, after: int) -> AsyncIterator[Event]:
        """Replay then live, as an SSE stream serves them; an eviction resubscribes after the last id."""
        cursor = after
        while True:
            subscriber, upto = await self.bus.subscribe(session_id, self.budget.sse_queue_max_events)
            try:
                async for page in self.bus.replay(session_id, cursor, upto):
                    for event in page:
                        cursor = max(cursor, event.id or 0)
                        yield Event(event.id, event.type, orjson.loads(event.data), event.size)
                while True:
                    live = await subscriber.next(self.budget.sse_heartbeat_seconds)
                    if live is None:
                        if subscriber.closed:
                            return  # the session was deleted
                        continue
                    if live.type == CLIENT_EVICTED:
                        break
                    if live.id is not None:
                        if live.id <= cursor:
                            continue
                        cursor = live.id
                    yield Event(live.id, live.type, orjson.loads(live.data), live.size)
            finally:
                self.bus.unsubscribe(subscriber)

    async def cancel(self, session_id: str) -> None:
        session = self.manager.find(session_id)
        if session is not None and session.child is not None and session.state == "ready":
            await self.manager.cancel(session)

    async def delete(self, session_id: str) -> None:
        session = self.manager.find(session_id)
        if session is not None:
            await self.manager.delete(session)

    def has_session(self, session_id: str) -> bool:
        """A session this daemon holds in memory (a journaled one is loaded by :meth:`load_session`)."""
        return self.manager.find(session_id) is not None

    async def load_session(self, session_id: str) -> bool:
        """Whether the session exists, read back from the journal into memory when it must be."""
        try:
            await self.manager.get(session_id)
        except SessionError:
            return False
        return True

    def publish(self, stream: str, event_type: str, data: dict[str, Any]) -> None:
        self.bus.publish(stream, event_type, data)

    async def resolve_update(self, session_id: str, update: dict[str, Any]) -> dict[str, Any]:
        """The update with its sidecars read back from this daemon's store (off the loop: files)."""
        store = self.manager.sidecars
        if store is None:
            return update

        def body(entry: dict[str, Any]) -> bytes:
            found = store.get(session_id, str(entry.get("id")))
            data = store.read_bytes(found) if found is not None else None
            if data is None or hashlib.sha256(data).hexdigest() != entry.get("sha256"):
                raise SidecarUnavailable("a sidecar of this update is gone or does not match its entry")
            return data

        def restore() -> dict[str, Any]:
            try:
                return restore_update(update, body)
            except ValueError as exc:  # a truncated entry: its bytes were lost
                raise SidecarUnavailable(str(exc)) from None

        return await asyncio.to_thread(restore)


class SidecarUnavailable(StoreError):
    """A moved field of an update cannot be read back (truncated, reaped, or changed)."""


# The gate agents' names as a type: the names themselves are vocabulary.GATE_AGENTS (spelled once).
GateAgentName = enum.StrEnum("GateAgentName", {name: name for name in GATE_AGENTS})  # type: ignore[misc]


class GateBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    repo: Annotated[str, Field(min_length=1, max_length=4096)]
    base: Annotated[str, Field(min_length=1, max_length=255)] | None = None
    head: Annotated[str, Field(min_length=1, max_length=255)] | None = None
    agents: Annotated[list[GateAgentName], Field(min_length=1, max_length=len(GATE_AGENTS))] | None = None
    devSessionId: Annotated[str, Field(min_length=1, max_length=128)] | None = None
    fix: bool = False
    rounds: int | None = None
    scripted: dict[str, Any] | None = None
    testCommand: Annotated[str, Field(min_length=1, max_length=4096)] | None = None
    allowUnsandboxed: bool = False
    python: Annotated[str, Field(min_length=1, max_length=4096)] | None = None  # the project's interpreter


class GateCreated(BaseModel):
    gateId: str


class GateRegistry:
    def __init__(self, budget: Budget, manager: SessionManager, bus: EventBus, journal: EventJournal,
                 data_dir: Path) -> None:
        self.budget = budget
        self.driver = ManagerDriver(manager, bus, budget)
        self.bus = bus
        self.journal = journal
        self.work_root = data_dir / WORK_DIR
        self.runs: dict[str, GateRun] = {}
        self._slots: asyncio.Semaphore | None = None
        self._releases: set[asyncio.Future[None]] = set()  # gate streams' leases to give up (shared store)
        self.leftovers_removed = self._remove_leftovers()

    def _remove_leftovers(self) -> int:
        """The checkouts of runs a previous daemon did not finish (it stopped or died): removed."""
        removed = 0
        if not self.work_root.is_dir():
            return 0
        for run_dir in self.work_root.iterdir():
            with contextlib.suppress(OSError, ValueError, KeyError):
                repo = Path(json.loads((run_dir / RUN_FILE).read_text())["repo"])
                Checkout(repo, run_dir / CHECKOUT_DIR, self.budget).remove()
            shutil.rmtree(run_dir, ignore_errors=True)
            removed += 1
        if removed:
            log.warning("left-over gate checkouts removed", extra={"count": removed})
        return removed

    @property
    def slots(self) -> asyncio.Semaphore:
        if self._slots is None:  # made on the loop that runs the gates
            self._slots = asyncio.Semaphore(self.budget.gate_concurrency)
        return self._slots

    def in_progress(self) -> list[GateRun]:
        return [run for run in self.runs.values() if run.in_progress]

    async def start(self, body: GateBody) -> GateRun:
        budget = self.budget
        running = len(self.in_progress())
        if running >= budget.max_gate_runs:
            setting = CEILINGS_BY_KEY["max_gate_runs"].name
            message = (f"this would be gate run {running + 1} in progress in this daemon, over the limit "
                       f"of {budget.max_gate_runs} ({setting}); wait for one to end")
            raise SessionError.over_limit(429, "too_many_gate_runs", "max_gate_runs", budget.max_gate_runs,
                                          running + 1, message, hop=HOP_GATE)
        rounds = body.rounds if body.rounds is not None else DEFAULT_ROUNDS
        if not 1 <= rounds <= budget.gate_max_rounds:
            setting = CEILINGS_BY_KEY["gate_max_rounds"].name
            raise SessionError.over_limit(400, "invalid_rounds", "gate_max_rounds", budget.gate_max_rounds,
                                          rounds, f"rounds={rounds} is outside 1..{budget.gate_max_rounds} "
                                          f"({setting})", hop=HOP_GATE, field="rounds")
        if body.fix and body.devSessionId is not None:
            raise SessionError(400, "invalid_gate_request",
                               "fix makes its own dev session on the head checkout; devSessionId attaches "
                               "one that waits: give one of them", hop=HOP_GATE, field="devSessionId")
        if len(set(body.agents or ())) != len(body.agents or ()):
            raise SessionError(400, "invalid_gate_request", "agents lists an agent twice", hop=HOP_GATE,
                               field="agents")
        if body.scripted is not None:
            scripted_hints(body.scripted, budget, unknown=True)
        if body.devSessionId is not None:
            if not await self.driver.load_session(body.devSessionId):
                raise SessionError(422, "unknown_dev_session", "devSessionId names no session of this daemon",
                                   hop=HOP_GATE, field="devSessionId")
            waiting = self.dev_gate(body.devSessionId)
            if waiting is not None:
                raise SessionError(409, "awaiting_gate", "this dev session already waits for a gate run",
                                   hop=HOP_GATE, gateId=waiting.id)
        if not Path(body.repo).is_absolute():
            raise SessionError(422, "invalid_repo", "repo must be an absolute path", hop=HOP_GATE,
                               field="repo")
        if body.python is not None and not Path(body.python).is_absolute():
            raise SessionError(422, "invalid_gate_request", "python must be an absolute path to an "
                               "interpreter", hop=HOP_GATE, field="python")
        request = GateRequest(repo=Path(body.repo), base=body.base, head=body.head,
                              agents=tuple(a.value for a in body.agents) if body.agents else GATE_AGENTS,
                              dev_session_id=body.devSessionId, fix=body.fix, rounds=rounds,
                              scripted=body.scripted, test_command=body.testCommand,
                              allow_unsandboxed=body.allowUnsandboxed, python=body.python)
        run = GateRun(request, self.driver, budget, work_dir=self.work_root, slots=self.slots)
        try:
            await asyncio.to_thread(run.resolve)
        except RepoError as exc:
            raise SessionError(422, "invalid_gate_request", str(exc), hop=HOP_GATE) from None
        running = len(self.in_progress())
        if running >= budget.max_gate_runs:  # others started while git ran
            raise SessionError.over_limit(429, "too_many_gate_runs", "max_gate_runs", budget.max_gate_runs,
                                          running + 1, "the gate runs in progress reached the limit of "
                                          f"{budget.max_gate_runs} ({CEILINGS_BY_KEY['max_gate_runs'].name})",
                                          hop=HOP_GATE)
        self._forget_ended()
        await self.journal.create_session(run.id, {STREAM_KIND: STREAM_KIND_GATE})  # opens its stream
        ownership = self.driver.manager.ownership
        await ownership.claim_new(run.id)  # on a shared store, a stream is written under its lease
        self.runs[run.id] = run
        run.start()
        if ownership.cluster is not None:
            self._releases.add(task := asyncio.ensure_future(self._release_when_done(run, ownership)))
            task.add_done_callback(self._releases.discard)
        log.info("gate run started", extra={"agents": len(request.agents), "fix": request.fix,
                                            "rounds": rounds})
        return run

    async def _release_when_done(self, run: GateRun, ownership: Ownership) -> None:
        """Once the run has ended and its last event is committed, its stream's lease goes."""
        await run.wait()
        await self.bus.flushed()
        await ownership.release(run.id)

    def _forget_ended(self) -> None:
        """Keep the newest ``HOPLINE_GATE_RUNS_KEPT`` ended runs in memory; an older one's stream ring
        is freed and ``GET /gate/{id}`` reads its result back from the journal."""
        ended = [run for run in self.runs.values() if not run.in_progress]
        for run in ended[:max(0, len(ended) - self.budget.gate_runs_kept)]:
            del self.runs[run.id]
            self.bus.close_session(run.id)

    def dev_gate(self, session_id: str) -> GateRun | None:
        """The run that holds this dev session (awaiting_gate or working), if one does."""
        for run in self.in_progress():
            dev = run.dev
            if run.dev_session_id == session_id and dev is not None and dev.state is not DevState.IDLE:
                return run
        return None

    def check_prompt(self, session_id: str) -> None:
        """K-2: a dev session awaiting a gate takes no prompt of a client until the gate lets it go."""
        run = self.dev_gate(session_id)
        if run is not None and run.dev is not None:
            raise SessionError(409, "awaiting_gate",
                               f"this dev session is {run.dev.state.value} for gate run {run.id}: it takes "
                               "no prompt until every gate has a verdict (or the run is cancelled)",
                               hop=HOP_GATE, state=run.dev.state.value, gateId=run.id)

    def dev_states(self) -> dict[str, str]:
        """Dev session id -> its dev state, for the sessions of ``/daemon/status``."""
        states: dict[str, str] = {}
        for run in self.runs.values():
            if run.dev is not None and run.dev_session_id is not None:
                states[run.dev_session_id] = run.dev.state.value
        return states

    async def result(self, gate_id: str) -> dict[str, Any]:
        """A run's state: live from memory, or its last journaled result (after a restart)."""
        if not GATE_ID_RE.fullmatch(gate_id):
            raise SessionError(404, "unknown_gate", "no such gate run", hop=HOP_GATE)
        run = self.runs.get(gate_id)
        if run is not None:
            return run.to_json()
        last = await self.journal.last_id(gate_id)
        if last == 0:
            raise SessionError(404, "unknown_gate", "no such gate run", hop=HOP_GATE)
        rows = await self.journal.read_page(gate_id, last - 1, max_bytes=self.budget.sse_max_event_bytes)
        if rows and rows[0].type == GATE_COMPLETE:
            result: dict[str, Any] = orjson.loads(rows[0].data)["result"]
            return result
        return {"gateId": gate_id, "state": RunState.INTERRUPTED.value, "exitCode": 2,
                "error": "the daemon stopped while this gate run was in progress"}

    def status(self) -> list[dict[str, Any]]:
        return [{"gateId": run.id, "state": run.state.value, "exitCode": run.exit_code,
                 "round": len(run.rounds),
                 "devSessionId": run.dev_session_id, "devState": run.dev_state,
                 "items": {r.agent: r.item.value for r in run.agents},
                 "verdicts": {r.agent: r.verdict for r in run.agents}} for run in self.runs.values()]

    async def shutdown(self) -> None:
        runs = self.in_progress()
        for run in runs:
            run.cancel()
        await asyncio.gather(*(run.wait() for run in runs), return_exceptions=True)


def gate_router(registry: GateRegistry) -> APIRouter:
    # Bodies parsed as the daemon's own routes parse them (bounded depth, no lone surrogate: 400);
    # what a request gets wrong is the gate's hop's error (daemon.gate), like every other /gate error.
    router = APIRouter(route_class=bounded_json_route(registry.budget.json_max_depth, HOP_GATE))
    errors: dict[int | str, dict[str, Any]] = {400: {}, 401: {}, 404: {}, 409: {}, 413: {}, 422: {}}

    @router.post("/gate", status_code=202, response_model=GateCreated, responses={**errors, 429: {}})
    async def start_gate(body: GateBody) -> Any:
        """Start a gate run over ``repo``'s ``base..head`` (defaults: the merge base with the upstream
        or main, and HEAD); ``devSessionId`` attaches a dev session, ``fix`` makes one that fixes."""
        return {"gateId": (await registry.start(body)).id}

    @router.get("/gate/vocabulary", responses=errors)
    async def vocabulary() -> dict[str, Any]:
        """The gate's agent names and event types (the console reads them here: spelled once)."""
        return gate_vocabulary()

    @router.get("/gate", responses=errors)
    async def list_gates() -> dict[str, Any]:
        return {"gates": registry.status()}

    @router.get("/gate/{gate_id}", responses=errors)
    async def gate(gate_id: str) -> dict[str, Any]:
        return await registry.result(gate_id)

    @router.get("/gate/{gate_id}/events", responses={**errors, 429: {}})
    async def gate_events(
        gate_id: str,
        maxQueued: Annotated[int | None, Query(ge=MAX_QUEUED_RANGE[0], le=MAX_QUEUED_RANGE[1])] = None,
        last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
    ) -> Any:

        await registry.result(gate_id)  # 404 for a run this daemon never had
        return await open_event_stream(registry.bus, registry.budget, gate_id, max_queued=maxQueued,
                                       last_event_id=last_event_id)

    @router.post("/gate/{gate_id}/cancel", responses=errors)
    async def cancel_gate(gate_id: str) -> dict[str, Any]:
        await registry.result(gate_id)
        run = registry.runs.get(gate_id)
        cancelled = run.cancel() if run is not None else False
        if run is not None and cancelled:
            await run.wait()
        return {"cancelled": cancelled}

    return router
