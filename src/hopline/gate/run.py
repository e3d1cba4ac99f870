"""One gate run (ADR 0098): four gate agents review ``base..head`` on a read-only head checkout while
the dev session, when one is attached, waits in ``awaiting_gate``.

The run drives daemon sessions through :class:`SessionDriver` (create, prompt, events, cancel, delete,
publish), a protocol of its own: the daemon implements it over its session manager and event bus, so
this module never imports the daemon. What happens is published as events on the run's own stream
(``gate_started``, ``gate_round``, ``gate_item``, ``gate_progress``, ``gate_verdict``, ``dev_state``,
``gate_complete``), journaled like a session's.

Per gate agent and round: one session (profile = the agent, ``_meta["hopline.review"]`` = the commits),
started when a slot is free (``HOPLINE_GATE_CONCURRENCY``, daemon-wide). Its item follows its events:
``gate_running``, ``gate_compacting`` from a compaction to the next iteration, ``gate_retrying`` while
the loop retries a transient model-origin failure; no event for ``HOPLINE_GATE_STALL_SECONDS`` is
``gate_stalled``. An attempt that ends without a verdict (stalled, the turn failed, the agent exited)
is retried once on a fresh session (``gate_retrying``), then it is ``gate_error``. A final answer with
no valid verdict is asked for once more in the same session, then it is ``gate_error``: never a pass.

With ``fix`` and a ``fail`` verdict while rounds remain, the dev agent (a session on the checkout,
``dev`` profile) gets one prompt with the findings; what it writes is committed in the checkout
(a detached commit: the new head) and the gate runs again. The checkout is removed at the end,
whatever the end (verdicts, an error, a cancel).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import secrets
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol

from hopline.budget import Budget, HoplineError
from hopline.client.events import Event
from hopline.client.turn import TurnTracker
from hopline.gate.git import Checkout, RepoError, default_base, repository_root, resolve_commit
from hopline.gate.states import (
    RUN_IN_PROGRESS,
    TERMINAL_TYPES,
    VERDICT_ITEMS,
    DevEvent,
    DevState,
    DevStateMachine,
    GateItem,
    RunState,
    move_run,
)
from hopline.gate.verdict import VERDICT_FORMAT, ParsedVerdict, VerdictInvalid, error_verdict, parse_verdict
from hopline.harness.review import FIX_MARKER, GATE_AGENTS, GATE_REVIEW_MARKER
from hopline.vocabulary import COMPACTION, PROGRESS, TURN_COMPLETE, TURN_ERROR

log = logging.getLogger("hopline.gate")

# What a driver's events() yields: a session event as the SDK types it (id, type, data, size).
SessionEvent = Event

DEFAULT_ROUNDS = 2
DEV_PROFILE = "dev"
RUN_FILE = "run.json"  # in the run's work directory: what a restarted daemon needs to clean up
CHECKOUT_DIR = "checkout"
# The gate stream's event types (journaled, with ids, like a session's).
GATE_STARTED = "gate_started"
GATE_ROUND = "gate_round"
GATE_ITEM = "gate_item"
GATE_PROGRESS = "gate_progress"
GATE_VERDICT = "gate_verdict"
DEV_STATE = "dev_state"
GATE_COMPLETE = "gate_complete"

TITLES = {"qa_automation": "QA automation", "qa_performance_security": "QA performance and security",
          "qa_strategy": "QA strategy", "appsec": "application security"}
DOMAINS = {
    "qa_automation": "the tests of the change: run them or read their logs, and report every failing test.",
    "qa_performance_security": "slow paths, resource leaks and unsafe input handling (text run as code, "
                               "as with eval or exec).",
    "qa_strategy": "test coverage and risk: changed code that no test covers, unfinished work (TODO, FIXME).",
    "appsec": "security: injection, secrets in the code (access keys, passwords), unsafe defaults.",
}


class SessionDriver(Protocol):
    """What a gate run needs of a daemon: its sessions, their events, and a place to publish."""

    async def create_session(self, *, cwd: str, profile: str, scripted: dict[str, Any] | None,
                             review: dict[str, str] | None) -> str:
        """A new session (tools auto-approved); ``review`` = ``{base, head}`` makes it a gate session."""
        ...

    async def prompt(self, session_id: str, text: str) -> str:
        """Queue a prompt; its id."""
        ...

    def events(self, session_id: str, *, after: int) -> AsyncIterator[SessionEvent]:
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


@dataclasses.dataclass(frozen=True)
class GateRequest:
    repo: Path
    base: str | None = None
    head: str | None = None
    agents: tuple[str, ...] = GATE_AGENTS
    dev_session_id: str | None = None
    fix: bool = False
    rounds: int = DEFAULT_ROUNDS
    scripted: dict[str, Any] | None = None


def _header(agent: str, base: str, head: str) -> str:
    return f"{GATE_REVIEW_MARKER} · agent {agent} · base {base} · head {head}"


def gate_prompt(agent: str, base: str, head: str) -> str:
    """What a gate agent is asked: its domain, its tools, and the verdict's form."""
    return (f"{_header(agent, base, head)}\n"
            f"You are the {TITLES[agent]} gate of this pull request: {DOMAINS[agent]}\n"
            "Review the change between base and head. git_diff with stat=true lists the changed files "
            "with their line counts, git_diff with path shows one file's diff, without arguments the "
            "whole diff. read_file, search_workspace and run_command (tests and linters only) let you "
            "look closer; the checkout is read-only.\n"
            f"End with your verdict as one JSON object in a ```json block, in this form:\n{VERDICT_FORMAT}\n"
            'verdict is "fail" when a finding has severity "error", "pass" otherwise, and "error" only '
            "when you could not review the change; file is relative to the repository's root.")


def verdict_retry_prompt(agent: str, base: str, head: str, reason: str) -> str:
    return (f"{_header(agent, base, head)}\nYour last answer held no valid verdict ({reason}). Answer "
            f"again with only your verdict, as one JSON object in a ```json block:\n{VERDICT_FORMAT}")


def fix_prompt(round_number: int, findings: list[dict[str, Any]]) -> str:
    """The dev agent's one prompt after a round with a fail: the findings to fix, as JSON."""
    return (f"{FIX_MARKER} · round {round_number}\nThe gate reviewed your change and found the issues "
            "below. Fix them in this checkout with write_file (paths relative to its root), then say "
            "what you changed and what you could not fix.\n"
            f"```json\n{json.dumps(findings, indent=1)}\n```")


@dataclasses.dataclass
class AgentReport:
    """One gate agent in one round: where it is, its verdict and its figures."""

    agent: str
    round: int
    item: GateItem = GateItem.QUEUED
    attempt: int = 0
    session_id: str | None = None
    verdict: str | None = None
    summary: str = ""
    findings: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    omitted_findings: int = 0
    iterations: int = 0
    max_iterations: int = 0
    compactions: int = 0
    summarizers: dict[str, int] = dataclasses.field(default_factory=dict)  # compactions by summarizer
    summarizer_errors: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # why extractive
    max_body_bytes: int = 0
    ceiling_bytes: int = 0
    http_413s: int = 0
    model_retries: int = 0
    stalls: int = 0
    verdict_asks: int = 0
    sidecars: int = 0  # fields of its updates moved to sidecars (kept off the wire)
    sidecar_bytes: int = 0
    error: dict[str, Any] | None = None
    started_at: float | None = None
    ended_at: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"agent": self.agent, "round": self.round, "item": self.item.value, "attempt": self.attempt,
                "sessionId": self.session_id, "verdict": self.verdict, "summary": self.summary,
                "findings": self.findings, "omittedFindings": self.omitted_findings,
                "iterations": self.iterations, "maxIterations": self.max_iterations,
                "compactions": self.compactions, "summarizers": dict(self.summarizers),
                "summarizerErrors": list(self.summarizer_errors), "maxBodyBytes": self.max_body_bytes,
                "ceilingBytes": self.ceiling_bytes, "http413s": self.http_413s,
                "modelRetries": self.model_retries, "stalls": self.stalls, "verdictAsks": self.verdict_asks,
                "sidecars": self.sidecars, "sidecarBytes": self.sidecar_bytes,
                "error": self.error, "startedAt": self.started_at, "endedAt": self.ended_at}


@dataclasses.dataclass(frozen=True)
class _NoVerdict:
    reason: str
    error: dict[str, Any] | None = None
    retry: bool = True  # a fresh attempt may help (a stall, a failed turn); not after a bad answer


class _Stalled(HoplineError):
    pass


# What a failed turn's error says that a report keeps (sizes and origins, never a message's payload).
_ERROR_KEYS = ("origin", "status", "hop", "limitBytes", "observedBytes", "reason", "exitCode")


class GateRun:
    """One run; :meth:`run` drives it to its end and never raises (its end is in :meth:`to_json`)."""

    def __init__(self, request: GateRequest, driver: SessionDriver, budget: Budget, *, work_dir: Path,
                 slots: asyncio.Semaphore, gate_id: str | None = None) -> None:
        self.id = gate_id or "g_" + secrets.token_hex(12)
        self.request = request
        self.driver = driver
        self.budget = budget
        self.work_dir = work_dir / self.id
        self.slots = slots
        self._state = RunState.STARTING  # moves through RUN_TRANSITIONS only (see :meth:`move`)
        self.error: str | None = None
        self.repo = request.repo
        self.base = ""
        self.head = ""
        self.base_from = ""
        self.heads: list[str] = []  # the head of each round (a fix makes a new one)
        self.rounds: list[list[AgentReport]] = []
        self.dev: DevStateMachine | None = None
        self.dev_session_id = request.dev_session_id
        self.dev_created = False
        self.dev_turns: list[dict[str, Any]] = []
        self.created_at = time.time()
        self.ended_at: float | None = None
        self._checkout: Checkout | None = None
        self._creating: asyncio.Future[Checkout] | None = None
        self._cursors: dict[str, int] = {}  # last event id seen, per session
        self._task: asyncio.Task[None] | None = None

    # --- what it publishes -----------------------------------------------------------------------

    def _emit(self, event_type: str, data: dict[str, Any]) -> None:
        self.driver.publish(self.id, event_type, {"gateId": self.id, **data})

    def _set_item(self, report: AgentReport, item: GateItem, **detail: Any) -> None:
        if report.item is item and not detail:
            return
        report.item = item
        self._emit(GATE_ITEM, {"agent": report.agent, "round": report.round, "item": item.value,
                               "attempt": report.attempt, "sessionId": report.session_id, **detail})

    def _dev_fire(self, event: DevEvent, **detail: Any) -> None:
        if self.dev is None:
            return
        items = [r.item for r in self.rounds[-1]] if self.rounds else []
        change = self.dev.fire(event, items, round=len(self.rounds), **detail)
        data = {"devSessionId": self.dev_session_id, **change}
        self._emit(DEV_STATE, data)
        if self.dev_session_id is not None and self.driver.has_session(self.dev_session_id):
            self.driver.publish(self.dev_session_id, DEV_STATE, {"gateId": self.id, **data})
        log.info("dev state", extra={"state": change["state"], "previous": change["previous"]})

    @property
    def state(self) -> RunState:
        return self._state

    @property
    def in_progress(self) -> bool:
        return self._state in RUN_IN_PROGRESS

    def move(self, target: RunState) -> None:
        """Go to ``target``, or :class:`~hopline.gate.states.IllegalRunTransition`."""
        self._state = move_run(self._state, target)

    @property
    def dev_state(self) -> str | None:
        return self.dev.state.value if self.dev is not None else None

    # --- the run ---------------------------------------------------------------------------------

    def start(self) -> asyncio.Task[None]:
        self._task = asyncio.ensure_future(self.run())
        return self._task

    def cancel(self) -> bool:
        if self._task is None or self._task.done():
            return False
        self._task.cancel()
        return True

    async def wait(self) -> None:
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(self._task)

    async def run(self) -> None:
        try:
            await self._prepare()
            self.move(RunState.RUNNING)
            await self._rounds()
            self.move(RunState.DONE)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            self.move(RunState.CANCELLED)
            self.error = "cancelled"
            self._end_dev(DevEvent.CANCELLED)
        except RepoError as exc:
            self.move(RunState.FAILED)
            self.error = str(exc)
            self._end_dev(DevEvent.CANCELLED)
        except Exception as exc:  # a bug or a daemon failure: the run ends, said, never a pass
            self.move(RunState.FAILED)
            self.error = f"{type(exc).__name__}: {str(exc)[:300]}"
            log.warning("gate run failed", extra={"exception": type(exc).__name__})
            self._end_dev(DevEvent.CANCELLED)
        finally:
            await asyncio.shield(self._cleanup())
            self.ended_at = time.time()
            self._emit(GATE_COMPLETE, {"result": self.to_json()})
            log.info("gate run ended", extra={"state": self.state.value, "exitCode": self.exit_code})

    def _end_dev(self, event: DevEvent) -> None:
        if self.dev is not None and self.dev.state is not DevState.IDLE:
            with contextlib.suppress(Exception):
                self._dev_fire(event)

    def resolve(self) -> None:
        """The repository's root and the commits under review (blocking; :class:`RepoError` names
        what is wrong). :meth:`run` calls it unless it was called before (the daemon does, so a bad
        revision is the client's 422, not a failed run)."""
        request, budget = self.request, self.budget
        self.repo = repository_root(request.repo, budget)
        self.head = resolve_commit(self.repo, budget, request.head or "HEAD", "head")
        if request.base is not None:
            self.base = resolve_commit(self.repo, budget, request.base, "base")
            self.base_from = "given"
        else:
            self.base, self.base_from = default_base(self.repo, budget, self.head)

    async def _prepare(self) -> None:
        request, budget = self.request, self.budget
        if not self.head:
            await asyncio.to_thread(self.resolve)
        repo = self.repo
        if request.dev_session_id is not None:
            if not self.driver.has_session(request.dev_session_id):
                raise RepoError("devSessionId names no session of this daemon")
            self.dev = DevStateMachine()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        (self.work_dir / RUN_FILE).write_text(json.dumps({"repo": str(repo)}))
        # Made in a thread that a cancel cannot stop: the cleanup waits for it, then removes it.
        self._creating = asyncio.ensure_future(asyncio.to_thread(
            Checkout.create, repo, self.work_dir / CHECKOUT_DIR, self.head, budget))
        self._checkout = await asyncio.shield(self._creating)
        if request.fix:
            self.dev_session_id = await self.driver.create_session(
                cwd=str(self._checkout.path), profile=DEV_PROFILE, scripted=request.scripted, review=None)
            self.dev_created = True
            self.dev = DevStateMachine()
        self._emit(GATE_STARTED, {"base": self.base, "baseFrom": self.base_from, "head": self.head,
                                  "agents": list(request.agents), "rounds": request.rounds,
                                  "fix": request.fix, "devSessionId": self.dev_session_id})

    async def _rounds(self) -> None:
        head = self.head
        for number in range(1, self.request.rounds + 1):
            reports = [AgentReport(agent, number) for agent in self.request.agents]
            self.rounds.append(reports)
            self.heads.append(head)
            self._emit(GATE_ROUND, {"round": number, "head": head,
                                    "items": {r.agent: r.item.value for r in reports}})
            for report in reports:
                self._set_item(report, GateItem.QUEUED, reason="round started")
            if self.dev is not None and self.dev.state is DevState.IDLE:  # a fix round is awaited already
                self._dev_fire(DevEvent.GATE_STARTED)
            async with asyncio.TaskGroup() as group:
                for report in reports:
                    group.create_task(self._review(report, head))
            failed = [f for r in reports if r.verdict == "fail" for f in r.findings]
            if not (self.request.fix and failed and number < self.request.rounds):
                self._dev_fire(DevEvent.GATES_SETTLED)
                return
            self._dev_fire(DevEvent.FIX_STARTED)
            new_head = await self._fix(number, [{"agent": r.agent, **f} for r in reports
                                                if r.verdict == "fail" for f in r.findings])
            if new_head is None:
                return
            head = new_head

    # --- one gate agent ----------------------------------------------------------------------------

    async def _review(self, report: AgentReport, head: str) -> None:
        async with self.slots:
            report.started_at = time.time()
            outcome: ParsedVerdict | _NoVerdict = _NoVerdict("not run")
            for attempt in (1, 2):
                report.attempt = attempt
                outcome = await self._attempt(report, head)
                if isinstance(outcome, ParsedVerdict) or not outcome.retry or attempt == 2:
                    break
                self._set_item(report, GateItem.RETRYING, reason=outcome.reason)
            if isinstance(outcome, _NoVerdict):
                report.error = outcome.error or {"reason": outcome.reason}
                outcome = error_verdict(f"no verdict after {report.attempt} attempt(s): {outcome.reason}",
                                        self.budget)
            report.verdict = outcome.verdict
            report.summary = outcome.summary
            report.findings = outcome.findings
            report.omitted_findings = outcome.omitted_findings
            report.ended_at = time.time()
            self._set_item(report, VERDICT_ITEMS[outcome.verdict])
            self._emit(GATE_VERDICT, report.to_json())
            log.info("gate verdict", extra={"agent": report.agent, "verdict": outcome.verdict,
                                            "findings": len(outcome.findings)})

    async def _attempt(self, report: AgentReport, head: str) -> ParsedVerdict | _NoVerdict:
        assert self._checkout is not None
        session_id = await self.driver.create_session(
            cwd=str(self._checkout.path), profile=report.agent, scripted=self.request.scripted,
            review={"base": self.base, "head": head})
        report.session_id = session_id
        self._cursors[session_id] = 0
        self._set_item(report, GateItem.RUNNING)
        stalled = False
        try:
            text = gate_prompt(report.agent, self.base, head)
            for ask in (1, 2):
                report.verdict_asks += 1
                try:
                    tracker = await self._follow(session_id, text, report)
                except _Stalled:
                    stalled = True
                    report.stalls += 1
                    self._set_item(report, GateItem.STALLED,
                                   reason=f"no event for {self.budget.gate_stall_seconds} s")
                    return _NoVerdict(f"stalled: no event for {self.budget.gate_stall_seconds} s "
                                      "(HOPLINE_GATE_STALL_SECONDS)")
                if tracker.error is not None:
                    failed = tracker.error
                    error: dict[str, Any] = {k: failed.get(k) for k in _ERROR_KEYS if k in failed}
                    if error.get("status") == 413:
                        report.http_413s += 1
                    return _NoVerdict(f"the turn failed (origin {error.get('origin')})", error)
                try:  # linear, bounded by the budget, and off the loop: an answer may be megabytes
                    return await asyncio.to_thread(parse_verdict, tracker.final_text, self.budget)
                except VerdictInvalid as exc:
                    if ask == 2:
                        return _NoVerdict(f"no valid verdict, asked twice: {exc}", retry=False)
                    text = verdict_retry_prompt(report.agent, self.base, head, str(exc))
            return _NoVerdict("no verdict")  # pragma: no cover - the loop returns
        finally:
            with contextlib.suppress(Exception):
                if stalled:
                    await self.driver.cancel(session_id)
            with contextlib.suppress(Exception):
                await self.driver.delete(session_id)
            self._cursors.pop(session_id, None)

    async def _follow(self, session_id: str, text: str, report: AgentReport | None) -> TurnTracker:
        """Prompt the session and fold its events until that turn ends; :class:`_Stalled` after
        ``HOPLINE_GATE_STALL_SECONDS`` without an event. ``report`` (a gate's) follows its item."""
        prompt_id = await self.driver.prompt(session_id, text)
        tracker = TurnTracker(prompt_id)
        stream = self.driver.events(session_id, after=self._cursors.get(session_id, 0))
        events = stream.__aiter__()
        try:
            while True:
                try:
                    event = await asyncio.wait_for(events.__anext__(), self.budget.gate_stall_seconds)
                except TimeoutError:
                    raise _Stalled() from None
                except StopAsyncIteration:  # the session went away under the turn
                    tracker.error = {"origin": "agent", "reason": "session_closed",
                                     "message": "the session ended before its turn did"}
                    return tracker
                if event.id is not None:
                    self._cursors[session_id] = event.id
                if not event.synthetic and not tracker.mine(event):
                    continue
                tracker.apply(await self._whole(session_id, event))
                if report is not None:
                    self._track(report, event)
                if event.is_turn_end and event.prompt_id == prompt_id:
                    return tracker
        finally:
            with contextlib.suppress(Exception):
                await stream.aclose()  # type: ignore[attr-defined]

    async def _whole(self, session_id: str, event: Event) -> Event:
        """An agent message whose text went to a sidecar (a long answer in one chunk), restored: the
        verdict is read from the whole answer, never from its preview. Other events as they are."""
        if event.update_kind != "agent_message_chunk" or not any(not r.truncated for r in event.sidecars()):
            return event
        try:
            update = await self.driver.resolve_update(session_id, event.update)
        except HoplineError as exc:  # gone or lost: the preview is all there is (said, sizes only)
            log.warning("a moved agent message could not be restored", extra={
                "exception": type(exc).__name__, "bytes": sum(r.bytes for r in event.sidecars())})
            return event
        return Event(event.id, event.type, {**event.data, "update": update}, event.size)

    def _track(self, report: AgentReport, event: Event) -> None:
        moved = [ref for ref in event.sidecars() if not ref.truncated]
        report.sidecars += len(moved)
        report.sidecar_bytes += sum(ref.bytes for ref in moved)
        if event.type == PROGRESS:
            progress = event.data.get("progress") or {}
            retry = progress.get("retry")
            report.iterations = max(report.iterations, int(progress.get("iteration") or 0))
            report.max_iterations = int(progress.get("maxIterations") or report.max_iterations)
            report.max_body_bytes = max(report.max_body_bytes, int(progress.get("bodyBytes") or 0))
            report.ceiling_bytes = int(progress.get("ceilingBytes") or report.ceiling_bytes)
            if isinstance(retry, dict):
                if retry.get("status") == 413:
                    report.http_413s += 1
                if retry.get("origin") == "model":
                    report.model_retries += 1
                    self._set_item(report, GateItem.RETRYING, reason="a transient model failure is retried")
            else:
                self._set_item(report, GateItem.RUNNING)
            self._emit(GATE_PROGRESS, {"agent": report.agent, "round": report.round,
                                       "attempt": report.attempt, "iteration": report.iterations,
                                       "maxIterations": report.max_iterations,
                                       "bodyBytes": int(progress.get("bodyBytes") or 0),
                                       "maxBodyBytes": report.max_body_bytes,
                                       "ceilingBytes": report.ceiling_bytes,
                                       "compactions": report.compactions,
                                       "extractiveSummaries": len(report.summarizer_errors),
                                       "http413s": report.http_413s,
                                       "sidecars": report.sidecars})
        elif event.type == COMPACTION:
            record = event.data.get("compaction")
            record = record if isinstance(record, dict) else {}
            report.compactions += 1
            summarizer = str(record.get("summarizer") or "model")
            report.summarizers[summarizer] = report.summarizers.get(summarizer, 0) + 1
            failed = record.get("summarizerError")
            if isinstance(failed, dict):  # the model's summary failed: the extractive one was used
                report.summarizer_errors.append({k: failed.get(k) for k in ("origin", "status", "hop")
                                                 if k in failed})
            self._set_item(report, GateItem.COMPACTING, trigger=record.get("trigger"))
        elif event.type == TURN_COMPLETE:
            turn = event.data.get("turn")
            turn = turn if isinstance(turn, dict) else {}
            report.max_body_bytes = max(report.max_body_bytes, int(turn.get("maxBodyBytes") or 0))
        elif event.type == TURN_ERROR:
            pass

    # --- the dev agent -----------------------------------------------------------------------------

    async def _fix(self, round_number: int, findings: list[dict[str, Any]]) -> str | None:
        """The dev agent's turn on the findings; the new head, or None when there is no new round."""
        assert self._checkout is not None and self.dev_session_id is not None
        checkout = self._checkout
        await asyncio.to_thread(checkout.writable)
        turn: dict[str, Any] = {"round": round_number, "findings": len(findings)}
        try:
            tracker = await self._follow(self.dev_session_id, fix_prompt(round_number, findings), None)
            turn["stopReason"] = tracker.stop_reason
            if tracker.error is not None:
                turn["error"] = {k: tracker.error.get(k) for k in ("origin", "status", "hop")}
        except _Stalled:
            turn["error"] = {"reason": f"stalled: no event for {self.budget.gate_stall_seconds} s"}
            with contextlib.suppress(Exception):
                await self.driver.cancel(self.dev_session_id)
        finally:
            await asyncio.to_thread(checkout.read_only)
        new_head = None
        if "error" not in turn:
            new_head = await asyncio.to_thread(checkout.commit_all,
                                               f"hopline dev agent: fixes after gate round {round_number}")
            turn["commit"] = new_head
        self.dev_turns.append(turn)
        if new_head is None:
            reason = "the dev turn failed" if "error" in turn else "the dev agent changed nothing"
            self._dev_fire(DevEvent.FIX_FAILED, reason=reason)
            return None
        self._dev_fire(DevEvent.FIX_DONE, commit=new_head)
        return new_head

    async def _cleanup(self) -> None:
        if self.dev_created and self.dev_session_id is not None:
            with contextlib.suppress(Exception):
                await self.driver.delete(self.dev_session_id)
        if self._creating is not None:
            with contextlib.suppress(BaseException):
                await self._creating  # a checkout still being made is removed once it is there
            checkout = Checkout(self.repo, self.work_dir / CHECKOUT_DIR, self.budget)
            with contextlib.suppress(Exception):
                await asyncio.to_thread(checkout.remove)
        await asyncio.to_thread(shutil.rmtree, self.work_dir, True)

    # --- the result ----------------------------------------------------------------------------------

    @property
    def agents(self) -> list[AgentReport]:
        """The last round's reports: the verdicts that count."""
        return self.rounds[-1] if self.rounds else []

    @property
    def exit_code(self) -> int | None:
        """0: every gate passed; 1: a gate failed; 2: a gate error, or the run did not finish."""
        if self.in_progress:
            return None
        verdicts = [r.verdict for r in self.agents]
        if self.state is not RunState.DONE or not verdicts or any(v not in ("pass", "fail")
                                                                  for v in verdicts):
            return 2
        return 1 if "fail" in verdicts else 0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "gateId": self.id, "state": self.state.value, "error": self.error, "exitCode": self.exit_code,
            "base": self.base, "baseFrom": self.base_from, "head": self.head,
            "finalHead": self.heads[-1] if self.heads else self.head,
            "fix": self.request.fix, "rounds": self.request.rounds, "roundsRun": len(self.rounds),
            "agents": [r.to_json() for r in self.agents],
            "history": [{"round": i + 1, "head": self.heads[i], "agents": [r.to_json() for r in reports]}
                        for i, reports in enumerate(self.rounds[:-1])],
            "pending": sorted(r.agent for r in self.agents if r.item not in TERMINAL_TYPES),
            "createdAt": self.created_at, "endedAt": self.ended_at,
        }
        if self.dev is not None:
            out["devSessionId"] = self.dev_session_id
            out["devState"] = self.dev.state.value
            out["devStates"] = list(self.dev.history)
            out["devTurns"] = list(self.dev_turns)
        return out
